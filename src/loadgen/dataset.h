// Benchmark datasets of `kvpush bench` (docs/bench.md): the synthetic `random` dataset and
// ShareGPT-format JSON, following vLLM's vllm/benchmarks/datasets.py (RandomDataset,
// ShareGPTDataset). Pure functions of their options: no I/O except reading the ShareGPT file.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kvpush::loadgen {

/// One request to send. `prompt` is a JSON string (text) or an array of token ids.
struct SampleRequest {
  nlohmann::json prompt;
  int64_t prompt_len = 0;           ///< tokens: exact for `random`, estimated for ShareGPT
  int64_t expected_output_len = 0;  ///< tokens; sent as max_tokens
};

/// Options of the `random` dataset (vLLM flag names in comments).
struct RandomDatasetOptions {
  int64_t num_prompts = 1000;  ///< --num-prompts
  int64_t input_len = 1024;    ///< --random-input-len: tokens after the shared prefix
  int64_t output_len = 128;    ///< --random-output-len
  int64_t prefix_len = 0;      ///< --random-prefix-len: tokens shared by every prompt
  double range_ratio = 0.0;    ///< --random-range-ratio, in [0, 1)
  int32_t vocab_size = 512;    ///< --random-vocab-size (kvpush): ids are drawn below this
  int32_t first_token_id = 3;  ///< lowest id drawn (0..2 are unk/BOS/EOS in Llama vocabularies)
  uint64_t seed = 0;           ///< --seed
};

/// Inclusive bounds of the sampled lengths, as vLLM's RandomDataset.get_sampling_params:
/// [floor(len·(1−r)), ceil(len·(1+r))], the output's lower bound at least 1.
struct LengthRange {
  int64_t low = 0;
  int64_t high = 0;
};
LengthRange InputLengthRange(const RandomDatasetOptions& o);
LengthRange OutputLengthRange(const RandomDatasetOptions& o);

/// The `random` dataset: prompts are token-id lists (sent as `prompt: [ids]`, so each input
/// length is exact: prefix_len + a length drawn uniformly from InputLengthRange). Every prompt
/// starts with the same prefix_len random ids; the rest is vLLM's reproducible sequence
/// allowed[(offset + i + j) mod |allowed|] with a random offset per request. Deterministic in
/// the options (std::mt19937_64 seeded with `seed`; not numpy's generator, so the ids differ from
/// vLLM's for the same seed). Errors: kInvalidArgument for out-of-range options.
Result<std::vector<SampleRequest>> SampleRandomDataset(const RandomDatasetOptions& o);

/// Options of the ShareGPT dataset.
struct ShareGptOptions {
  std::string path;              ///< --dataset-path: JSON array of {"conversations": [...]}
  int64_t num_prompts = 1000;    ///< --num-prompts
  int64_t output_len = -1;       ///< --sharegpt-output-len; -1: from the reply's length
  uint64_t seed = 0;             ///< --seed: shuffle order and oversampling
  double chars_per_token = 4.0;  ///< --sharegpt-chars-per-token (kvpush): the token estimate
};

/// Token count estimate used for ShareGPT without a tokenizer: ceil(bytes / chars_per_token),
/// at least 1 for non-empty text.
int64_t EstimateTokens(std::string_view text, double chars_per_token);

/// vLLM's is_valid_sequence with its defaults: prompt ≥ 4 tokens, output ≥ 4 (unless the output
/// length is fixed), prompt ≤ 1024, prompt + output ≤ 2048.
bool IsValidSequence(int64_t prompt_len, int64_t output_len, bool fixed_output_len);

/// ShareGPT: entries with ≥ 2 turns, shuffled with `seed`; the first turn is the prompt text,
/// the second the reply whose estimated length becomes max_tokens (or output_len when ≥ 0);
/// filtered with IsValidSequence on estimated lengths; oversampled (random repeats) when too
/// few remain, as vLLM. `parsed` is the file's JSON. Errors: kInvalidArgument (bad format, no
/// valid entry).
Result<std::vector<SampleRequest>> SampleShareGpt(const nlohmann::json& parsed,
                                                  const ShareGptOptions& o);

/// Reads and parses o.path, then SampleShareGpt. Errors: kIoError, kInvalidArgument.
Result<std::vector<SampleRequest>> LoadShareGptDataset(const ShareGptOptions& o);

}  // namespace kvpush::loadgen
