#include "model/llama_executor.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "model/gemm_kernels.h"

namespace kvpush {

namespace {

/// Dot product with eight interleaved partial sums combined in a fixed tree. The order depends only
/// on n, so equal inputs give equal bits wherever this is called from (and it vectorises).
inline float Dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  for (int j = 0; i < n; ++i, ++j) acc[j] += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/// out[i] = w[i] * (x[i] / sqrt(mean(x^2) + eps)), as llama2.c rmsnorm.
inline void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* out) {
  float ss = Dot(x, x, n) / static_cast<float>(n) + eps;
  ss = 1.0f / std::sqrt(ss);
  for (int64_t i = 0; i < n; ++i) out[i] = w[i] * (ss * x[i]);
}

}  // namespace

LlamaExecutor::LlamaExecutor(LlamaWeights weights, const LlamaExecutorOptions& options)
    : weights_(std::move(weights)), gemm_(options.gemm, options.quant_math) {
  if (options.threads > 1) {
    pool_ = std::make_unique<WorkerPool>(options.threads, options.cpus);
    gemm_.set_pool(pool_.get());
  }
  namespace gi = gemm_internal;
  attn_scores_ = gi::AttnScoresScalar;
  attn_values_group_ = gi::AttnValuesGroupScalar;
  attn_softmax_ = gi::AttnSoftmaxScalar;
  const int isa = options.gemm == GemmBackend::kFixedOrderScalar ? 0 : gi::FixedOrderIsa();
  if (isa == 2) {
    attn_scores_ = gi::AttnScoresAvx512;
    attn_values_group_ = gi::AttnValuesGroupAvx512;
    attn_softmax_ = gi::AttnSoftmaxAvx512;
  } else if (isa == 1) {
    attn_scores_ = gi::AttnScoresAvx2;
    attn_values_group_ = gi::AttnValuesGroupAvx2;
    attn_softmax_ = gi::AttnSoftmaxAvx2;
  }
}

Result<std::unique_ptr<LlamaExecutor>> LlamaExecutor::Create(LlamaWeights weights,
                                                             const LlamaExecutorOptions& options) {
  KVP_RETURN_IF_ERROR(ValidateLlamaWeights(weights));
  if (options.threads < 1 || options.threads > 256) {
    return InvalidArgument("threads must be 1..256, got " + std::to_string(options.threads));
  }
  if (options.max_context > 0) {
    weights.config.context_length = std::min(weights.config.context_length, options.max_context);
  }
  SetBlasThreads(options.blas_threads);
  std::unique_ptr<LlamaExecutor> ex(new LlamaExecutor(std::move(weights), options));
  const ModelConfig& c = ex->weights_.config;
  // RoPE frequencies in float as llama2.c: freq_i = 1 / theta^(2i / rope_dim). The angles
  // pos * freq_i are computed per step for the rows in the batch (no context-sized table, so a
  // file declaring a huge context cannot make us allocate for it).
  // Llama 3.1+ frequency factors divide each pair's frequency (llama.cpp ggml_rope_ext: theta /
  // freq_factors[i]); a factor must be positive.
  const int32_t pairs = c.rope_dim / 2;
  const std::vector<float>& factors = ex->weights_.rope_freqs;
  ex->rope_freq_.resize(static_cast<size_t>(pairs));
  for (int32_t i = 0; i < pairs; ++i) {
    float f =
        1.0f / std::pow(c.rope_theta, static_cast<float>(2 * i) / static_cast<float>(c.rope_dim));
    if (!factors.empty()) {
      const float ff = factors[static_cast<size_t>(i)];
      if (!(ff > 0.0f) || !std::isfinite(ff)) {
        return DataLoss("rope_freqs[" + std::to_string(i) + "] = " + std::to_string(ff) +
                        " is not a positive factor");
      }
      f /= ff;
    }
    ex->rope_freq_[static_cast<size_t>(i)] = f;
  }
  return ex;
}

