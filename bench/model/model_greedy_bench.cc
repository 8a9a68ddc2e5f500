// kvpush_model_greedy_bench: one greedy generation through LlamaExecutor (called directly: no
// engine, no HTTP), timed the way bench/llamacpp/greedy.mjs times llama.cpp, for
// bench/model_vs_llamacpp.py.
//
//   prefill s = time of the one Execute() that computes the whole prompt (one chunk) and its last
//               position's logits, plus the argmax giving generated token 1
//   decode s  = time of the next `--decode` single-token Execute() steps, each followed by its
//               argmax (tokens 2 .. decode + 1)
// A full untimed warm-up generation runs first (faults the weight mapping in, grows scratch).
// Prints one JSON object on stdout: {"prefill_s", "decode_s", "prompt_len", "decode_steps",
// "tokens": [generated ids], "gemm"}.
//
//   kvpush_model_greedy_bench --model M.gguf --prompt-file ids.txt [--decode 48] [--threads 1]
//       [--quant-math int8|f32]
// ids.txt: whitespace-separated token ids (no BOS is added). --quant-math f32 takes the float path
// for Q8_0 / Q4_K / Q6_K (weights dequantized to f32, as before the integer kernels).
//   kvpush_model_greedy_bench --gen OUT.gguf --arch llama3 --dtype q8_0 --dim 1024 --layers 8
//       --heads 16 --kv-heads 4 --hidden-dim 2816 --vocab 32000 [--seed 1]
// writes the same file as `kvpush gen-model` with those flags (family RoPE base), without needing
// the full kvpush binary.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "kv/kv_cache.h"
#include "model/llama_executor.h"
#include "model/model.h"
#include "model/random_model.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "kvpush_model_greedy_bench: %s\n", what.c_str());
  std::exit(1);
}

