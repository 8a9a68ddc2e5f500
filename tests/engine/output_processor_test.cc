// OutputTextProcessor: stop strings on detokenized text (spanning tokens, excluded from the
// output), hold-back, UTF-8 completeness.
#include "engine/output_processor.h"

#include <gtest/gtest.h>

#include "fake_model.h"

namespace kvpush::testing {
namespace {

std::vector<int32_t> Enc(const FakeTokenizer& tok, std::string_view s) {
  auto r = tok.Encode(s);
  EXPECT_TRUE(r.ok());
  return *r;
}

TEST(OutputTextProcessorTest, NoStopStringsStreamsEverything) {
  FakeTokenizer tok;
  OutputTextProcessor p(tok, {});
  std::string all;
  for (int32_t id : Enc(tok, "the cat sat")) all += p.Append(id).text;
  all += p.Flush();
  EXPECT_EQ(all, "the cat sat");
}

TEST(OutputTextProcessorTest, StopStringSpanningTokensIsExcluded) {
  FakeTokenizer tok;
  OutputTextProcessor p(tok, {"t sa"});
  std::string all;
  bool stopped = false;
  for (int32_t id : Enc(tok, "the cat sat on the mat")) {
    auto d = p.Append(id);
    all += d.text;
    if (d.stopped) {
      stopped = true;
      EXPECT_EQ(d.stop_string, "t sa");
      break;
    }
  }
  EXPECT_TRUE(stopped);
  all += p.Flush();
  EXPECT_EQ(all, "the ca");
}

TEST(OutputTextProcessorTest, HoldBackReleasesTextWhenNoMatch) {
  FakeTokenizer tok;
  OutputTextProcessor p(tok, {"xyz!"});
  std::string streamed;
  for (int32_t id : Enc(tok, "the cat")) streamed += p.Append(id).text;
  EXPECT_EQ(streamed, "the ");  // the last 3 bytes ("cat") are held back
  EXPECT_EQ(streamed + p.Flush(), "the cat");
}

TEST(OutputTextProcessorTest, EarliestStopStringWins) {
  FakeTokenizer tok;
  OutputTextProcessor p(tok, {"mat", "sat"});
  std::string all;
  for (int32_t id : Enc(tok, "the cat sat on the mat")) {
    auto d = p.Append(id);
    all += d.text;
    if (d.stopped) {
      EXPECT_EQ(d.stop_string, "sat");
      break;
    }
  }
  EXPECT_EQ(all, "the cat ");
}

TEST(OutputTextProcessorTest, MultiByteCharactersComeOutWhole) {
  FakeTokenizer tok;
  OutputTextProcessor p(tok, {"zz"});  // hold back 1 byte
  // 60 + 61 = U+00E9 split over two byte tokens; 62 + 63 = U+20AC.
  std::vector<std::string> deltas;
  for (int32_t id : {3, 60, 61, 62, 63, 4}) deltas.push_back(p.Append(id).text);
  deltas.push_back(p.Flush());
  std::string all;
  for (const auto& d : deltas) {
    all += d;
    // Every delta is a sequence of complete UTF-8 characters.
    for (size_t i = 0; i < d.size();) {
      auto c = static_cast<unsigned char>(d[i]);
      size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
      ASSERT_LE(i + len, d.size()) << "split character in delta";
      i += len;
    }
  }
  EXPECT_EQ(all,
            "a\xC3\xA9\xE2\x82\xAC"
            "b");
}

TEST(OutputTextProcessorTest, HeldOffTextOnlyLeadsIntoAMatch) {
  // vLLM's min_tokens: text of held-off tokens is never searched on its own, but a match may
  // start in it and end in later text (check_stop_strings looks back len(stop) - 1 bytes).
  FakeTokenizer tok;
  const std::vector<int32_t> ids = Enc(tok, "the cat sat");
  auto run = [&](size_t held_tokens) {
    OutputTextProcessor p(tok, {"cat"});
    std::string all;
    for (size_t i = 0; i < ids.size(); ++i) {
      auto d = p.Append(ids[i], i >= held_tokens);
      all += d.text;
      if (d.stopped) return all + "|stop";
    }
    return all + p.Flush();
  };
  // Tokens held off: all that cover "the cat" / all that end within "the ca".
  size_t cover = 0, before = 0, seen = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    seen += tok.TokenBytes(ids[i]).size();
    if (seen <= 6) before = i + 1;
    if (cover == 0 && seen >= 7) cover = i + 1;
  }
  EXPECT_EQ(run(cover), "the cat sat");  // "cat" lies in held-off text only: no match
  EXPECT_EQ(run(before), "the |stop");   // "cat" ends in later text: it matches
}

}  // namespace
}  // namespace kvpush::testing