Status LlamaExecutor::Validate(std::span<const SequenceChunk> batch, const KvCache& kv,
                               std::span<float> logits, int64_t* total_tokens,
                               int64_t* logit_rows) const {
  const ModelConfig& c = weights_.config;
  const KvLayout& lay = kv.layout();
  if (lay.num_layers != c.num_layers || lay.num_kv_heads != c.num_kv_heads ||
      lay.head_dim != c.head_dim || lay.dtype != KvDtype::kF32) {
    return InvalidArgument("KV cache layout (" + lay.ToString() + ") does not match the model (" +
                           std::to_string(c.num_layers) + " layers, " +
                           std::to_string(c.num_kv_heads) + " kv heads, head_dim " +
                           std::to_string(c.head_dim) + ", f32)");
  }
  int64_t tokens = 0, rows = 0;
  for (const SequenceChunk& ch : batch) {
    const std::string who = "sequence " + std::to_string(ch.seq_id) + ": ";
    if (ch.tokens.empty()) return InvalidArgument(who + "empty chunk");
    if (ch.start_pos < 0) return InvalidArgument(who + "negative start_pos");
    const int64_t end = int64_t{ch.start_pos} + static_cast<int64_t>(ch.tokens.size());
    if (end > c.context_length) {
      return InvalidArgument(who + "position " + std::to_string(end - 1) +
                             " is beyond the context length " + std::to_string(c.context_length));
    }
    for (int32_t t : ch.tokens) {
      if (t < 0 || t >= c.vocab_size) {
        return InvalidArgument(who + "token id " + std::to_string(t) + " outside the vocabulary");
      }
    }
    const int64_t need_blocks = (end + lay.block_size - 1) / lay.block_size;
    if (static_cast<int64_t>(ch.block_table.size()) < need_blocks) {
      return InvalidArgument(who + "block table has " + std::to_string(ch.block_table.size()) +
                             " blocks, positions up to " + std::to_string(end) + " need " +
                             std::to_string(need_blocks));
    }
    for (int64_t b = 0; b < need_blocks; ++b) {
      const BlockId id = ch.block_table[static_cast<size_t>(b)];
      if (id < 0 || id >= lay.num_blocks) {
        return InvalidArgument(who + "block id " + std::to_string(id) + " out of range");
      }
    }
    tokens += static_cast<int64_t>(ch.tokens.size());
    rows += ch.logit_rows();
  }
  if (static_cast<int64_t>(logits.size()) < rows * c.vocab_size) {
    return InvalidArgument("logits span holds " + std::to_string(logits.size()) + " floats, need " +
                           std::to_string(rows * c.vocab_size));
  }
  *total_tokens = tokens;
  *logit_rows = rows;
  return Status::Ok();
}

void LlamaExecutor::Attention(int32_t layer, std::span<const SequenceChunk> batch, KvCache& kv) {
  // (token, KV head) items are independent and each is computed alone in a fixed order, so they
  // are split over the pool's threads without changing a bit.
  std::vector<std::pair<const SequenceChunk*, int32_t>>& rows = attn_rows_;
  rows.clear();
  for (const SequenceChunk& ch : batch) {
    for (size_t t = 0; t < ch.tokens.size(); ++t) {
      rows.emplace_back(&ch, ch.start_pos + static_cast<int32_t>(t));
    }
  }
  // One item per (token, KV head): the query heads that share a KV head run together.
  const int64_t heads = weights_.config.num_kv_heads;
  const int64_t items = static_cast<int64_t>(rows.size()) * heads;
  const int parts =
      pool_ != nullptr ? static_cast<int>(std::min<int64_t>(pool_->threads(), items)) : 1;
  const size_t stride = scores_.size() / static_cast<size_t>(std::max(1, scores_parts_));
  // Items are dealt round-robin: a prompt's later tokens attend to more positions, so contiguous
  // ranges left the thread with the last tokens about three quarters of a prefill's attention.
  auto part = [&](int p) {
    float* scores = scores_.data() + static_cast<size_t>(p) * stride;
    for (int64_t i = p; i < items; i += parts) {
      const auto& [ch, pos] = rows[static_cast<size_t>(i / heads)];
      AttentionGroup(layer, *ch, pos, i / heads, i % heads, kv, scores);
    }
  };
  if (parts <= 1) {
    part(0);
  } else {
    pool_->Run(parts, part);
  }
}

