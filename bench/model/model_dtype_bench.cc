// kvpush_model_dtype_bench: decode throughput and resident memory of LlamaExecutor for one model
// file, per weight storage type (f32, f16, bf16, q8_0, q6_k, q4_k), against the memory-bandwidth
// bound of that type. One process per model so that VmRSS is the model's own.
//
//   --gen OUT --dtype T [--dim 1024 --layers 8 --heads 16 --kv-heads 8 --hidden 2816
//                        --vocab 32000 --seed 1]     writes a random GGUF (as kvpush gen-model)
//   --model PATH [--context 64 --decode-steps 16 --reps 3 --json OUT]
//
// Measured, in this order, in one process:
//   VmRSS before loading, after LoadModel + KV cache + a `context`-token prefill (every weight
//   touched), and VmHWM (peak); file size; KV arena bytes.
//   decode tok/s = 1 / median time of a batch-1 decode step (one new token; the sequence already
//   holds `context` + i tokens), over reps x decode-steps steps.
//   streamed bytes per token = stored bytes of every matrix a decode step reads (all but the
//   embedding table, which is read one row per token, unless the classifier is tied to it)
//   + the f32 norm / bias vectors.
//   read bandwidth = bytes / time of summing a 512 MiB float array read as 8 concurrent streams
//   (read only; median of 5);
//   copy bandwidth = STREAM-style 2 x bytes / time of a 512 MiB memcpy (median of 5).
//   bound tok/s = read bandwidth / streamed bytes; fraction = decode tok/s / bound.
// Prints one table row and writes JSON (--json). Driven by bench/model_dtype.sh.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
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

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

/// A field of /proc/self/status in bytes ("VmRSS", "VmHWM"); 0 when absent.
double StatusBytes(const std::string& field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1)) * 1024.0;
  }
  return 0.0;
}

/// Read-only bandwidth in bytes/s: sums `bytes` of floats read as 8 concurrent streams (the
/// buffer in 8 parts, as the decode GEMM streams 8 rows of W at a time), SSE adds, median of 5
/// passes after one that faults the pages in.
double ReadBandwidth(size_t bytes) {
  constexpr size_t kStreams = 8;
  std::vector<float> a(bytes / sizeof(float), 1.0f);
  const size_t part = a.size() / kStreams / 8 * 8;
  std::vector<double> t;
  volatile float sink = 0.0f;
  for (int r = 0; r < 6; ++r) {
    const auto t0 = Clock::now();
    __m128 acc[kStreams][2];
    for (auto& v : acc) v[0] = v[1] = _mm_setzero_ps();
    for (size_t i = 0; i < part; i += 8) {
      for (size_t s = 0; s < kStreams; ++s) {
        acc[s][0] = _mm_add_ps(acc[s][0], _mm_loadu_ps(&a[s * part + i]));
        acc[s][1] = _mm_add_ps(acc[s][1], _mm_loadu_ps(&a[s * part + i + 4]));
      }
    }
    const double sec = Seconds(t0, Clock::now());
    alignas(16) float lanes[4];
    for (size_t s = 1; s < kStreams; ++s) {
      acc[0][0] = _mm_add_ps(acc[0][0], _mm_add_ps(acc[s][0], acc[s][1]));
    }
    _mm_store_ps(lanes, acc[0][0]);
    sink = sink + lanes[0] + lanes[1] + lanes[2] + lanes[3];
    if (r > 0) t.push_back(sec);
  }
  return static_cast<double>(part * kStreams * sizeof(float)) / Median(t);
}

/// STREAM-convention copy bandwidth: 2 * bytes / time of a memcpy, median of 5.
double CopyBandwidth(size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 0);
  std::memcpy(b.data(), a.data(), bytes);
  std::vector<double> t;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    t.push_back(Seconds(t0, Clock::now()));
    a[static_cast<size_t>(r)] = b[bytes - 1 - static_cast<size_t>(r)];
  }
  return 2.0 * static_cast<double>(bytes) / Median(t);
}

struct Args {
  std::map<std::string, std::string> kv;
  std::string Get(const std::string& k, const std::string& d) const {
    auto it = kv.find(k);
    return it == kv.end() ? d : it->second;
  }
  int Int(const std::string& k, int d) const { return std::stoi(Get(k, std::to_string(d))); }
};

