// HandleTokenize / HandleDetokenize (server/tokenize_handler.h).
#include "server/tokenize_handler.h"

#include <nlohmann/json.hpp>
#include <variant>

#include "http/api_error.h"
#include "server/openai_request.h"

namespace kvpush::server {

bool ServesModel(std::string_view model, std::string_view name,
                 std::span<const std::string> aliases) {
  if (model == name) return true;
  for (const std::string& a : aliases) {
    if (model == a) return true;
  }
  return false;
}

namespace {

JsonReply Error(std::string message, std::string param) {
  return {400, http::ApiError::Invalid(std::move(message), std::move(param)).ToJson()};
}

/// Parses a JSON object body; a discarded value when the body is not one.
nlohmann::json ParseObject(std::string_view body) {
  auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : nlohmann::json(nlohmann::json::value_t::discarded);
}

/// 404 model_not_found when the body names another model (as the completion endpoints);
/// status 0 when the model is absent, empty or the served one.
JsonReply CheckModel(const nlohmann::json& j, const TokenizeTarget& target) {
  if (!j.contains("model") || j["model"].is_null()) return {0, ""};
  if (!j["model"].is_string()) return Error("'model' must be a string", "model");
  const std::string model = j["model"].get<std::string>();
  if (model.empty() || ServesModel(model, target.served_model_name, target.model_aliases)) {
    return {0, ""};
  }
  return {404, http::ApiError{404, "The model '" + model + "' does not exist.",
                              "invalid_request_error", "model", "model_not_found"}
                   .ToJson()};
}

/// The ids of a /tokenize body's chat `messages`, parsed as a chat completion parses them;
/// `bad` gets the 400 of a malformed body.
Result<std::vector<int32_t>> TokenizeMessages(const TokenizeTarget& target, const nlohmann::json& j,
                                              JsonReply& bad) {
  if (target.chat == nullptr) {
    bad = Error("'messages' is not supported here", "messages");
    return std::vector<int32_t>{};
  }
  nlohmann::json body = {{"messages", j["messages"]}};
  for (const char* f : {"add_generation_prompt", "chat_template_kwargs", "continue_final_message",
                        "chat_template", "tools"}) {
    if (j.contains(f)) body[f] = j[f];
  }
  auto parsed = ParseOpenAiRequest(ApiKind::kChat, body.dump());
  if (const auto* e = std::get_if<http::ApiError>(&parsed)) {
    bad = {e->http_status, e->ToJson()};
    return std::vector<int32_t>{};
  }
  const auto& r = std::get<OpenAiRequest>(parsed);
  return target.chat->Build(r.messages, r.chat_template);
}

}  // namespace

JsonReply HandleTokenize(const TokenizeTarget& target, std::string_view body) {
  const Tokenizer& tokenizer = target.tokenizer;
  const nlohmann::json j = ParseObject(body);
  if (j.is_discarded()) {
    return Error("request body is not a JSON object (a JSON string must be valid UTF-8)", "");
  }
  if (JsonReply m = CheckModel(j, target); m.status != 0) return m;
  const bool chat = j.contains("messages");
  if (chat && j.contains("prompt")) return Error("give 'prompt' or 'messages', not both", "prompt");
  if (!chat && (!j.contains("prompt") || !j["prompt"].is_string())) {
    return Error("'prompt' must be a string", "prompt");
  }
  bool add_special = !chat;
  if (j.contains("add_special_tokens")) {
    if (!j["add_special_tokens"].is_boolean()) {
      return Error("'add_special_tokens' must be a boolean", "add_special_tokens");
    }
    add_special = j["add_special_tokens"].get<bool>();
  }
  bool token_strs = false;
  if (j.contains("return_token_strs") && !j["return_token_strs"].is_null()) {
    if (!j["return_token_strs"].is_boolean()) {
      return Error("'return_token_strs' must be a boolean", "return_token_strs");
    }
    token_strs = j["return_token_strs"].get<bool>();
  }
  Result<std::vector<int32_t>> ids = std::vector<int32_t>{};
  if (chat) {
    if (add_special) {
      return Error(
          "'add_special_tokens' is not supported for messages: only false (the chat "
          "template writes the special tokens)",
          "add_special_tokens");
    }
    JsonReply bad{0, ""};
    ids = TokenizeMessages(target, j, bad);
    if (bad.status != 0) return bad;
  } else {
    ids = TokenizePrompt(tokenizer, j["prompt"].get<std::string>(), add_special);
  }
  if (!ids.ok()) return Error(ids.status().message(), chat ? "messages" : "prompt");
  nlohmann::json out = {
      {"count", ids->size()}, {"max_model_len", target.max_model_len}, {"tokens", *ids}};
  if (token_strs) {
    // The vocabulary's spelling of each token ("Ġworld"), as vLLM's convert_ids_to_tokens.
    nlohmann::json strs = nlohmann::json::array();
    for (int32_t id : *ids) strs.push_back(tokenizer.TokenPiece(id));
    out["token_strs"] = std::move(strs);
  }
  return {200, out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)};
}

JsonReply HandleDetokenize(const TokenizeTarget& target, std::string_view body) {
  const Tokenizer& tokenizer = target.tokenizer;
  const nlohmann::json j = ParseObject(body);
  if (j.is_discarded()) return Error("request body is not a JSON object", "");
  if (JsonReply m = CheckModel(j, target); m.status != 0) return m;
  if (!j.contains("tokens") || !j["tokens"].is_array()) {
    return Error("'tokens' must be an array of token ids", "tokens");
  }
  std::vector<int32_t> ids;
  ids.reserve(j["tokens"].size());
  for (const auto& t : j["tokens"]) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
        t.get<int64_t>() >= tokenizer.vocab_size()) {
      return Error("token id " + t.dump() + " is outside the vocabulary [0, " +
                       std::to_string(tokenizer.vocab_size()) + ")",
                   "tokens");
    }
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  // DecodeTokens emits only valid UTF-8 (invalid sequences as U+FFFD), so dump cannot throw.
  const nlohmann::json out = {{"prompt", DecodeTokens(tokenizer, ids, /*show_special=*/true)}};
  return {200, out.dump()};
}

}  // namespace kvpush::server
