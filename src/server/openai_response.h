// Building OpenAI response bodies and SSE chunks from engine outputs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/request.h"
#include "model/tokenizer.h"
#include "server/openai_request.h"

namespace kvpush::server {

/// Identity shared by every chunk of one response.
struct ResponseMeta {
  ApiKind kind = ApiKind::kCompletion;
  std::string id;       ///< "cmpl-..." / "chatcmpl-..." or the client's x-request-id
  int64_t created = 0;  ///< Unix seconds
  std::string model;
  bool logprobs = false;   ///< include logprobs objects
  bool token_ids = false;  ///< include "token_ids" per choice (vLLM's return_token_ids)
  /// OpenAI `system_fingerprint` of every body and chunk: "fp_" + 16 hex digits of the model
  /// fingerprint, so equal on every instance serving the same weights (colocated, P, D).
  std::string system_fingerprint;
  /// `usage.prompt_tokens_details.cached_tokens` (vLLM's --enable-prompt-tokens-details).
  bool prompt_tokens_details = false;
};

/// Token counts of a response (`usage`).
struct UsageCounts {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  ///< prompt tokens this instance's prefix cache served
};

/// The prompt's part of a completion choice's `logprobs` (echo with logprobs, vLLM): the
/// prompt's token ids and the logprobs of tokens 1.. (RequestOutput::prompt_logprobs; the first
/// token has none: null logprob and top_logprobs).
struct PromptLogprobs {
  std::vector<int32_t> ids;
  std::vector<TokenOutput> scored;  ///< scored[i] is ids[i + 1]; missing entries print as null
};

/// Everything one choice produced (accumulated from RequestOutputs).
struct ChoiceResult {
  std::string text;
  std::vector<TokenOutput> tokens;
  FinishReason finish = FinishReason::kNone;
  std::string stop_reason;
  int32_t stop_token_id = -1;  ///< a stop_token_ids entry that ended it (`stop_reason` = the id)
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t cached_tokens = 0;
  /// The first choice of its prompt: its prompt counts in usage (n > 1 samples of one prompt
  /// count the prompt once, as vLLM does).
  bool counts_prompt = true;
  /// Echo with logprobs (completions): the prompt's part, which leads the choice's logprobs.
  /// Empty ids: none.
  PromptLogprobs prompt;
};

/// Usage summed over `choices` (prompts counted once, see ChoiceResult::counts_prompt).
UsageCounts SumUsage(const std::vector<ChoiceResult>& choices);

/// "stop" / "length" (kAbort and kError never reach a 200 response body).
std::string FinishReasonString(FinishReason r);

/// Non-streaming body (text_completion or chat.completion) with usage summed over choices.
std::string BuildResponse(const ResponseMeta& meta, const std::vector<ChoiceResult>& choices,
                          const Tokenizer& tokenizer);

/// One SSE event "data: {...}\n\n" for choice `index` carrying `text` and the logprobs of
/// `tokens`; `finish` != kNone adds finish_reason and stop_reason (`stop_token_id` >= 0: that
/// id, else `stop_reason` or null). `first` (chat) adds role "assistant". `usage_null` adds
/// "usage": null (stream_options.include_usage). `prompt` (completions, echo with logprobs: the
/// choice's first event) leads the logprobs, and the text offsets of `tokens` continue after it.
std::string BuildStreamChunk(const ResponseMeta& meta, int index, const std::string& text,
                             const std::vector<TokenOutput>& tokens, FinishReason finish,
                             const std::string& stop_reason, int32_t stop_token_id, bool first,
                             bool usage_null, const Tokenizer& tokenizer,
                             const PromptLogprobs* prompt = nullptr);

/// A P/D prefill instance's `prompt_echo` for a completion with echo and logprobs (JSON object
/// text): {"text": `echo_text`, "logprobs": the prompt's part of the choice logprobs
/// ({tokens, token_logprobs, top_logprobs, text_offset}, offsets from 0), "text_offset_end":
/// the offset where the generated tokens' text_offset continues}. The router puts it before
/// D's choices (docs/router.md, "Echo with logprobs").
std::string BuildPromptEcho(const std::string& echo_text, const PromptLogprobs& prompt,
                            const Tokenizer& tokenizer);

/// The final usage event (choices: []) for include_usage.
std::string BuildUsageChunk(const ResponseMeta& meta, const UsageCounts& usage);

}  // namespace kvpush::server
