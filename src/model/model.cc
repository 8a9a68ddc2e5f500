// LoadModel / LoadModelFromGgufBytes (declared in model/model.h).
#include "model/model.h"

#include <cstring>
#include <filesystem>

#include "model/bpe_tokenizer.h"
#include "model/gguf.h"
#include "model/llama2c.h"
#include "model/llama_executor.h"
#include "model/mapped_file.h"
#include "model/spm_tokenizer.h"

namespace kvpush {

namespace {

std::string Stem(const std::string& path) {
  return std::filesystem::path(path).stem().string();
}

Result<LoadedModel> Finish(LlamaWeights weights, std::unique_ptr<Tokenizer> tokenizer,
                           const ModelLoadOptions& options) {
  if (tokenizer->vocab_size() != weights.config.vocab_size) {
    return DataLoss("tokenizer has " + std::to_string(tokenizer->vocab_size()) +
                    " tokens, the model " + std::to_string(weights.config.vocab_size));
  }
  if (weights.config.name.empty()) weights.config.name = Stem(options.path);
  LlamaExecutorOptions eo;
  eo.max_context = options.max_context;
  eo.blas_threads = options.blas_threads;
  eo.gemm = options.gemm;
  eo.quant_math = options.quant_math;
  eo.threads = options.threads;
  eo.cpus = options.cpus;
  KVP_ASSIGN_OR_RETURN(auto executor, LlamaExecutor::Create(std::move(weights), eo));
  LoadedModel m;
  m.config = executor->config();
  m.executor = std::move(executor);
  m.tokenizer = std::move(tokenizer);
  return m;
}

Result<LoadedModel> FromGguf(const GgufFile& file, const ModelLoadOptions& options) {
  KVP_ASSIGN_OR_RETURN(LlamaWeights weights, LoadLlamaWeightsFromGguf(file));
  KVP_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, TokenizerFromGguf(file));
  if (tok->bos_id() != weights.config.bos_id || tok->eos_id() != weights.config.eos_id) {
    return Internal("tokenizer and model disagree on BOS/EOS");
  }
  KVP_ASSIGN_OR_RETURN(LoadedModel m, Finish(std::move(weights), std::move(tok), options));
  if (auto t = file.GetString("tokenizer.chat_template"); t.ok()) m.chat_template = *t;
  return m;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> TokenizerFromGguf(const GgufFile& file) {
  KVP_ASSIGN_OR_RETURN(std::string model, file.GetString("tokenizer.ggml.model"));
  if (model == "gpt2") {
    KVP_ASSIGN_OR_RETURN(std::unique_ptr<BpeTokenizer> bpe, BpeTokenizer::FromGguf(file));
    return std::unique_ptr<Tokenizer>(std::move(bpe));
  }
  KVP_ASSIGN_OR_RETURN(std::unique_ptr<SpmTokenizer> spm, SpmTokenizer::FromGguf(file));
  return std::unique_ptr<Tokenizer>(std::move(spm));
}

Result<LoadedModel> LoadModelFromGgufBytes(std::span<const uint8_t> bytes,
                                           const ModelLoadOptions& options) {
  KVP_ASSIGN_OR_RETURN(GgufFile file, GgufFile::Parse(bytes));
  return FromGguf(file, options);
}

Result<LoadedModel> LoadModel(const ModelLoadOptions& options) {
  KVP_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> map, MappedFile::Open(options.path));
  const auto bytes = map->bytes();
  if (bytes.size() >= 4 && std::memcmp(bytes.data(), "GGUF", 4) == 0) {
    // Opened by path so that the weights use the mapping in place (and keep it alive).
    map.reset();
    auto file = GgufFile::Open(options.path);
    if (!file.ok()) return file.status();
    auto m = FromGguf(*file, options);
    if (!m.ok()) return m.status().WithContext(options.path);
    return m;
  }
  auto weights = ParseLlama2cCheckpoint(bytes);
  if (!weights.ok()) return weights.status().WithContext(options.path);
  std::string tok_path = options.tokenizer_path;
  if (tok_path.empty()) {
    const auto dir = std::filesystem::path(options.path).parent_path();
    for (const std::string& name : {"tok" + std::to_string(weights->config.vocab_size) + ".bin",
                                    std::string("tokenizer.bin")}) {
      if (std::filesystem::exists(dir / name)) {
        tok_path = (dir / name).string();
        break;
      }
    }
    if (tok_path.empty()) {
      return NotFound("no tokenizer for llama2.c checkpoint '" + options.path +
                      "' (looked for tok" + std::to_string(weights->config.vocab_size) +
                      ".bin and tokenizer.bin beside it; pass tokenizer_path)");
    }
  }
  KVP_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> tmap, MappedFile::Open(tok_path));
  auto tok = ParseLlama2cTokenizer(tmap->bytes(), weights->config.vocab_size);
  if (!tok.ok()) return tok.status().WithContext(tok_path);
  return Finish(std::move(*weights), std::move(*tok), options);
}

}  // namespace kvpush
