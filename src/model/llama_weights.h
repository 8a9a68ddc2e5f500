// LlamaWeights: the f32 weights of a Llama-family decoder (GGUF architectures "llama" -- Llama 2
// and Llama 3 --, "qwen2" and "qwen3"), loaded from GGUF or llama2.c.
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
/// kv = num_kv_heads * head_dim, h = hidden_dim, hd = head_dim. Optional tensors are empty when
/// the architecture has none.
struct LlamaLayerWeights {
  std::vector<float> attn_norm;  ///< [d]
  std::vector<float> wq;         ///< [q, d]
  std::vector<float> wk;         ///< [kv, d]
  std::vector<float> wv;         ///< [kv, d]
  std::vector<float> bq;         ///< [q] or empty (qwen2 attn_q.bias)
  std::vector<float> bk;         ///< [kv] or empty (qwen2 attn_k.bias)
  std::vector<float> bv;         ///< [kv] or empty (qwen2 attn_v.bias)
  std::vector<float> q_norm;     ///< [hd] or empty (qwen3 attn_q_norm: per-head RMSNorm of q)
  std::vector<float> k_norm;     ///< [hd] or empty (qwen3 attn_k_norm: per-head RMSNorm of k)
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
  /// [rope_dim / 2] or empty: RoPE frequency factors (GGUF rope_freqs.weight, Llama 3.1+); pair
  /// i rotates by pos * theta^(-2i / rope_dim) / rope_freqs[i], as llama.cpp's ggml_rope_ext.
  std::vector<float> rope_freqs;
  std::vector<LlamaLayerWeights> layers;

  /// The classifier matrix: `output`, or `token_embd` when tied.
  const std::vector<float>& classifier() const { return output.empty() ? token_embd : output; }
  /// Total bytes of the f32 weights (what one decode step streams from memory).
  size_t weight_bytes() const;
  /// Sets config.fingerprint to an XXH3 hash of the hyper-parameters and all weights, so the same
  /// model loaded from GGUF or llama2.c gets the same fingerprint.
  void ComputeFingerprint();
};

/// Checks the hyper-parameters (positive, heads divisible by kv_heads, even rope_dim <= head_dim)
/// and that every tensor, optional ones included when present, has its expected size; the
/// optional tensors of a kind (biases, q/k norms) must be present in every layer or in none.
/// Errors: kDataLoss naming the field or tensor.
Status ValidateLlamaWeights(const LlamaWeights& w);

/// Reads a GGUF of architecture (general.architecture) A = "llama", "qwen2" or "qwen3", with
/// llama.cpp's key and tensor names. Hyper-parameters from `A.*` keys: embedding_length,
/// feed_forward_length, block_count, attention.head_count, and with defaults
/// attention.head_count_kv (= head_count), context_length (2048), attention.key_length /
/// value_length (= embedding_length / head_count; they set head_dim and must be equal),
/// rope.dimension_count (= head_dim), rope.freq_base (10000), attention.layer_norm_rms_epsilon
/// (1e-5); rope.scaling.type must be absent or "none". Tensors: token_embd, output_norm, output
/// (optional: tied to token_embd), rope_freqs (optional, llama only), blk.N.{attn_norm, attn_q,
/// attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_down, ffn_up}.weight, plus
/// blk.N.attn_{q,k,v}.bias (qwen2) and blk.N.attn_{q,k}_norm.weight (qwen3). RoPE: kNormal for
/// llama, kNeox for qwen2/qwen3 (llama.cpp llama_model_rope_type).
/// Errors: kUnimplemented ("unsupported architecture 'gpt2'", RoPE scaling), kDataLoss/kNotFound
/// for missing, out-of-range or mis-shaped keys and tensors.
Result<LlamaWeights> LoadLlamaWeightsFromGguf(const GgufFile& file);

}  // namespace kvpush
