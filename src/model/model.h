// Loading a model: picks the format from the file, returns executor + tokenizer + config.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/executor.h"
#include "model/gemm.h"
#include "model/tokenizer.h"

namespace kvpush {

struct ModelLoadOptions {
  std::string path;            ///< .gguf, or llama2.c .bin checkpoint
  std::string tokenizer_path;  ///< llama2.c tokenizer (tok512.bin); default: beside the .bin
  int32_t max_context = 0;     ///< 0 = the model's context length
  int32_t blas_threads = 1;    ///< OpenBLAS threads (process-global; kOpenBlasTiles only)
  GemmBackend gemm = GemmBackend::kFixedOrder;  ///< linear-layer kernel (model/gemm.h)
  QuantMath quant_math = QuantMath::kInt8;      ///< Q8_0 / Q4_K / Q6_K arithmetic (model/gemm.h)
  int32_t threads = 1;  ///< executor GEMM threads, caller included (LlamaExecutorOptions::threads)
  std::vector<int> cpus;  ///< empty, or one CPU per thread to bind (LlamaExecutorOptions::cpus)
};

struct LoadedModel {
  ModelConfig config;
  std::unique_ptr<Executor> executor;
  std::unique_ptr<Tokenizer> tokenizer;
  /// The model's Jinja chat template (GGUF tokenizer.chat_template); "" when it has none.
  std::string chat_template;
};

/// Loads a Llama-family model. The format is picked from the file's first bytes ("GGUF" magic, else
/// a llama2.c checkpoint). For a llama2.c checkpoint without tokenizer_path, the tokenizer is
/// looked up beside it as tok<vocab_size>.bin, then tokenizer.bin.
/// Errors: kNotFound (file), kDataLoss (truncated/malformed file),
/// kUnimplemented (unsupported architecture, tensor type or tokenizer model, named).
Result<LoadedModel> LoadModel(const ModelLoadOptions& options);

class GgufFile;

/// The tokenizer a GGUF file declares: tokenizer.ggml.model "gpt2" -> BpeTokenizer (byte-level
/// BPE), otherwise SpmTokenizer ("llama"; other names are refused there, kUnimplemented, named).
/// Errors: those of BpeTokenizer::FromGguf / SpmTokenizer::FromGguf.
Result<std::unique_ptr<Tokenizer>> TokenizerFromGguf(const GgufFile& file);

/// Loads a GGUF model from memory (`bytes` need not outlive the result: weights are copied).
/// options.path is only used as the display name. Errors: as LoadModel.
Result<LoadedModel> LoadModelFromGgufBytes(std::span<const uint8_t> bytes,
                                           const ModelLoadOptions& options);

}  // namespace kvpush
