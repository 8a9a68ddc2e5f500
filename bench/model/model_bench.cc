// kvpush_model_bench: prefill and decode throughput of LlamaExecutor (the real CPU executor, called
// directly: no engine, no HTTP) at batch 1 and batch N, plus the memory-bandwidth bound of decode.
//
//   prefill tok/s  = batch * prompt_len / (median time of one Execute() computing all prompts)
//   decode tok/s   = batch / (median time of one Execute() step with one new token per sequence,
//                    each sequence already holding `context` tokens)
//   bound tok/s    = copy bandwidth / f32 weight bytes (a decode step at batch 1 streams every
//                    weight once); copy bandwidth = STREAM-style (read + write bytes) / time of a
//                    memcpy of a 512 MiB buffer, median of 5, measured in the same run.
// Prints a table and writes JSON (--json). Usage: see bench/model_throughput.sh.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "kv/kv_cache.h"
#include "model/gemm.h"
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

/// STREAM-convention copy bandwidth in bytes/s: 2 * size / time (read + write), median of `reps`.
double CopyBandwidth(size_t bytes, int reps) {
  std::vector<char> a(bytes, 1), b(bytes, 0);
  std::memcpy(b.data(), a.data(), bytes);  // fault pages in
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    t.push_back(Seconds(t0, Clock::now()));
    a[static_cast<size_t>(r)] = b[bytes - 1 - static_cast<size_t>(r)];  // keep the copy observable
  }
  return 2.0 * static_cast<double>(bytes) / Median(t);
}

struct Args {
  std::string model, tokenizer, label, json;
  std::vector<int> batches = {1, 32};
  int prompt_batch1 = 512;  // prompt tokens per sequence at batch 1
  int prompt_batchn = 64;   // prompt tokens per sequence at batch > 1
  int context = 128;        // tokens already cached before the timed decode steps
  int decode_steps = 16;
  int reps = 5;
  int threads = 1;
  std::string gemm = "fixed";  // fixed | openblas
};

struct Row {
  int batch;
  int prompt_len;
  double prefill_tok_s, decode_tok_s, prefill_median_s, decode_step_median_s;
};

class Runner {
 public:
  Runner(kvpush::Executor& ex, int max_seqs, int max_tokens) : ex_(ex) {
    const auto& c = ex.config();
    blocks_per_seq_ = (max_tokens + kBlock - 1) / kBlock;
    kvpush::KvLayout lay;
    lay.num_layers = c.num_layers;
    lay.num_kv_heads = c.num_kv_heads;
    lay.head_dim = c.head_dim;
    lay.block_size = kBlock;
    lay.num_blocks = blocks_per_seq_ * max_seqs;
    auto kv = kvpush::KvCache::Create(lay);
    if (!kv.ok()) {
      std::fprintf(stderr, "KV cache: %s\n", kv.status().ToString().c_str());
      std::exit(1);
    }
    kv_ = std::move(kv.value());
    tables_.resize(static_cast<size_t>(max_seqs));
    for (int s = 0; s < max_seqs; ++s) {
      tables_[static_cast<size_t>(s)].resize(static_cast<size_t>(blocks_per_seq_));
      std::iota(tables_[static_cast<size_t>(s)].begin(), tables_[static_cast<size_t>(s)].end(),
                s * blocks_per_seq_);
    }
    logits_.resize(static_cast<size_t>(max_seqs) * static_cast<size_t>(c.vocab_size));
  }

  /// One step: sequence s computes `len` tokens at [start, start + len). Returns seconds.
  double Step(int batch, int start, int len) {
    const int32_t vocab = ex_.config().vocab_size;
    tokens_.assign(static_cast<size_t>(batch * len), 0);
    for (size_t i = 0; i < tokens_.size(); ++i)
      tokens_[i] = static_cast<int32_t>(3 + (i * 7919) % (vocab - 3));
    std::vector<kvpush::SequenceChunk> chunks(static_cast<size_t>(batch));
    for (int s = 0; s < batch; ++s) {
      auto& ch = chunks[static_cast<size_t>(s)];
      ch.seq_id = s;
      ch.tokens = std::span<const int32_t>(tokens_).subspan(static_cast<size_t>(s * len),
                                                            static_cast<size_t>(len));
      ch.start_pos = start;
      ch.block_table = tables_[static_cast<size_t>(s)];
      ch.want_logits = true;
    }
    auto t0 = Clock::now();
    kvpush::Status st = ex_.Execute(chunks, *kv_, logits_, nullptr);
    const double t = Seconds(t0, Clock::now());
    if (!st.ok()) {
      std::fprintf(stderr, "Execute failed: %s\n", st.ToString().c_str());
      std::exit(1);
    }
    return t;
  }

