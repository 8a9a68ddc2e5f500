// BpeTokenizer: byte-level BPE (GGUF tokenizer.ggml.model = "gpt2": Llama 3, Qwen2/2.5/3, GPT-2).
//
// Encoding (the HF tokenizers / llama.cpp "llm_tokenizer_bpe" behaviour):
//   1. added tokens — pieces of type kControl or kUserDefined, e.g. <|im_start|>, <think>,
//      <|begin_of_text|> — are found in the text first (longest match at each position) and become
//      their ids; the text between them goes through steps 2-4;
//   2. optional Unicode NFC (the qwen2 pre-tokenizer family), then the pre-tokenizer's regex split
//      (model/pretokenizer.h) into chunks;
//   3. each chunk's bytes are mapped to GPT-2's byte-level alphabet (byte b -> one code point:
//      printable Latin-1 bytes stand for themselves, the other 68 bytes for U+0100.. in order);
//   4. BPE over token ids (as HF tokenizers: merges map an id pair to a rank and a result id):
//      repeatedly merge the adjacent pair with the lowest merge rank (ties: leftmost), O(n log n)
//      with a priority queue; with ignore_merges (llama3 family) a chunk that is itself a token is
//      emitted whole. Each final symbol is a vocabulary piece.
// Any byte sequence, including invalid UTF-8, encodes (invalid bytes form chunks of their own), and
// TokenBytes over the ids gives the input back byte for byte (after NFC where it applies).
// Thread-safety: immutable after construction; concurrent const use is safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "model/pretokenizer.h"
#include "model/spm_tokenizer.h"  // TokenType
#include "model/tokenizer.h"

namespace kvpush {

class GgufFile;

/// A byte-level BPE vocabulary as GGUF stores it.
struct BpeVocab {
  std::vector<std::string> pieces;  ///< byte-level strings ("Ġthe"); added tokens as plain text
  std::vector<TokenType> types;     ///< empty = all kNormal
  std::vector<std::string> merges;  ///< "left right", rank = index
  std::string pre = "default";      ///< tokenizer.ggml.pre
  int32_t bos_id = -1;              ///< -1: none
  int32_t eos_id = -1;
  bool add_bos = false;  ///< whether a prompt gets BOS (tokenizer.ggml.add_bos_token)
};

class BpeTokenizer final : public Tokenizer {
 public:
  /// Validates and indexes the vocabulary. Errors: kDataLoss (sizes disagree, ids out of range, a
  /// merge without a space, a merge whose two sides or result are not pieces — HF tokenizers
  /// refuse these too —, a byte-level character missing from the vocabulary), kUnimplemented
  /// (unknown pre-tokenizer, named).
  static Result<std::unique_ptr<BpeTokenizer>> Create(BpeVocab vocab);

  /// Builds from GGUF metadata tokenizer.ggml.{model = "gpt2", pre, tokens, token_type, merges,
  /// bos_token_id, eos_token_id, add_bos_token}. Absent pre = "default" (GPT-2 pattern, as
  /// llama.cpp); absent add_bos_token = false. Errors: as Create, kNotFound for missing tokens,
  /// merges, bos_token_id or eos_token_id, kDataLoss for wrongly typed fields, kInvalidArgument for
  /// a model other than "gpt2".
  static Result<std::unique_ptr<BpeTokenizer>> FromGguf(const GgufFile& file);

  int32_t vocab_size() const override { return static_cast<int32_t>(vocab_.pieces.size()); }
  /// BOS/EOS ids (0 when the vocabulary has none: only possible through Create; FromGguf
  /// requires both).
  int32_t bos_id() const override { return vocab_.bos_id < 0 ? 0 : vocab_.bos_id; }
  int32_t eos_id() const override { return vocab_.eos_id < 0 ? 0 : vocab_.eos_id; }
  bool add_bos() const override { return vocab_.add_bos && vocab_.bos_id >= 0; }
  bool DropsFirstSpace() const override { return false; }
  /// Never fails: any bytes encode (see the file comment). Added tokens in the text are matched.
  Result<std::vector<int32_t>> Encode(std::string_view text) const override;
  /// Normal pieces: the byte-level string mapped back to bytes. kUserDefined: the piece text.
  /// kControl / kUnused / out of range: "".
  std::string TokenBytes(int32_t id) const override;
  bool IsControl(int32_t id) const override;
  std::string ControlText(int32_t id) const override;
  std::string TokenPiece(int32_t id) const override { return Piece(id); }

  /// The pre-tokenizer family the `pre` name resolved to: "qwen2", "llama3" or "gpt2".
  const std::string& pre_family() const { return spec_.family; }
  /// The piece as stored (byte-level alphabet for normal tokens); "" when out of range.
  const std::string& Piece(int32_t id) const;
  /// The id of exactly this piece, or -1.
  int32_t Lookup(std::string_view piece) const;

 private:
  explicit BpeTokenizer(BpeVocab vocab) : vocab_(std::move(vocab)) {}
  Status Index();
  Status IndexMerges();
  void EncodeChunk(std::string_view chunk, std::vector<int32_t>& out) const;
  void EncodeText(std::string_view text, std::vector<int32_t>& out) const;
  /// The merge of adjacent tokens (left, right): its rank and result id.
  struct Merge {
    int32_t rank;
    int32_t id;
  };
  const Merge* FindMerge(int32_t left, int32_t right) const;

  BpeVocab vocab_;
  PreTokenizerSpec spec_;
  std::unique_ptr<RegexSplitter> splitter_;
  std::unordered_map<std::string, int32_t> piece_to_id_;
  std::unordered_map<uint64_t, Merge> merges_;  ///< (left id << 32 | right id) -> merge
  std::string byte_char_[256];                  ///< byte -> its byte-level UTF-8 char
  int32_t byte_id_[256];                        ///< byte -> id of its byte-level char
  std::vector<std::string> token_bytes_;        ///< decoded bytes per id
  /// Added tokens grouped by first byte, longest first.
  std::vector<std::pair<std::string, int32_t>> added_by_first_[256];
};

/// GPT-2's byte-level alphabet: the code point that stands for byte `b`.
uint32_t ByteToCodePoint(uint8_t b);

}  // namespace kvpush