void LlamaExecutor::AttentionWeights(int32_t layer, const SequenceChunk& ch, int32_t pos,
                                     int64_t row, int64_t h, const KvCache& kv, float* weights) {
  const ModelConfig& c = weights_.config;
  const int64_t hd = c.head_dim, nkv = c.num_kv_heads, qdim = int64_t{c.num_heads} * hd;
  const int64_t kvh = h / (c.num_heads / c.num_kv_heads);
  const int32_t bs = kv.layout().block_size;
  const float inv_sqrt = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* q = q_.data() + row * qdim + h * hd;
  // Scores over positions [0, pos], block by block through the block table.
  for (int32_t p = 0; p <= pos; p += bs) {
    const float* kb =
        kv.chunk_f32(layer, KvKind::kKey, ch.block_table[static_cast<size_t>(p / bs)]);
    const int32_t n = std::min(bs, pos + 1 - p);
    attn_scores_(q, kb + kvh * hd, nkv * hd, n, hd, inv_sqrt, weights + p);
  }
  attn_softmax_(weights, pos + 1);
}

void LlamaExecutor::AttentionGroup(int32_t layer, const SequenceChunk& ch, int32_t pos, int64_t row,
                                   int64_t kvh, const KvCache& kv, float* scores) {
  const ModelConfig& c = weights_.config;
  const int64_t hd = c.head_dim, nkv = c.num_kv_heads, qdim = int64_t{c.num_heads} * hd;
  const int64_t group = c.num_heads / c.num_kv_heads;
  const int32_t bs = kv.layout().block_size;
  std::array<const float*, kMaxGroup> a{};
  std::array<float*, kMaxGroup> out{};
  for (int64_t g0 = 0; g0 < group; g0 += kMaxGroup) {
    const int64_t heads = std::min<int64_t>(kMaxGroup, group - g0);
    for (int64_t g = 0; g < heads; ++g) {
      const int64_t h = kvh * group + g0 + g;
      float* weights = scores + g * (pos + 1);
      AttentionWeights(layer, ch, pos, row, h, kv, weights);
      out[static_cast<size_t>(g)] = att_.data() + row * qdim + h * hd;
      std::fill(out[static_cast<size_t>(g)], out[static_cast<size_t>(g)] + hd, 0.0f);
    }
    // The heads share the V rows: their accumulations run side by side, each in position order.
    for (int32_t p = 0; p <= pos; p += bs) {
      const float* vb =
          kv.chunk_f32(layer, KvKind::kValue, ch.block_table[static_cast<size_t>(p / bs)]);
      const int32_t n = std::min(bs, pos + 1 - p);
      for (int64_t g = 0; g < heads; ++g) a[static_cast<size_t>(g)] = scores + g * (pos + 1) + p;
      attn_values_group_(a.data(), heads, vb + kvh * hd, nkv * hd, n, hd, out.data());
    }
  }
}

void LlamaExecutor::Embed(std::span<const SequenceChunk> batch) {
  const ModelConfig& c = weights_.config;
  const int64_t d = c.dim;
  const int32_t pairs = c.rope_dim / 2;
  int64_t row = 0;
  for (const SequenceChunk& ch : batch) {
    for (size_t t = 0; t < ch.tokens.size(); ++t, ++row) {
      const int32_t pos = ch.start_pos + static_cast<int32_t>(t);
      for (int32_t i = 0; i < pairs; ++i) {
        const float angle = static_cast<float>(pos) * rope_freq_[static_cast<size_t>(i)];
        rope_cos_[static_cast<size_t>(row * pairs + i)] = std::cos(angle);
        rope_sin_[static_cast<size_t>(row * pairs + i)] = std::sin(angle);
      }
      // One embedding row, dequantized from its stored type.
      weights_.token_embd.DequantizeRows(ch.tokens[t], 1, x_.data() + row * d);
    }
  }
}