 private:
  static constexpr int kBlock = 16;
  kvpush::Executor& ex_;
  int blocks_per_seq_;
  std::unique_ptr<kvpush::KvCache> kv_;
  std::vector<std::vector<kvpush::BlockId>> tables_;
  std::vector<float> logits_;
  std::vector<int32_t> tokens_;
};

int ParseInt(const char* s) {
  return std::atoi(s);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "missing value for %s\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--model")
      a.model = val();
    else if (k == "--tokenizer")
      a.tokenizer = val();
    else if (k == "--label")
      a.label = val();
    else if (k == "--json")
      a.json = val();
    else if (k == "--prompt-batch1")
      a.prompt_batch1 = ParseInt(val());
    else if (k == "--prompt-batchn")
      a.prompt_batchn = ParseInt(val());
    else if (k == "--context")
      a.context = ParseInt(val());
    else if (k == "--decode-steps")
      a.decode_steps = ParseInt(val());
    else if (k == "--reps")
      a.reps = ParseInt(val());
    else if (k == "--threads")
      a.threads = ParseInt(val());
    else if (k == "--gemm")
      a.gemm = val();
    else if (k == "--batches") {
      a.batches.clear();
      std::string s = val();
      for (size_t p = 0; p < s.size();) {
        size_t q = s.find(',', p);
        if (q == std::string::npos) q = s.size();
        a.batches.push_back(std::stoi(s.substr(p, q - p)));
        p = q + 1;
      }
    } else {
      std::fprintf(
          stderr,
          "usage: kvpush_model_bench --model PATH|random [--tokenizer PATH] [--label NAME] "
          "[--gemm fixed|openblas] "
          "[--batches 1,32] [--prompt-batch1 512] [--prompt-batchn 64] [--context 128] "
          "[--decode-steps 16] [--reps 5] [--threads 1] [--json OUT]\n");
      return 2;
    }
  }
  if (a.model.empty()) {
    std::fprintf(stderr, "--model is required\n");
    return 2;
  }
  kvpush::ModelLoadOptions lo;
  lo.path = a.model;
  lo.tokenizer_path = a.tokenizer;
  lo.blas_threads = a.threads;
  lo.gemm =
      a.gemm == "openblas" ? kvpush::GemmBackend::kOpenBlasTiles : kvpush::GemmBackend::kFixedOrder;
  kvpush::Result<kvpush::LoadedModel> m = kvpush::Internal("not loaded");
  if (a.model == "random") {
    // `kvpush gen-model` defaults, built in memory (seed 1).
    auto w = kvpush::BuildRandomLlamaGguf(kvpush::RandomLlamaOptions{});
    if (!w.ok()) {
      std::fprintf(stderr, "gen: %s\n", w.status().ToString().c_str());
      return 1;
    }
    lo.path = "random";
    m = kvpush::LoadModelFromGgufBytes(w->Serialize(), lo);
  } else {
    m = kvpush::LoadModel(lo);
  }
  if (!m.ok()) {
    std::fprintf(stderr, "load: %s\n", m.status().ToString().c_str());
    return 1;
  }
  const auto& c = m->config;
  const auto* llama = dynamic_cast<const kvpush::LlamaExecutor*>(m->executor.get());
  const double weight_bytes = static_cast<double>(llama->weights().weight_bytes());
  if (a.label.empty()) a.label = c.name;
  const double bw = CopyBandwidth(size_t{512} << 20, 5);
  const int max_batch = *std::max_element(a.batches.begin(), a.batches.end());
  const int max_tokens = std::max({a.prompt_batch1, a.prompt_batchn, a.context + a.decode_steps});
  if (max_tokens > c.context_length) {
    std::fprintf(stderr, "model context %d is smaller than %d tokens\n", c.context_length,
                 max_tokens);
    return 2;
  }
  Runner run(*m->executor, max_batch, max_tokens);
  std::vector<Row> rows;
  for (int b : a.batches) {
    Row r{};
    r.batch = b;
    r.prompt_len = b == 1 ? a.prompt_batch1 : a.prompt_batchn;
    run.Step(b, 0, r.prompt_len);  // warm-up
    std::vector<double> pt;
    for (int rep = 0; rep < a.reps; ++rep) pt.push_back(run.Step(b, 0, r.prompt_len));
    r.prefill_median_s = Median(pt);
    r.prefill_tok_s = b * r.prompt_len / r.prefill_median_s;
    // Decode: fill `context` tokens, then time single-token steps.
    std::vector<double> dt;
    for (int rep = 0; rep < a.reps; ++rep) {
      run.Step(b, 0, a.context);
      for (int s = 0; s < a.decode_steps; ++s) dt.push_back(run.Step(b, a.context + s, 1));
    }
    r.decode_step_median_s = Median(dt);
    r.decode_tok_s = b / r.decode_step_median_s;
    rows.push_back(r);
  }
  const double bound = bw / weight_bytes;
  std::printf(
      "model %s: dim %d, layers %d, heads %d/%d, hidden %d, vocab %d; weights %.1f MiB as stored\n",
      a.label.c_str(), c.dim, c.num_layers, c.num_heads, c.num_kv_heads, c.hidden_dim, c.vocab_size,
      weight_bytes / (1 << 20));
  std::printf(
      "GEMM %s (OpenBLAS core %s, %d thread(s)); copy bandwidth %.2f GB/s (read+write); "
      "decode bound at batch 1: %.1f tok/s\n",
      llama->gemm_name().c_str(), kvpush::BlasCoreName(), a.threads, bw / 1e9, bound);
  std::printf("%-6s %-8s %14s %14s %16s %14s\n", "batch", "prompt", "prefill tok/s", "decode tok/s",
              "decode step ms", "vs bound");
  for (const Row& r : rows) {
    std::printf("%-6d %-8d %14.1f %14.1f %16.3f %13.0f%%\n", r.batch, r.prompt_len, r.prefill_tok_s,
                r.decode_tok_s, r.decode_step_median_s * 1e3,
                r.batch == 1 ? 100.0 * r.decode_tok_s / bound : 0.0);
  }
  if (!a.json.empty()) {
    nlohmann::json j;
    j["model"] = a.label;
    j["model_path"] = a.model;
    j["executor"] = "LlamaExecutor (direct Execute() calls)";
    j["config"] = {{"dim", c.dim},
                   {"layers", c.num_layers},
                   {"heads", c.num_heads},
                   {"kv_heads", c.num_kv_heads},
                   {"hidden_dim", c.hidden_dim},
                   {"vocab", c.vocab_size}};
    j["weight_bytes_f32"] = weight_bytes;
    j["gemm"] = llama->gemm_name();
    j["gemm"] = llama->gemm_name();
    j["blas_core"] = kvpush::BlasCoreName();
    j["blas_threads"] = a.threads;
    j["copy_bandwidth_bytes_per_s"] = bw;
    j["decode_bound_tok_s_batch1"] = bound;
    j["reps"] = a.reps;
    j["decode_context"] = a.context;
    j["decode_steps_per_rep"] = a.decode_steps;
    for (const Row& r : rows) {
      j["results"].push_back({{"batch", r.batch},
                              {"prompt_len", r.prompt_len},
                              {"prefill_tok_s", r.prefill_tok_s},
                              {"prefill_median_s", r.prefill_median_s},
                              {"decode_tok_s", r.decode_tok_s},
                              {"decode_step_median_s", r.decode_step_median_s}});
    }
    std::ofstream(a.json) << j.dump(2) << "\n";
  }
  return 0;
}