int Generate(const Args& a) {
  static const std::map<std::string, kvpush::GgmlType> kTypes = {
      {"f32", kvpush::GgmlType::kF32},   {"f16", kvpush::GgmlType::kF16},
      {"bf16", kvpush::GgmlType::kBF16}, {"q8_0", kvpush::GgmlType::kQ8_0},
      {"q4_k", kvpush::GgmlType::kQ4_K}, {"q6_k", kvpush::GgmlType::kQ6_K}};
  const std::string dtype = a.Get("dtype", "q8_0");
  if (kTypes.count(dtype) == 0) {
    std::fprintf(stderr, "--dtype must be f32, f16, bf16, q8_0, q4_k or q6_k\n");
    return 2;
  }
  kvpush::RandomLlamaOptions o;
  o.dim = a.Int("dim", 1024);
  o.layers = a.Int("layers", 8);
  o.heads = a.Int("heads", 16);
  o.kv_heads = a.Int("kv-heads", 8);
  o.hidden_dim = a.Int("hidden", 2816);
  o.vocab = a.Int("vocab", 32000);
  o.seed = static_cast<uint64_t>(a.Int("seed", 1));
  o.dtype = kTypes.at(dtype);
  o.name = "dtype-bench-" + dtype;
  auto w = kvpush::BuildRandomLlamaGguf(o);
  if (!w.ok()) {
    std::fprintf(stderr, "gen: %s\n", w.status().ToString().c_str());
    return 1;
  }
  if (auto s = w->WriteFile(a.Get("gen", "")); !s.ok()) {
    std::fprintf(stderr, "gen: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

/// Bytes a batch-1 decode step reads from the weights (see the file comment).
double StreamedBytes(const kvpush::LlamaWeights& w) {
  double b = static_cast<double>(w.weight_bytes());
  if (!w.output.empty()) b -= static_cast<double>(w.token_embd.bytes());
  return b + static_cast<double>(w.token_embd.row_bytes());
}

/// Everything one run measured (see the file comment).
struct Measured {
  std::string path, dtype, gemm;
  kvpush::ModelConfig config;
  double rss0 = 0, rss_loaded = 0, hwm = 0, file_bytes = 0, kv_bytes = 0, streamed = 0;
  double step_s = 0, read_bw = 0, copy_bw = 0;
  int context = 0, steps = 0, reps = 0;
};

/// Prints the table row and, when `json_path` is not empty, writes the JSON.
void Report(const Measured& r, const std::string& json_path) {
  const double mib = 1 << 20;
  const double decode_tok_s = 1.0 / r.step_s, bound = r.read_bw / r.streamed;
  const double rss_ratio = r.rss_loaded / (r.file_bytes + r.kv_bytes);
  std::printf(
      "%-5s file %7.1f MiB  VmRSS %7.1f MiB (before load %5.1f, peak %7.1f)  KV %5.1f MiB  "
      "RSS/(file+KV) %.3f  streamed %7.1f MiB/token  decode %7.2f tok/s  read %5.1f GB/s  "
      "copy %5.1f GB/s  bound %7.2f tok/s  decode/bound %5.1f%%\n",
      r.dtype.c_str(), r.file_bytes / mib, r.rss_loaded / mib, r.rss0 / mib, r.hwm / mib,
      r.kv_bytes / mib, rss_ratio, r.streamed / mib, decode_tok_s, r.read_bw / 1e9, r.copy_bw / 1e9,
      bound, 100.0 * decode_tok_s / bound);
  if (json_path.empty()) return;
  const kvpush::ModelConfig& c = r.config;
  nlohmann::json j;
  j["model_path"] = r.path;
  j["dtype"] = r.dtype;
  j["config"] = {{"dim", c.dim},
                 {"layers", c.num_layers},
                 {"heads", c.num_heads},
                 {"kv_heads", c.num_kv_heads},
                 {"hidden_dim", c.hidden_dim},
                 {"vocab", c.vocab_size}};
  j["gemm"] = r.gemm;
  j["file_bytes"] = r.file_bytes;
  j["vmrss_before_load_bytes"] = r.rss0;
  j["vmrss_loaded_bytes"] = r.rss_loaded;
  j["vmhwm_bytes"] = r.hwm;
  j["kv_arena_bytes"] = r.kv_bytes;
  j["rss_over_file_plus_kv"] = rss_ratio;
  j["streamed_bytes_per_token"] = r.streamed;
  j["decode_tok_s"] = decode_tok_s;
  j["decode_step_median_s"] = r.step_s;
  j["read_bandwidth_bytes_per_s"] = r.read_bw;
  j["copy_bandwidth_bytes_per_s"] = r.copy_bw;
  j["bound_tok_s"] = bound;
  j["decode_over_bound"] = decode_tok_s / bound;
  j["context"] = r.context;
  j["decode_steps"] = r.steps;
  j["reps"] = r.reps;
  std::ofstream(json_path) << j.dump(2) << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strncmp(argv[i], "--", 2) != 0) break;
    a.kv[argv[i] + 2] = argv[i + 1];
  }
  if (a.kv.count("gen") != 0) return Generate(a);
  const std::string path = a.Get("model", "");
  if (path.empty()) {
    std::fprintf(stderr,
                 "usage: kvpush_model_dtype_bench --gen OUT --dtype T [--dim ...] | --model PATH "
                 "[--context 64] [--decode-steps 16] [--reps 3] [--json OUT]\n");
    return 2;
  }
  const int context = a.Int("context", 64), steps = a.Int("decode-steps", 16);
  const int reps = a.Int("reps", 3);
  const double rss0 = StatusBytes("VmRSS");
  kvpush::ModelLoadOptions lo;
  lo.path = path;
  auto m = kvpush::LoadModel(lo);
  if (!m.ok()) {
    std::fprintf(stderr, "load: %s\n", m.status().ToString().c_str());
    return 1;
  }
  const auto& c = m->config;
  const auto* llama = dynamic_cast<const kvpush::LlamaExecutor*>(m->executor.get());
  const kvpush::LlamaWeights& w = llama->weights();
  constexpr int kBlock = 16;
  kvpush::KvLayout lay;
  lay.num_layers = c.num_layers;
  lay.num_kv_heads = c.num_kv_heads;
  lay.head_dim = c.head_dim;
  lay.block_size = kBlock;
  lay.num_blocks = (context + steps + kBlock - 1) / kBlock;
  auto kv = kvpush::KvCache::Create(lay);
  if (!kv.ok()) return 1;
  const double kv_bytes = 2.0 * lay.num_layers * lay.num_blocks * kBlock * lay.num_kv_heads *
                          lay.head_dim * sizeof(float);
  std::vector<kvpush::BlockId> table(static_cast<size_t>(lay.num_blocks));
  std::iota(table.begin(), table.end(), 0);
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  std::vector<int32_t> prompt(static_cast<size_t>(context));
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(3 + i * 7919 % 1000);
  auto step = [&](std::span<const int32_t> toks, int start) {
    kvpush::SequenceChunk ch;
    ch.tokens = toks;
    ch.start_pos = start;
    ch.block_table = table;
    ch.want_logits = true;
    const auto t0 = Clock::now();
    if (!m->executor->Execute({&ch, 1}, **kv, logits, nullptr).ok()) std::exit(1);
    return Seconds(t0, Clock::now());
  };
  std::vector<double> dt;
  std::vector<int32_t> tok = {5};
  double rss_loaded = 0.0;
  for (int r = 0; r < reps; ++r) {
    step(prompt, 0);
    if (r == 0) rss_loaded = StatusBytes("VmRSS");
    for (int s = 0; s < steps; ++s) dt.push_back(step(tok, context + s));
  }
  Measured r;
  r.path = path;
  r.dtype = kvpush::GgmlTypeName(static_cast<uint32_t>(w.layers[0].wq.type()));
  r.gemm = llama->gemm_name();
  r.config = c;
  r.rss0 = rss0;
  r.rss_loaded = rss_loaded;
  r.hwm = StatusBytes("VmHWM");
  r.file_bytes = static_cast<double>(std::filesystem::file_size(path));
  r.kv_bytes = kv_bytes;
  r.streamed = StreamedBytes(w);
  r.step_s = Median(dt);
  r.read_bw = ReadBandwidth(size_t{512} << 20);
  r.copy_bw = CopyBandwidth(size_t{512} << 20);
  r.context = context;
  r.steps = steps;
  r.reps = reps;
  Report(r, a.Get("json", ""));
  return 0;
}
