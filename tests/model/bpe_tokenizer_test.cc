// BpeTokenizer (byte-level BPE), the pre-tokenizer regexes and NFC, GGUF loading, and the
// byte-level StreamingDetokenizer. The real Qwen3 / Llama 3 vocabularies are compared with the
// reference tokenizers by tests/tokenizer_oracle.
#include "model/bpe_tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "model/hf_vocab.h"
#include "model/model.h"
#include "model/pretokenizer.h"

namespace kvpush {
namespace {

/// The byte-level character (UTF-8) standing for byte `b`.
std::string B(uint8_t b) {
  const uint32_t cp = ByteToCodePoint(b);
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

/// ids 0..255: the byte-level characters of bytes 0..255 (in byte order); then the merge results
/// and added tokens below.
BpeVocab TinyVocab(std::vector<std::string> merges, std::string pre = "qwen2") {
  BpeVocab v;
  for (int b = 0; b < 256; ++b) v.pieces.push_back(B(static_cast<uint8_t>(b)));
  v.types.assign(256, TokenType::kNormal);
  auto add = [&v](std::string p, TokenType t) {
    v.pieces.push_back(std::move(p));
    v.types.push_back(t);
    return static_cast<int32_t>(v.pieces.size() - 1);
  };
  for (const std::string& m : merges) {
    const size_t sp = m.find(' ', 1);
    add(m.substr(0, sp) + m.substr(sp + 1), TokenType::kNormal);
  }
  add("<|im_start|>", TokenType::kControl);
  add("<|im_start|>x", TokenType::kControl);  // longer added token sharing a prefix
  add("<think>", TokenType::kUserDefined);
  v.merges = std::move(merges);
  v.pre = std::move(pre);
  v.bos_id = 256 + static_cast<int32_t>(v.merges.size());  // <|im_start|>
  v.eos_id = v.bos_id;
  return v;
}

std::unique_ptr<BpeTokenizer> Make(BpeVocab v) {
  auto t = BpeTokenizer::Create(std::move(v));
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(*t) : nullptr;
}

std::vector<std::string> Pieces(const BpeTokenizer& t, const std::vector<int32_t>& ids) {
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(t.Piece(id));
  return out;
}

std::vector<std::string> SplitWith(const std::string& pre, const std::string& text) {
  auto spec = FindPreTokenizer(pre);
  EXPECT_TRUE(spec.ok());
  auto re = RegexSplitter::Create(spec->pattern);
  EXPECT_TRUE(re.ok()) << re.status().ToString();
  std::vector<std::string> out;
  for (std::string_view c : (*re)->Split(text)) out.emplace_back(c);
  return out;
}

using Strs = std::vector<std::string>;

TEST(ByteLevel, AlphabetIsGpt2BytesToUnicode) {
  EXPECT_EQ(ByteToCodePoint('a'), 'a');
  EXPECT_EQ(ByteToCodePoint('!'), '!');
  EXPECT_EQ(ByteToCodePoint(0x00), 0x100u);
  EXPECT_EQ(ByteToCodePoint(' '), 0x120u);   // "Ġ"
  EXPECT_EQ(ByteToCodePoint('\n'), 0x10Au);  // "Ċ"
  EXPECT_EQ(ByteToCodePoint(0x7F), 0x121u);
  EXPECT_EQ(ByteToCodePoint(0xAD), 0x143u);  // the last of the 68 remapped bytes
  EXPECT_EQ(ByteToCodePoint(0xFF), 0xFFu);
}

TEST(PreTokenizer, Qwen2SplitsDigitsOneByOneAndLlama3InThrees) {
  EXPECT_EQ(SplitWith("qwen2", "12345"), (Strs{"1", "2", "3", "4", "5"}));
  EXPECT_EQ(SplitWith("llama-bpe", "12345"), (Strs{"123", "45"}));
  EXPECT_EQ(SplitWith("gpt2", "12345 x"), (Strs{"12345", " x"}));
}

TEST(PreTokenizer, ContractionsAreCaseInsensitive) {
  EXPECT_EQ(SplitWith("qwen2", "I'M don'T"), (Strs{"I", "'M", " don", "'T"}));
  EXPECT_EQ(SplitWith("gpt2", "I'M"), (Strs{"I", "'", "M"}));  // GPT-2's pattern is case-sensitive
}

TEST(PreTokenizer, WhitespaceRunsAndNewlines) {
  EXPECT_EQ(SplitWith("qwen2", "a   b"), (Strs{"a", "  ", " b"}));
  EXPECT_EQ(SplitWith("qwen2", "a\n\n  b  "), (Strs{"a", "\n\n", " ", " b", "  "}));
  EXPECT_EQ(SplitWith("llama3", "x!!\n\ny"), (Strs{"x", "!!\n\n", "y"}));
  EXPECT_EQ(SplitWith("qwen2", "\xE4\xBD\xA0\xE5\xA5\xBD, world"),
            (Strs{"\xE4\xBD\xA0\xE5\xA5\xBD", ",", " world"}));
}

TEST(PreTokenizer, InvalidUtf8BytesBecomeTheirOwnChunksAndNothingIsLost) {
  const std::string text = "ab\xFF\xC3 cd\x80";
  const Strs chunks = SplitWith("qwen2", text);
  std::string joined;
  for (const auto& c : chunks) joined += c;
  EXPECT_EQ(joined, text);
  EXPECT_EQ(chunks.front(), "ab");
  EXPECT_EQ(chunks.back(), "\x80");
}

TEST(PreTokenizer, UnknownNameIsRefusedByName) {
  auto s = FindPreTokenizer("falcon");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.status().message().find("'falcon'"), std::string::npos);
}

TEST(Nfc, ComposesAndPassesInvalidBytesThrough) {
  EXPECT_EQ(NormalizeNfc("e\xCC\x81"), "\xC3\xA9");  // e + U+0301 -> é
  EXPECT_EQ(NormalizeNfc("abc"), "abc");
  EXPECT_EQ(NormalizeNfc("e\xCC\x81\xFF"), "\xC3\xA9\xFF");
}

TEST(BpeTokenizer, MergesByRankNotByOrderInText) {
  // "b c" has the better rank, so "abc" -> a + bc even though "a b" comes first in the text.
  auto t = Make(TinyVocab({"b c", "a b"}));
  auto ids = t->Encode("abc");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(Pieces(*t, *ids), (Strs{"a", "bc"}));
  auto t2 = Make(TinyVocab({"a b", "b c"}));
  EXPECT_EQ(Pieces(*t2, *t2->Encode("abc")), (Strs{"ab", "c"}));
}

TEST(BpeTokenizer, EqualRanksMergeLeftmostFirstAndChains) {
  auto t = Make(TinyVocab({"a a", "aa a"}));
  EXPECT_EQ(Pieces(*t, *t->Encode("aaaa")), (Strs{"aa", "aa"}));  // aa a never forms: a a twice
  EXPECT_EQ(Pieces(*t, *t->Encode("aaa")), (Strs{"aaa"}));        // aa then aa+a
}

TEST(BpeTokenizer, SpaceIsByteLevelAndStaysInItsChunk) {
  auto t = Make(TinyVocab({B(' ') + " a", "Ġa b"}));
  EXPECT_EQ(Pieces(*t, *t->Encode("b ab")), (Strs{"b",
                                                  "\xC4\xA0"
                                                  "ab"}));
}

TEST(BpeTokenizer, AddedTokensMatchBeforeBpeLongestFirst) {
  auto t = Make(TinyVocab({"a b"}));
  EXPECT_EQ(Pieces(*t, *t->Encode("ab<|im_start|>ab<think><|im_start|>xy")),
            (Strs{"ab", "<|im_start|>", "ab", "<think>", "<|im_start|>x", "y"}));
  // A prefix of an added token is plain text: 10 single bytes (no merge applies).
  EXPECT_EQ(t->Encode("<|im_start")->size(), 10u);
}

TEST(BpeTokenizer, IgnoreMergesEmitsAWholeChunkThatIsAToken) {
  // "abc" is a piece but no merge builds it: llama3 (ignore_merges) emits it whole, qwen2 not.
  BpeVocab v = TinyVocab({"a b"}, "llama-bpe");
  v.pieces.push_back("abc");
  v.types.push_back(TokenType::kNormal);
  auto llama = Make(v);
  EXPECT_EQ(Pieces(*llama, *llama->Encode("abc")), (Strs{"abc"}));
  v.pre = "qwen2";
  auto qwen = Make(v);
  EXPECT_EQ(Pieces(*qwen, *qwen->Encode("abc")), (Strs{"ab", "c"}));
}

TEST(BpeTokenizer, AnyBytesRoundTripThroughTokenBytes) {
  auto t = Make(TinyVocab({"a b", B(0xC3) + " " + B(0xA9)}));
  for (const std::string& s :
       {std::string("ab \xFF\xFE\x80 \xC3"), std::string("\xC3\xA9t\xC3\xA9"),
        std::string("\0\x01\n\r\t", 5), std::string("<|im_start|>\xF0\x9F")}) {
    auto ids = t->Encode(s);
    ASSERT_TRUE(ids.ok());
    std::string back;
    for (int32_t id : *ids) back += t->IsControl(id) ? t->ControlText(id) : t->TokenBytes(id);
    EXPECT_EQ(back, s);
  }
}

TEST(BpeTokenizer, Qwen2FamilyNormalizesToNfcLlama3DoesNot) {
  auto qwen = Make(TinyVocab({B(0xC3) + " " + B(0xA9)}, "qwen2"));
  EXPECT_EQ(Pieces(*qwen, *qwen->Encode("e\xCC\x81")), (Strs{B(0xC3) + B(0xA9)}));
  auto llama = Make(TinyVocab({B(0xC3) + " " + B(0xA9)}, "llama-bpe"));
  EXPECT_EQ(llama->Encode("e\xCC\x81")->size(), 3u);  // e, 0xCC, 0x81
}

TEST(BpeTokenizer, TokenBytesAndControlText) {
  auto t = Make(TinyVocab({"a b"}));
  const int32_t im_start = t->Lookup("<|im_start|>");
  const int32_t think = t->Lookup("<think>");
  EXPECT_TRUE(t->IsControl(im_start));
  EXPECT_EQ(t->TokenBytes(im_start), "");
  EXPECT_EQ(t->ControlText(im_start), "<|im_start|>");
  EXPECT_FALSE(t->IsControl(think));
  EXPECT_EQ(t->TokenBytes(think), "<think>");  // user-defined: its text
  EXPECT_EQ(t->TokenBytes(' '), " ");          // id 32 is "Ġ"
  EXPECT_EQ(t->TokenBytes(-1), "");
  EXPECT_EQ(t->TokenBytes(t->vocab_size()), "");
}

TEST(BpeTokenizer, AddBosFollowsMetadata) {
  BpeVocab v = TinyVocab({"a b"});
  v.add_bos = true;
  auto with = Make(v);
  EXPECT_EQ(*TokenizePrompt(*with, "ab", true), (std::vector<int32_t>{with->bos_id(), 256}));
  EXPECT_EQ(*TokenizePrompt(*with, "ab", false), (std::vector<int32_t>{256}));
  v.add_bos = false;
  auto without = Make(v);
  EXPECT_EQ(*TokenizePrompt(*without, "ab", true), (std::vector<int32_t>{256}));
}

TEST(BpeTokenizer, InvalidVocabulariesAreRefused) {
  BpeVocab missing_byte = TinyVocab({"a b"});
  missing_byte.pieces[10] = "not-a-byte";  // byte 0x0A's character is gone
  EXPECT_EQ(BpeTokenizer::Create(missing_byte).status().code(), StatusCode::kDataLoss);
  BpeVocab bad_merge = TinyVocab({"a b"});
  bad_merge.merges.push_back("nospace");
  EXPECT_EQ(BpeTokenizer::Create(bad_merge).status().code(), StatusCode::kDataLoss);
  BpeVocab unknown_side = TinyVocab({"a b"});
  unknown_side.merges.push_back("ab zz");  // "zz" is not a piece (nor "abzz")
  EXPECT_EQ(BpeTokenizer::Create(unknown_side).status().code(), StatusCode::kDataLoss);
  BpeVocab bad_pre = TinyVocab({"a b"}, "no-such-pre");
  EXPECT_EQ(BpeTokenizer::Create(bad_pre).status().code(), StatusCode::kUnimplemented);
  BpeVocab bad_types = TinyVocab({"a b"});
  bad_types.types.pop_back();
  EXPECT_EQ(BpeTokenizer::Create(bad_types).status().code(), StatusCode::kDataLoss);
}

TEST(BpeTokenizer, StreamingDetokenizerHoldsPartialUtf8AndKeepsLeadingSpace) {
  auto t = Make(TinyVocab({"a b"}));
  // "😀" = F0 9F 98 80, one token per byte: nothing comes out until the last byte.
  StreamingDetokenizer d(*t);
  EXPECT_EQ(d.Push(' '), " ");  // byte-level: the first space is text, not a dummy prefix
  EXPECT_EQ(d.Push(0xF0), "");
  EXPECT_EQ(d.Push(0x9F), "");
  EXPECT_EQ(d.Push(0x98), "");
  EXPECT_EQ(d.Push(0x80), "\xF0\x9F\x98\x80");
  EXPECT_EQ(d.Push(0xC3), "");
  EXPECT_EQ(d.Flush(), "\xEF\xBF\xBD");  // an incomplete tail is U+FFFD
  const int32_t im_start = t->Lookup("<|im_start|>");
  const std::vector<int32_t> ids = {im_start, 'h', 'i'};
  EXPECT_EQ(DecodeTokens(*t, ids), "hi");
  EXPECT_EQ(DecodeTokens(*t, ids, /*show_special=*/true), "<|im_start|>hi");
}

TEST(BpeTokenizer, LoadsFromGgufAndTokenizerFromGgufPicksIt) {
  HfVocab hv;
  hv.vocab = TinyVocab({"a b"}, "llama-bpe");
  hv.vocab.add_bos = true;
  GgufWriter w;
  WriteBpeVocab(hv, w);
  const std::vector<uint8_t> bytes = w.Serialize();
  auto file = GgufFile::Parse(bytes);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  auto tok = TokenizerFromGguf(*file);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->vocab_size(), static_cast<int32_t>(hv.vocab.pieces.size()));
  EXPECT_TRUE((*tok)->add_bos());
  EXPECT_FALSE((*tok)->DropsFirstSpace());
  EXPECT_EQ(*(*tok)->Encode("ab1234"), (std::vector<int32_t>{256, '1', '2', '3', '4'}));
  auto bpe = BpeTokenizer::FromGguf(*file);
  ASSERT_TRUE(bpe.ok());
  EXPECT_EQ((*bpe)->pre_family(), "llama3");