void LlamaExecutor::Project(const LlamaLayerWeights& w, int64_t n_tok) {
  const ModelConfig& c = weights_.config;
  const int64_t d = c.dim, hd = c.head_dim, qdim = int64_t{c.num_heads} * hd;
  const int64_t kvdim = int64_t{c.num_kv_heads} * hd;
  const int32_t pairs = c.rope_dim / 2;
  for (int64_t r = 0; r < n_tok; ++r) {
    RmsNorm(x_.data() + r * d, w.attn_norm.data(), d, c.rms_eps, xn_.data() + r * d);
  }
  gemm_.Run(xn_.data(), n_tok, w.wq, q_.data());
  gemm_.Run(xn_.data(), n_tok, w.wk, k_.data());
  gemm_.Run(xn_.data(), n_tok, w.wv, v_.data());
  auto add_bias = [n_tok](float* y, const std::vector<float>& b, int64_t width) {
    if (b.empty()) return;
    for (int64_t r = 0; r < n_tok; ++r) {
      for (int64_t i = 0; i < width; ++i) y[r * width + i] += b[static_cast<size_t>(i)];
    }
  };
  add_bias(q_.data(), w.bq, qdim);  // qwen2
  add_bias(k_.data(), w.bk, kvdim);
  add_bias(v_.data(), w.bv, kvdim);
  // Per head: optional RMSNorm over head_dim (qwen3, llama.cpp build_qwen3: attn_q_norm /
  // attn_k_norm with the model's rms eps), then RoPE on the first rope_dim dims, pairing
  // (2i, 2i+1) (kNormal) or (i, i + rope_dim/2) (kNeox).
  const bool neox = c.rope_style == RopeStyle::kNeox;
  for (int64_t r = 0; r < n_tok; ++r) {
    const float* cs = rope_cos_.data() + r * pairs;
    const float* sn = rope_sin_.data() + r * pairs;
    auto per_head = [&](float* vec, int64_t heads, const std::vector<float>& norm) {
      for (int64_t h = 0; h < heads; ++h) {
        float* p = vec + h * hd;
        if (!norm.empty()) RmsNorm(p, norm.data(), hd, c.rms_eps, p);
        for (int32_t i = 0; i < pairs; ++i) {
          const int32_t i0 = neox ? i : 2 * i, i1 = neox ? i + pairs : 2 * i + 1;
          const float a = p[i0], b = p[i1];
          p[i0] = a * cs[i] - b * sn[i];
          p[i1] = a * sn[i] + b * cs[i];
        }
      }
    };
    per_head(q_.data() + r * qdim, c.num_heads, w.q_norm);
    per_head(k_.data() + r * kvdim, c.num_kv_heads, w.k_norm);
  }
}

void LlamaExecutor::StoreKv(int32_t layer, std::span<const SequenceChunk> batch, KvCache& kv) {
  const ModelConfig& c = weights_.config;
  const int64_t kvdim = int64_t{c.num_kv_heads} * c.head_dim;
  const int32_t bs = kv.layout().block_size;
  int64_t row = 0;
  for (const SequenceChunk& ch : batch) {
    for (size_t t = 0; t < ch.tokens.size(); ++t, ++row) {
      const int32_t pos = ch.start_pos + static_cast<int32_t>(t);
      const BlockId blk = ch.block_table[static_cast<size_t>(pos / bs)];
      const int64_t slot = int64_t{pos % bs} * kvdim;
      std::memcpy(kv.chunk_f32(layer, KvKind::kKey, blk) + slot, k_.data() + row * kvdim,
                  static_cast<size_t>(kvdim) * sizeof(float));
      std::memcpy(kv.chunk_f32(layer, KvKind::kValue, blk) + slot, v_.data() + row * kvdim,
                  static_cast<size_t>(kvdim) * sizeof(float));
    }
  }
}

