// Tokenizer: text <-> token ids for a loaded model, plus a streaming-safe detokenizer.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kvpush {

/// A model's vocabulary. Implementations: SentencePiece-style BPE with byte fallback (GGUF
/// tokenizer.ggml.model = "llama", and llama2.c tok512.bin; spm_tokenizer.h), byte-level BPE
/// (GGUF "gpt2": Llama 3, Qwen; bpe_tokenizer.h), and the sim tokenizer. Thread-safe for
/// concurrent const use.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual int32_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;

  /// Encodes text into ids, without BOS/EOS (TokenizePrompt adds BOS). SentencePiece: a leading
  /// space is added to the text, byte fallback for unknown characters. Byte-level BPE: added
  /// tokens in the text are matched, any bytes encode. Errors: kInvalidArgument for text that is
  /// not valid UTF-8 when the vocabulary needs it (neither built-in tokenizer does).
  virtual Result<std::vector<int32_t>> Encode(std::string_view text) const = 0;

  /// Raw bytes of one token's piece ("▁" already turned into ' ', <0xNN> into the byte, a
  /// byte-level BPE piece mapped back to bytes; control tokens such as BOS/EOS give ""). Errors:
  /// none; an out-of-range id gives "".
  virtual std::string TokenBytes(int32_t id) const = 0;

  /// True for control tokens (BOS, EOS, ...), which decode to nothing.
  virtual bool IsControl(int32_t id) const = 0;

  /// The vocabulary's own spelling of a token ("▁the", "Ġthe", "<0x0A>", "<|im_start|>"), as HF's
  /// convert_ids_to_tokens gives it; "" when out of range. Default: TokenBytes(id).
  virtual std::string TokenPiece(int32_t id) const { return TokenBytes(id); }

  /// The text of a control token when special tokens are shown (e.g. "<|im_start|>", "<s>"); ""
  /// for other ids. Default: "".
  virtual std::string ControlText(int32_t /*id*/) const { return ""; }

  /// Whether a prompt starts with BOS when special tokens are added (GGUF
  /// tokenizer.ggml.add_bos_token; SentencePiece Llama vocabularies: true). Default: true.
  virtual bool add_bos() const { return true; }

  /// Whether decoding drops the first piece's leading space (the SentencePiece dummy prefix).
  /// Default: true; byte-level BPE: false.
  virtual bool DropsFirstSpace() const { return true; }
};

/// Tokenizes a prompt as the model receives it: BOS first when `add_special_tokens` and the
/// vocabulary adds BOS (Tokenizer::add_bos), then Encode(text). Errors: those of Encode.
Result<std::vector<int32_t>> TokenizePrompt(const Tokenizer& tokenizer, std::string_view text,
                                            bool add_special_tokens);

/// Turns a stream of token ids into text, emitting only complete UTF-8 characters (a character
/// whose bytes are split across byte-fallback tokens comes out whole, once its last byte arrives).
/// The first piece's leading space is dropped when the tokenizer says so (SentencePiece dummy
/// prefix, as llama2.c does). Invalid UTF-8 sequences are emitted as U+FFFD. Control tokens give
/// nothing unless `show_special` (then Tokenizer::ControlText). Not thread-safe: one per request.
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tokenizer, bool show_special = false)
      : tokenizer_(&tokenizer), show_special_(show_special) {}

  /// Appends one token; returns the text that became complete (possibly empty).
  std::string Push(int32_t id);
  /// Returns whatever is pending at the end of the stream (an incomplete sequence as U+FFFD).
  std::string Flush();

 private:
  const Tokenizer* tokenizer_;
  bool show_special_;
  std::string pending_;
  bool first_ = true;
};

/// Decodes a whole id sequence with StreamingDetokenizer semantics (`show_special` as there).
std::string DecodeTokens(const Tokenizer& tokenizer, std::span<const int32_t> ids,
                         bool show_special = false);

}  // namespace kvpush