  // Without EOS the file is refused by name (no SentencePiece-style default).
  GgufWriter no_eos;
  no_eos.SetString("tokenizer.ggml.model", "gpt2");
  no_eos.SetStringArray("tokenizer.ggml.tokens", hv.vocab.pieces);
  no_eos.SetStringArray("tokenizer.ggml.merges", hv.vocab.merges);
  no_eos.SetU32("tokenizer.ggml.bos_token_id", 0);
  const std::vector<uint8_t> no_eos_bytes = no_eos.Serialize();
  auto no_eos_file = GgufFile::Parse(no_eos_bytes);
  ASSERT_TRUE(no_eos_file.ok());
  auto refused = BpeTokenizer::FromGguf(*no_eos_file);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kNotFound);
  EXPECT_NE(refused.status().message().find("eos_token_id"), std::string::npos);
}

/// Writes `files` (name -> content) into a fresh temporary directory; returns its path.
std::filesystem::path WriteTempDir(const std::string& tag,
                                   const std::vector<std::pair<std::string, std::string>>& files) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("kvpush_hf_vocab_" + tag + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  for (const auto& [name, content] : files) std::ofstream(dir / name) << content;
  return dir;
}

TEST(HfVocab, ReadsTokenizerJsonAndConfig) {
  // Byte-level characters for all 256 bytes, "ab" at 300 (ids 256..299 unused -> [PAD]),
  // added tokens: special <|s|>, non-special <|fim|> (looks special -> control), <tool>.
  std::string vocab = "{";
  for (int b = 0; b < 256; ++b) {
    vocab += "\"" +
             std::string(b == '"'    ? "\\\""
                         : b == '\\' ? "\\\\"
                                     : B(static_cast<uint8_t>(b))) +
             "\": " + std::to_string(b) + ",";
  }
  vocab += "\"ab\": 300}";
  const std::string tokenizer_json =
      R"({"model": {"type": "BPE", "vocab": )" + vocab + R"(, "merges": [["a", "b"], "x y"]},
          "added_tokens": [{"id": 301, "content": "<|s|>", "special": true},
                           {"id": 302, "content": "<|fim|>", "special": false},
                           {"id": 303, "content": "<tool>", "special": false}]})";
  const auto dir =
      WriteTempDir("ok", {{"tokenizer.json", tokenizer_json},
                          {"tokenizer_config.json",
                           R"({"bos_token": {"content": "<|s|>"}, "eos_token": "<tool>",
                                            "add_bos_token": true, "chat_template": "T"})"}});
  auto hv = ReadHfTokenizerJson((dir / "tokenizer.json").string(), "qwen3");
  ASSERT_TRUE(hv.ok()) << hv.status().ToString();
  const BpeVocab& v = hv->vocab;
  ASSERT_EQ(v.pieces.size(), 304u);
  EXPECT_EQ(v.pieces[' '], "\xC4\xA0");
  EXPECT_EQ(v.pieces[256], "[PAD256]");
  EXPECT_EQ(v.types[256], TokenType::kUnused);
  EXPECT_EQ(v.pieces[300], "ab");
  EXPECT_EQ(v.types[300], TokenType::kNormal);
  EXPECT_EQ(v.types[301], TokenType::kControl);
  EXPECT_EQ(v.types[302], TokenType::kControl);
  EXPECT_EQ(v.types[303], TokenType::kUserDefined);
  EXPECT_EQ(v.merges, (Strs{"a b", "x y"}));
  EXPECT_EQ(v.pre, "qwen2");
  EXPECT_EQ(v.bos_id, 301);
  EXPECT_EQ(v.eos_id, 303);
  EXPECT_TRUE(v.add_bos);  // the config overrides the qwen default
  EXPECT_EQ(hv->chat_template, "T");

  // Without a config: the family's defaults name the specials; here they do not exist.
  std::filesystem::remove(dir / "tokenizer_config.json");
  auto llama = ReadHfTokenizerJson((dir / "tokenizer.json").string(), "llama3");
  ASSERT_FALSE(llama.ok());
  EXPECT_NE(llama.status().message().find("<|begin_of_text|>"), std::string::npos);
  EXPECT_EQ(ReadHfTokenizerJson((dir / "tokenizer.json").string(), "mistral").status().code(),
            StatusCode::kInvalidArgument);
  std::filesystem::remove_all(dir);
}

TEST(HfVocab, RefusesWhatIsNotAByteLevelBpeTokenizer) {
  const auto dir = WriteTempDir(
      "bad", {{"wordpiece.json", R"({"model": {"type": "WordPiece"}})"}, {"broken.json", "{"}});
  EXPECT_EQ(ReadHfTokenizerJson((dir / "wordpiece.json").string(), "qwen2").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadHfTokenizerJson((dir / "broken.json").string(), "qwen2").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadHfTokenizerJson((dir / "missing.json").string(), "qwen2").status().code(),
            StatusCode::kNotFound);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvpush
