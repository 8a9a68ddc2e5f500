// LlamaWeights: the f32 weights of a Llama-family decoder, loaded from GGUF or llama2.c.
//
// Every matrix is row-major [out, in] (PyTorch nn.Linear layout; in GGUF terms ne = [in, out]),
// so y = W x is a dot product of x with each row. F16/BF16/Q8_0 tensors are dequantized to f32 at
// load time (memory and bandwidth are those of f32; the file's dtype is only a storage format).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "model/executor.h"

namespace kvpush {

class GgufFile;

/// Weights of one transformer block. Shapes with d = dim, q = num_heads * head_dim,
/// kv = num_kv_heads * head_dim, h = hidden_dim.
struct LlamaLayerWeights {
  std::vector<float> attn_norm;  ///< [d]
  std::vector<float> wq;         ///< [q, d]
  std::vector<float> wk;         ///< [kv, d]
  std::vector<float> wv;         ///< [kv, d]
  std::vector<float> wo;         ///< [d, q]
  std::vector<float> ffn_norm;   ///< [d]
  std::vector<float> w_gate;     ///< [h, d]  (llama2.c w1)
  std::vector<float> w_down;     ///< [d, h]  (llama2.c w2)
  std::vector<float> w_up;       ///< [h, d]  (llama2.c w3)
};

/// All weights plus the hyper-parameters. `output` is empty when the classifier is tied to
/// `token_embd`.
struct LlamaWeights {
  ModelConfig config;
  std::vector<float> token_embd;   ///< [vocab, d]
  std::vector<float> output_norm;  ///< [d]
  std::vector<float> output;       ///< [vocab, d] or empty (tied)
  std::vector<LlamaLayerWeights> layers;

  /// The classifier matrix: `output`, or `token_embd` when tied.
  const std::vector<float>& classifier() const { return output.empty() ? token_embd : output; }
  /// Total bytes of the f32 weights (what one decode step streams from memory).
  size_t weight_bytes() const;
  /// Sets config.fingerprint to an XXH3 hash of the hyper-parameters and all weights, so the same
  /// model loaded from GGUF or llama2.c gets the same fingerprint.
  void ComputeFingerprint();
};

/// Checks the hyper-parameters (positive, dim = heads * head_dim, heads divisible by kv_heads,
/// even rope_dim <= head_dim) and that every tensor has its expected size.
/// Errors: kDataLoss naming the field or tensor.
Status ValidateLlamaWeights(const LlamaWeights& w);

/// Reads a Llama-architecture GGUF: hyper-parameters from `llama.*` keys (defaults: head_count_kv
/// = head_count, rope.dimension_count = head_dim, rope.freq_base = 10000, rms eps = 1e-5), tensors
/// token_embd / output_norm / output (optional: tied) / blk.N.{attn_norm, attn_q, attn_k, attn_v,
/// attn_output, ffn_norm, ffn_gate, ffn_down, ffn_up}.weight. Errors: kUnimplemented
/// ("unsupported architecture 'qwen2'"), kDataLoss/kNotFound for missing or mis-shaped tensors.
Result<LlamaWeights> LoadLlamaWeightsFromGguf(const GgufFile& file);

}  // namespace kvpush
