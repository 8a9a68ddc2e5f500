// libFuzzer target: the router's handling of a list of prompts (src/router/prompt_list.h): the
// client's /v1/completions body it splits, and the instances' answers and stream chunks it merges
// back (their `choices[].index` and `usage` are the instances' numbers).
// Input: a prompt index byte, a choices-per-prompt byte (n = 1..128, what the instances accept),
// then JSON text, checked as given and with one of its numbers replaced by a boundary value
// (json_boundary.h). Asserted:
//   * ChoicesPerPrompt >= 1; IsPromptList bodies split into one body per prompt, in order, each
//     the client's body with only `prompt` replaced;
//   * RewriteChunk gives every object choice the index prompt * n + its own, when that is an
//     int64; UsageSum and MergeAnswers over any answers finish without undefined behaviour (UBSan:
//     no signed overflow) and give an object.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "json_boundary.h"
#include "router/prompt_list.h"

using namespace kvpush::router;
using nlohmann::json;

namespace {

void Run(const json& j, int64_t prompt, int64_t n) {
  Check(ChoicesPerPrompt(j) >= 1);
  if (IsPromptList(j)) {
    const std::vector<json> bodies = SplitPromptList(j);
    Check(bodies.size() == j["prompt"].size());
    for (size_t i = 0; i < bodies.size(); ++i) {
      Check(bodies[i]["prompt"] == j["prompt"][i]);
      json rest = bodies[i];
      rest["prompt"] = j["prompt"];
      Check(rest == j);
    }
  }

  json chunk = j;
  (void)IsUsageChunk(chunk);
  RewriteChunk(chunk, "cmpl-fuzz", prompt, n);
  if (j.is_object() && j.contains("choices") && j["choices"].is_array()) {
    const json& before = j["choices"];
    const json& after = chunk["choices"];
    Check(after.size() == before.size());
    for (size_t i = 0; i < before.size(); ++i) {
      if (!before[i].is_object()) continue;
      int64_t own = 0;
      const auto it = before[i].find("index");
      if (it != before[i].end() && it->is_number_integer()) {
        if (it->is_number_unsigned() && it->get<uint64_t>() > INT64_MAX) continue;
        own = it->get<int64_t>();
      }
      int64_t want = 0;
      if (__builtin_add_overflow(prompt * n, own, &want)) continue;
      Check(after[i]["index"] == want);
    }
  }

  UsageSum usage;
  for (int i = 0; i < 3; ++i) usage.Add(j.is_object() && j.contains("usage") ? j["usage"] : j);
  Check(usage.ToJson().is_object());
  if (j.is_object()) Check(MergeAnswers({j, j, j}, "cmpl-fuzz", n).is_object());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int64_t prompt = data[0];
  const int64_t n = 1 + data[1] % 128;
  const json j = json::parse(data + 2, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  Run(j, prompt, n);
  Run(kvpush::fuzz::WithBoundaryNumber(j, kvpush::fuzz::BoundarySeed(data, size)), prompt, n);
  return 0;
}
