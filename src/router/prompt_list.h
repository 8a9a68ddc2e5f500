// A completion request whose `prompt` is a list (a batch): the router runs each prompt as its own
// P/D request and merges the answers back as a colocated instance gives them (docs/router.md,
// "Lists of prompts"). Pure functions over JSON, no I/O.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvpush::router {

/// True when `body` (a /v1/completions body) carries a list of prompts the router splits:
/// `prompt` is a non-empty array whose elements are all non-empty strings or non-empty arrays of
/// integer token ids in [0, 2^31) (vLLM's batch forms; one array of ids is a single prompt). Any
/// other shape is not split: the instance's parser then refuses it with the words it gives
/// colocated.
bool IsPromptList(const nlohmann::json& body);

/// One body per prompt of a list (IsPromptList(body)), in order: `body` with `prompt` replaced by
/// that prompt; every other field, the minted `seed` included, is kept.
std::vector<nlohmann::json> SplitPromptList(const nlohmann::json& body);

/// Choices per prompt: `n` when it is an integer >= 1, else 1 (the instances refuse other
/// values before any choice is produced).
int64_t ChoicesPerPrompt(const nlohmann::json& body);

/// Sums OpenAI `usage` objects: prompt, completion and total tokens, and
/// `prompt_tokens_details.cached_tokens` when any part has it (as a colocated instance sums
/// them over the prompts of a list). Value type.
class UsageSum {
 public:
  /// Adds one answer's `usage` (ignored when it is not an object).
  void Add(const nlohmann::json& usage);
  /// The summed `usage` object.
  nlohmann::json ToJson() const;

 private:
  int64_t prompt_ = 0, completion_ = 0, total_ = 0, cached_ = 0;
  bool has_cached_ = false;
};

/// Merges the non-streamed answers of a list's prompts (`answers[i]`: prompt i's body, each a
/// 200 answer) into the one a colocated instance gives: prompt 0's body with `id` = `id`, every
/// choice in prompt order with `index` = i * n + its index, and `usage` summed.
nlohmann::json MergeAnswers(const std::vector<nlohmann::json>& answers, const std::string& id,
                            int64_t n);

/// True for a streamed chunk that carries only usage (`{"choices": [], "usage": {...}}`).
bool IsUsageChunk(const nlohmann::json& chunk);

/// Rewrites one streamed chunk of prompt `prompt` in place: `id` = `id`, every choice's `index`
/// offset by prompt * n.
void RewriteChunk(nlohmann::json& chunk, const std::string& id, int64_t prompt, int64_t n);

/// The JSON of an SSE event's data (SseEventData: its `data:` lines joined), or a discarded value
/// when it has none or it is not JSON.
nlohmann::json ParseSseData(const std::string& event);

/// `data: <json>` + blank line, dumped as the instances dump (invalid UTF-8 replaced).
std::string SseEvent(const nlohmann::json& data);

}  // namespace kvpush::router
