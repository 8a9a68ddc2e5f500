// POST /tokenize and /detokenize bodies (server/tokenize_handler.h) over a tiny byte-level BPE
// vocabulary: vLLM's request and response shapes, BOS per add_special_tokens, and the 400s.
// The real vocabularies through a running `kvpush serve` are tests/tokenizer_oracle.
#include "server/tokenize_handler.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/bpe_tokenizer.h"

namespace kvpush::server {
namespace {

/// ids 0..255 byte-level characters, 256 "ab" (merge "a b"), 257 <|bos|> (control, added as
/// BOS), 258 <tool> (user-defined).
std::unique_ptr<BpeTokenizer> Tiny(bool add_bos) {
  BpeVocab v;
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = ByteToCodePoint(static_cast<uint8_t>(b));
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    v.pieces.push_back(s);
  }
  v.types.assign(256, TokenType::kNormal);
  v.pieces.push_back("ab");
  v.types.push_back(TokenType::kNormal);
  v.pieces.push_back("<|bos|>");
  v.types.push_back(TokenType::kControl);
  v.pieces.push_back("<tool>");
  v.types.push_back(TokenType::kUserDefined);
  v.merges = {"a b"};
  v.pre = "llama-bpe";
  v.bos_id = 257;
  v.eos_id = 257;
  v.add_bos = add_bos;
  auto t = BpeTokenizer::Create(std::move(v));
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return std::move(*t);
}

TokenizeTarget Target(const Tokenizer& tok, int32_t max_model_len = 64) {
  return TokenizeTarget{tok, max_model_len, "tiny"};
}

nlohmann::json Body(const JsonReply& r) {
  return nlohmann::json::parse(r.body);
}

TEST(TokenizeHandler, PromptGivesTokensCountAndMaxModelLen) {
  auto tok = Tiny(/*add_bos=*/true);
  const JsonReply r = HandleTokenize(Target(*tok, 2048), R"({"prompt": "ab<tool>1234"})");
  ASSERT_EQ(r.status, 200) << r.body;
  const auto j = Body(r);
  // BOS (add_special_tokens defaults to true), "ab", <tool>, then llama-bpe digits: "123", "4".
  EXPECT_EQ(j["tokens"], nlohmann::json({257, 256, 258, '1', '2', '3', '4'}));
  EXPECT_EQ(j["count"], 7);
  EXPECT_EQ(j["max_model_len"], 2048);
  EXPECT_FALSE(j.contains("token_strs"));
}

TEST(TokenizeHandler, AddSpecialTokensControlsBosOnlyWhenTheVocabularyAddsIt) {
  auto with = Tiny(/*add_bos=*/true);
  auto without = Tiny(/*add_bos=*/false);
  const std::string body = R"({"prompt": "ab", "add_special_tokens": false})";
  EXPECT_EQ(Body(HandleTokenize(Target(*with), body))["tokens"], nlohmann::json({256}));
  EXPECT_EQ(Body(HandleTokenize(Target(*without), R"({"prompt": "ab"})"))["tokens"],
            nlohmann::json({256}));
  // Added tokens written in the prompt are matched even without add_special_tokens (as HF).
  EXPECT_EQ(Body(HandleTokenize(Target(*with),
                                R"({"prompt": "<|bos|>", "add_special_tokens": false})"))["tokens"],
            nlohmann::json({257}));
}

TEST(TokenizeHandler, TokenStrsOnRequest) {
  auto tok = Tiny(true);
  const auto j =
      Body(HandleTokenize(Target(*tok), R"({"prompt": "ab c", "return_token_strs": true})"));
  EXPECT_EQ(j["token_strs"], nlohmann::json({"<|bos|>", "ab", "\xC4\xA0", "c"}));  // "Ġ"
}

TEST(TokenizeHandler, RefusesWithFieldNames) {
  auto tok = Tiny(true);
  struct Case {
    std::string body, param;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"messages": [{"role": "user", "content": "hi"}]})", "messages"},
           {R"({"add_special_tokens": true})", "prompt"},
           {R"({"prompt": 5})", "prompt"},
           {R"({"prompt": "x", "add_special_tokens": "yes"})", "add_special_tokens"},
           {R"({"prompt": "x", "return_token_strs": 1})", "return_token_strs"},
       }) {
    const JsonReply r = HandleTokenize(Target(*tok), c.body);
    EXPECT_EQ(r.status, 400) << c.body;
    EXPECT_EQ(Body(r)["error"]["param"], c.param) << c.body;
  }
  EXPECT_EQ(HandleTokenize(Target(*tok), "not json").status, 400);
  EXPECT_EQ(HandleTokenize(Target(*tok), "[1]").status, 400);
  EXPECT_EQ(HandleTokenize(Target(*tok), "{\"prompt\": \"a\xFF\"}").status, 400);  // not UTF-8
}

