#include "model/sim_model.h"

#include <algorithm>

namespace kvpush {

namespace {

// Shapes from each model's config.json on Hugging Face (hidden_size, intermediate_size,
// num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, vocab_size,
// max_position_embeddings): Qwen/Qwen3-32B, meta-llama/Llama-3.1-8B, meta-llama/Llama-3.1-70B.
const SimModelSpec kModels[] = {
    {"qwen3-32b", 64, 5120, 25600, 64, 8, 128, 151936, 40960},
    {"llama-3.1-8b", 32, 4096, 14336, 32, 8, 128, 128256, 131072},
    {"llama-3.1-70b", 80, 8192, 28672, 64, 8, 128, 128256, 131072},
};

// Dense (no sparsity) BF16 tensor-core peaks and HBM bandwidth from NVIDIA's datasheets: H100 SXM5
// 989 TFLOP/s, 3.35 TB/s (HBM3); H200 SXM 989 TFLOP/s, 4.8 TB/s (HBM3e).
const SimHardware kHardware[] = {
    {"h100-sxm", 989e12, 3.35e12},
    {"h200", 989e12, 4.8e12},
};

template <typename T, size_t N>
std::vector<std::string> Names(const T (&table)[N]) {
  std::vector<std::string> out;
  for (const T& t : table) out.push_back(t.name);
  return out;
}

template <typename T, size_t N>
Result<T> Find(const T (&table)[N], const std::string& name, const char* what) {
  for (const T& t : table) {
    if (t.name == name) return t;
  }
  std::string known;
  for (const T& t : table) known += (known.empty() ? "" : ", ") + t.name;
  return NotFound(std::string("unknown sim ") + what + " '" + name + "' (known: " + known + ")");
}

}  // namespace

int64_t SimModelSpec::LayerParams() const {
  const int64_t q = static_cast<int64_t>(num_heads) * head_dim;
  const int64_t kv = static_cast<int64_t>(num_kv_heads) * head_dim;
  return int64_t{dim} * q + 2 * int64_t{dim} * kv + q * dim + 3 * int64_t{dim} * ffn_dim;
}

int64_t SimModelSpec::KvBytesPerToken() const {
  return int64_t{num_layers} * 2 * num_kv_heads * head_dim * 2;
}

Result<SimModelSpec> FindSimModel(const std::string& name) {
  return Find(kModels, name, "model");
}

Result<SimHardware> FindSimHardware(const std::string& name) {
  return Find(kHardware, name, "hardware");
}

std::vector<std::string> SimModelNames() {
  return Names(kModels);
}

std::vector<std::string> SimHardwareNames() {
  return Names(kHardware);
}

SimStepTime SimStepCost(const SimModelSpec& m, const SimHardware& hw, const SimEfficiency& eff,
                        std::span<const SimChunk> chunks, int64_t num_logits) {
  const double flops_rate = hw.peak_flops * eff.compute;
  const double byte_rate = hw.hbm_bytes_per_s * eff.memory;
  const double p_layer = static_cast<double>(m.LayerParams());
  const double hd = static_cast<double>(m.num_heads) * m.head_dim;
  const double kv_token_bytes = 2.0 * m.num_kv_heads * m.head_dim * 2.0;
  double tokens = 0, att_flops = 0, att_bytes = 0;
  for (const SimChunk& c : chunks) {
    const double n = static_cast<double>(c.n);
    const double s = static_cast<double>(c.start);
    tokens += n;
    att_flops += 4.0 * hd * (n * s + n * (n + 1) / 2);
    att_bytes += (s + n) * kv_token_bytes;
  }
  SimStepTime t;
  if (chunks.empty()) return t;
  const double flops = 2.0 * p_layer * tokens + att_flops;
  const double bytes = p_layer * 2.0 + att_bytes;
  t.layer_s = std::max(flops / flops_rate, bytes / byte_rate);
  if (num_logits > 0) {
    const double head_params = static_cast<double>(m.dim) * m.vocab_size;
    t.head_s = std::max(2.0 * head_params * static_cast<double>(num_logits) / flops_rate,
                        head_params * 2.0 / byte_rate);
  }
  t.total_s = t.layer_s * m.num_layers + t.head_s;
  return t;
}

}  // namespace kvpush
