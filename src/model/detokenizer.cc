// StreamingDetokenizer and DecodeTokens (declared in model/tokenizer.h).
#include <string>

#include "model/tokenizer.h"

namespace kvpush {

namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

/// Expected length of a UTF-8 sequence from its lead byte; 0 for a byte that cannot lead.
size_t LeadLength(uint8_t b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

/// Whether `b` may follow lead byte `lead` as its first continuation byte (RFC 3629 table:
/// excludes overlongs, surrogates and code points above U+10FFFF).
bool ValidSecond(uint8_t lead, uint8_t b) {
  if (lead == 0xE0) return b >= 0xA0 && b <= 0xBF;
  if (lead == 0xED) return b >= 0x80 && b <= 0x9F;
  if (lead == 0xF0) return b >= 0x90 && b <= 0xBF;
  if (lead == 0xF4) return b >= 0x80 && b <= 0x8F;
  return b >= 0x80 && b <= 0xBF;
}

/// Moves every complete (or definitely invalid) character from the front of `pending` to `out`.
/// With `flush`, an incomplete tail becomes U+FFFD too.
void Drain(std::string& pending, std::string& out, bool flush) {
  size_t i = 0;
  while (i < pending.size()) {
    const auto lead = static_cast<uint8_t>(pending[i]);
    const size_t len = LeadLength(lead);
    if (len == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    size_t have = 1;
    bool bad = false;
    while (have < len && i + have < pending.size()) {
      const auto b = static_cast<uint8_t>(pending[i + have]);
      const bool ok = have == 1 ? ValidSecond(lead, b) : (b & 0xC0) == 0x80;
      if (!ok) {
        bad = true;
        break;
      }
      ++have;
    }
    if (bad) {  // the lead (and continuation bytes so far) form no character
      out += kReplacement;
      i += have;
      continue;
    }
    if (have < len) {  // incomplete: wait for more bytes unless flushing
      if (!flush) break;
      out += kReplacement;
      i = pending.size();
      break;
    }
    out.append(pending, i, len);
    i += len;
  }
  pending.erase(0, i);
}

}  // namespace

std::string StreamingDetokenizer::Push(int32_t id) {
  std::string bytes = tokenizer_->TokenBytes(id);
  if (bytes.empty() && show_special_) bytes = tokenizer_->ControlText(id);
  if (bytes.empty()) return "";
  if (first_) {
    first_ = false;
    if (bytes[0] == ' ' && tokenizer_->DropsFirstSpace()) bytes.erase(0, 1);
  }
  pending_ += bytes;
  std::string out;
  Drain(pending_, out, /*flush=*/false);
  return out;
}

std::string StreamingDetokenizer::Flush() {
  std::string out;
  Drain(pending_, out, /*flush=*/true);
  return out;
}

std::string DecodeTokens(const Tokenizer& tokenizer, std::span<const int32_t> ids,
                         bool show_special) {
  StreamingDetokenizer detok(tokenizer, show_special);
  std::string text;
  for (int32_t id : ids) text += detok.Push(id);
  text += detok.Flush();
  return text;
}

Result<std::vector<int32_t>> TokenizePrompt(const Tokenizer& tokenizer, std::string_view text,
                                            bool add_special_tokens) {
  KVP_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer.Encode(text));
  if (add_special_tokens && tokenizer.add_bos()) ids.insert(ids.begin(), tokenizer.bos_id());
  return ids;
}

}  // namespace kvpush
