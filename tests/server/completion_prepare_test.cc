// The prepare step of a completion request (server/completion_prepare.h), without sockets or an
// engine: a body in, token ids and limits or vLLM's error out, over a tiny byte-level BPE
// vocabulary. The same answers through a running server: http_server_test, openai_parity_test,
// tests/pd/pd_error_vocabulary_test.cc.
#include "server/completion_prepare.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "model/bpe_tokenizer.h"

namespace kvpush::server {
namespace {

/// ids 0..255 byte-level characters, 256 "ab" (merge "a b"), 257 <|bos|> (control, BOS).
std::unique_ptr<BpeTokenizer> Tiny() {
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
  v.merges = {"a b"};
  v.pre = "llama-bpe";
  v.bos_id = 257;
  v.eos_id = 257;
  v.add_bos = true;
  auto t = BpeTokenizer::Create(std::move(v));
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return std::move(*t);
}

class PrepareTest : public ::testing::Test {
 protected:
  PrepareTest() : tok_(Tiny()), chat_(ChatTemplate{}, *tok_) { model_.vocab_size = 258; }

  PrepareContext Context(bool pd_instance = false, int32_t max_model_len = 32) const {
    return PrepareContext{*tok_, chat_, model_, max_model_len, "tiny", pd_instance};
  }
  PreparedRequest Ok(ApiKind kind, const std::string& body, bool pd_instance = false) const {
    auto r = PrepareCompletion(kind, body, Context(pd_instance));
    if (auto* e = std::get_if<http::ApiError>(&r)) {
      ADD_FAILURE() << body << ": " << e->ToJson();
      return {};
    }
    return std::get<PreparedRequest>(std::move(r));
  }
  http::ApiError Err(ApiKind kind, const std::string& body, bool pd_instance = false) const {
    auto r = PrepareCompletion(kind, body, Context(pd_instance));
    if (auto* e = std::get_if<http::ApiError>(&r)) return *e;
    ADD_FAILURE() << body << " was accepted";
    return {};
  }

  std::unique_ptr<BpeTokenizer> tok_;
  ChatPromptBuilder chat_;
  ModelConfig model_;
};

const char* kTid = "0123456789abcdef0123456789abcdef";

TEST_F(PrepareTest, TextPromptsGetBosAndTheDefaultMaxTokens) {
  const PreparedRequest p = Ok(ApiKind::kCompletion, R"({"prompt": ["ab", "a"], "n": 2})");
  ASSERT_EQ(p.prompts.size(), 2u);
  EXPECT_EQ(p.prompts[0], (std::vector<int32_t>{257, 256}));
  EXPECT_EQ(p.prompts[1], (std::vector<int32_t>{257, 'a'}));
  EXPECT_EQ(p.max_tokens, (std::vector<int32_t>{16, 16}));  // completions: min(16, room)
  EXPECT_EQ(p.kv.role, pd::KvTransferParams::Role::kNone);
  EXPECT_TRUE(p.echo.empty());
}

TEST_F(PrepareTest, ChatRendersTheMessagesAndTakesTheRoomLeft) {
  const PreparedRequest p =
      Ok(ApiKind::kChat, R"({"messages": [{"role": "user", "content": "ab"}], "echo": true})");
  ASSERT_EQ(p.prompts.size(), 1u);
  EXPECT_EQ(p.prompts[0].front(), 257);  // plain template: BOS as for a prompt
  EXPECT_EQ(p.max_tokens[0], 32 - static_cast<int32_t>(p.prompts[0].size()));
  EXPECT_EQ(p.echo, std::vector<std::string>{""});  // the last message is not the assistant's
}

TEST_F(PrepareTest, EchoIsThePromptTextPerChoice) {
  const PreparedRequest p =
      Ok(ApiKind::kCompletion, R"({"prompt": [97, 98], "echo": true, "n": 2})");
  EXPECT_EQ(p.echo, (std::vector<std::string>{"ab", "ab"}));  // a token prompt decoded
}

TEST_F(PrepareTest, ErrorsInVllmsOrderNamingTheirField) {
  struct Case {
    std::string body;
    int status;
    std::string param;
    std::string code;
  };
  const Case cases[] = {
      {R"({"prompt": "a", "model": "other"})", 404, "model", "model_not_found"},
      {R"({"prompt": "a", "logit_bias": {"258": 1}})", 400, "logit_bias", ""},
      {R"({"prompt": "a", "stop_token_ids": [300]})", 400, "stop_token_ids", ""},
      {R"({"prompt": [1, 258]})", 400, "prompt", ""},
      {R"({"prompt": "a", "max_tokens": 31})", 400, "max_tokens", "context_length_exceeded"},
      {R"({"prompt": "a", "max_tokens": 4, "min_tokens": 5})", 400, "min_tokens", ""},
      {R"({"prompt": "a", "kv_transfer_params": {"do_remote_decode": true, "transfer_id": ")" +
           std::string(kTid) + R"("}})",
       400, "kv_transfer_params", ""},
  };
  for (const Case& c : cases) {
    const http::ApiError e = Err(ApiKind::kCompletion, c.body);
    EXPECT_EQ(e.http_status, c.status) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " " << e.message;
    EXPECT_EQ(e.code, c.code) << c.body;
  }
  // A prompt with no room for one generated token.
  std::string ids = "[1";
  for (int i = 1; i < 32; ++i) ids += ",1";
  const http::ApiError full = Err(ApiKind::kCompletion, R"({"prompt": )" + ids + "]}");
  EXPECT_EQ(full.param, "prompt");
  EXPECT_EQ(full.code, "context_length_exceeded");
  EXPECT_NE(full.message.find("your prompt has 32 tokens"), std::string::npos) << full.message;
}

TEST_F(PrepareTest, PdLegsOnAPdInstance) {
  const std::string p_leg = R"({"prompt": "ab", "n": 3, "min_tokens": 5, "kv_transfer_params":
      {"do_remote_decode": true, "transfer_mode": "push", "transfer_id": ")" +
                            std::string(kTid) + R"("}})";
  const PreparedRequest p = Ok(ApiKind::kCompletion, p_leg, /*pd_instance=*/true);
  EXPECT_EQ(p.kv.role, pd::KvTransferParams::Role::kProducer);
  EXPECT_EQ(p.request.n, 1);  // P prefills once; D forks the other choices
  const std::string two = R"({"prompt": ["a", "b"], "kv_transfer_params":
      {"do_remote_decode": true, "transfer_id": ")" +
                          std::string(kTid) + R"("}})";
  EXPECT_EQ(Err(ApiKind::kCompletion, two, true).param, "prompt");
  const std::string d_echo = R"({"prompt": "a", "echo": true, "logprobs": 1, "kv_transfer_params":
      {"do_remote_prefill": true, "transfer_mode": "push", "transfer_id": ")" +
                             std::string(kTid) + R"(", "remote_host": "h", "remote_port": 1}})";
  EXPECT_EQ(Err(ApiKind::kCompletion, d_echo, true).param, "echo");
  const std::string bad = R"({"prompt": "a", "kv_transfer_params": {"do_remote_decode": 1}})";
  EXPECT_EQ(Err(ApiKind::kCompletion, bad, true).param, "kv_transfer_params.do_remote_decode");
}

}  // namespace
}  // namespace kvpush::server
