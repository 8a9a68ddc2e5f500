// Random GGUF models of the executor's architectures (for `kvpush gen-model`, benchmarks and
// tests): Llama 2 shaped ("llama", the default), Llama 3 ("llama3": general.architecture "llama"
// plus rope_freqs from Llama 3.1's RoPE scaling), Qwen2 ("qwen2": Q/K/V biases) and Qwen3
// ("qwen3": attn_q_norm / attn_k_norm, head_dim from attention.key_length).
//
// The weights are uniform random with the variance of a scaled init (std 1/sqrt(fan_in) for linear
// layers; norms are all ones for "llama", 1 +- 0.3 uniform for the others so that a norm weight
// applied wrongly shows in the logits), generated from a SplitMix64 stream, so a
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

/// Llama 3.1's RoPE frequency factors (HF rope_scaling "llama3": factor 8, low_freq_factor 1,
/// high_freq_factor 4, original_max_position_embeddings 8192), one per rotated pair i of a head
/// of `rope_dim` dims with base `theta`, as llama.cpp's converter writes them to rope_freqs:
/// 1 for wavelengths 2*pi/f_i < 8192/4, 8 beyond 8192/1, else 1 / ((1 - s) / 8 + s) with
/// s = (8192 / wavelength - 1) / (4 - 1). Returns [rope_dim / 2] factors.
std::vector<float> Llama31RopeFactors(int32_t rope_dim, float theta);

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
  /// "llama" (Llama 2 shaped), "llama3", "qwen2" or "qwen3" (see the file comment).
  std::string arch = "llama";
  int32_t head_dim = 0;             ///< 0 = dim / heads; else attention.key_length (any even value)
  float rope_freq_base = 10000.0f;  ///< A.rope.freq_base (Llama 3: 500000, Qwen: 1000000)
  GgmlType dtype = GgmlType::kF32;  ///< storage type of the 2-D weights (norms stay f32):
                                    ///< f32, f16, bf16, q8_0, q4_k or q6_k
  uint64_t seed = 1;
  bool tied_output = false;  ///< omit output.weight (classifier tied to token_embd)
  std::string name = "kvpush-random-llama";
  /// A real byte-level BPE vocabulary (`--vocab-from tokenizer.json`) replacing the demo one;
  /// `vocab` is then ignored (the size is the vocabulary's). Not owned; may be null.
  const HfVocab* bpe_vocab = nullptr;

  /// head_dim in effect: `head_dim`, or dim / heads when 0.
  int32_t effective_head_dim() const { return head_dim > 0 ? head_dim : dim / heads; }
  /// The GGUF general.architecture of `arch` ("llama" for "llama3").
  std::string gguf_arch() const { return arch == "llama3" ? "llama" : arch; }

  /// Errors: kInvalidArgument naming the field (unknown arch, non-positive, dim % heads without
  /// head_dim, heads % kv_heads, odd head_dim, vocab < 355 without bpe_vocab, q8_0 with dim,
  /// hidden_dim or heads * head_dim not a multiple of 32;
  /// q4_k / q6_k with any of them not a multiple of 256).
  Status Validate() const;
};

/// The demo vocabulary of `vocab_size` tokens (>= 355) described above.
Result<SpmVocab> BuildDemoVocab(int32_t vocab_size);

/// Builds the whole model into a writer (call Serialize() or WriteFile()).
Result<GgufWriter> BuildRandomLlamaGguf(const RandomLlamaOptions& options);

}  // namespace kvpush
