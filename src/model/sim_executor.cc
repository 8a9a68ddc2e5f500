#include "model/sim_executor.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include "common/clock.h"

namespace kvpush {

namespace {

constexpr int32_t kFirstWordId = 259;  ///< 3 specials + 256 bytes

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t ChainHash(uint64_t prev, int32_t token, int32_t pos) {
  unsigned char buf[16];
  std::memcpy(buf, &prev, 8);
  std::memcpy(buf + 8, &token, 4);
  std::memcpy(buf + 12, &pos, 4);
  return XXH3_64bits(buf, sizeof(buf));
}

}  // namespace

Result<ModelConfig> SimModelConfig(const SimOptions& o) {
  const SimModelSpec& m = o.model;
  if (m.num_layers < 1 || m.num_kv_heads < 1 || m.head_dim < 1 || m.vocab_size <= kFirstWordId) {
    return InvalidArgument("sim: model preset '" + m.name + "' is incomplete");
  }
  if (!(o.kv_scale > 0) || o.kv_scale > 1) return InvalidArgument("--sim-kv-scale must be in (0, 1]");
  if (!(o.efficiency.compute > 0 && o.efficiency.compute <= 1) ||
      !(o.efficiency.memory > 0 && o.efficiency.memory <= 1)) {
    return InvalidArgument("--sim-compute-eff and --sim-mem-eff must be in (0, 1]");
  }
  if (!(o.hardware.peak_flops > 0) || !(o.hardware.hbm_bytes_per_s > 0)) {
    return InvalidArgument("sim: hardware preset '" + o.hardware.name + "' is incomplete");
  }
  ModelConfig c;
  c.architecture = "sim";
  c.name = m.name + "@" + o.hardware.name;
  c.dim = m.dim;
  c.hidden_dim = m.ffn_dim;
  c.num_layers = m.num_layers;
  c.num_heads = m.num_heads;
  c.num_kv_heads = m.num_kv_heads;
  // The scaled head dim keeps at least 4 bf16 values (8 bytes: room for h_p in every slot).
  c.head_dim = std::max(4, static_cast<int32_t>(std::lround(m.head_dim * o.kv_scale)));
  c.vocab_size = m.vocab_size;
  c.context_length = m.context_length;
  c.bos_id = 1;
  c.eos_id = 2;
  c.kv_dtype = KvDtype::kBF16;
  const std::string id = m.name + "|" + o.hardware.name + "|" + std::to_string(c.head_dim);
  c.fingerprint = XXH3_64bits(id.data(), id.size());
  return c;
}

Result<std::unique_ptr<SimExecutor>> SimExecutor::Create(const SimOptions& options) {
  KVP_ASSIGN_OR_RETURN(ModelConfig c, SimModelConfig(options));
  return std::unique_ptr<SimExecutor>(new SimExecutor(options, std::move(c)));
}

void SimExecutor::ChainHashes(const SequenceChunk& c, const KvCache& kv,
                              std::vector<uint64_t>& out) const {
  const KvLayout& L = kv.layout();
  uint64_t h = config_.fingerprint;
  if (c.start_pos > 0) {
    const int32_t p = c.start_pos - 1;
    const BlockId b = c.block_table[static_cast<size_t>(p / L.block_size)];
    std::memcpy(&h, kv.data() + L.offset(0, KvKind::kKey, b) +
                        static_cast<size_t>(p % L.block_size) * L.token_bytes(),
                8);
  }
  out.resize(c.tokens.size());
  for (size_t i = 0; i < c.tokens.size(); ++i) {
    h = ChainHash(h, c.tokens[i], c.start_pos + static_cast<int32_t>(i));
    out[i] = h;
  }
}

void SimExecutor::WriteLayer(const SequenceChunk& c, std::span<const uint64_t> hashes,
                             int32_t layer, KvCache& kv) const {
  const KvLayout& L = kv.layout();
  const size_t slot = L.token_bytes();
  const size_t words = slot / 8;
  for (size_t i = 0; i < hashes.size(); ++i) {
    const int32_t p = c.start_pos + static_cast<int32_t>(i);
    const BlockId b = c.block_table[static_cast<size_t>(p / L.block_size)];
    for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
      std::byte* dst = kv.data() + L.offset(layer, kind, b) +
                       static_cast<size_t>(p % L.block_size) * slot;
      const uint64_t salt = (static_cast<uint64_t>(layer) << 1 | static_cast<uint64_t>(kind)) *
                            0x9E3779B97F4A7C15ull;
      uint64_t w = hashes[i];
      std::memcpy(dst, &w, 8);
      for (size_t j = 1; j < words; ++j) {
        w = SplitMix64((hashes[i] ^ salt) + j);
        std::memcpy(dst + j * 8, &w, 8);
      }
    }
  }
}

