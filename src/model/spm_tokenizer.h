// SpmTokenizer: SentencePiece-style BPE with byte fallback (GGUF tokenizer.ggml.model = "llama",
// llama2.c tok512.bin).
//
// Encoding (the llama.cpp "llm_tokenizer_spm" / llama2.c encode() behaviour):
//   1. non-empty text gets a dummy prefix space; every ' ' becomes the vocabulary's space piece
//      ("▁" U+2581 for GGUF vocabularies, a real ' ' for tok512.bin);
//   2. the text is split into UTF-8 characters (an invalid byte is a character of its own);
//   3. repeatedly, the adjacent pair whose concatenation is a vocabulary piece with the highest
//      score is merged (ties: leftmost pair first), until no pair merges;
//   4. each remaining symbol becomes its piece id, or, if it is not in the vocabulary, one byte
//      token <0xNN> per byte (byte fallback), or <unk> when the vocabulary has no byte tokens.
// Thread-safety: immutable after construction; concurrent const use is safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "model/tokenizer.h"

namespace kvpush {

class GgufFile;
struct GgufValue;

/// Token types (GGUF tokenizer.ggml.token_type numbering).
enum class TokenType : int32_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

/// A vocabulary: pieces, merge scores and types, plus special ids.
struct SpmVocab {
  std::vector<std::string> pieces;
  std::vector<float> scores;
  std::vector<TokenType> types;
  std::string space_piece = "\xE2\x96\x81";  ///< what ' ' becomes before lookup
  int32_t bos_id = 1;
  int32_t eos_id = 2;
  int32_t unk_id = 0;
};

class SpmTokenizer final : public Tokenizer {
 public:
  /// Validates (sizes agree, ids in range) and indexes the vocabulary. Byte tokens are the pieces
  /// of type kByte, or, when no types are given, pieces spelled exactly "<0xNN>".
  /// Errors: kDataLoss (inconsistent vocabulary).
  static Result<std::unique_ptr<SpmTokenizer>> Create(SpmVocab vocab);

  /// Builds from GGUF metadata tokenizer.ggml.{model,tokens,scores,token_type,bos_token_id,
  /// eos_token_id,unknown_token_id}. Errors: kUnimplemented for a tokenizer model other than
  /// "llama" (e.g. "gpt2": byte-level BPE is not implemented), kDataLoss/kNotFound for malformed or
  /// missing fields.
  static Result<std::unique_ptr<SpmTokenizer>> FromGguf(const GgufFile& file);

  int32_t vocab_size() const override { return static_cast<int32_t>(vocab_.pieces.size()); }
  int32_t bos_id() const override { return vocab_.bos_id; }
  int32_t eos_id() const override { return vocab_.eos_id; }
  /// Never fails: bytes that are not valid UTF-8 go through byte fallback.
  Result<std::vector<int32_t>> Encode(std::string_view text) const override;
  std::string TokenBytes(int32_t id) const override;
  bool IsControl(int32_t id) const override;
  std::string TokenPiece(int32_t id) const override { return Piece(id); }
  std::string ControlText(int32_t id) const override {
    return IsControl(id) ? Piece(id) : std::string();
  }

  /// The raw piece string of `id` ("" when out of range).
  const std::string& Piece(int32_t id) const;

 private:
  explicit SpmTokenizer(SpmVocab vocab) : vocab_(std::move(vocab)) {}
  int32_t Lookup(std::string_view piece) const;
  static bool IsSupportedTokenTypeArray(const GgufValue& v);

  SpmVocab vocab_;
  std::unordered_map<std::string, int32_t> piece_to_id_;
  int32_t byte_ids_[256];
  std::vector<std::string> token_bytes_;  ///< decoded bytes per id
};

}  // namespace kvpush
