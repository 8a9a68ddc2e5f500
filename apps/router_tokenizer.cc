#include "apps/router_tokenizer.h"

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "model/model.h"
#include "model/chat_template.h"
#include "server/tokenize_handler.h"

namespace kvpush::apps {
namespace {

using nlohmann::json;

struct Loaded {
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ChatPromptBuilder> chat;
};

bool IsGguf(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char magic[4] = {};
  return f.read(magic, 4) && std::string(magic, 4) == "GGUF";
}

/// The /tokenize body that gives `body`'s prompt ids; nullopt when the router cannot say.
std::optional<json> TokenizeBody(const std::string& path, const json& body) {
  json t = json::object();
  if (path == "/v1/chat/completions") {
    if (!body.contains("messages")) return std::nullopt;
    for (const char* f : {"messages", "add_generation_prompt", "chat_template_kwargs",
                          "continue_final_message", "chat_template", "tools"}) {
      if (body.contains(f)) t[f] = body[f];
    }
    t["add_special_tokens"] = false;
    return t;
  }
  const auto p = body.find("prompt");
  if (p == body.end() || !p->is_string()) return std::nullopt;
  t["prompt"] = *p;
  if (body.contains("add_special_tokens")) t["add_special_tokens"] = body["add_special_tokens"];
  return t;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> LoadTokenizerFile(const std::string& path,
                                                     std::string* chat_template) {
  if (IsGguf(path)) {
    auto file = GgufFile::Open(path);
    if (!file.ok()) return file.status();
    auto tok = TokenizerFromGguf(*file);
    if (!tok.ok()) return tok.status();
    if (auto t = file->GetString("tokenizer.chat_template"); t.ok() && chat_template != nullptr) {
      *chat_template = *t;
    }
    return std::move(tok).value();
  }
  ModelLoadOptions mo;
  mo.path = path;
  auto model = LoadModel(mo);
  if (!model.ok()) return model.status();
  if (chat_template != nullptr) *chat_template = model->chat_template;
  return std::move(model->tokenizer);
}

Result<router::PromptTokenizer> LoadRouterTokenizer(const std::string& path) {
  auto loaded = std::make_shared<Loaded>();
  std::string jinja;
  auto tok = LoadTokenizerFile(path, &jinja);
  if (!tok.ok()) return tok.status();
  loaded->tokenizer = std::move(tok).value();
  loaded->chat = std::make_unique<ChatPromptBuilder>(
      DetectChatTemplate(jinja).chat_template, *loaded->tokenizer);
  return router::PromptTokenizer(
      [loaded](const std::string& route, const json& body) -> std::optional<std::vector<int32_t>> {
        const auto p = body.find("prompt");
        if (route == "/v1/completions" && p != body.end() && p->is_array() && !p->empty() &&
            (*p)[0].is_number_integer()) {
          std::vector<int32_t> ids;
          for (const json& id : *p) {
            if (!id.is_number_integer()) return std::nullopt;
            ids.push_back(id.get<int32_t>());
          }
          return ids;
        }
        const std::optional<json> t = TokenizeBody(route, body);
        if (!t) return std::nullopt;
        const server::JsonReply r = server::HandleTokenize(
            server::TokenizeTarget{*loaded->tokenizer, 0, "", loaded->chat.get()}, t->dump());
        if (r.status != 200) return std::nullopt;
        const json out = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
        if (!out.is_object() || !out.contains("tokens")) return std::nullopt;
        return out["tokens"].get<std::vector<int32_t>>();
      });
}

}  // namespace kvpush::apps
