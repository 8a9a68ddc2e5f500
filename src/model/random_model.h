// Random Llama-shaped GGUF models (for `kvpush gen-model`, benchmarks and tests).
//
// The weights are uniform random with the variance of a scaled init (std 1/sqrt(fan_in) for linear
// layers, 1 for norms' complement: norms are all ones), generated from a SplitMix64 stream, so a
// seed fully determines the file. The vocabulary is a usable SentencePiece "llama" vocabulary:
// <unk>, <s>, </s>, 256 byte tokens <0x00>..<0xFF>, "▁" and printable ASCII, then BPE merges
// learned from a built-in English paragraph (score = -merge rank), padded with unused tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/dtype.h"
#include "model/gguf_writer.h"
#include "model/hf_vocab.h"
#include "model/spm_tokenizer.h"

namespace kvpush {

struct RandomLlamaOptions {
  // Defaults: ~28M parameters (106 MiB f32), sized so that a 512-token prefill takes about 0.5-1 s
  // on the 2-core development machine (docs/benchmarks/model.md).
  int32_t dim = 512;
  int32_t layers = 8;
  int32_t heads = 8;
  int32_t kv_heads = 4;
  int32_t hidden_dim = 1408;
  int32_t vocab = 4096;
  int32_t context = 2048;
  float rope_freq_base = 10000.0f;  ///< llama.rope.freq_base (Llama 3: 500000)
  GgmlType dtype = GgmlType::kF32;  ///< storage type of the 2-D weights (norms stay f32)
  uint64_t seed = 1;
  bool tied_output = false;  ///< omit output.weight (classifier tied to token_embd)
  std::string name = "kvpush-random-llama";
  /// A real byte-level BPE vocabulary (`--vocab-from tokenizer.json`) replacing the demo one;
  /// `vocab` is then ignored (the size is the vocabulary's). Not owned; may be null. The weights
  /// stay Llama-shaped (general.architecture = "llama") whatever family the vocabulary is from.
  const HfVocab* bpe_vocab = nullptr;

  /// Errors: kInvalidArgument naming the field (non-positive, dim % heads, heads % kv_heads,
  /// odd head_dim, vocab < 355 without bpe_vocab, q8_0 with dim or hidden_dim not a multiple
  /// of 32).
  Status Validate() const;
};

/// The demo vocabulary of `vocab_size` tokens (>= 355) described above.
Result<SpmVocab> BuildDemoVocab(int32_t vocab_size);

/// Builds the whole model into a writer (call Serialize() or WriteFile()).
Result<GgufWriter> BuildRandomLlamaGguf(const RandomLlamaOptions& options);

}  // namespace kvpush
