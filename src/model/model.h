// Loading a model: picks the format from the file, returns executor + tokenizer + config.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "model/executor.h"
#include "model/tokenizer.h"

namespace kvpush {

struct ModelLoadOptions {
  std::string path;            ///< .gguf, or llama2.c .bin checkpoint
  std::string tokenizer_path;  ///< llama2.c tokenizer (tok512.bin); default: beside the .bin
  int32_t max_context = 0;     ///< 0 = the model's context length
};

struct LoadedModel {
  ModelConfig config;
  std::unique_ptr<Executor> executor;
  std::unique_ptr<Tokenizer> tokenizer;
};

/// Loads a Llama-family model. Errors: kNotFound (file), kDataLoss (truncated/malformed file),
/// kUnimplemented (unsupported architecture, tensor type or tokenizer model, named).
Result<LoadedModel> LoadModel(const ModelLoadOptions& options);

}  // namespace kvpush
