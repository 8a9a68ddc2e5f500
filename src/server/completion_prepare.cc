#include "server/completion_prepare.h"

#include "server/tokenize_handler.h"

#include <algorithm>
#include <optional>
#include <utility>

namespace kvpush::server {
namespace {

using Role = pd::KvTransferParams::Role;

/// "<field>: token id <t> is outside the vocabulary [0, <vocab>)".
http::ApiError OutsideVocabulary(const std::string& field, int32_t t, int32_t vocab) {
  return http::ApiError::Invalid(field + ": token id " + std::to_string(t) +
                                     " is outside the vocabulary [0, " + std::to_string(vocab) +
                                     ")",
                                 field);
}

/// The P/D params of the request, and where a leg may be sent at all.
std::optional<http::ApiError> ReadKvTransferParams(ApiKind kind, const PrepareContext& c,
                                                   PreparedRequest& p) {
  auto parsed = pd::ParseKvTransferParams(p.request.kv_transfer_params);
  if (auto* e = std::get_if<pd::ParamError>(&parsed))
    return http::ApiError::Invalid(e->message, e->param);
  p.kv = std::get<pd::KvTransferParams>(std::move(parsed));
  if (p.kv.role == Role::kNone) return std::nullopt;
  if (!c.pd_instance) {
    // The router's words for a client body carrying it (one error vocabulary): only the
    // router's legs to P/D instances (serve --role prefill|decode) may.
    return http::ApiError::Invalid(
        "kv_transfer_params is only for the legs of a P/D request, which "
        "the router writes; a client request may not carry it",
        "kv_transfer_params");
  }
  if (kind == ApiKind::kCompletion && p.request.prompts.size() != 1) {
    return http::ApiError::Invalid("kv_transfer_params: a P/D request takes exactly one prompt",
                                   "prompt");
  }
  return std::nullopt;
}

/// Token ids the engine would refuse, named by their own field (the engine's Submit error
/// would be reported against `prompt`).
std::optional<http::ApiError> CheckSamplingIds(const OpenAiRequest& r, int32_t vocab) {
  for (const auto& [tid, bias] : r.logit_bias) {
    if (tid >= vocab) return OutsideVocabulary("logit_bias", tid, vocab);
  }
  for (int32_t tid : r.stop_token_ids) {
    if (tid >= vocab) return OutsideVocabulary("stop_token_ids", tid, vocab);
  }
  for (const ResumedChoice& rc : r.resume) {
    for (const ResumedLogprob& lp : rc.logprobs) {
      for (const auto& [tid, logprob] : lp.top) {
        if (tid >= vocab) return OutsideVocabulary("kvpush_resume", tid, vocab);
      }
    }
  }
  return std::nullopt;
}

/// What `echo` puts before a choice's text: the prompt (completions; a token prompt decoded);
/// for chat, vLLM's rule: the last message's content when it is the assistant's (the role of the
/// reply), else nothing.
std::string EchoText(const OpenAiRequest& r, const PromptInput& p, const Tokenizer& tok,
                     const std::vector<int32_t>& ids) {
  if (r.kind == ApiKind::kChat) {
    return !r.messages.empty() && r.messages.back().role == "assistant" ? r.messages.back().content
                                                                        : "";
  }
  return p.is_tokens ? DecodeTokens(tok, ids) : p.text;
}

/// The token ids of one prompt: token-id prompts checked against the vocabulary, text
/// tokenized with BOS when the vocabulary adds one (vLLM's add_special_tokens = true: Llama yes,
/// Qwen no).
std::variant<std::vector<int32_t>, http::ApiError> PromptIds(const PromptInput& p,
                                                             const PrepareContext& c) {
  if (!p.is_tokens) {
    auto enc = TokenizePrompt(c.tokenizer, p.text, /*add_special_tokens=*/true);
    if (!enc.ok()) return http::ApiError::Invalid(enc.status().message(), "prompt");
    return std::move(*enc);
  }
  for (int32_t t : p.tokens) {
    if (t < 0 || t >= c.model.vocab_size) {
      return http::ApiError::Invalid("token id " + std::to_string(t) +
                                         " is outside the vocabulary [0, " +
                                         std::to_string(c.model.vocab_size) + ")",
                                     "prompt");
    }
  }
  return p.tokens;
}

/// The context length rules for a prompt of `n` tokens; the max_tokens it gets.
std::variant<int32_t, http::ApiError> MaxTokensFor(ApiKind kind, const PreparedRequest& p,
                                                   int64_t n, int32_t max_len) {
  const OpenAiRequest& r = p.request;
  const char* what = kind == ApiKind::kChat ? "messages" : "prompt";
  if (n + 1 > max_len) {
    return http::ApiError::Invalid("This model's maximum context length is " +
                                       std::to_string(max_len) + " tokens. However, your " + what +
                                       " has " + std::to_string(n) +
                                       " tokens (at least one token must be generated).",
                                   what, "context_length_exceeded");
  }
  if (r.max_tokens && n + *r.max_tokens > max_len) {
    return http::ApiError::Invalid(
        "This model's maximum context length is " + std::to_string(max_len) +
            " tokens. However, you requested " + std::to_string(n + *r.max_tokens) + " tokens (" +
            std::to_string(n) + " in the " + what + ", " + std::to_string(*r.max_tokens) +
            " in the completion).",
        "max_tokens", "context_length_exceeded");
  }
  const auto room = static_cast<int32_t>(max_len - n);
  const int32_t max_tokens =
      r.max_tokens ? *r.max_tokens : (kind == ApiKind::kChat ? room : std::min(16, room));
  if (r.min_tokens > max_tokens && p.kv.role != Role::kProducer) {
    return http::ApiError::Invalid(
        "min_tokens must be less than or equal to max_tokens=" + std::to_string(max_tokens) +
            ", got " + std::to_string(r.min_tokens),
        "min_tokens");
  }
  return max_tokens;
}

/// Every prompt tokenized and checked (chat: the messages rendered into one token prompt).
std::optional<http::ApiError> TokenizePrompts(ApiKind kind, const PrepareContext& c,
                                              PreparedRequest& p) {
  OpenAiRequest& r = p.request;
  if (kind == ApiKind::kChat) {  // the model's chat template (model/chat_template.h)
    auto chat_ids = c.chat.Build(r.messages, r.chat_template);
    if (!chat_ids.ok()) return http::ApiError::Invalid(chat_ids.status().message(), "messages");
    r.prompts.push_back(PromptInput{true, "", std::move(*chat_ids)});
  }
  for (const PromptInput& prompt : r.prompts) {
    auto ids = PromptIds(prompt, c);
    if (auto* e = std::get_if<http::ApiError>(&ids)) return *e;
    std::vector<int32_t>& tokens = std::get<std::vector<int32_t>>(ids);
    auto max_tokens = MaxTokensFor(kind, p, static_cast<int64_t>(tokens.size()), c.max_model_len);
    if (auto* e = std::get_if<http::ApiError>(&max_tokens)) return *e;
    p.max_tokens.push_back(std::get<int32_t>(max_tokens));
    if (r.echo) {
      p.echo.insert(p.echo.end(), static_cast<size_t>(r.n),
                    EchoText(r, prompt, c.tokenizer, tokens));
    }
    if (p.echo_logprobs && p.kv.role == Role::kProducer) {
      p.prompt_echo = EchoText(r, prompt, c.tokenizer, tokens);  // text; the JSON once computed
    }
    p.prompts.push_back(std::move(tokens));
  }
  return std::nullopt;
}

}  // namespace

std::variant<PreparedRequest, http::ApiError> PrepareCompletion(ApiKind kind, std::string_view body,
                                                                const PrepareContext& context) {
  auto parsed = ParseOpenAiRequest(kind, body);
  if (auto* e = std::get_if<http::ApiError>(&parsed)) return *e;
  PreparedRequest p;
  p.request = std::get<OpenAiRequest>(std::move(parsed));
  OpenAiRequest& r = p.request;
  if (!r.model.empty() && !ServesModel(r.model, context.served_model_name, context.model_aliases)) {
    return http::ApiError{404, "The model '" + r.model + "' does not exist.",
                          "invalid_request_error", "model", "model_not_found"};
  }
  if (auto e = ReadKvTransferParams(kind, context, p)) return *e;
  // Echo with logprobs needs the prompt's logits, which P computes: the router gives D echo
  // false and puts P's `prompt_echo` before D's choices (docs/router.md).
  p.echo_logprobs = kind == ApiKind::kCompletion && r.echo && r.logprobs >= 0;
  if (p.echo_logprobs && p.kv.role == Role::kConsumer) {
    return http::ApiError::Invalid(
        "echo with logprobs on a P/D decode leg: the prompt logprobs are "
        "computed by the prefill instance (the router sends D echo false "
        "and merges P's prompt_echo)",
        "echo");
  }
  // n > 1 on a P/D request: P prefills once and samples choice 0's first token (seed + 0); D
  // forks the other choices after the KV arrived (SubmitForks).
  if (p.kv.role == Role::kProducer) r.n = 1;
  if (auto e = CheckSamplingIds(r, context.model.vocab_size)) return *e;
  if (auto e = TokenizePrompts(kind, context, p)) return *e;
  return p;
}

}  // namespace kvpush::server
