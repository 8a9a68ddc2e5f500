// libFuzzer target: OpenAI request JSON parsing (src/server/openai_request.h). The first byte picks
// the endpoint (even: /v1/completions, odd: /v1/chat/completions); the rest is the body. Every
// input must give either a request that satisfies the documented invariants or an ApiError
// with a 4xx status and a serializable body; nothing may crash, leak or hit UB.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "server/openai_request.h"

using kvpush::http::ApiError;
using kvpush::server::ApiKind;
using kvpush::server::OpenAiRequest;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const ApiKind kind = (data[0] & 1) ? ApiKind::kChat : ApiKind::kCompletion;
  std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  auto parsed = kvpush::server::ParseOpenAiRequest(kind, body);
  if (auto* e = std::get_if<ApiError>(&parsed)) {
    if (e->http_status < 400 || e->http_status > 499 || e->message.empty()) std::abort();
    if (e->ToJson().empty()) std::abort();
    return 0;
  }
  const OpenAiRequest& r = std::get<OpenAiRequest>(parsed);
  // Invariants promised by the parser.
  if (kind == ApiKind::kCompletion && r.prompts.empty()) std::abort();
  if (kind == ApiKind::kChat && r.messages.empty()) std::abort();
  for (const auto& p : r.prompts) {
    if (p.is_tokens ? p.tokens.empty() : p.text.empty()) std::abort();
    for (int32_t t : p.tokens) {
      if (t < 0) std::abort();
    }
  }
  if (r.max_tokens && *r.max_tokens < 1) std::abort();
  if (!(r.temperature >= 0.0f) || !(r.top_p > 0.0f && r.top_p <= 1.0f)) std::abort();
  if (r.top_k < -1 || r.logprobs < -1 || r.logprobs > 20) std::abort();
  if (r.include_usage && !r.stream) std::abort();
  for (const auto& s : r.stop) {
    if (s.empty()) std::abort();
  }
  // Sampling extensions (issue 13): every value inside the range the engine accepts.
  if (r.n < 1 || r.n > kvpush::server::kMaxN || r.min_tokens < 0) std::abort();
  if (!(r.min_p >= 0.0f && r.min_p <= 1.0f)) std::abort();
  if (!(r.presence_penalty >= -2.0f && r.presence_penalty <= 2.0f)) std::abort();
  if (!(r.frequency_penalty >= -2.0f && r.frequency_penalty <= 2.0f)) std::abort();
  if (!(r.repetition_penalty > 0.0f && r.repetition_penalty <= 10.0f)) std::abort();
  for (size_t i = 0; i < r.logit_bias.size(); ++i) {
    const auto& [id, bias] = r.logit_bias[i];
    if (id < 0 || (i > 0 && id <= r.logit_bias[i - 1].first)) std::abort();
    if (!(bias >= -100.0f && bias <= 100.0f)) std::abort();
  }
  if (r.echo && (kind != ApiKind::kCompletion || r.logprobs >= 0)) std::abort();
  return 0;
}
