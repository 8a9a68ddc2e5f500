// kvpush gen-model: writes a GGUF v3 with seeded random weights of one architecture (--arch
// llama (Llama 2 shaped, the default), llama3, qwen2, qwen3; src/model/random_model.h) and a usable
// SentencePiece vocabulary, or a real byte-level BPE vocabulary read from a HF tokenizer.json of
// that family (--vocab-from), then loads it back.
#include <chrono>
#include <cstdio>
#include <string>

#include "apps/commands.h"
#include "model/model.h"
#include "model/random_model.h"

namespace kvpush::apps {

namespace {

struct GenModelArgs {
  RandomLlamaOptions model;
  std::string dtype = "f32";
  std::string out = "kvpush-random.gguf";
  bool tied = false;
  std::string arch;             ///< llama (default), llama3, qwen2, qwen3: weights and vocab family
  std::string vocab_from;       ///< HF tokenizer.json
  float rope_freq_base = 0.0f;  ///< 0 = the family's (10000, llama3 500000, qwen 1000000)
};

int RunGenModel(GenModelArgs& a) {
  if (a.dtype == "f32") {
    a.model.dtype = GgmlType::kF32;
  } else if (a.dtype == "f16") {
    a.model.dtype = GgmlType::kF16;
  } else if (a.dtype == "bf16") {
    a.model.dtype = GgmlType::kBF16;
  } else if (a.dtype == "q8_0") {
    a.model.dtype = GgmlType::kQ8_0;
  } else if (a.dtype == "q4_k") {
    a.model.dtype = GgmlType::kQ4_K;
  } else if (a.dtype == "q6_k") {
    a.model.dtype = GgmlType::kQ6_K;
  } else {
    std::fprintf(stderr, "kvpush gen-model: --dtype must be f32, f16, bf16, q8_0, q4_k or q6_k\n");
    return 2;
  }
  a.model.tied_output = a.tied;
  const auto t0 = std::chrono::steady_clock::now();
  HfVocab hf;
  a.model.arch = a.arch.empty() ? "llama" : a.arch;
  if (!a.vocab_from.empty()) {
    if (a.arch.empty() || a.arch == "llama") {
      std::fprintf(stderr, "kvpush gen-model: --vocab-from needs --arch qwen3, qwen2 or llama3\n");
      return 2;
    }
    auto read = ReadHfTokenizerJson(a.vocab_from, a.arch);
    if (!read.ok()) {
      std::fprintf(stderr, "kvpush gen-model: %s\n", read.status().ToString().c_str());
      return 2;
    }
    hf = std::move(*read);
    a.model.bpe_vocab = &hf;
  }
  a.model.rope_freq_base = a.rope_freq_base > 0.0f    ? a.rope_freq_base
                           : a.model.arch == "llama3" ? 500000.0f
                           : a.model.arch == "llama"  ? 10000.0f
                                                      : 1000000.0f;
  auto writer = BuildRandomLlamaGguf(a.model);
  if (!writer.ok()) {
    std::fprintf(stderr, "kvpush gen-model: %s\n", writer.status().ToString().c_str());
    return 2;
  }
  if (Status s = writer->WriteFile(a.out); !s.ok()) {
    std::fprintf(stderr, "kvpush gen-model: %s\n", s.ToString().c_str());
    return 1;
  }
  ModelLoadOptions lo;
  lo.path = a.out;
  auto loaded = LoadModel(lo);
  if (!loaded.ok()) {
    std::fprintf(stderr, "kvpush gen-model: wrote %s but cannot load it back: %s\n", a.out.c_str(),
                 loaded.status().ToString().c_str());
    return 1;
  }
  const ModelConfig& c = loaded->config;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "wrote %s: %s%s, dim %d, layers %d, heads %d/%d kv, head_dim %d, hidden %d, vocab %d, "
      "context %d, dtype %s, seed %llu, fingerprint %016llx (%.1f s)\n",
      a.out.c_str(), a.model.arch.c_str(),
      a.vocab_from.empty() ? "" : (", " + a.arch + " vocabulary (" + hf.vocab.pre + ")").c_str(),
      c.dim, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.hidden_dim, c.vocab_size,
      c.context_length, a.dtype.c_str(), static_cast<unsigned long long>(a.model.seed),
      static_cast<unsigned long long>(c.fingerprint), secs);
  return 0;
}

}  // namespace

void RegisterGenModelCommand(CLI::App& app) {
  auto args = std::make_shared<GenModelArgs>();
  auto* cmd = app.add_subcommand(
      "gen-model",
      "Write a llama/llama3/qwen2/qwen3 GGUF with seeded random weights (for benchmarks/tests)");
  RandomLlamaOptions& m = args->model;
  cmd->add_option("--dim", m.dim, "embedding length")->capture_default_str();
  cmd->add_option("--layers", m.layers, "transformer blocks")->capture_default_str();
  cmd->add_option("--heads", m.heads, "query heads")->capture_default_str();
  cmd->add_option("--kv-heads", m.kv_heads, "KV heads (GQA)")->capture_default_str();
  cmd->add_option("--head-dim", m.head_dim, "per-head dim (attention.key_length); 0 = dim / heads")
      ->capture_default_str();
  cmd->add_option("--rope-freq-base", args->rope_freq_base,
                  "RoPE base; 0 = the architecture's (llama 10000, llama3 500000, qwen 1000000)")
      ->capture_default_str();
  cmd->add_option("--hidden-dim", m.hidden_dim, "FFN hidden size")->capture_default_str();
  cmd->add_option("--vocab", m.vocab, "vocabulary size (>= 355)")->capture_default_str();
  cmd->add_option("--context", m.context, "context length")->capture_default_str();
  cmd->add_option(
         "--dtype", args->dtype,
         "weight storage of the matrices: f32, f16, bf16, q8_0, q4_k, q6_k (norms stay f32)")
      ->capture_default_str();
  cmd->add_option("--seed", m.seed, "random seed")->capture_default_str();
  cmd->add_option("--name", m.name, "general.name")->capture_default_str();
  cmd->add_flag("--tied", args->tied, "no output.weight (classifier tied to the embedding)");
  cmd->add_option("--out", args->out, "output path")->capture_default_str();
  cmd->add_option(
      "--arch", args->arch,
      "architecture: llama (Llama 2 shaped, default), llama3 (rope_freqs), qwen2 "
      "(Q/K/V biases) or qwen3 (q/k norms); also the vocabulary family of --vocab-from");
  cmd->add_option("--vocab-from", args->vocab_from,
                  "HF tokenizer.json (byte-level BPE) whose vocabulary, merges and added tokens "
                  "the GGUF carries; tokenizer_config.json beside it is read too");
  cmd->callback([args] {
    const int rc = RunGenModel(*args);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace kvpush::apps
