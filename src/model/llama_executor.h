// LlamaExecutor: the Llama-family decoder on CPU over the paged KV cache: GGUF architectures
// "llama" (Llama 2, Llama 3 with rope_freqs), "qwen2" and "qwen3" (docs/model.md).
//
// Per step (Execute): embeddings for every token of every chunk, then per layer
//   xn = RMSNorm(x) * attn_norm;  q, k, v = xn Wq^T, xn Wk^T, xn Wv^T   (all rows in one GEMM)
//   q, k, v += bq, bk, bv when the model has biases (qwen2);
//   per head q = RMSNorm(q) * q_norm, k = RMSNorm(k) * k_norm when it has them (qwen3);
//   RoPE on q and k at each row's position: adjacent pairs (llama2.c / llama.cpp "normal",
//   llama) or halves (llama.cpp "neox" / HF rotate_half, qwen2 and qwen3), frequencies
//   theta^(-2i / rope_dim), divided by rope_freqs[i] when present (Llama 3.1);
//   k, v written into the KV cache slots given by the sequence's block table;
//   observer->OnLayerDone(layer) (this layer's K/V is final; the push connector may send it now);
//   attention per sequence, token and head over positions [0, pos] read from the cache (GQA:
//   query head h uses KV head h / (num_heads / num_kv_heads)); causal by construction;
//   x += attn Wo^T;  xn = RMSNorm(x) * ffn_norm;  x += (silu(xn Wg^T) * (xn Wu^T)) Wd^T.
// Then RMSNorm(x) * output_norm and the classifier for the last token of each chunk that wants
// logits. Formulas: Touvron et al. 2023 (Llama 2), as in llama2.c run.c; Qwen2 / Qwen3 and
// Llama 3 as HF transformers' modeling_qwen2 / modeling_qwen3 / modeling_llama and llama.cpp.
// q has num_heads * head_dim columns, which may differ from dim (Qwen3); the attention scale is
// 1 / sqrt(head_dim).
//
// Weights stay in their stored type (F32, F16, BF16, Q8_0, Q4_K, Q6_K): InvariantGemm dequantizes
// them per tile, the embedding lookup per row (model/weight_matrix.h); Q8_0 matrices are by default
// multiplied with int8 activations and integer dot products instead (QuantMath, model/gemm.h).
// Batch invariance: GEMMs go through InvariantGemm (fixed summation order); RMSNorm, RoPE,
// attention and softmax are per-row loops with a fixed summation order that depends only on the
// row's own data and position. A sequence's logits are therefore bit-identical whatever else is in
// the batch and however its prompt is chunked (tests/model/batch_invariance_test.cc).
// Threading: the GEMMs of the fixed-order backends are split by output columns over
// LlamaExecutorOptions::threads threads (a WorkerPool; the calling thread takes part); everything
// else runs on the calling (engine) thread (see docs/model.md). With the kOpenBlasTiles backend
// OpenBLAS gets LlamaExecutorOptions::blas_threads threads instead.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "model/attention_kernels.h"
#include "model/executor.h"
#include "model/gemm.h"
#include "model/llama_weights.h"
#include "model/worker_pool.h"

namespace kvpush {

struct LlamaExecutorOptions {
  int32_t max_context = 0;   ///< 0 = the model's context length; else min(model, this)
  int32_t blas_threads = 1;  ///< OpenBLAS threads (process-global; used by kOpenBlasTiles only)
  GemmBackend gemm = GemmBackend::kFixedOrder;  ///< linear-layer kernel (model/gemm.h)
  QuantMath quant_math = QuantMath::kInt8;      ///< Q8_0 / Q4_K / Q6_K arithmetic (model/gemm.h)
  /// Threads for the linear layers (the calling thread included; 1 = no workers): each GEMM's
  /// output columns are split over them. Logits are bit-identical for every value.
  int32_t threads = 1;
  /// Empty, or one CPU per thread to bind them to (ResolveThreadsBind, model/worker_pool.h).
  std::vector<int> cpus;
};

class LlamaExecutor final : public Executor {
 public:
  /// Takes the weights. Errors: kDataLoss (weights inconsistent with their config).
  static Result<std::unique_ptr<LlamaExecutor>> Create(LlamaWeights weights,
                                                       const LlamaExecutorOptions& options = {});

