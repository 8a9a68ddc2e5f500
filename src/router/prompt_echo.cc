#include "router/prompt_echo.h"

namespace kvpush::router {

using nlohmann::json;

namespace {

constexpr const char* kLogprobKeys[] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};

}  // namespace

bool WantsPromptEcho(const std::string& path, const json& body) {
  if (path != "/v1/completions" || !body.is_object()) return false;
  const auto echo = body.find("echo");
  const auto logprobs = body.find("logprobs");
  return echo != body.end() && echo->is_boolean() && echo->get<bool>() && logprobs != body.end() &&
         logprobs->is_number();
}

Result<PromptEcho> ParsePromptEcho(const json& prefill_answer) {
  if (!prefill_answer.is_object() || !prefill_answer.contains("prompt_echo")) {
    return InvalidArgument("prefill instance returned no prompt_echo");
  }
  const json& e = prefill_answer["prompt_echo"];
  if (!e.is_object() || !e.contains("text") || !e["text"].is_string() || !e.contains("logprobs") ||
      !e["logprobs"].is_object() || !e.contains("text_offset_end") ||
      !e["text_offset_end"].is_number_integer()) {
    return InvalidArgument("prefill instance returned a malformed prompt_echo");
  }
  for (const char* k : kLogprobKeys) {
    if (!e["logprobs"].contains(k) || !e["logprobs"][k].is_array()) {
      return InvalidArgument(std::string("prefill instance's prompt_echo has no logprobs.") + k);
    }
  }
  PromptEcho out;
  out.text = e["text"].get<std::string>();
  out.logprobs = e["logprobs"];
  out.text_offset_end = e["text_offset_end"].get<int64_t>();
  return out;
}

void PrependPromptEcho(json& choice, const PromptEcho& echo) {
  if (!choice.is_object()) return;
  const auto text = choice.find("text");
  choice["text"] = echo.text + (text != choice.end() && text->is_string() ? text->get<std::string>()
                                                                          : std::string());
  json& lp = choice["logprobs"];
  if (!lp.is_object()) {
    lp = echo.logprobs;
    return;
  }
  json merged = echo.logprobs;
  for (const char* k : kLogprobKeys) {
    if (!lp.contains(k) || !lp[k].is_array()) continue;
    for (const json& v : lp[k]) {
      if (std::string(k) == "text_offset" && v.is_number_integer()) {
        merged[k].push_back(v.get<int64_t>() + echo.text_offset_end);
      } else {
        merged[k].push_back(v);
      }
    }
  }
  lp = std::move(merged);
}

void PrependPromptEchoToAnswer(json& answer, const PromptEcho& echo) {
  if (!answer.is_object() || !answer.contains("choices") || !answer["choices"].is_array()) return;
  for (json& c : answer["choices"]) PrependPromptEcho(c, echo);
}

bool PrependPromptEchoToChunk(json& chunk, const PromptEcho& echo, std::set<int64_t>* echoed) {
  if (!chunk.is_object() || !chunk.contains("choices") || !chunk["choices"].is_array()) {
    return false;
  }
  bool changed = false;
  for (json& c : chunk["choices"]) {
    if (!c.is_object() || !c.contains("index") || !c["index"].is_number_integer()) continue;
    if (!echoed->insert(c["index"].get<int64_t>()).second) continue;
    PrependPromptEcho(c, echo);
    changed = true;
  }
  return changed;
}

}  // namespace kvpush::router
