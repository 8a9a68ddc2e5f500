// LlamaWeights: the weights of a Llama-family decoder (GGUF architectures "llama" -- Llama 2 and
// Llama 3 --, "qwen2" and "qwen3"), loaded from GGUF or llama2.c.
//
// Every matrix is row-major [out, in] (PyTorch nn.Linear layout; in GGUF terms ne = [in, out]),
// so y = W x is a dot product of x with each row. Matrices stay in the type the file stores them
// in (F32, F16, BF16, Q8_0, Q4_K, Q6_K; WeightMatrix), used in place from the file mapping when the
// GGUF was opened from a path; the GEMM dequantizes them per tile. Norm weights, biases and
// rope_freqs (vectors) are converted to f32 at load.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "model/executor.h"
#include "model/weight_matrix.h"

namespace kvpush {

class GgufFile;

/// Weights of one transformer block. Shapes with d = dim, q = num_heads * head_dim,
/// kv = num_kv_heads * head_dim, h = hidden_dim, hd = head_dim. Optional tensors are empty when
/// the architecture has none.
struct LlamaLayerWeights {
  std::vector<float> attn_norm;  ///< [d]
  WeightMatrix wq;               ///< [q, d]
  WeightMatrix wk;               ///< [kv, d]
  WeightMatrix wv;               ///< [kv, d]
  std::vector<float> bq;         ///< [q] or empty (qwen2 attn_q.bias)
  std::vector<float> bk;         ///< [kv] or empty (qwen2 attn_k.bias)
  std::vector<float> bv;         ///< [kv] or empty (qwen2 attn_v.bias)
  std::vector<float> q_norm;     ///< [hd] or empty (qwen3 attn_q_norm: per-head RMSNorm of q)
  std::vector<float> k_norm;     ///< [hd] or empty (qwen3 attn_k_norm: per-head RMSNorm of k)
  WeightMatrix wo;               ///< [d, q]
  std::vector<float> ffn_norm;   ///< [d]
  WeightMatrix w_gate;           ///< [h, d]  (llama2.c w1)
  WeightMatrix w_down;           ///< [d, h]  (llama2.c w2)
  WeightMatrix w_up;             ///< [h, d]  (llama2.c w3)
};

/// All weights plus the hyper-parameters. `output` is empty when the classifier is tied to
/// `token_embd`.
struct LlamaWeights {
  ModelConfig config;
  WeightMatrix token_embd;         ///< [vocab, d]
  std::vector<float> output_norm;  ///< [d]
  WeightMatrix output;             ///< [vocab, d] or empty (tied)
  /// [rope_dim / 2] or empty: RoPE frequency factors (GGUF rope_freqs.weight, Llama 3.1+); pair
  /// i rotates by pos * theta^(-2i / rope_dim) / rope_freqs[i], as llama.cpp's ggml_rope_ext.
  std::vector<float> rope_freqs;
  std::vector<LlamaLayerWeights> layers;

  /// The classifier matrix: `output`, or `token_embd` when tied.
  const WeightMatrix& classifier() const { return output.empty() ? token_embd : output; }
  /// Total bytes of the weights in their stored types (what one decode step streams from
  /// memory: every matrix once, plus the f32 vectors).
  size_t weight_bytes() const;
  /// Sets config.fingerprint to an XXH3 hash of the hyper-parameters and all weights' f32 values
  /// (matrices dequantized row by row), so the same model loaded from GGUF or llama2.c gets the
  /// same fingerprint, and a quantized file the fingerprint of its dequantized values.
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
/// Matrices keep their stored type; when `file` owns a mapping (GgufFile::Open) they borrow its
/// bytes and keep it alive, else (GgufFile::Parse of a caller's buffer) they are copied.
/// Errors: kUnimplemented ("unsupported architecture 'gpt2'", RoPE scaling), kDataLoss/kNotFound
/// for missing, out-of-range or mis-shaped keys and tensors.
Result<LlamaWeights> LoadLlamaWeightsFromGguf(const GgufFile& file);

}  // namespace kvpush
