// FindPreTokenizer, RegexSplitter (PCRE2) and NormalizeNfc (ICU); see pretokenizer.h.
#include "model/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

namespace kvpush {

namespace {

// Whitespace as ECMAScript's \s (WhiteSpace + LineTerminator), which the reference tokenizers
// (transformers.js) use: TAB LF VT FF CR, the Zs space separators, LS, PS and U+FEFF. PCRE2's own
// \s under UCP differs (it includes U+0085 and U+180E and excludes U+FEFF), so the patterns spell
// the class out. HF's Rust tokenizers (Oniguruma, Unicode White_Space) differ from both: U+0085 is
// a space there and U+FEFF is not (docs/model.md).
#define KVP_WS \
  R"(\t\n\x{0B}\f\r\x{20}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}\x{FEFF})"
// English contractions, ASCII-case-insensitive ("(?i:'s|'t|...)" upstream; spelled as
// transformers.js does, so Unicode case folding such as 's' ~ U+017F does not apply).
#define KVP_CONTRACTIONS R"('(?:[sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))"

// Qwen2 / Qwen2.5 / Qwen3 tokenizer.json `Split` pattern: single digits.
constexpr char kQwen2Pattern[] = KVP_CONTRACTIONS
    R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^)" KVP_WS R"(\p{L}\p{N}]+[\r\n]*)"
    R"(|[)" KVP_WS R"(]*[\r\n]+|[)" KVP_WS R"(]+(?![^)" KVP_WS R"(])|[)" KVP_WS R"(]+)";
// Meta-Llama-3 tokenizer.json `Split` pattern: digits in runs of at most three.
constexpr char kLlama3Pattern[] = KVP_CONTRACTIONS
    R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^)" KVP_WS R"(\p{L}\p{N}]+[\r\n]*)"
    R"(|[)" KVP_WS R"(]*[\r\n]+|[)" KVP_WS R"(]+(?![^)" KVP_WS R"(])|[)" KVP_WS R"(]+)";
// GPT-2's pattern (llama.cpp's "default" pre-tokenizer; case-sensitive contractions).
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^)" KVP_WS R"(\p{L}\p{N}]+|[)" KVP_WS
    R"(]+(?![^)" KVP_WS R"(])|[)" KVP_WS R"(]+)";
#undef KVP_WS
#undef KVP_CONTRACTIONS

}  // namespace

Result<PreTokenizerSpec> FindPreTokenizer(std::string_view name) {
  if (name == "qwen2" || name == "deepseek-r1-qwen") {
    return PreTokenizerSpec{"qwen2", kQwen2Pattern, /*nfc=*/true, /*ignore_merges=*/false};
  }
  if (name == "llama-bpe" || name == "llama3" || name == "llama-v3") {
    return PreTokenizerSpec{"llama3", kLlama3Pattern, /*nfc=*/false, /*ignore_merges=*/true};
  }
  if (name == "default" || name == "gpt2" || name == "gpt-2") {
    return PreTokenizerSpec{"gpt2", kGpt2Pattern, /*nfc=*/false, /*ignore_merges=*/false};
  }
  return Unimplemented("pre-tokenizer '" + std::string(name) +
                       "' (tokenizer.ggml.pre) is not supported; kvpush knows qwen2, "
                       "deepseek-r1-qwen, llama-bpe, llama3, llama-v3, default, gpt2");
}

Result<std::unique_ptr<RegexSplitter>> RegexSplitter::Create(const std::string& pattern) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return InvalidArgument("split regex does not compile at offset " + std::to_string(offset) +
                           ": " + reinterpret_cast<const char*>(msg));
  }
  // JIT is an optimisation only: without it (e.g. an architecture PCRE2 has no JIT for) matching
  // falls back to the interpreter with identical results.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::unique_ptr<RegexSplitter>(new RegexSplitter(code));
}

RegexSplitter::~RegexSplitter() {
  pcre2_code_free(code_);
}

std::vector<std::string_view> RegexSplitter::Split(std::string_view text) const {
  std::vector<std::string_view> chunks;
  if (text.empty()) return chunks;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;   // where the next search starts
  size_t done = 0;  // bytes already emitted as chunks
  while (pos < text.size()) {
    const int rc = pcre2_match(code_, subject, text.size(), pos, 0, md, nullptr);
    if (rc < 0) break;  // PCRE2_ERROR_NOMATCH (or a resource error): the rest is one gap chunk
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t start = ov[0], end = ov[1];
    if (end == start) {  // no alternative matches empty text; guard against a looping pattern
      pos = start + 1;
      continue;
    }
    if (start > done) chunks.push_back(text.substr(done, start - done));
    chunks.push_back(text.substr(start, end - start));
    done = pos = end;
  }
  if (done < text.size()) chunks.push_back(text.substr(done));
  pcre2_match_data_free(md);
  return chunks;
}

std::string NormalizeNfc(std::string_view text) {
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(err);
  if (U_FAILURE(err)) return std::string(text);  // ICU data missing: leave the text as it is
  const icu::StringPiece piece(text.data(), static_cast<int32_t>(text.size()));
  if (nfc->isNormalizedUTF8(piece, err) && U_SUCCESS(err)) return std::string(text);
  err = U_ZERO_ERROR;
  std::string out;
  icu::StringByteSink<std::string> sink(&out);
  nfc->normalizeUTF8(0, piece, sink, nullptr, err);
  return U_SUCCESS(err) ? out : std::string(text);
}

}  // namespace kvpush
