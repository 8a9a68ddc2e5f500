// SpmTokenizer (SentencePiece BPE with byte fallback) and StreamingDetokenizer.
#include <gtest/gtest.h>

#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "model/random_model.h"
#include "model/spm_tokenizer.h"

namespace kvpush {
namespace {

constexpr char kSp[] = "\xE2\x96\x81";

/// <unk> <s> </s>, bytes, "▁", "a", "b", "c", "▁a", "ab", "▁ab", "bc", "é" with chosen scores.
std::unique_ptr<SpmTokenizer> TinyTokenizer() {
  SpmVocab v;
  auto add = [&v](std::string p, float s, TokenType t) {
    v.pieces.push_back(std::move(p));
    v.scores.push_back(s);
    v.types.push_back(t);
  };
  add("<unk>", 0, TokenType::kUnknown);
  add("<s>", 0, TokenType::kControl);
  add("</s>", 0, TokenType::kControl);
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    add(buf, 0, TokenType::kByte);
  }
  add(kSp, 0, TokenType::kNormal);                       // 259
  add("a", 0, TokenType::kNormal);                       // 260
  add("b", 0, TokenType::kNormal);                       // 261
  add("c", 0, TokenType::kNormal);                       // 262
  add(std::string(kSp) + "a", -3, TokenType::kNormal);   // 263
  add("ab", -1, TokenType::kNormal);                     // 264
  add(std::string(kSp) + "ab", -2, TokenType::kNormal);  // 265
  add("bc", -0.5, TokenType::kNormal);                   // 266
  add("\xC3\xA9", 0, TokenType::kNormal);                // 267 "é"
  auto t = SpmTokenizer::Create(std::move(v));
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return std::move(*t);
}

std::vector<int32_t> Enc(const Tokenizer& t, std::string_view s) {
  auto r = t.Encode(s);
  EXPECT_TRUE(r.ok());
  return *r;
}

TEST(TokenizerTest, MergesHighestScoreFirst) {
  auto t = TinyTokenizer();
  EXPECT_EQ(Enc(*t, ""), std::vector<int32_t>{});
  // "▁ab": ab (-1) beats ▁a (-3); then ▁ + ab -> ▁ab (-2).
  EXPECT_EQ(Enc(*t, "ab"), (std::vector<int32_t>{265}));
  // "▁abc": bc (-0.5) first, then ▁a (-3): ▁a + bc.
  EXPECT_EQ(Enc(*t, "abc"), (std::vector<int32_t>{263, 266}));
  // Spaces become ▁ and a dummy prefix is added.
  EXPECT_EQ(Enc(*t, "a a"), (std::vector<int32_t>{263, 263}));
  EXPECT_EQ(Enc(*t, " c"), (std::vector<int32_t>{259, 259, 262}));
}

TEST(TokenizerTest, ByteFallbackForUnknownCharacters) {
  auto t = TinyTokenizer();
  // "€" (E2 82 AC) is not in the vocabulary: three byte tokens (id = byte + 3).
  EXPECT_EQ(Enc(*t, "\xE2\x82\xAC"), (std::vector<int32_t>{259, 0xE2 + 3, 0x82 + 3, 0xAC + 3}));
  EXPECT_EQ(Enc(*t, "\xC3\xA9"), (std::vector<int32_t>{259, 267}));
  // Invalid UTF-8 still encodes, byte by byte.
  EXPECT_EQ(Enc(*t, "\xFF"), (std::vector<int32_t>{259, 0xFF + 3}));
  EXPECT_EQ(t->TokenBytes(0xE2 + 3), "\xE2");
  EXPECT_EQ(t->TokenBytes(263), " a");
  EXPECT_EQ(t->TokenBytes(1), "");
  EXPECT_TRUE(t->IsControl(1));
  EXPECT_FALSE(t->IsControl(263));
  EXPECT_EQ(t->TokenBytes(100000), "");
}

TEST(TokenizerTest, StreamingDetokenizerEmitsWholeCharacters) {
  auto t = TinyTokenizer();
  StreamingDetokenizer d(*t);
  EXPECT_EQ(d.Push(263), "a");  // leading space of the first piece dropped
  EXPECT_EQ(d.Push(0xE2 + 3), "");
  EXPECT_EQ(d.Push(0x82 + 3), "");
  EXPECT_EQ(d.Push(0xAC + 3), "\xE2\x82\xAC");
  EXPECT_EQ(d.Push(2), "");  // EOS decodes to nothing
  EXPECT_EQ(d.Push(263), " a");
  EXPECT_EQ(d.Push(0xF0 + 3), "");
  EXPECT_EQ(d.Flush(), "\xEF\xBF\xBD");  // incomplete at the end -> U+FFFD
}

TEST(TokenizerTest, InvalidBytesBecomeReplacementCharacters) {
  auto t = TinyTokenizer();
  std::vector<int32_t> ids = {260, 0xFF + 3, 260, 0xE2 + 3, 260, 0xC3 + 3, 0xA9 + 3};
  EXPECT_EQ(DecodeTokens(*t, ids),
            "a\xEF\xBF\xBD"
            "a\xEF\xBF\xBD"
            "a\xC3\xA9");
}

TEST(TokenizerTest, DemoVocabularyRoundTripsText) {
  auto v = BuildDemoVocab(1000);
  ASSERT_TRUE(v.ok());
  auto t = SpmTokenizer::Create(std::move(*v));
  ASSERT_TRUE(t.ok());
  const std::string text =
      "Once upon a time the little robot said hello to the people. \xE2\x9C\x93 ok";
  auto ids = Enc(**t, text);
  EXPECT_LT(ids.size(), text.size() / 2);  // merges are used
  EXPECT_EQ(DecodeTokens(**t, ids), text);
}

TEST(TokenizerTest, GgufGpt2TokenizerIsUnimplemented) {
  GgufWriter w;
  w.SetString("tokenizer.ggml.model", "gpt2");
  w.SetStringArray("tokenizer.ggml.tokens", {"a", "b", "c"});
  const auto bytes = w.Serialize();
  auto f = GgufFile::Parse(bytes);
  ASSERT_TRUE(f.ok());
  auto t = SpmTokenizer::FromGguf(*f);
  EXPECT_EQ(t.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(t.status().message().find("'gpt2'"), std::string::npos) << t.status().message();
}

TEST(TokenizerTest, GgufVocabularyMismatchIsDataLoss) {
  GgufWriter w;
  w.SetString("tokenizer.ggml.model", "llama");
  w.SetStringArray("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a"});
  w.SetF32Array("tokenizer.ggml.scores", {0, 0, 0});
  const auto bytes = w.Serialize();
  auto f = GgufFile::Parse(bytes);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(SpmTokenizer::FromGguf(*f).status().code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace kvpush
