// BpeTokenizer (model/bpe_tokenizer.h).
#include "model/bpe_tokenizer.h"

#include <algorithm>
#include <iterator>
#include <queue>

#include "model/gguf.h"

namespace kvpush {

namespace {

void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool IsPrintableByte(uint32_t b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

/// GPT-2's bytes_to_unicode table and its inverse (code points 0..0x143 -> byte, -1 if none).
struct ByteLevelTables {
  uint32_t byte_to_cp[256];
  int16_t cp_to_byte[0x144];
  ByteLevelTables() {
    std::fill(std::begin(cp_to_byte), std::end(cp_to_byte), int16_t{-1});
    uint32_t n = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      byte_to_cp[b] = IsPrintableByte(b) ? b : 0x100 + n++;
      cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteLevelTables& Tables() {
  static const ByteLevelTables tables;
  return tables;
}

/// Maps a byte-level string back to bytes; false if a character is outside the alphabet.
bool ByteLevelToBytes(std::string_view s, std::string& out) {
  const ByteLevelTables& t = Tables();
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<uint8_t>(s[i]);
    uint32_t cp = 0;
    if (b0 < 0x80) {
      cp = b0;
      i += 1;
    } else if ((b0 & 0xE0) == 0xC0 && i + 1 < s.size()) {
      cp = ((b0 & 0x1Fu) << 6) | (static_cast<uint8_t>(s[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return false;
    }
    if (cp >= 0x144 || t.cp_to_byte[cp] < 0) return false;
    out += static_cast<char>(t.cp_to_byte[cp]);
  }
  return true;
}

bool IsAddedType(TokenType t) {
  return t == TokenType::kControl || t == TokenType::kUserDefined;
}

}  // namespace

uint32_t ByteToCodePoint(uint8_t b) {
  return Tables().byte_to_cp[b];
}

Result<std::unique_ptr<BpeTokenizer>> BpeTokenizer::Create(BpeVocab vocab) {
  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer(std::move(vocab)));
  KVP_RETURN_IF_ERROR(t->Index());
  return t;
}

Status BpeTokenizer::Index() {
  const size_t n = vocab_.pieces.size();
  if (n == 0 || n > (size_t{1} << 30))
    return DataLoss("tokenizer: vocabulary size " + std::to_string(n));
  if (vocab_.types.empty()) vocab_.types.assign(n, TokenType::kNormal);
  if (vocab_.types.size() != n) {
    return DataLoss("tokenizer: " + std::to_string(vocab_.types.size()) + " token types for " +
                    std::to_string(n) + " tokens");
  }
  const auto limit = static_cast<int32_t>(n);
  if (vocab_.bos_id >= limit || vocab_.eos_id >= limit || vocab_.bos_id < -1 ||
      vocab_.eos_id < -1) {
    return DataLoss("tokenizer: bos/eos id out of range");
  }
  KVP_ASSIGN_OR_RETURN(spec_, FindPreTokenizer(vocab_.pre));
  KVP_ASSIGN_OR_RETURN(splitter_, RegexSplitter::Create(spec_.pattern));
  piece_to_id_.reserve(n);
  token_bytes_.resize(n);
  for (int32_t id = 0; id < limit; ++id) {
    const std::string& p = vocab_.pieces[static_cast<size_t>(id)];
    piece_to_id_.emplace(p, id);  // first id wins on duplicates, as llama.cpp
    const TokenType type = vocab_.types[static_cast<size_t>(id)];
    if (type == TokenType::kUserDefined) {
      token_bytes_[static_cast<size_t>(id)] = p;
    } else if (type == TokenType::kNormal) {
      std::string bytes;
      // A normal piece outside the byte-level alphabet decodes to its own text (llama.cpp warns).
      token_bytes_[static_cast<size_t>(id)] = ByteLevelToBytes(p, bytes) ? bytes : p;
    }
    if (IsAddedType(type) && !p.empty()) {
      added_by_first_[static_cast<uint8_t>(p[0])].emplace_back(p, id);
    }
  }
  for (auto& group : added_by_first_) {
    std::stable_sort(group.begin(), group.end(),
                     [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  }
  for (int b = 0; b < 256; ++b) {
    byte_char_[b].clear();
    AppendUtf8(ByteToCodePoint(static_cast<uint8_t>(b)), byte_char_[b]);
    const int32_t id = Lookup(byte_char_[b]);
    if (id < 0) {
      return DataLoss("tokenizer: byte-level character for byte " + std::to_string(b) +
                      " is not in the vocabulary");
    }
    byte_id_[b] = id;
  }
  return IndexMerges();
}

Status BpeTokenizer::IndexMerges() {
  merges_.reserve(vocab_.merges.size());
  for (size_t r = 0; r < vocab_.merges.size(); ++r) {
    const std::string& m = vocab_.merges[r];
    const size_t sp = m.find(' ', 1);
    if (sp == std::string::npos || sp + 1 >= m.size()) {
      return DataLoss("tokenizer: merge " + std::to_string(r) + " ('" + m +
                      "') is not 'left right'");
    }
    const int32_t left = Lookup(std::string_view(m).substr(0, sp));
    const int32_t right = Lookup(std::string_view(m).substr(sp + 1));
    const int32_t result = Lookup(m.substr(0, sp) + m.substr(sp + 1));
    if (left < 0 || right < 0 || result < 0) {
      return DataLoss("tokenizer: merge " + std::to_string(r) + " ('" + m +
                      "') names a piece that is not in the vocabulary");
    }
    const uint64_t key =
        (uint64_t{static_cast<uint32_t>(left)} << 32) | static_cast<uint32_t>(right);
    merges_.emplace(key, Merge{static_cast<int32_t>(r), result});  // first rank wins on duplicates
  }
  std::vector<std::string>().swap(vocab_.merges);  // indexed: the strings are not needed again
  return Status::Ok();
}

Result<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromGguf(const GgufFile& file) {
  const GgufValue* model = file.Find("tokenizer.ggml.model");
  if (model == nullptr || model->type != GgufType::kString || model->s != "gpt2") {
    return InvalidArgument("tokenizer.ggml.model is not the string 'gpt2'");
  }
  BpeVocab vocab;
  if (file.Find("tokenizer.ggml.pre") != nullptr) {
    KVP_ASSIGN_OR_RETURN(vocab.pre, file.GetString("tokenizer.ggml.pre"));
  }
  auto strings = [&](const char* key, std::vector<std::string>& out) -> Status {
    const GgufValue* v = file.Find(key);
    if (v == nullptr) return NotFound(std::string("GGUF key '") + key + "' is missing");
    if (v->type != GgufType::kArray || v->elem_type != GgufType::kString) {
      return DataLoss(std::string(key) + " is not a string array");
    }
    out = v->strings;
    return Status::Ok();
  };
  KVP_RETURN_IF_ERROR(strings("tokenizer.ggml.tokens", vocab.pieces));
  KVP_RETURN_IF_ERROR(strings("tokenizer.ggml.merges", vocab.merges));
  if (const GgufValue* types = file.Find("tokenizer.ggml.token_type")) {
    if (types->type != GgufType::kArray || types->elem_type == GgufType::kString ||
        types->elem_type == GgufType::kF32 || types->elem_type == GgufType::kF64 ||
        types->ints.size() != types->array_size()) {
      return DataLoss("tokenizer.ggml.token_type is not an integer array");
    }
    for (int64_t t : types->ints) {
      if (t < 1 || t > 6) return DataLoss("tokenizer: token type " + std::to_string(t));
      vocab.types.push_back(static_cast<TokenType>(t));
    }
  }
  // No defaults: the SentencePiece convention (1, 2) the model loader assumes would name ordinary
  // byte-level tokens here ('"' and '#'), so a file without them is refused by name.
  KVP_ASSIGN_OR_RETURN(int64_t bos, file.GetInt("tokenizer.ggml.bos_token_id"));
  KVP_ASSIGN_OR_RETURN(int64_t eos, file.GetInt("tokenizer.ggml.eos_token_id"));
  KVP_ASSIGN_OR_RETURN(int64_t add_bos, file.GetIntOr("tokenizer.ggml.add_bos_token", 0));
  const auto limit = static_cast<int64_t>(vocab.pieces.size());
  if (bos < -1 || bos >= limit || eos < -1 || eos >= limit) {
    return DataLoss("tokenizer: bos/eos id out of range");
  }
  vocab.bos_id = static_cast<int32_t>(bos);
  vocab.eos_id = static_cast<int32_t>(eos);
  vocab.add_bos = add_bos != 0;
  return Create(std::move(vocab));
}

const std::string& BpeTokenizer::Piece(int32_t id) const {
  static const std::string kEmpty;
  return id >= 0 && id < vocab_size() ? vocab_.pieces[static_cast<size_t>(id)] : kEmpty;
}

int32_t BpeTokenizer::Lookup(std::string_view piece) const {
  auto it = piece_to_id_.find(std::string(piece));
  return it == piece_to_id_.end() ? -1 : it->second;
}

std::string BpeTokenizer::TokenBytes(int32_t id) const {
  return id >= 0 && id < vocab_size() ? token_bytes_[static_cast<size_t>(id)] : std::string();
}

bool BpeTokenizer::IsControl(int32_t id) const {
  return id >= 0 && id < vocab_size() &&
         vocab_.types[static_cast<size_t>(id)] == TokenType::kControl;
}

std::string BpeTokenizer::ControlText(int32_t id) const {
  return IsControl(id) ? Piece(id) : std::string();
}

const BpeTokenizer::Merge* BpeTokenizer::FindMerge(int32_t left, int32_t right) const {
  const uint64_t key = (uint64_t{static_cast<uint32_t>(left)} << 32) | static_cast<uint32_t>(right);
  auto it = merges_.find(key);
  return it == merges_.end() ? nullptr : &it->second;
}

Result<std::vector<int32_t>> BpeTokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> out;
  size_t done = 0;  // start of the text not yet encoded
  size_t i = 0;
  while (i < text.size()) {
    const auto& group = added_by_first_[static_cast<uint8_t>(text[i])];
    int32_t match = -1;
    size_t match_len = 0;
    for (const auto& [piece, id] : group) {  // longest first
      if (text.compare(i, piece.size(), piece) == 0) {
        match = id;
        match_len = piece.size();
        break;
      }
    }
    if (match < 0) {
      ++i;
      continue;
    }
    EncodeText(text.substr(done, i - done), out);
    out.push_back(match);
    i += match_len;
    done = i;
  }
  EncodeText(text.substr(done), out);
  return out;
}

void BpeTokenizer::EncodeText(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::string normalized;
  if (spec_.nfc) {
    normalized = NormalizeNfc(text);
    text = normalized;
  }
  for (std::string_view chunk : splitter_->Split(text)) EncodeChunk(chunk, out);
}

void BpeTokenizer::EncodeChunk(std::string_view chunk, std::vector<int32_t>& out) const {
  if (spec_.ignore_merges || chunk.size() == 1) {
    std::string s;  // the chunk in the byte-level alphabet
    for (char c : chunk) s += byte_char_[static_cast<uint8_t>(c)];
    if (const int32_t id = Lookup(s); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  // One symbol per byte, as a doubly linked list; a merged symbol keeps the left index.
  struct Symbol {
    int32_t id, prev, next;
  };
  std::vector<Symbol> syms(chunk.size());
  for (size_t k = 0; k < chunk.size(); ++k) {
    syms[k] = {byte_id_[static_cast<uint8_t>(chunk[k])], static_cast<int32_t>(k) - 1,
               k + 1 < chunk.size() ? static_cast<int32_t>(k + 1) : -1};
  }
  struct Pair {
    int32_t rank, left, right, left_id, right_id, result;  ///< stale if an id changed since
    bool operator>(const Pair& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Pair, std::vector<Pair>, std::greater<>> queue;
  auto push = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const int32_t a = syms[static_cast<size_t>(l)].id, b = syms[static_cast<size_t>(r)].id;
    if (const Merge* m = FindMerge(a, b)) queue.push({m->rank, l, r, a, b, m->id});
  };
  for (size_t k = 0; k + 1 < syms.size(); ++k) {
    push(static_cast<int32_t>(k), static_cast<int32_t>(k + 1));
  }
  while (!queue.empty()) {
    const Pair p = queue.top();
    queue.pop();
    Symbol& a = syms[static_cast<size_t>(p.left)];
    Symbol& b = syms[static_cast<size_t>(p.right)];
    if (a.id != p.left_id || b.id != p.right_id || a.next != p.right) continue;  // stale
    a.id = p.result;
    b.id = -1;  // dead
    a.next = b.next;
    if (b.next >= 0) syms[static_cast<size_t>(b.next)].prev = p.left;
    push(a.prev, p.left);
    push(p.left, a.next);
  }
  for (int32_t k = 0; k >= 0; k = syms[static_cast<size_t>(k)].next) {
    out.push_back(syms[static_cast<size_t>(k)].id);
  }
}

}  // namespace kvpush
