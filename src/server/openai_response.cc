#include "server/openai_response.h"

#include <nlohmann/json.hpp>

namespace kvpush::server {
namespace {

using nlohmann::json;

std::string Dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json Bytes(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

// Token text for logprobs: the raw piece, with invalid UTF-8 replaced at dump time.
std::string Piece(const Tokenizer& tok, int32_t id) {
  return tok.TokenBytes(id);
}

/// Completion `logprobs` of `prompt` (may be null: echo with logprobs only) then `tokens`, text
/// offsets counted in token bytes from `text_offset`; `*end_offset` (if given) gets the offset
/// after the last token.
json CompletionLogprobs(const PromptLogprobs* prompt, const std::vector<TokenOutput>& tokens,
                        const Tokenizer& tok, size_t text_offset, size_t* end_offset = nullptr) {
  json l = {{"tokens", json::array()},
            {"token_logprobs", json::array()},
            {"top_logprobs", json::array()},
            {"text_offset", json::array()}};
  // One entry; t == nullptr: a token without logprobs (the prompt's first), vLLM's nulls.
  auto add = [&](int32_t id, const TokenOutput* t) {
    std::string piece = Piece(tok, id);
    l["tokens"].push_back(piece);
    if (t == nullptr) {
      l["token_logprobs"].push_back(nullptr);
      l["top_logprobs"].push_back(nullptr);
    } else {
      l["token_logprobs"].push_back(t->logprob);
      json top = json::object();
      for (const auto& [tid, lp] : t->top_logprobs) top[Piece(tok, tid)] = lp;
      top[piece] = t->logprob;
      l["top_logprobs"].push_back(top);
    }
    l["text_offset"].push_back(text_offset);
    text_offset += piece.size();
  };
  if (prompt != nullptr) {
    for (size_t i = 0; i < prompt->ids.size(); ++i) {
      const bool scored = i > 0 && i - 1 < prompt->scored.size();
      add(prompt->ids[i], scored ? &prompt->scored[i - 1] : nullptr);
    }
  }
  for (const auto& t : tokens) add(t.id, &t);
  if (end_offset != nullptr) *end_offset = text_offset;
  return l;
}

json ChatLogprobs(const std::vector<TokenOutput>& tokens, const Tokenizer& tok) {
  json content = json::array();
  for (const auto& t : tokens) {
    std::string piece = Piece(tok, t.id);
    json top = json::array();
    for (const auto& [id, lp] : t.top_logprobs) {
      std::string p = Piece(tok, id);
      top.push_back({{"token", p}, {"logprob", lp}, {"bytes", Bytes(p)}});
    }
    content.push_back(
        {{"token", piece}, {"logprob", t.logprob}, {"bytes", Bytes(piece)}, {"top_logprobs", top}});
  }
  return json{{"content", content}};
}

json Usage(const ResponseMeta& meta, const UsageCounts& u) {
  json j = {{"prompt_tokens", u.prompt_tokens},
            {"completion_tokens", u.completion_tokens},
            {"total_tokens", u.prompt_tokens + u.completion_tokens}};
  if (meta.prompt_tokens_details) j["prompt_tokens_details"] = {{"cached_tokens", u.cached_tokens}};
  return j;
}

/// vLLM's stop_reason: the stop token id (an integer), the stop string, or null (EOS, length).
json StopReason(const std::string& s, int32_t stop_token_id) {
  if (stop_token_id >= 0) return json(stop_token_id);
  return s.empty() ? json(nullptr) : json(s);
}

}  // namespace

UsageCounts SumUsage(const std::vector<ChoiceResult>& choices) {
  UsageCounts u;
  for (const ChoiceResult& c : choices) {
    if (c.counts_prompt) {
      u.prompt_tokens += c.prompt_tokens;
      u.cached_tokens += c.cached_tokens;
    }
    u.completion_tokens += c.completion_tokens;
  }
  return u;
}

std::string FinishReasonString(FinishReason r) {
  return r == FinishReason::kLength ? "length" : "stop";
}

std::string BuildResponse(const ResponseMeta& meta, const std::vector<ChoiceResult>& choices,
                          const Tokenizer& tokenizer) {
  const bool chat = meta.kind == ApiKind::kChat;
  json j = {{"id", meta.id},
            {"object", chat ? "chat.completion" : "text_completion"},
            {"created", meta.created},
            {"model", meta.model},
            {"system_fingerprint", meta.system_fingerprint}};
  json arr = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& c = choices[i];
    json choice = {{"index", i},
                   {"finish_reason", FinishReasonString(c.finish)},
                   {"stop_reason", StopReason(c.stop_reason, c.stop_token_id)}};
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
      choice["logprobs"] = meta.logprobs ? ChatLogprobs(c.tokens, tokenizer) : json(nullptr);
    } else {
      choice["text"] = c.text;
      const PromptLogprobs* prompt = c.prompt.ids.empty() ? nullptr : &c.prompt;
      choice["logprobs"] =
          meta.logprobs ? CompletionLogprobs(prompt, c.tokens, tokenizer, 0) : json(nullptr);
    }
    if (meta.token_ids) {
      json ids = json::array();
      for (const auto& t : c.tokens) ids.push_back(t.id);
      choice["token_ids"] = std::move(ids);
    }
    arr.push_back(std::move(choice));
  }
  j["choices"] = std::move(arr);
  j["usage"] = Usage(meta, SumUsage(choices));
  return Dump(j);
}

