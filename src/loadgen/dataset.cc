#include "loadgen/dataset.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <sstream>

namespace kvpush::loadgen {

LengthRange InputLengthRange(const RandomDatasetOptions& o) {
  const auto len = static_cast<double>(o.input_len);
  return {static_cast<int64_t>(std::floor(len * (1.0 - o.range_ratio))),
          static_cast<int64_t>(std::ceil(len * (1.0 + o.range_ratio)))};
}

LengthRange OutputLengthRange(const RandomDatasetOptions& o) {
  const auto len = static_cast<double>(o.output_len);
  LengthRange r{static_cast<int64_t>(std::floor(len * (1.0 - o.range_ratio))),
                static_cast<int64_t>(std::ceil(len * (1.0 + o.range_ratio)))};
  r.low = std::max<int64_t>(r.low, 1);
  r.high = std::max<int64_t>(r.high, 1);
  return r;
}

namespace {

Status ValidateRandom(const RandomDatasetOptions& o) {
  if (o.num_prompts < 1) return InvalidArgument("--num-prompts must be >= 1");
  if (o.input_len < 0 || o.output_len < 1 || o.prefix_len < 0) {
    return InvalidArgument(
        "--random-input-len and --random-prefix-len must be >= 0, --random-output-len >= 1");
  }
  if (!(o.range_ratio >= 0.0 && o.range_ratio < 1.0)) {
    return InvalidArgument("--random-range-ratio must be in [0, 1)");
  }
  if (o.first_token_id < 0 || o.vocab_size <= o.first_token_id) {
    return InvalidArgument("--random-vocab-size must be greater than " +
                           std::to_string(o.first_token_id));
  }
  if (o.prefix_len + InputLengthRange(o).low < 1) {
    return InvalidArgument(
        "--random-input-len is too small: the shortest prompt (prefix + sampled) would be empty");
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<SampleRequest>> SampleRandomDataset(const RandomDatasetOptions& o) {
  KVP_RETURN_IF_ERROR(ValidateRandom(o));
  std::mt19937_64 rng(o.seed);
  const int64_t allowed = o.vocab_size - o.first_token_id;
  std::uniform_int_distribution<int64_t> any_id(0, allowed - 1);
  std::vector<int32_t> prefix(static_cast<size_t>(o.prefix_len));
  for (auto& id : prefix) id = static_cast<int32_t>(o.first_token_id + any_id(rng));

  const LengthRange in = InputLengthRange(o);
  const LengthRange out = OutputLengthRange(o);
  std::uniform_int_distribution<int64_t> in_len(in.low, in.high);
  std::uniform_int_distribution<int64_t> out_len(out.low, out.high);
  const auto n = static_cast<size_t>(o.num_prompts);
  std::vector<int64_t> in_lens(n), out_lens(n), offsets(n);
  // Drawn in vLLM's order: all input lengths, all output lengths, all offsets.
  for (auto& v : in_lens) v = in_len(rng);
  for (auto& v : out_lens) v = out_len(rng);
  for (auto& v : offsets) v = any_id(rng);

  std::vector<SampleRequest> requests(n);
  for (size_t i = 0; i < n; ++i) {
    std::vector<int32_t> ids = prefix;
    ids.reserve(prefix.size() + static_cast<size_t>(in_lens[i]));
    for (int64_t j = 0; j < in_lens[i]; ++j) {
      const int64_t k = (offsets[i] + static_cast<int64_t>(i) + j) % allowed;
      ids.push_back(static_cast<int32_t>(o.first_token_id + k));
    }
    requests[i].prompt_len = static_cast<int64_t>(ids.size());
    requests[i].prompt = std::move(ids);
    requests[i].expected_output_len = out_lens[i];
  }
  return requests;
}

int64_t EstimateTokens(std::string_view text, double chars_per_token) {
  if (text.empty()) return 0;
  const auto est =
      static_cast<int64_t>(std::ceil(static_cast<double>(text.size()) / chars_per_token));
  return std::max<int64_t>(est, 1);
}

bool IsValidSequence(int64_t prompt_len, int64_t output_len, bool fixed_output_len) {
  constexpr int64_t kMinLen = 4, kMaxPromptLen = 1024, kMaxTotalLen = 2048;
  if (prompt_len < kMinLen) return false;
  if (!fixed_output_len && output_len < kMinLen) return false;
  if (prompt_len > kMaxPromptLen) return false;
  return prompt_len + output_len <= kMaxTotalLen;
}

namespace {

// The text of turn `i` of a ShareGPT entry, or nullptr when absent or not a string.
const nlohmann::json* TurnText(const nlohmann::json& entry, size_t i) {
  if (!entry.is_object()) return nullptr;
  auto c = entry.find("conversations");
  if (c == entry.end() || !c->is_array() || c->size() <= i) return nullptr;
  const auto& turn = (*c)[i];
  if (!turn.is_object()) return nullptr;
  auto v = turn.find("value");
  return v != turn.end() && v->is_string() ? &*v : nullptr;
}

}  // namespace

Result<std::vector<SampleRequest>> SampleShareGpt(const nlohmann::json& parsed,
                                                  const ShareGptOptions& o) {
  if (!parsed.is_array()) {
    return InvalidArgument("ShareGPT file must hold a JSON array of {\"conversations\": [...]}");
  }
  if (o.num_prompts < 1) return InvalidArgument("--num-prompts must be >= 1");
  if (!(o.chars_per_token > 0)) return InvalidArgument("--sharegpt-chars-per-token must be > 0");
  std::vector<const nlohmann::json*> entries;
  for (const auto& e : parsed) {
    if (TurnText(e, 0) != nullptr && TurnText(e, 1) != nullptr) entries.push_back(&e);
  }
  std::mt19937_64 rng(o.seed);
  std::shuffle(entries.begin(), entries.end(), rng);

  std::vector<SampleRequest> out;
  const bool fixed = o.output_len >= 0;
  for (const auto* e : entries) {
    if (static_cast<int64_t>(out.size()) >= o.num_prompts) break;
    const auto& prompt = TurnText(*e, 0)->get_ref<const std::string&>();
    const auto& reply = TurnText(*e, 1)->get_ref<const std::string&>();
    const int64_t prompt_len = EstimateTokens(prompt, o.chars_per_token);
    const int64_t output_len = fixed ? o.output_len : EstimateTokens(reply, o.chars_per_token);
    if (!IsValidSequence(prompt_len, output_len, fixed)) continue;
    out.push_back({prompt, prompt_len, std::max<int64_t>(output_len, 1)});
  }
  if (out.empty()) return InvalidArgument("no ShareGPT entry passed the length filter");
  const size_t valid = out.size();
  std::uniform_int_distribution<size_t> pick(0, valid - 1);
  while (static_cast<int64_t>(out.size()) < o.num_prompts) out.push_back(out[pick(rng)]);
  return out;
}

Result<std::vector<SampleRequest>> LoadShareGptDataset(const ShareGptOptions& o) {
  std::ifstream f(o.path, std::ios::binary);
  if (!f) return IoError("cannot open --dataset-path '" + o.path + "'");
  std::stringstream ss;
  ss << f.rdbuf();
  auto j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument("--dataset-path '" + o.path + "' is not JSON");
  auto r = SampleShareGpt(j, o);
  if (!r.ok()) return r.status().WithContext(o.path);
  return r;
}

}  // namespace kvpush::loadgen
