#include "router/prompt_list.h"

#include <limits>

#include "router/sse_splitter.h"

namespace kvpush::router {
namespace {

using nlohmann::json;

/// A non-empty array of integers in [0, 2^31): one token-id prompt the instances accept.
bool IsTokenIds(const json& p) {
  if (!p.is_array() || p.empty()) return false;
  for (const json& e : p) {
    if (!e.is_number_integer()) return false;
    if (e.is_number_unsigned() ? e.get<uint64_t>() > 0x7fffffffull
                               : (e.get<int64_t>() < 0 || e.get<int64_t>() > 0x7fffffffll)) {
      return false;
    }
  }
  return true;
}

/// a + b, clamped to int64's range (the instances' numbers are not trusted not to overflow).
int64_t SaturatingAdd(int64_t a, int64_t b) {
  int64_t sum = 0;
  if (!__builtin_add_overflow(a, b, &sum)) return sum;
  return b > 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
}

int64_t IntOr(const json& j, const char* key, int64_t fallback) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
}

}  // namespace

bool IsPromptList(const json& body) {
  const auto it = body.find("prompt");
  if (it == body.end() || !it->is_array() || it->empty() || (*it)[0].is_number()) return false;
  for (const json& p : *it) {
    const bool ok = p.is_string() ? !p.get_ref<const std::string&>().empty() : IsTokenIds(p);
    if (!ok) return false;
  }
  return true;
}

std::vector<json> SplitPromptList(const json& body) {
  std::vector<json> out;
  for (const json& p : body["prompt"]) {
    json one = body;
    one["prompt"] = p;
    out.push_back(std::move(one));
  }
  return out;
}

int64_t ChoicesPerPrompt(const json& body) {
  const int64_t n = IntOr(body, "n", 1);
  return n >= 1 ? n : 1;
}

void UsageSum::Add(const json& usage) {
  if (!usage.is_object()) return;
  prompt_ = SaturatingAdd(prompt_, IntOr(usage, "prompt_tokens", 0));
  completion_ = SaturatingAdd(completion_, IntOr(usage, "completion_tokens", 0));
  total_ = SaturatingAdd(total_, IntOr(usage, "total_tokens", 0));
  const auto d = usage.find("prompt_tokens_details");
  if (d != usage.end() && d->is_object()) {
    has_cached_ = true;
    cached_ = SaturatingAdd(cached_, IntOr(*d, "cached_tokens", 0));
  }
}

json UsageSum::ToJson() const {
  json u = {
      {"prompt_tokens", prompt_}, {"completion_tokens", completion_}, {"total_tokens", total_}};
  if (has_cached_) u["prompt_tokens_details"] = {{"cached_tokens", cached_}};
  return u;
}

json MergeAnswers(const std::vector<json>& answers, const std::string& id, int64_t n) {
  json out = answers.at(0);
  out["id"] = id;
  json choices = json::array();
  UsageSum usage;
  for (size_t i = 0; i < answers.size(); ++i) {
    json part = answers[i];
    RewriteChunk(part, id, static_cast<int64_t>(i), n);
    if (part.contains("choices") && part["choices"].is_array()) {
      for (json& c : part["choices"]) choices.push_back(std::move(c));
    }
    if (part.contains("usage")) usage.Add(part["usage"]);
  }
  out["choices"] = std::move(choices);
  if (out.contains("usage")) out["usage"] = usage.ToJson();
  return out;
}

bool IsUsageChunk(const json& chunk) {
  if (!chunk.is_object()) return false;
  const auto c = chunk.find("choices");
  const auto u = chunk.find("usage");
  return c != chunk.end() && c->is_array() && c->empty() && u != chunk.end() && u->is_object();
}

void RewriteChunk(json& chunk, const std::string& id, int64_t prompt, int64_t n) {
  if (!chunk.is_object()) return;
  if (chunk.contains("id")) chunk["id"] = id;
  const auto c = chunk.find("choices");
  if (c == chunk.end() || !c->is_array()) return;
  for (json& choice : *c) {
    if (choice.is_object()) {
      choice["index"] = SaturatingAdd(prompt * n, IntOr(choice, "index", 0));
    }
  }
}

json ParseSseData(const std::string& event) {
  const auto data = SseEventData(event);
  if (!data) return json(json::value_t::discarded);
  return json::parse(*data, nullptr, /*allow_exceptions=*/false);
}

std::string SseEvent(const json& data) {
  return "data: " + data.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

}  // namespace kvpush::router
