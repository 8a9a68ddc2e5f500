// Chat templates (model/chat_template.h): family detection from template texts, the native
// renderers against goldens rendered by a Jinja engine (@huggingface/jinja) from the templates'
// own text (chat_template_goldens.json, written by tests/tokenizer_oracle/chat_templates.mjs),
// and the special-token-aware chat prompt tokenizer.
#include "model/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

namespace kvpush {
namespace {

using nlohmann::json;

json LoadGoldens() {
  std::ifstream in(KVPUSH_CHAT_TEMPLATE_GOLDENS);
  EXPECT_TRUE(in.good()) << KVPUSH_CHAT_TEMPLATE_GOLDENS;
  return json::parse(in);
}

TEST(ChatTemplateDetect, EachGoldenTemplateIsRecognisedAsItsFamily) {
  const json g = LoadGoldens();
  const std::map<std::string, ChatTemplateFormat> want = {
      {"qwen3", ChatTemplateFormat::kQwen3},     {"llama3", ChatTemplateFormat::kLlama3},
      {"qwen2.5", ChatTemplateFormat::kChatMl},  {"chatml", ChatTemplateFormat::kChatMl},
      {"llama3.1", ChatTemplateFormat::kLlama3}, {"llama3.2", ChatTemplateFormat::kLlama3},
      {"llama2", ChatTemplateFormat::kLlama2},   {"mistral", ChatTemplateFormat::kMistral}};
  ASSERT_EQ(g["templates"].size(), want.size());
  for (const json& t : g["templates"]) {
    const std::string name = t["name"];
    const DetectedChatTemplate d = DetectChatTemplate(t["text"].get<std::string>());
    EXPECT_TRUE(d.recognised) << name;
    EXPECT_EQ(d.chat_template.format, want.at(name)) << name;
  }
}

TEST(ChatTemplateDetect, ReadsTheLiteralsEachTemplateVariesIn) {
  const json g = LoadGoldens();
  std::map<std::string, ChatTemplate> t;
  for (const json& j : g["templates"]) {
    t[j["name"]] = DetectChatTemplate(j["text"].get<std::string>()).chat_template;
  }
  EXPECT_EQ(t["qwen2.5"].default_system,
            "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  EXPECT_EQ(t["chatml"].default_system, "");
  EXPECT_FALSE(t["llama3"].llama3_date_header);
  EXPECT_FALSE(t["llama3"].honours_add_generation_prompt);  // Llama 3's first template
  EXPECT_TRUE(t["llama3.1"].llama3_date_header);
  EXPECT_FALSE(t["llama3.1"].date_from_clock);
  EXPECT_EQ(t["llama3.1"].date_string, "26 Jul 2024");
  EXPECT_TRUE(t["llama3.2"].date_from_clock);
}

TEST(ChatTemplateDetect, UnknownOrEmptyTemplatesAreNotRecognised) {
  EXPECT_FALSE(DetectChatTemplate("").recognised);
  const DetectedChatTemplate d =
      DetectChatTemplate("{% for m in messages %}<|user|>{{ m.content }}{% endfor %}");
  EXPECT_FALSE(d.recognised);
  EXPECT_EQ(d.chat_template.format, ChatTemplateFormat::kPlain);
}

TEST(ChatTemplateRender, EqualsTheJinjaRenderingOfEveryGoldenRow) {
  const json g = LoadGoldens();
  std::map<std::string, ChatTemplate> templates;
  for (const json& j : g["templates"]) {
    templates[j["name"]] = DetectChatTemplate(j["text"].get<std::string>()).chat_template;
  }
  int checked = 0;
  int errors = 0;
  for (const json& row : g["rows"]) {
    ChatTemplate t = templates.at(row["template"]);
    t.bos_token = row["bos_token"];
    t.eos_token = row["eos_token"];
    std::vector<ChatMessage> messages;
    for (const json& m : row["messages"]) messages.push_back({m["role"], m["content"]});
    ChatRenderOptions o;
    o.add_generation_prompt = row["add_generation_prompt"];
    if (row.contains("enable_thinking")) o.enable_thinking = row["enable_thinking"].get<bool>();
    o.today = row["today"];
    const std::string what =
        row["template"].get<std::string>() + " / " + row["conversation"].get<std::string>() +
        " / " + row["add_generation_prompt"].dump() + " / thinking " +
        (row.contains("enable_thinking") ? row["enable_thinking"].dump() : "-");
    auto got = RenderChat(t, messages, o);
    if (row.contains("error")) {
      ++errors;
      ASSERT_FALSE(got.ok()) << what;
      EXPECT_EQ(got.status().message(), row["error"].get<std::string>()) << what;
    } else {
      ASSERT_TRUE(got.ok()) << what << ": " << got.status().message();
      EXPECT_EQ(*got, row["text"].get<std::string>()) << what;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 480);
  EXPECT_GT(errors, 0);
}

TEST(ChatTemplateRender, PlainIsTheDefaultTemplateWithOrWithoutTheGenerationPrompt) {
  const std::vector<ChatMessage> m = {{"system", "S"}, {"user", "U"}, {"assistant", "A"}};
  EXPECT_EQ(ApplyDefaultChatTemplate(m), "System: S\nUser: U\nAssistant: A\nAssistant:");
  ChatRenderOptions o;
  o.add_generation_prompt = false;
  EXPECT_EQ(*RenderChat(ChatTemplate{}, m, o), "System: S\nUser: U\nAssistant: A\n");
}

TEST(ChatTemplateRender, Llama32UsesTodayWhenNoneIsGiven) {
  ChatTemplate t;
  t.format = ChatTemplateFormat::kLlama3;
  t.llama3_date_header = true;
  t.date_from_clock = true;
  auto got = RenderChat(t, {{"user", "hi"}}, ChatRenderOptions{});
  ASSERT_TRUE(got.ok());
  EXPECT_NE(got->find("Today Date: "), std::string::npos);
  EXPECT_EQ(got->find("26 Jul 2024"), std::string::npos);
}

TEST(ChatTemplateFormatFlag, ParsesEveryNameAndAutoAndRefusesOthers) {
  EXPECT_FALSE(ParseChatTemplateFormat("auto")->has_value());
  for (const char* n : {"plain", "chatml", "qwen3", "llama3", "llama2", "mistral"}) {
    auto f = ParseChatTemplateFormat(n);
    ASSERT_TRUE(f.ok() && f->has_value()) << n;
    EXPECT_STREQ(ChatTemplateFormatName(**f), n);
  }
  auto bad = ParseChatTemplateFormat("jinja");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("auto, plain, chatml"), std::string::npos);
}

/// A vocabulary of single characters plus two control tokens, like SentencePiece: control texts
/// in a prompt are text to Encode (which spells "<s>" as '<', 's', '>').
class CharTokenizer : public Tokenizer {
 public:
  int32_t vocab_size() const override { return 258; }
  int32_t bos_id() const override { return 256; }
  int32_t eos_id() const override { return 257; }
  Result<std::vector<int32_t>> Encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    ids.push_back(' ');  // the SentencePiece dummy prefix, per fragment
    for (char c : text) ids.push_back(static_cast<unsigned char>(c));
    return ids;
  }
  std::string TokenBytes(int32_t id) const override {
    return id < 256 ? std::string(1, static_cast<char>(id)) : "";
  }
  bool IsControl(int32_t id) const override { return id >= 256; }
  std::string ControlText(int32_t id) const override {
    return id == 256 ? "<s>" : id == 257 ? "</s>" : "";
  }
};

TEST(ChatPromptTokenizer, ControlTextsBecomeTheirIdsAndTheTextBetweenIsEncoded) {
  CharTokenizer tok;
  ChatPromptTokenizer chat(tok);
  auto ids = chat.Encode("<s>[I] a </s><s>b");
  ASSERT_TRUE(ids.ok());
  const std::vector<int32_t> want = {256, ' ', '[', 'I', ']', ' ', 'a', ' ', 257, 256, ' ', 'b'};
  EXPECT_EQ(*ids, want);
  // Nothing special: one fragment; a lone '<' is text.
  EXPECT_EQ(*chat.Encode("<a"), (std::vector<int32_t>{' ', '<', 'a'}));
  EXPECT_TRUE(chat.Encode("")->empty());
}

}  // namespace
}  // namespace kvpush
