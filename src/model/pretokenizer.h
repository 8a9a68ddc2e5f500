// Pre-tokenizers for byte-level BPE: the text normalization and the regex split that run before
// BPE, chosen by the GGUF key `tokenizer.ggml.pre`.
//
// Sources of the split regexes (data, re-typed for PCRE2): the `Split` pre-tokenizer patterns in
// the upstream tokenizer.json files (Qwen2/Qwen2.5/Qwen3, Meta-Llama-3) and GPT-2's pattern, as
// llama.cpp's llama-vocab documents them per `tokenizer.ggml.pre` name. Normalization: the Qwen
// tokenizer.json files declare an NFC normalizer (HF tokenizers and transformers.js apply it;
// llama.cpp does not), so the `qwen2` family applies Unicode NFC (ICU) before splitting.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

struct pcre2_real_code_8;

namespace kvpush {

/// What a `tokenizer.ggml.pre` name means.
struct PreTokenizerSpec {
  std::string family;          ///< canonical name: "qwen2", "llama3" or "gpt2"
  std::string pattern;         ///< PCRE2 pattern (compiled with UTF + UCP)
  bool nfc = false;            ///< apply Unicode NFC to text before splitting
  bool ignore_merges = false;  ///< a chunk that is itself a token is emitted without merging
};

/// Looks up a `tokenizer.ggml.pre` value. Accepted: "qwen2", "deepseek-r1-qwen" (qwen2 family);
/// "llama-bpe", "llama3", "llama-v3" (llama3 family: digits in runs of up to 3, ignore_merges);
/// "default", "gpt2", "gpt-2" (the GPT-2 pattern). Errors: kUnimplemented naming the value.
Result<PreTokenizerSpec> FindPreTokenizer(std::string_view name);

/// A compiled split regex (PCRE2, UTF mode with Unicode properties, JIT when available).
/// Split() is the HF "Isolated" split: every match is a chunk, and so is every stretch of text
/// between matches. Invalid UTF-8 never matches (PCRE2_MATCH_INVALID_UTF): such bytes end up in
/// the between-match chunks, so chunks always concatenate back to the input, byte for byte.
/// Thread-safety: immutable after Create; Split may be called concurrently (each call allocates
/// its own match data).
class RegexSplitter {
 public:
  /// Errors: kInvalidArgument with PCRE2's message and offset for a pattern that does not compile.
  static Result<std::unique_ptr<RegexSplitter>> Create(const std::string& pattern);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  /// Chunks of `text` in order (views into `text`); empty for empty text.
  std::vector<std::string_view> Split(std::string_view text) const;

 private:
  explicit RegexSplitter(pcre2_real_code_8* code) : code_(code) {}
  pcre2_real_code_8* code_;
};

/// Unicode NFC of UTF-8 `text` (ICU). Ill-formed byte sequences are copied through unchanged.
/// Thread-safe.
std::string NormalizeNfc(std::string_view text);

}  // namespace kvpush