TEST(TokenizeHandler, MessagesGiveWhatTheChatTemplateRenders) {
  auto tok = Tiny(/*add_bos=*/true);
  auto tokenize = [&](const ChatTemplate& t, const std::string& body) {
    ChatPromptBuilder chat(t, *tok);
    TokenizeTarget target{*tok, 2048, "tiny", &chat};
    return HandleTokenize(target, body);
  };
  auto ids = [&](const std::string& prompt, bool special) {
    const JsonReply r = HandleTokenize(
        Target(*tok, 2048),
        nlohmann::json{{"prompt", prompt}, {"add_special_tokens", special}}.dump());
    return Body(r)["tokens"];
  };
  const std::string msgs = R"("messages": [{"role": "user", "content": "ab"}])";
  // Plain: kvpush's template, BOS prepended as for a prompt.
  JsonReply r = tokenize(ChatTemplate{}, "{" + msgs + "}");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Body(r)["tokens"], ids("User: ab\nAssistant:", true));
  // ChatML: the model's template, no BOS added; add_generation_prompt honoured.
  ChatTemplate chatml;
  chatml.format = ChatTemplateFormat::kChatMl;
  r = tokenize(chatml, "{" + msgs + R"(, "add_generation_prompt": false})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Body(r)["tokens"], ids("<|im_start|>user\nab<|im_end|>\n", false));
  // Llama 3 writes the vocabulary's BOS text, which becomes the BOS id (257).
  ChatTemplate llama3;
  llama3.format = ChatTemplateFormat::kLlama3;
  r = tokenize(llama3, "{" + msgs + "}");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Body(r)["tokens"][0], 257);
  EXPECT_EQ(Body(r)["count"], Body(r)["tokens"].size());
}

TEST(TokenizeHandler, MessagesRefusalsNameTheField) {
  auto tok = Tiny(/*add_bos=*/true);
  ChatTemplate llama2;
  llama2.format = ChatTemplateFormat::kLlama2;
  ChatPromptBuilder chat(llama2, *tok);
  const TokenizeTarget target{*tok, 2048, "tiny", &chat};
  const std::pair<const char*, const char*> cases[] = {
      {R"({"messages": [{"role": "user", "content": "a"}], "add_special_tokens": true})",
       "add_special_tokens"},
      {R"({"messages": [{"role": "user", "content": "a"}], "prompt": "a"})", "prompt"},
      {R"({"messages": [{"role": "user", "content": "a"}], "chat_template_kwargs": {"x": 1}})",
       "chat_template_kwargs.x"},
      {R"({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]})",
       "messages"},  // Llama 2's template: roles must alternate
      {R"({"messages": []})", "messages"},
  };
  for (const auto& [body, param] : cases) {
    const JsonReply r = HandleTokenize(target, body);
    EXPECT_EQ(r.status, 400) << body;
    EXPECT_EQ(Body(r)["error"]["param"], param) << body << " -> " << r.body;
  }
}

TEST(TokenizeHandler, AnotherModelNameIsNotFound) {
  auto tok = Tiny(true);
  EXPECT_EQ(HandleTokenize(Target(*tok), R"({"model": "tiny", "prompt": "a"})").status, 200);
  const JsonReply r = HandleTokenize(Target(*tok), R"({"model": "other", "prompt": "a"})");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(Body(r)["error"]["code"], "model_not_found");
  EXPECT_EQ(HandleDetokenize(Target(*tok), R"({"model": "other", "tokens": [1]})").status, 404);
}

TEST(DetokenizeHandler, TokensGivePromptWithSpecialTokensShown) {
  auto tok = Tiny(true);
  const JsonReply r = HandleDetokenize(Target(*tok), R"({"tokens": [257, 256, 32, 258, 99]})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Body(r), nlohmann::json({{"prompt", "<|bos|>ab <tool>c"}}));
  // A UTF-8 character split across tokens comes out whole; a dangling lead byte as U+FFFD.
  EXPECT_EQ(Body(HandleDetokenize(Target(*tok), R"({"tokens": [195, 169, 195]})"))["prompt"],
            "\xC3\xA9\xEF\xBF\xBD");
}

TEST(DetokenizeHandler, RefusesIdsOutsideTheVocabulary) {
  auto tok = Tiny(true);
  for (const char* body : {R"({"tokens": [259]})", R"({"tokens": [-1]})", R"({"tokens": ["a"]})",
                           R"({"tokens": 3})", R"({})"}) {
    const JsonReply r = HandleDetokenize(Target(*tok), body);
    EXPECT_EQ(r.status, 400) << body;
    EXPECT_EQ(Body(r)["error"]["param"], "tokens") << body;
  }
}

}  // namespace
}  // namespace kvpush::server
