#include "model/spm_tokenizer.h"

#include <algorithm>
#include <queue>

#include "model/gguf.h"

namespace kvpush {

namespace {

/// Parses "<0xNN>" (exactly 6 chars, hex digits either case); -1 if not a byte piece.
int ParseBytePiece(const std::string& p) {
  if (p.size() != 6 || p[0] != '<' || p[1] != '0' || p[2] != 'x' || p[5] != '>') return -1;
  auto hex = [](char ch) -> int {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
  };
  int hi = hex(p[3]), lo = hex(p[4]);
  if (hi < 0 || lo < 0) return -1;
  return hi * 16 + lo;
}

/// Length of the UTF-8 character starting at s[i]; 1 for an invalid or truncated sequence.
size_t Utf8CharLen(std::string_view s, size_t i) {
  const auto lead = static_cast<uint8_t>(s[i]);
  size_t len = lead < 0x80           ? 1
               : (lead >> 5) == 0x6  ? 2
               : (lead >> 4) == 0xE  ? 3
               : (lead >> 3) == 0x1E ? 4
                                     : 1;
  if (i + len > s.size()) return 1;
  for (size_t k = 1; k < len; ++k) {
    if ((static_cast<uint8_t>(s[i + k]) & 0xC0) != 0x80) return 1;
  }
  return len;
}

std::string ReplaceAll(std::string s, const std::string& from, const std::string& to) {
  if (from.empty() || from == to) return s;
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    if (s.compare(i, from.size(), from) == 0) {
      out += to;
      i += from.size();
    } else {
      out += s[i++];
    }
  }
  return out;
}

}  // namespace

Result<std::unique_ptr<SpmTokenizer>> SpmTokenizer::Create(SpmVocab vocab) {
  const size_t n = vocab.pieces.size();
  if (n == 0) return DataLoss("tokenizer: empty vocabulary");
  if (n > (size_t{1} << 30)) return DataLoss("tokenizer: vocabulary too large");
  if (vocab.scores.empty()) vocab.scores.assign(n, 0.0f);
  if (vocab.scores.size() != n) {
    return DataLoss("tokenizer: " + std::to_string(vocab.scores.size()) + " scores for " +
                    std::to_string(n) + " tokens");
  }
  const bool typed = !vocab.types.empty();
  if (typed && vocab.types.size() != n) {
    return DataLoss("tokenizer: " + std::to_string(vocab.types.size()) + " token types for " +
                    std::to_string(n) + " tokens");
  }
  auto in_range = [n](int32_t id) { return id >= 0 && static_cast<size_t>(id) < n; };
  if (!in_range(vocab.bos_id) || !in_range(vocab.eos_id) || !in_range(vocab.unk_id)) {
    return DataLoss("tokenizer: bos/eos/unk id out of range");
  }
  if (!typed) {
    vocab.types.assign(n, TokenType::kNormal);
    for (size_t i = 0; i < n; ++i) {
      if (ParseBytePiece(vocab.pieces[i]) >= 0) vocab.types[i] = TokenType::kByte;
    }
    vocab.types[static_cast<size_t>(vocab.unk_id)] = TokenType::kUnknown;
    vocab.types[static_cast<size_t>(vocab.bos_id)] = TokenType::kControl;
    vocab.types[static_cast<size_t>(vocab.eos_id)] = TokenType::kControl;
  }
  std::unique_ptr<SpmTokenizer> tok(new SpmTokenizer(std::move(vocab)));
  const SpmVocab& v = tok->vocab_;
  std::fill(std::begin(tok->byte_ids_), std::end(tok->byte_ids_), -1);
  tok->piece_to_id_.reserve(n);
  tok->token_bytes_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const auto id = static_cast<int32_t>(i);
    const TokenType type = v.types[i];
    if (type == TokenType::kByte) {
      int b = ParseBytePiece(v.pieces[i]);
      if (b < 0) return DataLoss("tokenizer: byte token " + std::to_string(i) + " is not <0xNN>");
      if (tok->byte_ids_[b] < 0) tok->byte_ids_[b] = id;
      tok->token_bytes_[i] = std::string(1, static_cast<char>(b));
      continue;  // byte pieces are not looked up as text
    }
    if (type == TokenType::kNormal || type == TokenType::kUserDefined) {
      tok->piece_to_id_.emplace(v.pieces[i], id);  // first id wins for duplicates
    }
    if (type == TokenType::kNormal || type == TokenType::kUserDefined ||
        type == TokenType::kUnknown) {
      tok->token_bytes_[i] = ReplaceAll(v.pieces[i], v.space_piece, " ");
    }
  }
  return tok;
}

