// Parsing and validating OpenAI /v1/completions and /v1/chat/completions request bodies.
// JSON in, a validated OpenAiRequest or an http::ApiError out; no I/O, no engine, no tokenizer, so
// it can be fuzzed (fuzz/request_json_fuzz.cc).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "http/api_error.h"
#include "model/chat_template.h"

namespace kvpush::server {

enum class ApiKind { kCompletion, kChat };

/// One prompt: text (tokenized by the server, BOS prepended) or token ids (used as given).
struct PromptInput {
  bool is_tokens = false;
  std::string text;
  std::vector<int32_t> tokens;
};

/// Reads `add_generation_prompt` (a boolean, default true) and `chat_template_kwargs` (null, {} or
/// {"enable_thinking": bool}; any other key: 400 naming it, since no template here reads one) of
/// a chat request body. Errors: http::ApiError 400 naming the field. Pure; thread-safe.
std::optional<http::ApiError> ParseChatTemplateOptions(const nlohmann::json& body,
                                                       ChatTemplateOptions& out);

/// The logprobs of one resumed token of a whole answer handed back: the token's own and the top
/// alternatives as (id, logprob), descending; natural log.
struct ResumedLogprob {
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;
};

/// One choice of a continuation (kvpush extension `kvpush_resume`, docs/reliability.md,
/// "Continuation"): what an earlier instance streamed of it before it failed — or, for a whole
/// answer an instance handed back when it began draining (`kvpush_resume.whole`), what it had
/// generated, which the continuation's answer then includes.
struct ResumedChoice {
  int32_t index = 0;               ///< the choice's `index` in the stream
  std::vector<int32_t> token_ids;  ///< its output tokens the client already received
  int64_t text_bytes = 0;          ///< bytes of text the client received for them
  bool finished = false;           ///< its finish_reason was received: nothing left to generate
  // Whole answers only:
  std::string text;                      ///< the text its tokens emitted (text_bytes bytes)
  std::vector<ResumedLogprob> logprobs;  ///< one per token id when the request has logprobs
  std::string finish_reason;             ///< finished: "stop" or "length"
  std::string stop_reason;               ///< finished by this stop string ("" for none)
  int32_t stop_token_id = -1;            ///< finished by this stop_token_ids entry (-1: none)
};

/// A validated request. Field semantics follow the OpenAI API and vLLM's extensions
/// (top_k, ignore_eos, stop_token_ids). docs/server.md lists what is accepted and refused.
struct OpenAiRequest {
  ApiKind kind = ApiKind::kCompletion;
  std::string model;                  ///< "" = not given
  std::vector<PromptInput> prompts;   ///< completions: >= 1 (a list = a batch, one choice each)
  std::vector<ChatMessage> messages;  ///< chat: >= 1
  ChatTemplateOptions chat_template;  ///< chat: how `messages` are rendered
  std::optional<int32_t> max_tokens;  ///< >= 1; absent = server default
  float temperature = 1.0f;           ///< >= 0 (0 = greedy)
  float top_p = 1.0f;                 ///< (0, 1]
  int32_t top_k = -1;                 ///< -1 or 0 = disabled
  std::optional<int64_t> seed;
  std::vector<std::string> stop;  ///< up to 16 non-empty strings... empty ones dropped
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int32_t min_tokens = 0;           ///< vLLM: >= 0; holds off EOS, stop ids and stop strings
  float min_p = 0.0f;               ///< vLLM: [0, 1]
  float presence_penalty = 0.0f;    ///< [-2, 2]
  float frequency_penalty = 0.0f;   ///< [-2, 2]
  float repetition_penalty = 1.0f;  ///< vLLM: (0, 10]
  /// OpenAI `logit_bias` ({"<token id>": bias}): ids ascending, unique, < 2^31; bias in
  /// [-100, 100]. The vocabulary is checked by the engine.
  std::vector<std::pair<int32_t, float>> logit_bias;
  int32_t n = 1;          ///< choices per prompt, [1, kMaxN]
  bool echo = false;      ///< completions: prepend the prompt to each choice's text (and logprobs)
  int32_t logprobs = -1;  ///< -1 = none; n >= 0 = sampled token + top n (<= 20)
  bool stream = false;
  bool include_usage = false;     ///< stream_options.include_usage
  bool return_token_ids = false;  ///< vLLM extension: add "token_ids" to each choice
  /// vLLM P/D extension: the `kv_transfer_params` object (null when absent). Its fields are
  /// validated by pd::ParseKvTransferParams (pd/kv_transfer_params.h).
  nlohmann::json kv_transfer_params;
  /// kvpush extension `kvpush_resume` ({"choices": [{index, token_ids, text_bytes, finished}]}):
  /// continue a streamed request an earlier instance began (the router sends it after that
  /// instance failed mid-stream, or to move it: a migration's push legs carry it too). Empty:
  /// not a continuation. Requires stream, except on a P/D leg (kv_transfer_params.
  /// do_remote_decode or do_remote_prefill true: a migration's); indices unique and < n x
  /// prompts.
  std::vector<ResumedChoice> resume;
  /// `kvpush_resume.usage_sent`: the client already got the usage chunk (include_usage); only
  /// `data: [DONE]` is left to send.
  bool resume_usage_sent = false;
  /// `kvpush_resume.whole`: the continuation of a whole (not streamed) answer that a draining
  /// instance handed back; its choices carry text, logprobs and finish, and the answer is the
  /// whole one (resumed output + new). Requires stream false.
  bool resume_whole = false;
};

/// Most choices per prompt (`n`).
inline constexpr int32_t kMaxN = 128;

/// Parses `body` for endpoint `kind`. Errors (http::ApiError, HTTP 400, invalid_request_error,
/// param naming the field): malformed JSON, a non-object body, wrong field types, out-of-range
/// values, best_of != 1, unsupported features (suffix, tools, beam search, structured outputs,
/// prompt logprobs, ... — docs/server.md lists each), a non-default value of a known field that
/// would change the output and is not implemented, stream_options without stream. Fields that
/// change nothing here (user, metadata, store, service_tier, ...) and unknown fields are ignored.
/// Thread-safe (pure). Never throws.
std::variant<OpenAiRequest, http::ApiError> ParseOpenAiRequest(ApiKind kind, std::string_view body);

}  // namespace kvpush::server
