// kvpush generate: offline generation through the engine (all prompts batched together), prints
// each prompt's generated text.
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "common/log.h"
#include "engine/engine.h"
#include "model/model.h"

namespace kvpush::apps {
namespace {

struct GenerateOptions {
  std::string model;
  std::string tokenizer;
  std::vector<std::string> prompts;
  int max_tokens = 256;
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = -1;
  int64_t seed = -1;
  bool ignore_eos = false;
  std::vector<std::string> stop;
  std::string log_level = "warn";
  EngineConfig engine;
};

int RunGenerate(GenerateOptions o) {
  if (Status s = InitLogging(o.log_level); !s.ok()) {
    std::fprintf(stderr, "kvpush generate: %s\n", s.ToString().c_str());
    return 2;
  }
  if (o.prompts.empty()) o.prompts.push_back("");
  ModelLoadOptions mo;
  mo.path = o.model;
  mo.tokenizer_path = o.tokenizer;
  auto loaded = LoadModel(mo);
  if (!loaded.ok()) {
    std::fprintf(stderr, "kvpush generate: loading %s: %s\n", o.model.c_str(),
                 loaded.status().ToString().c_str());
    return 1;
  }
  LoadedModel model = std::move(loaded).value();
  auto engine = Engine::Create(o.engine, std::move(model.executor), *model.tokenizer);
  if (!engine.ok()) {
    std::fprintf(stderr, "kvpush generate: %s\n", engine.status().message().c_str());
    return 2;
  }
  const uint64_t seed = o.seed >= 0 ? static_cast<uint64_t>(o.seed) : std::random_device{}();
  std::vector<Engine::Handle> handles;
  for (const std::string& p : o.prompts) {
    GenerationRequest r;
    r.prompt_tokens.push_back(model.tokenizer->bos_id());  // "" = BOS only
    auto enc = model.tokenizer->Encode(p);
    if (!enc.ok()) {
      std::fprintf(stderr, "kvpush generate: %s\n", enc.status().ToString().c_str());
      return 2;
    }
    r.prompt_tokens.insert(r.prompt_tokens.end(), enc->begin(), enc->end());
    r.max_tokens = o.max_tokens;
    r.sampling.temperature = o.temperature;
    r.sampling.top_p = o.top_p;
    r.sampling.top_k = o.top_k;
    r.sampling.seed = seed;
    r.ignore_eos = o.ignore_eos;
    r.stop = o.stop;
    auto h = (*engine)->Submit(std::move(r));
    if (!h.ok()) {
      std::fprintf(stderr, "kvpush generate: prompt \"%s\": %s\n", p.c_str(),
                   h.status().ToString().c_str());
      return 2;
    }
    handles.push_back(*h);
  }
  int rc = 0;
  for (size_t i = 0; i < handles.size(); ++i) {
    std::string text;
    RequestOutput last;
    while (!last.finished()) {
      auto out = handles[i].channel->Next(std::chrono::milliseconds(60000));
      if (!out) {
        std::fprintf(stderr, "kvpush generate: no output for 60 s\n");
        return 1;
      }
      text += out->text;
      last = std::move(*out);
    }
    if (last.finish_reason == FinishReason::kError || last.finish_reason == FinishReason::kAbort) {
      std::fprintf(stderr, "kvpush generate: prompt %zu failed: %s\n", i,
                   last.error.ToString().c_str());
      rc = 1;
      continue;
    }
    if (handles.size() > 1) std::printf("--- prompt %zu (%s)\n", i, o.prompts[i].c_str());
    std::printf("%s%s\n", o.prompts[i].c_str(), text.c_str());
    std::fprintf(stderr, "[%d prompt tokens, %d generated, finish_reason=%s]\n",
                 last.num_prompt_tokens, last.num_output_tokens,
                 std::string(FinishReasonName(last.finish_reason)).c_str());
  }
  return rc;
}

}  // namespace

void RegisterGenerateCommand(CLI::App& app) {
  auto opts = std::make_shared<GenerateOptions>();
  auto* cmd = app.add_subcommand("generate", "Generate text offline through the engine");
  cmd->add_option("--model", opts->model, "Model file (.gguf or llama2.c .bin)")->required();
  cmd->add_option("--tokenizer", opts->tokenizer, "llama2.c tokenizer (for a .bin model)");
  cmd->add_option("--prompt", opts->prompts, "Prompt text (repeatable; default: \"\" = BOS only)");
  cmd->add_option("--max-tokens", opts->max_tokens, "Tokens to generate per prompt")
      ->capture_default_str();
  cmd->add_option("--temperature", opts->temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-p", opts->top_p, "Nucleus sampling mass")->capture_default_str();
  cmd->add_option("--top-k", opts->top_k, "Top-k (-1 = off)")->capture_default_str();
  cmd->add_option("--seed", opts->seed, "Sampling seed (default: random)");
  cmd->add_flag("--ignore-eos", opts->ignore_eos, "Keep generating past EOS");
  cmd->add_option("--stop", opts->stop, "Stop string (repeatable)");
  cmd->add_option("--block-size", opts->engine.block_size, "Tokens per KV block")
      ->capture_default_str();
  cmd->add_option("--num-kv-blocks", opts->engine.num_kv_blocks, "KV blocks in the pool");
  cmd->add_option("--max-num-batched-tokens", opts->engine.max_num_batched_tokens,
                  "Token budget per step")
      ->capture_default_str();
  cmd->add_option("--max-model-len", opts->engine.max_model_len, "Max prompt + output tokens");
  cmd->add_option("--log-level", opts->log_level, "trace|debug|info|warn|error|off")
      ->capture_default_str();
  cmd->callback([opts] {
    int rc = RunGenerate(*opts);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace kvpush::apps
