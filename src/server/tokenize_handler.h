// POST /tokenize and POST /detokenize with vLLM's request and response shapes
// (vllm/entrypoints/openai/protocol.py: TokenizeCompletionRequest, TokenizeChatRequest,
// TokenizeResponse, DetokenizeRequest, DetokenizeResponse), so users and tests can see exactly
// which ids the model receives for a prompt.
//
//   POST /tokenize   {"prompt": "...", "add_special_tokens": true, "return_token_strs": false,
//                     "model": "..."}
//     -> 200 {"count": N, "max_model_len": L, "tokens": [ids...]}  (+ "token_strs" on request:
//        each token as the vocabulary spells it, "Ġworld", like HF's convert_ids_to_tokens)
//   POST /detokenize {"tokens": [ids...], "model": "..."}  -> 200 {"prompt": "text"}
//
// A "model" other than the served name -> 404 model_not_found, as the completion endpoints.
// add_special_tokens (default true) prepends BOS when the vocabulary adds one
// (Tokenizer::add_bos); added tokens written in the prompt (<|im_start|>) are always matched, as
// in HF tokenizers.
//   POST /tokenize   {"messages": [...], "add_generation_prompt": true, "chat_template_kwargs":
//                     {...}, "add_special_tokens": false, ...}
//     -> the ids /v1/chat/completions gives the model for those messages (the model's chat
//        template, model/chat_template.h; add_special_tokens: only false, as for chat).
// /detokenize shows control tokens as their text (skip_special_tokens = false, as vLLM's
// tokenizer.decode). Errors: 400 invalid_request_error naming the field.
#pragma once

#include <cstdint>
#include <string>
#include <span>
#include <string_view>

#include "model/tokenizer.h"
#include "model/chat_template.h"

namespace kvpush::server {

/// A JSON reply: HTTP status and body (an OpenAI error object when status != 200).
struct JsonReply {
  int status = 200;
  std::string body;
};

/// What the handlers serve: the engine's tokenizer, its max_model_len (tokens) and the served
/// model name. Borrowed; must outlive the calls.
struct TokenizeTarget {
  const Tokenizer& tokenizer;
  int32_t max_model_len = 0;
  std::string_view served_model_name;
  const ChatPromptBuilder* chat = nullptr;  ///< renders "messages" (null: messages get 400)
  std::span<const std::string> model_aliases = {};  ///< other names of the served model
};

/// Whether a request's `model` names the served model: `name` or one of `aliases`. Pure.
bool ServesModel(std::string_view model, std::string_view name,
                 std::span<const std::string> aliases);

/// Serves one /tokenize body. Pure apart from reading the tokenizer; thread-safe.
JsonReply HandleTokenize(const TokenizeTarget& target, std::string_view body);

/// Serves one /detokenize body (ids must lie in [0, vocab_size)). Thread-safe.
JsonReply HandleDetokenize(const TokenizeTarget& target, std::string_view body);

}  // namespace kvpush::server
