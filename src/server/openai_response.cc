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

json CompletionLogprobs(const std::vector<TokenOutput>& tokens, const Tokenizer& tok,
                        size_t text_offset) {
  json l = {{"tokens", json::array()},
            {"token_logprobs", json::array()},
            {"top_logprobs", json::array()},
            {"text_offset", json::array()}};
  for (const auto& t : tokens) {
    std::string piece = Piece(tok, t.id);
    l["tokens"].push_back(piece);
    l["token_logprobs"].push_back(t.logprob);
    json top = json::object();
    for (const auto& [id, lp] : t.top_logprobs) top[Piece(tok, id)] = lp;
    top[piece] = t.logprob;
    l["top_logprobs"].push_back(top);
    l["text_offset"].push_back(text_offset);
    text_offset += piece.size();
  }
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

json Usage(int64_t prompt, int64_t completion) {
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion}};
}

json StopReason(const std::string& s) {
  return s.empty() ? json(nullptr) : json(s);
}

}  // namespace

std::string FinishReasonString(FinishReason r) {
  return r == FinishReason::kLength ? "length" : "stop";
}

std::string BuildResponse(const ResponseMeta& meta, const std::vector<ChoiceResult>& choices,
                          const Tokenizer& tokenizer) {
  const bool chat = meta.kind == ApiKind::kChat;
  json j = {{"id", meta.id},
            {"object", chat ? "chat.completion" : "text_completion"},
            {"created", meta.created},
            {"model", meta.model}};
  json arr = json::array();
  int64_t prompt = 0, completion = 0;
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& c = choices[i];
    json choice = {{"index", i},
                   {"finish_reason", FinishReasonString(c.finish)},
                   {"stop_reason", StopReason(c.stop_reason)}};
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
      choice["logprobs"] = meta.logprobs ? ChatLogprobs(c.tokens, tokenizer) : json(nullptr);
    } else {
      choice["text"] = c.text;
      choice["logprobs"] =
          meta.logprobs ? CompletionLogprobs(c.tokens, tokenizer, 0) : json(nullptr);
    }
    if (meta.token_ids) {
      json ids = json::array();
      for (const auto& t : c.tokens) ids.push_back(t.id);
      choice["token_ids"] = std::move(ids);
    }
    arr.push_back(std::move(choice));
    prompt += c.prompt_tokens;
    completion += c.completion_tokens;
  }
  j["choices"] = std::move(arr);
  j["usage"] = Usage(prompt, completion);
  return Dump(j);
}

std::string BuildStreamChunk(const ResponseMeta& meta, int index, const std::string& text,
                             const std::vector<TokenOutput>& tokens, FinishReason finish,
                             const std::string& stop_reason, bool first, bool usage_null,
                             const Tokenizer& tokenizer) {
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
    choice["logprobs"] =
        meta.logprobs && !tokens.empty() ? CompletionLogprobs(tokens, tokenizer, 0) : json(nullptr);
  }
  if (meta.token_ids) {
    json ids = json::array();
    for (const auto& t : tokens) ids.push_back(t.id);
    choice["token_ids"] = std::move(ids);
  }
  choice["finish_reason"] = fr;
  if (finish != FinishReason::kNone) choice["stop_reason"] = StopReason(stop_reason);
  json j = {{"id", meta.id},
            {"object", chat ? "chat.completion.chunk" : "text_completion"},
            {"created", meta.created},
            {"model", meta.model},
            {"choices", json::array({choice})}};
  if (usage_null) j["usage"] = nullptr;
  return "data: " + Dump(j) + "\n\n";
}

std::string BuildUsageChunk(const ResponseMeta& meta, int64_t prompt_tokens,
                            int64_t completion_tokens) {
  const bool chat = meta.kind == ApiKind::kChat;
  json j = {{"id", meta.id},
            {"object", chat ? "chat.completion.chunk" : "text_completion"},
            {"created", meta.created},
            {"model", meta.model},
            {"choices", json::array()},
            {"usage", Usage(prompt_tokens, completion_tokens)}};
  return "data: " + Dump(j) + "\n\n";
}

}  // namespace kvpush::server
