// The `sim` executor's latency model (DESIGN.md §7): presets of large models and accelerators,
// and the roofline time of one engine step, layer by layer.
//
// Per layer, for a batch of chunks (chunk c computes n_c tokens at positions [s_c, s_c + n_c)):
//   linear FLOPs   F_lin  = 2 * P_layer * sum_c n_c
//       (P_layer = attention q/k/v/o + SwiGLU MLP weights of one layer:
//        dim*(H*d) + 2*dim*(Hkv*d) + (H*d)*dim + 3*dim*ffn)
//   linear bytes   B_lin  = P_layer * 2                      (bf16 weights, read once per step)
//   attention FLOPs F_att = sum_c 4 * H * d * (n_c * s_c + n_c * (n_c + 1) / 2)
//       (QK^T and AV, causal: query i of the chunk sees s_c + i + 1 keys)
//   attention bytes B_att = sum_c (s_c + n_c) * 2 * Hkv * d * 2   (K and V, bf16, read once)
//   t_layer = max((F_lin + F_att) / (peak_flops * compute_eff), (B_lin + B_att) / (hbm_bw * mem_eff))
// and once per step, for the sequences that want logits (LM head, n_l rows):
//   t_head = max(2 * dim * vocab * n_l / (peak_flops * compute_eff), dim * vocab * 2 / (hbm_bw * mem_eff))
// This is the standard roofline (Williams, Waterman, Patterson, CACM 2009) applied per layer, with
// the FLOP counts of Kaplan et al. 2020 (2 FLOPs per weight per token) and the causal attention
// term. It ignores kernel launch gaps, activations' traffic and communication (one GPU, TP=1).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace kvpush {

/// A model's shape as published in its config.json (sources in sim_model.cc).
struct SimModelSpec {
  std::string name;  ///< preset name, e.g. "qwen3-32b"
  int32_t num_layers = 0;
  int32_t dim = 0;         ///< hidden_size
  int32_t ffn_dim = 0;     ///< intermediate_size
  int32_t num_heads = 0;   ///< num_attention_heads
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t vocab_size = 0;
  int32_t context_length = 0;  ///< max_position_embeddings
  /// Weights of one decoder layer (attention + MLP), the P_layer of the formula.
  int64_t LayerParams() const;
  /// K+V bytes per token in bf16, all layers: num_layers * 2 * num_kv_heads * head_dim * 2.
  int64_t KvBytesPerToken() const;
};

/// An accelerator's dense bf16 peak and memory bandwidth (vendor datasheets, sim_model.cc).
struct SimHardware {
  std::string name;  ///< "h100-sxm", "h200"
  double peak_flops = 0;     ///< dense bf16 FLOP/s (no sparsity)
  double hbm_bytes_per_s = 0;
};

/// Efficiencies applied to the peaks (fractions in (0, 1]).
struct SimEfficiency {
  double compute = 0.65;  ///< achieved / peak FLOP/s of the step's GEMMs and attention
  double memory = 0.85;   ///< achieved / peak HBM bandwidth
};

/// Preset lookup by name (case-sensitive, as listed by SimModelNames / SimHardwareNames).
/// Errors: kNotFound naming the known presets.
Result<SimModelSpec> FindSimModel(const std::string& name);
Result<SimHardware> FindSimHardware(const std::string& name);
std::vector<std::string> SimModelNames();
std::vector<std::string> SimHardwareNames();

/// One chunk of a step as the cost model sees it: `n` tokens at positions [start, start + n).
struct SimChunk {
  int64_t start = 0;
  int64_t n = 0;
};

/// The roofline times of one engine step (seconds).
struct SimStepTime {
  double layer_s = 0;  ///< every layer takes the same time (same shapes)
  double head_s = 0;   ///< LM head, after the last layer
  double total_s = 0;  ///< num_layers * layer_s + head_s
};

/// Step time of `chunks` (with `num_logits` rows of LM head) per the formula above. Pure.
SimStepTime SimStepCost(const SimModelSpec& m, const SimHardware& hw, const SimEfficiency& eff,
                        std::span<const SimChunk> chunks, int64_t num_logits);

}  // namespace kvpush