void LlamaExecutor::FeedForward(const LlamaLayerWeights& w, int64_t n_tok) {
  const ModelConfig& c = weights_.config;
  const int64_t d = c.dim, hid = c.hidden_dim;
  for (int64_t r = 0; r < n_tok; ++r) {
    RmsNorm(x_.data() + r * d, w.ffn_norm.data(), d, c.rms_eps, xn_.data() + r * d);
  }
  gemm_.Run(xn_.data(), n_tok, w.w_gate, gate_.data());
  gemm_.Run(xn_.data(), n_tok, w.w_up, up_.data());
  for (int64_t i = 0; i < n_tok * hid; ++i) {
    float g = gate_[static_cast<size_t>(i)];
    g *= 1.0f / (1.0f + std::exp(-g));
    gate_[static_cast<size_t>(i)] = g * up_[static_cast<size_t>(i)];
  }
  gemm_.Run(gate_.data(), n_tok, w.w_down, xn_.data());
  for (int64_t i = 0; i < n_tok * d; ++i) x_[static_cast<size_t>(i)] += xn_[static_cast<size_t>(i)];
}

Status LlamaExecutor::Execute(std::span<const SequenceChunk> batch, KvCache& kv,
                              std::span<float> logits, LayerObserver* observer) {
  int64_t n_tok = 0, n_logits = 0;
  KVP_RETURN_IF_ERROR(Validate(batch, kv, logits, &n_tok, &n_logits));
  if (n_tok == 0) return Status::Ok();
  const ModelConfig& c = weights_.config;
  const int64_t d = c.dim, hd = c.head_dim, qdim = int64_t{c.num_heads} * hd;
  const int64_t kvdim = int64_t{c.num_kv_heads} * hd, hid = c.hidden_dim;
  const int32_t pairs = c.rope_dim / 2;
  auto grow = [](std::vector<float>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  };
  grow(x_, n_tok * d);
  grow(xn_, n_tok * std::max(d, qdim));
  grow(q_, n_tok * qdim);
  grow(k_, n_tok * kvdim);
  grow(v_, n_tok * kvdim);
  grow(att_, n_tok * qdim);
  grow(gate_, n_tok * hid);
  grow(up_, n_tok * hid);
  grow(rope_cos_, n_tok * pairs);
  grow(rope_sin_, n_tok * pairs);
  int64_t max_pos = 0;
  for (const SequenceChunk& ch : batch) {
    max_pos = std::max<int64_t>(max_pos, ch.start_pos + static_cast<int64_t>(ch.tokens.size()) - 1);
  }
  scores_parts_ = pool_ != nullptr ? pool_->threads() : 1;
  grow(scores_, static_cast<int64_t>(max_pos + 1) * kMaxGroup * scores_parts_);
  Embed(batch);

  for (int32_t l = 0; l < c.num_layers; ++l) {
    const LlamaLayerWeights& w = weights_.layers[static_cast<size_t>(l)];
    Project(w, n_tok);
    // Write the new K/V into their cache slots before attending (the chunk attends to itself
    // through the cache, exactly as a later chunk will).
    StoreKv(l, batch, kv);
    // This layer's K/V of the whole batch is final: let the push connector start its WRITEs
    // while the rest of the layer (attention, FFN) is computed.
    if (observer != nullptr) observer->OnLayerDone(l);
    Attention(l, batch, kv);
    gemm_.Run(att_.data(), n_tok, w.wo, xn_.data());
    for (int64_t i = 0; i < n_tok * d; ++i)
      x_[static_cast<size_t>(i)] += xn_[static_cast<size_t>(i)];
    FeedForward(w, n_tok);
  }

  if (n_logits == 0) return Status::Ok();
  // Final norm of the rows that want logits (the last row of a chunk with want_logits, every row
  // of one with all_logits), then the classifier.
  int64_t row = 0, out_row = 0;
  for (const SequenceChunk& ch : batch) {
    const auto n = static_cast<int64_t>(ch.tokens.size());
    const int64_t rows = ch.logit_rows();
    for (int64_t r = n - rows; r < n; ++r) {
      RmsNorm(x_.data() + (row + r) * d, weights_.output_norm.data(), d, c.rms_eps,
              xn_.data() + out_row * d);
      ++out_row;
    }
    row += n;
  }
  gemm_.Run(xn_.data(), n_logits, weights_.classifier(), logits.data());
  return Status::Ok();
}

}  // namespace kvpush
