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
};

/// Everything one choice produced (accumulated from RequestOutputs).
struct ChoiceResult {
  std::string text;
  std::vector<TokenOutput> tokens;
  FinishReason finish = FinishReason::kNone;
  std::string stop_reason;
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
};

/// "stop" / "length" (kAbort and kError never reach a 200 response body).
std::string FinishReasonString(FinishReason r);

/// Non-streaming body (text_completion or chat.completion) with usage summed over choices.
std::string BuildResponse(const ResponseMeta& meta, const std::vector<ChoiceResult>& choices,
                          const Tokenizer& tokenizer);

/// One SSE event "data: {...}\n\n" for choice `index` carrying `text` and the logprobs of
/// `tokens`; `finish` != kNone adds finish_reason. `first` (chat) adds role "assistant".
/// `usage_null` adds "usage": null (stream_options.include_usage).
std::string BuildStreamChunk(const ResponseMeta& meta, int index, const std::string& text,
                             const std::vector<TokenOutput>& tokens, FinishReason finish,
                             const std::string& stop_reason, bool first, bool usage_null,
                             const Tokenizer& tokenizer);

/// The final usage event (choices: []) for include_usage.
std::string BuildUsageChunk(const ResponseMeta& meta, int64_t prompt_tokens,
                            int64_t completion_tokens);

}  // namespace kvpush::server