  const ModelConfig& config() const override { return weights_.config; }
  const LlamaWeights& weights() const { return weights_; }
  /// The GEMM kernels in use, e.g. "fixed-order avx512; q8_0 int8 avx512-vnni".
  std::string gemm_name() const { return gemm_.name(); }

  /// See Executor::Execute. The KV cache layout must match the model (num_layers, num_kv_heads,
  /// head_dim, KvDtype::kF32), else kInvalidArgument. Scratch memory grows to the largest batch
  /// seen and is reused.
  Status Execute(std::span<const SequenceChunk> batch, KvCache& kv, std::span<float> logits,
                 LayerObserver* observer) override;

 private:
  LlamaExecutor(LlamaWeights weights, const LlamaExecutorOptions& options);
  Status Validate(std::span<const SequenceChunk> batch, const KvCache& kv, std::span<float> logits,
                  int64_t* total_tokens, int64_t* logit_rows) const;
  /// Per-row RoPE cos/sin and the token embeddings into x_.
  void Embed(std::span<const SequenceChunk> batch);
  /// xn_ = attn-normed x_; q_, k_, v_ projected, biased, q/k-normed and rotated.
  void Project(const LlamaLayerWeights& w, int64_t n_tok);
  /// Copies k_ and v_ into each row's cache slot of `layer`.
  void StoreKv(int32_t layer, std::span<const SequenceChunk> batch, KvCache& kv);
  /// Attention of every (token, KV head) of the step, split over the pool's threads.
  void Attention(int32_t layer, std::span<const SequenceChunk> batch, KvCache& kv);
  /// Softmax weights of head h of the token at `pos` (row `row` of q_) over positions
  /// [0, pos], into `weights` (pos + 1 floats).
  void AttentionWeights(int32_t layer, const SequenceChunk& ch, int32_t pos, int64_t row, int64_t h,
                        const KvCache& kv, float* weights);
  /// The query heads of KV head `kvh` of the token at `pos` (row `row` of q_ / att_), at most
  /// kMaxGroup at a time; `scores` holds kMaxGroup * (pos + 1) floats.
  void AttentionGroup(int32_t layer, const SequenceChunk& ch, int32_t pos, int64_t row, int64_t kvh,
                      const KvCache& kv, float* scores);
  /// x_ += SwiGLU FFN of RMSNorm(x_) * ffn_norm.
  void FeedForward(const LlamaLayerWeights& w, int64_t n_tok);

  LlamaWeights weights_;
  std::vector<float> rope_freq_;  ///< [rope_dim / 2]: theta^(-2i / rope_dim) / rope_freqs[i]
  std::vector<float> rope_cos_, rope_sin_;  ///< per step: [tokens, rope_dim / 2]
  std::unique_ptr<WorkerPool> pool_;        ///< null with threads = 1
  InvariantGemm gemm_;
  /// Attention's inner loops (model/attention_kernels.h): the best ISA, or the scalar reference
  /// with GemmBackend::kFixedOrderScalar. Every version gives the same bits.
  gemm_internal::AttnScoresFn attn_scores_ = nullptr;
  gemm_internal::AttnValuesGroupFn attn_values_group_ = nullptr;
  gemm_internal::AttnSoftmaxFn attn_softmax_ = nullptr;
  /// Query heads of one KV head whose attention runs together (more are done in turns).
  static constexpr int64_t kMaxGroup = 8;
  // Scratch, [tokens, width] row-major.
  std::vector<float> x_, xn_, q_, k_, v_, att_, gate_, up_;
  std::vector<float> scores_;  ///< attention scores: scores_parts_ equal slices, one per thread
  int scores_parts_ = 1;
  std::vector<std::pair<const SequenceChunk*, int32_t>> attn_rows_;  ///< per row: chunk, position
};

}  // namespace kvpush