Result<std::unique_ptr<SpmTokenizer>> SpmTokenizer::FromGguf(const GgufFile& file) {
  KVP_ASSIGN_OR_RETURN(std::string model, file.GetString("tokenizer.ggml.model"));
  if (model != "llama") {
    return Unimplemented("tokenizer model '" + model +
                         "' is not supported (kvpush implements the SentencePiece 'llama' "
                         "and the byte-level BPE 'gpt2' tokenizers)");
  }
  const GgufValue* tokens = file.Find("tokenizer.ggml.tokens");
  if (tokens == nullptr) return NotFound("GGUF key 'tokenizer.ggml.tokens' is missing");
  if (tokens->type != GgufType::kArray || tokens->elem_type != GgufType::kString) {
    return DataLoss("tokenizer.ggml.tokens is not a string array");
  }
  SpmVocab vocab;
  vocab.pieces = tokens->strings;
  if (const GgufValue* scores = file.Find("tokenizer.ggml.scores")) {
    if (scores->type != GgufType::kArray || scores->elem_type != GgufType::kF32) {
      return DataLoss("tokenizer.ggml.scores is not an f32 array");
    }
    vocab.scores.assign(scores->floats.begin(), scores->floats.end());
  }
  if (const GgufValue* types = file.Find("tokenizer.ggml.token_type")) {
    if (types->type != GgufType::kArray || !IsSupportedTokenTypeArray(*types)) {
      return DataLoss("tokenizer.ggml.token_type is not an integer array");
    }
    for (int64_t t : types->ints) {
      if (t < 1 || t > 6) return DataLoss("tokenizer: token type " + std::to_string(t));
      vocab.types.push_back(static_cast<TokenType>(t));
    }
  }
  KVP_ASSIGN_OR_RETURN(int64_t bos, file.GetIntOr("tokenizer.ggml.bos_token_id", 1));
  KVP_ASSIGN_OR_RETURN(int64_t eos, file.GetIntOr("tokenizer.ggml.eos_token_id", 2));
  KVP_ASSIGN_OR_RETURN(int64_t unk, file.GetIntOr("tokenizer.ggml.unknown_token_id", 0));
  const int64_t limit = static_cast<int64_t>(vocab.pieces.size());
  if (bos < 0 || bos >= limit || eos < 0 || eos >= limit || unk < 0 || unk >= limit) {
    return DataLoss("tokenizer: bos/eos/unk id out of range");
  }
  vocab.bos_id = static_cast<int32_t>(bos);
  vocab.eos_id = static_cast<int32_t>(eos);
  vocab.unk_id = static_cast<int32_t>(unk);
  return Create(std::move(vocab));
}

bool SpmTokenizer::IsSupportedTokenTypeArray(const GgufValue& v) {
  return v.elem_type != GgufType::kString && v.elem_type != GgufType::kF32 &&
         v.elem_type != GgufType::kF64 && v.ints.size() == v.array_size();
}

int32_t SpmTokenizer::Lookup(std::string_view piece) const {
  auto it = piece_to_id_.find(std::string(piece));
  return it == piece_to_id_.end() ? -1 : it->second;
}

Result<std::vector<int32_t>> SpmTokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> out;
  if (text.empty()) return out;
  std::string norm = ReplaceAll(" " + std::string(text), " ", vocab_.space_piece);

  struct Symbol {
    size_t start, len;
    int prev, next;
  };
  std::vector<Symbol> sym;
  for (size_t i = 0; i < norm.size();) {
    size_t len = Utf8CharLen(norm, i);
    sym.push_back({i, len, static_cast<int>(sym.size()) - 1, static_cast<int>(sym.size()) + 1});
    i += len;
  }
  sym.back().next = -1;

  struct Bigram {
    float score;
    int left, right;
    size_t len;  // combined length when queued; stale entries have a different length
  };
  auto worse = [](const Bigram& a, const Bigram& b) {
    if (a.score != b.score) return a.score < b.score;
    return a.left > b.left;
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(worse)> queue(worse);
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    std::string_view merged(norm.data() + sym[left].start, sym[left].len + sym[right].len);
    int32_t id = Lookup(merged);
    if (id < 0) return;
    queue.push({vocab_.scores[static_cast<size_t>(id)], left, right, merged.size()});
  };
  for (size_t i = 0; i + 1 < sym.size(); ++i) try_add(static_cast<int>(i), static_cast<int>(i) + 1);

  while (!queue.empty()) {
    Bigram b = queue.top();
    queue.pop();
    Symbol& l = sym[b.left];
    Symbol& r = sym[b.right];
    if (l.len == 0 || r.len == 0 || l.len + r.len != b.len || l.next != b.right) continue;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }

  for (int i = 0; i >= 0; i = sym[i].next) {
    std::string_view piece(norm.data() + sym[i].start, sym[i].len);
    int32_t id = Lookup(piece);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    for (char ch : piece) {
      int32_t bid = byte_ids_[static_cast<uint8_t>(ch)];
      out.push_back(bid >= 0 ? bid : vocab_.unk_id);
    }
  }
  return out;
}

std::string SpmTokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return "";
  return token_bytes_[static_cast<size_t>(id)];
}

bool SpmTokenizer::IsControl(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return false;
  return vocab_.types[static_cast<size_t>(id)] == TokenType::kControl;
}

const std::string& SpmTokenizer::Piece(int32_t id) const {
  static const std::string kEmpty;
  if (id < 0 || id >= vocab_size()) return kEmpty;
  return vocab_.pieces[static_cast<size_t>(id)];
}

}  // namespace kvpush