Status SimExecutor::Execute(std::span<const SequenceChunk> batch, KvCache& kv,
                            std::span<float> logits, LayerObserver* observer) {
  const KvLayout& L = kv.layout();
  const auto vocab = static_cast<size_t>(config_.vocab_size);
  std::vector<SimChunk> shape;
  int64_t num_logits = 0;
  for (const SequenceChunk& c : batch) {
    const int64_t end = int64_t{c.start_pos} + static_cast<int64_t>(c.tokens.size());
    if (c.tokens.empty() || c.start_pos < 0 || end > config_.context_length) {
      return InvalidArgument("sim: positions outside the context");
    }
    if (static_cast<int64_t>(c.block_table.size()) * L.block_size < end) {
      return InvalidArgument("sim: block table too short");
    }
    shape.push_back(SimChunk{c.start_pos, static_cast<int64_t>(c.tokens.size())});
    num_logits += c.logit_rows();
  }
  if (logits.size() < static_cast<size_t>(num_logits) * vocab) {
    return InvalidArgument("sim: logits span too small");
  }
  last_step_ = SimStepCost(options_.model, options_.hardware, options_.efficiency, shape,
                           num_logits);
  const TimePoint start = SteadyClock::now();
  hashes_.resize(batch.size());
  for (size_t k = 0; k < batch.size(); ++k) ChainHashes(batch[k], kv, hashes_[k]);
  const auto layer_time = std::chrono::duration<double>(last_step_.layer_s);
  for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
    for (size_t k = 0; k < batch.size(); ++k) WriteLayer(batch[k], hashes_[k], layer, kv);
    if (options_.sleep) {
      std::this_thread::sleep_until(
          start + std::chrono::duration_cast<SteadyClock::duration>(layer_time * (layer + 1)));
    }
    if (observer != nullptr) observer->OnLayerDone(layer);
  }
  size_t row = 0;
  for (size_t k = 0; k < batch.size(); ++k) {
    // One row per scored position (the chunk's last, or every one with all_logits): a spike on a
    // word picked by the chain hash up to that position.
    const auto rows = static_cast<size_t>(batch[k].logit_rows());
    for (size_t i = hashes_[k].size() - rows; i < hashes_[k].size(); ++i) {
      std::span<float> out = logits.subspan(row++ * vocab, vocab);
      std::fill(out.begin(), out.end(), 0.0f);
      const uint64_t pick = XXH3_64bits_withSeed(&hashes_[k][i], 8, 0x746f6b);
      out[kFirstWordId + pick % (vocab - kFirstWordId)] = 20.0f;
    }
  }
  if (options_.sleep) {
    std::this_thread::sleep_until(
        start + std::chrono::duration_cast<SteadyClock::duration>(
                    std::chrono::duration<double>(last_step_.total_s)));
  }
  return Status::Ok();
}

Result<LoadedModel> MakeSimModel(const SimOptions& options) {
  KVP_ASSIGN_OR_RETURN(auto executor, SimExecutor::Create(options));
  LoadedModel m;
  m.config = executor->config();
  m.tokenizer = std::make_unique<SimTokenizer>(m.config.vocab_size);
  m.executor = std::move(executor);
  return m;
}

Result<std::vector<int32_t>> SimTokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (char ch : text) ids.push_back(3 + static_cast<int32_t>(static_cast<unsigned char>(ch)));
  return ids;
}

std::string SimTokenizer::TokenBytes(int32_t id) const {
  if (id < 3 || id >= vocab_) return "";
  if (id < kFirstWordId) return std::string(1, static_cast<char>(id - 3));
  return " w" + std::to_string(id);
}

}  // namespace kvpush
