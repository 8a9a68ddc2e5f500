// The sim executor: its roofline formula (model/sim_model.h) against hand-computed values and
// published figures, and its determinism contract (tokens and KV a pure function of the tokens,
// whatever the chunking or batch), with sleeping off.
#include <gtest/gtest.h>

#include <cstring>

#include "model/sim_executor.h"

namespace kvpush {
namespace {

SimOptions Qwen3OnH200(bool ideal) {
  SimOptions o;
  o.model = FindSimModel("qwen3-32b").value();
  o.hardware = FindSimHardware("h200").value();
  if (ideal) o.efficiency = SimEfficiency{1.0, 1.0};
  o.sleep = false;
  return o;
}

TEST(SimModel, PresetShapes) {
  const SimModelSpec q = FindSimModel("qwen3-32b").value();
  // q 5120x8192, k and v 5120x1024, o 8192x5120, SwiGLU 3 x 5120x25600.
  EXPECT_EQ(q.LayerParams(), 41943040LL + 2 * 5242880LL + 41943040LL + 393216000LL);
  EXPECT_NEAR(static_cast<double>(q.LayerParams()) * q.num_layers, 31.2e9, 0.05e9);
  EXPECT_EQ(q.KvBytesPerToken(), 262144);  // 64 layers x K,V x 8 heads x 128 x bf16
  EXPECT_EQ(FindSimModel("llama-3.1-8b").value().KvBytesPerToken(), 131072);
  EXPECT_EQ(FindSimModel("llama-3.1-70b").value().KvBytesPerToken(), 327680);
  EXPECT_FALSE(FindSimModel("gpt-5").ok());
  EXPECT_NE(FindSimHardware("tpu").status().message().find("h200"), std::string::npos);
}

TEST(SimModel, StepTimesFollowTheRoofline) {
  const SimOptions o = Qwen3OnH200(true);
  // A 4096-token prefill in one step, ideal efficiencies: compute-bound.
  const SimChunk prefill[] = {{0, 4096}};
  const SimStepTime p = SimStepCost(o.model, o.hardware, o.efficiency, prefill, 1);
  const double f_layer = 2.0 * 487587840.0 * 4096 + 4.0 * 8192 * (4096.0 * 4097 / 2);
  EXPECT_NEAR(p.layer_s, f_layer / 989e12, 1e-12);
  const double head = std::max(2.0 * 5120 * 151936 / 989e12, 5120.0 * 151936 * 2 / 4.8e12);
  EXPECT_NEAR(p.head_s, head, 1e-12);
  EXPECT_NEAR(p.total_s, 64 * f_layer / 989e12 + head, 1e-9);
  EXPECT_NEAR(p.total_s, 0.2766, 0.0005);  // the "~0.28 s ideal" of a 4k prefill on an H200
  // One decode token at context 4096: memory-bound (weights + the KV it reads).
  const SimChunk decode[] = {{4096, 1}};
  const SimStepTime d = SimStepCost(o.model, o.hardware, o.efficiency, decode, 1);
  const double bytes = 487587840.0 * 2 + 4097.0 * 2 * 8 * 128 * 2;
  EXPECT_NEAR(d.layer_s, bytes / 4.8e12, 1e-12);
  EXPECT_NEAR(d.total_s * 1e3, 13.55, 0.01);  // ms per output token at batch 1
  // Efficiencies divide the rates.
  SimOptions real = Qwen3OnH200(false);
  const SimStepTime pr = SimStepCost(real.model, real.hardware, real.efficiency, prefill, 1);
  EXPECT_NEAR(pr.layer_s, p.layer_s / real.efficiency.compute, 1e-12);
  EXPECT_EQ(SimStepCost(o.model, o.hardware, o.efficiency, {}, 0).total_s, 0.0);
}

struct SimRun {
  std::vector<std::byte> kv;
  int32_t next = -1;
};

/// Computes `prompt` on a fresh cache in chunks of `chunk` tokens (blocks 0..n-1 in reverse
/// order) and returns the cache and the token the sim picks next.
SimRun Compute(const std::vector<int32_t>& prompt, size_t chunk) {
  auto ex = SimExecutor::Create(Qwen3OnH200(false)).value();
  const ModelConfig& c = ex->config();
  KvLayout L{c.num_layers, c.num_kv_heads, c.head_dim, 16, 16, c.kv_dtype};
  auto kv = KvCache::Create(L).value();
  std::vector<BlockId> table;
  for (int32_t b = 15; b >= 0; --b) table.push_back(b);
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  SimRun r;
  for (size_t s = 0; s < prompt.size(); s += chunk) {
    SequenceChunk ch;
    ch.tokens = std::span<const int32_t>(prompt).subspan(s, std::min(chunk, prompt.size() - s));
    ch.start_pos = static_cast<int32_t>(s);
    ch.block_table = table;
    ch.want_logits = s + ch.tokens.size() == prompt.size();
    EXPECT_TRUE(ex->Execute(std::span<const SequenceChunk>(&ch, 1), *kv, logits, nullptr).ok());
  }
  r.next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  r.kv.assign(kv->data(), kv->data() + kv->size_bytes());
  return r;
}

TEST(SimExecutor, TokensAndKvArePureFunctionsOfTheTokens) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < 100; ++i) prompt.push_back(3 + (i * 37) % 250);
  const SimRun whole = Compute(prompt, 100);
  const SimRun chunked = Compute(prompt, 33);
  EXPECT_GE(whole.next, 259);
  EXPECT_EQ(whole.next, chunked.next);
  EXPECT_TRUE(whole.kv == chunked.kv);
  prompt[50] += 1;  // another context: another KV and (almost surely) another token
  const SimRun other = Compute(prompt, 100);
  EXPECT_FALSE(other.kv == whole.kv);
  EXPECT_NE(other.next, whole.next);
}

TEST(SimExecutor, ReportsItsConfigAndRefusesBadOptions) {
  SimOptions o = Qwen3OnH200(false);
  const ModelConfig c = SimModelConfig(o).value();
  EXPECT_EQ(c.kv_dtype, KvDtype::kBF16);
  EXPECT_EQ(c.head_dim, 16);  // 128 x the default scale 1/8
  EXPECT_EQ(c.num_layers, 64);
  o.kv_scale = 1.0;
  EXPECT_EQ(SimModelConfig(o).value().head_dim, 128);
  o.kv_scale = 0;
  EXPECT_FALSE(SimModelConfig(o).ok());
  o.kv_scale = 0.5;
  o.efficiency.compute = 1.5;
  EXPECT_FALSE(SimModelConfig(o).ok());
}

TEST(SimTokenizer, AnyTextRoundTrips) {
  SimTokenizer t(151936);
  const std::string text = "héllo\n\t\xff world 🙂";
  auto ids = t.Encode(text).value();
  ASSERT_EQ(ids.size(), text.size());
  std::string back;
  for (int32_t id : ids) back += t.TokenBytes(id);
  EXPECT_EQ(back, text);
  EXPECT_EQ(t.TokenBytes(1000), " w1000");
  EXPECT_TRUE(t.IsControl(2));
  EXPECT_EQ(t.TokenBytes(151936), "");
}

}  // namespace
}  // namespace kvpush