std::string BuildStreamChunk(const ResponseMeta& meta, int index, const std::string& text,
                             const std::vector<TokenOutput>& tokens, FinishReason finish,
                             const std::string& stop_reason, int32_t stop_token_id, bool first,
                             bool usage_null, const Tokenizer& tokenizer,
                             const PromptLogprobs* prompt) {
  const bool chat = meta.kind == ApiKind::kChat;
  json choice = {{"index", index}};
  json fr = finish == FinishReason::kNone ? json(nullptr) : json(FinishReasonString(finish));
  if (chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || first) delta["content"] = text;
    choice["delta"] = std::move(delta);
    choice["logprobs"] =
        meta.logprobs && !tokens.empty() ? ChatLogprobs(tokens, tokenizer) : json(nullptr);
  } else {
    choice["text"] = text;
    const bool any = !tokens.empty() || prompt != nullptr;
    choice["logprobs"] =
        meta.logprobs && any ? CompletionLogprobs(prompt, tokens, tokenizer, 0) : json(nullptr);
  }
  if (meta.token_ids) {
    json ids = json::array();
    for (const auto& t : tokens) ids.push_back(t.id);
    choice["token_ids"] = std::move(ids);
  }
  choice["finish_reason"] = fr;
  if (finish != FinishReason::kNone) {
    choice["stop_reason"] = StopReason(stop_reason, stop_token_id);
  }
  json j = {{"id", meta.id},
            {"object", chat ? "chat.completion.chunk" : "text_completion"},
            {"created", meta.created},
            {"model", meta.model},
            {"system_fingerprint", meta.system_fingerprint},
            {"choices", json::array({choice})}};
  if (usage_null) j["usage"] = nullptr;
  return "data: " + Dump(j) + "\n\n";
}

std::string BuildPromptEcho(const std::string& echo_text, const PromptLogprobs& prompt,
                            const Tokenizer& tokenizer) {
  size_t end = 0;
  json logprobs = CompletionLogprobs(&prompt, {}, tokenizer, 0, &end);
  return Dump(
      json{{"text", echo_text}, {"logprobs", std::move(logprobs)}, {"text_offset_end", end}});
}

std::string BuildUsageChunk(const ResponseMeta& meta, const UsageCounts& usage) {
  const bool chat = meta.kind == ApiKind::kChat;
  json j = {{"id", meta.id},
            {"object", chat ? "chat.completion.chunk" : "text_completion"},
            {"created", meta.created},
            {"model", meta.model},
            {"system_fingerprint", meta.system_fingerprint},
            {"choices", json::array()},
            {"usage", Usage(meta, usage)}};
  return "data: " + Dump(j) + "\n\n";
}

}  // namespace kvpush::server