int32_t Argmax(std::span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

struct Generation {
  double prefill_s = 0, decode_s = 0;
  std::vector<int32_t> tokens;
};

/// Greedy generation of 1 + `decode` tokens after `prompt` on a fresh block table.
Generation Generate(kvpush::Executor& ex, kvpush::KvCache& kv, std::span<const kvpush::BlockId> bt,
                    const std::vector<int32_t>& prompt, int decode) {
  std::vector<float> logits(static_cast<size_t>(ex.config().vocab_size));
  Generation g;
  kvpush::SequenceChunk ch{
      .seq_id = 1, .tokens = prompt, .start_pos = 0, .block_table = bt, .want_logits = true};
  auto t0 = Clock::now();
  if (auto st = ex.Execute({&ch, 1}, kv, logits, nullptr); !st.ok()) Die(st.ToString());
  g.tokens.push_back(Argmax(logits));
  auto t1 = Clock::now();
  for (int s = 0; s < decode; ++s) {
    const int32_t tok = g.tokens.back();
    ch.tokens = std::span<const int32_t>(&tok, 1);
    ch.start_pos = static_cast<int32_t>(prompt.size()) + s;
    if (auto st = ex.Execute({&ch, 1}, kv, logits, nullptr); !st.ok()) Die(st.ToString());
    g.tokens.push_back(Argmax(logits));
  }
  auto t2 = Clock::now();
  g.prefill_s = Seconds(t0, t1);
  g.decode_s = Seconds(t1, t2);
  return g;
}

int GenModel(const std::map<std::string, std::string>& a) {
  static const std::map<std::string, kvpush::GgmlType> kTypes = {
      {"f32", kvpush::GgmlType::kF32},   {"f16", kvpush::GgmlType::kF16},
      {"bf16", kvpush::GgmlType::kBF16}, {"q8_0", kvpush::GgmlType::kQ8_0},
      {"q4_k", kvpush::GgmlType::kQ4_K}, {"q6_k", kvpush::GgmlType::kQ6_K}};
  auto get = [&](const std::string& k, const std::string& d) {
    auto it = a.find(k);
    return it == a.end() ? d : it->second;
  };
  kvpush::RandomLlamaOptions o;
  o.arch = get("arch", "llama3");
  o.dim = std::stoi(get("dim", "1024"));
  o.layers = std::stoi(get("layers", "8"));
  o.heads = std::stoi(get("heads", "16"));
  o.kv_heads = std::stoi(get("kv-heads", "4"));
  o.hidden_dim = std::stoi(get("hidden-dim", "2816"));
  o.vocab = std::stoi(get("vocab", "32000"));
  o.seed = std::stoull(get("seed", "1"));
  o.rope_freq_base = o.arch == "llama3" ? 500000.0f : o.arch == "llama" ? 10000.0f : 1000000.0f;
  const auto t = kTypes.find(get("dtype", "f32"));
  if (t == kTypes.end()) Die("--dtype must be f32, f16, bf16, q8_0, q4_k or q6_k");
  o.dtype = t->second;
  auto w = kvpush::BuildRandomLlamaGguf(o);
  if (!w.ok()) Die(w.status().ToString());
  if (auto st = w->WriteFile(a.at("gen")); !st.ok()) Die(st.ToString());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> args;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strncmp(argv[i], "--", 2) != 0) Die(std::string("unexpected ") + argv[i]);
    args[argv[i] + 2] = argv[i + 1];
  }
  if (args.count("gen") != 0) return GenModel(args);
  auto get = [&](const std::string& k, const std::string& d) {
    auto it = args.find(k);
    return it == args.end() ? d : it->second;
  };
  const std::string model = get("model", ""), prompt_file = get("prompt-file", "");
  const int decode = std::stoi(get("decode", "48")), threads = std::stoi(get("threads", "1"));
  if (model.empty() || prompt_file.empty()) {
    Die("usage: --model M.gguf --prompt-file ids.txt [--decode 48] [--threads 1]");
  }
  std::vector<int32_t> prompt;
  std::ifstream in(prompt_file);
  for (int32_t id = 0; in >> id;) prompt.push_back(id);
  if (prompt.empty()) Die("no token ids in " + prompt_file);

  kvpush::ModelLoadOptions lo;
  lo.path = model;
  lo.threads = threads;
  const std::string quant = get("quant-math", "int8");
  if (quant != "int8" && quant != "f32") Die("--quant-math must be int8 or f32");
  lo.quant_math = quant == "int8" ? kvpush::QuantMath::kInt8 : kvpush::QuantMath::kDequantF32;
  auto m = kvpush::LoadModel(lo);
  if (!m.ok()) Die(m.status().ToString());
  const auto& c = m->config;
  constexpr int kBlock = 16;
  const int tokens = static_cast<int>(prompt.size()) + decode + 1;
  kvpush::KvLayout lay;
  lay.num_layers = c.num_layers;
  lay.num_kv_heads = c.num_kv_heads;
  lay.head_dim = c.head_dim;
  lay.block_size = kBlock;
  lay.num_blocks = (tokens + kBlock - 1) / kBlock;
  auto kv = kvpush::KvCache::Create(lay);
  if (!kv.ok()) Die(kv.status().ToString());
  std::vector<kvpush::BlockId> bt(static_cast<size_t>(lay.num_blocks));
  std::iota(bt.begin(), bt.end(), 0);

  Generate(*m->executor, **kv, bt, prompt, decode);  // warm-up
  const Generation g = Generate(*m->executor, **kv, bt, prompt, decode);
  const auto* llama = dynamic_cast<const kvpush::LlamaExecutor*>(m->executor.get());
  nlohmann::json j;
  j["engine"] = "kvpush";
  j["gemm"] = llama != nullptr ? llama->gemm_name() : "?";
  j["threads"] = threads;
  j["prompt_len"] = prompt.size();
  j["decode_steps"] = decode;
  j["prefill_s"] = g.prefill_s;
  j["decode_s"] = g.decode_s;
  j["tokens"] = g.tokens;
  std::printf("%s\n", j.dump().c_str());
  return 0;
}
