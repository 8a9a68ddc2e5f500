// The prepare step of a completion request (docs/server.md): the body parsed, checked against
// the served model and turned into token ids, before anything touches the engine or the P/D
// connector. Pure: a function of the body and of what the instance serves, unit-tested without
// sockets (tests/server/completion_prepare_test.cc).
#pragma once

#include <cstdint>
#include <string>
#include <span>
#include <string_view>
#include <variant>
#include <vector>

#include "http/api_error.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "pd/kv_transfer_params.h"
#include "model/chat_template.h"
#include "server/openai_request.h"

namespace kvpush::server {

/// What the prepare step reads of the instance. References must outlive the call.
struct PrepareContext {
  const Tokenizer& tokenizer;
  const ChatPromptBuilder& chat;  ///< renders /v1/chat/completions messages
  const ModelConfig& model;       ///< vocab_size
  int32_t max_model_len = 0;      ///< tokens, prompt + completion
  std::string_view served_model_name;
  bool pd_instance = false;  ///< has a P/D connector (accepts kv_transfer_params)
  /// Other names requests may give for the served model (vLLM: --served-model-name A B).
  std::span<const std::string> model_aliases = {};
};

/// A request ready to be submitted: its fields, its P/D params and, per prompt, its token ids.
struct PreparedRequest {
  OpenAiRequest request;    ///< n forced to 1 on a P leg (D forks the other choices)
  pd::KvTransferParams kv;  ///< role kNone for a colocated request
  std::vector<std::vector<int32_t>> prompts;  ///< token ids per prompt (BOS as the model adds it)
  std::vector<int32_t> max_tokens;            ///< per prompt: the request's, or the default
  /// echo = true: per choice (prompt-major, n per prompt), the text put before its completion.
  std::vector<std::string> echo;
  /// P leg of a completion with echo and logprobs: the prompt text, whose prompt logprobs the
  /// answer carries as `prompt_echo` for the router to put before D's choices.
  std::string prompt_echo;
  bool echo_logprobs = false;  ///< completion with echo and logprobs >= 0
};

/// Parses `body` (a /v1/completions or /v1/chat/completions JSON body) and prepares it: the model
/// name, kv_transfer_params (pd::ParseKvTransferParams; only a P/D instance takes a leg, with
/// exactly one prompt), echo with logprobs refused on a D leg, token ids of logit_bias and
/// stop_token_ids inside the vocabulary, chat messages rendered, prompts tokenized (token-id
/// prompts checked against the vocabulary), the context length (prompt + 1, prompt +
/// max_tokens), the default max_tokens (16 for completions, the room left for chat) and
/// min_tokens <= max_tokens (except on a P leg, which clamps it). Errors are the answers vLLM
/// gives, in this order: http::ApiError 400 (404 model_not_found for an unknown model) naming the
/// field. Pure apart from reading the context; thread-safe.
std::variant<PreparedRequest, http::ApiError> PrepareCompletion(ApiKind kind, std::string_view body,
                                                                const PrepareContext& context);

}  // namespace kvpush::server
