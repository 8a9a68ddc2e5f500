// The executor against an independent NumPy implementation of each published architecture
// (tests/model/reference/gguf_reference.py: its own GGUF reader, float64, HF transformers'
// formulas). For a small random model of each architecture and prompts of 1, 17 and 300 tokens,
// the logits of every position (fed one token per step, the decode path) and of the last
// position of the whole prompt as one chunk (the prefill path) must agree with the reference to
// 1e-4 relative: max |kvpush - reference| / max |reference| over the compared logits. Models
// stored as F16, BF16, Q8_0, Q4_K and Q6_K are compared with the reference running the same
// stored weights (dequantized by the reference's own reader), through kvpush's float path
// (QuantMath::kDequantF32). Q8_0, Q4_K and Q6_K are compared again through the default integer path
// (QuantMath::kInt8: int8 activations), whose error is that of the activation rounding and is
// bounded by kInt8Tolerance (measured values in docs/model.md).
// Skips with a message when /usr/bin/python3 or numpy is missing (Debian: python3-numpy).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/random_model.h"
#include "model_test_util.h"
#include "test_util.h"

namespace kvpush {
namespace {

constexpr double kTolerance = 1e-4;
constexpr double kInt8Tolerance = 3e-2;
constexpr const char* kPython = "/usr/bin/python3";

struct ArchCase {
  const char* label;
  RandomLlamaOptions options;
};

RandomLlamaOptions Base(const char* arch, uint64_t seed) {
  RandomLlamaOptions o;
  o.arch = arch;
  o.dim = 96;
  o.layers = 2;
  o.heads = 4;
  o.kv_heads = 2;
  o.hidden_dim = 160;
  o.vocab = 400;
  o.context = 512;
  o.seed = seed;
  o.name = std::string("ref-") + arch;
  return o;
}

std::vector<ArchCase> Cases() {
  std::vector<ArchCase> c;
  RandomLlamaOptions qwen3 = Base("qwen3", 11);
  qwen3.head_dim = 32;  // heads * head_dim = 128 != dim 96, as Qwen3's 16 x 128 with dim 1024
  qwen3.rope_freq_base = 1000000.0f;
  qwen3.tied_output = true;  // Qwen3-0.6B ties its classifier
  c.push_back({"qwen3", qwen3});
  RandomLlamaOptions llama3 = Base("llama3", 12);
  llama3.dim = 128;
  llama3.kv_heads = 1;                // GQA 4:1
  llama3.rope_freq_base = 500000.0f;  // with rope_freqs (Llama 3.1 scaling)
  c.push_back({"llama3", llama3});
  RandomLlamaOptions qwen2 = Base("qwen2", 13);
  qwen2.heads = 6;  // head_dim 16
  qwen2.rope_freq_base = 1000000.0f;
  qwen2.tied_output = true;
  c.push_back({"qwen2", qwen2});
  c.push_back({"llama2", Base("llama", 14)});
  // Weights kept in a stored type; the reference dequantizes them itself (its own reading of
  // ggml's block formats) and runs the same quantized weights in float64.
  RandomLlamaOptions qwen3_q4k = Base("qwen3", 15);
  qwen3_q4k.dim = 256;  // K-quant rows are multiples of 256
  qwen3_q4k.hidden_dim = 512;
  qwen3_q4k.head_dim = 64;
  qwen3_q4k.rope_freq_base = 1000000.0f;
  qwen3_q4k.tied_output = true;
  qwen3_q4k.dtype = GgmlType::kQ4_K;
  c.push_back({"qwen3_q4_k", qwen3_q4k});
  RandomLlamaOptions llama3_q6k = Base("llama3", 16);
  llama3_q6k.dim = 256;
  llama3_q6k.hidden_dim = 512;
  llama3_q6k.kv_heads = 1;
  llama3_q6k.rope_freq_base = 500000.0f;
  llama3_q6k.dtype = GgmlType::kQ6_K;
  c.push_back({"llama3_q6_k", llama3_q6k});
  RandomLlamaOptions qwen2_q8 = qwen2;
  qwen2_q8.dtype = GgmlType::kQ8_0;
  c.push_back({"qwen2_q8_0", qwen2_q8});
  RandomLlamaOptions qwen3_bf16 = qwen3;
  qwen3_bf16.dtype = GgmlType::kBF16;
  c.push_back({"qwen3_bf16", qwen3_bf16});
  RandomLlamaOptions llama2_f16 = Base("llama", 17);
  llama2_f16.dtype = GgmlType::kF16;
  c.push_back({"llama2_f16", llama2_f16});
  return c;
}

bool NumpyAvailable(std::string* why) {
  if (!std::filesystem::exists(kPython)) {
    *why = std::string(kPython) + " not found";
    return false;
  }
  const std::string cmd = std::string(kPython) + " -c 'import numpy' >/dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    *why =
        "numpy is not importable by " + std::string(kPython) + " (apt-get install python3-numpy)";
    return false;
  }
  return true;
}

/// The reference's logits [n, vocab] for `tokens`, or empty on failure (reported).
std::vector<double> ReferenceLogits(const std::string& model, const std::vector<int32_t>& tokens,
                                    const std::string& dir) {
  const std::string tok_path = dir + "/tokens.i32", out_path = dir + "/logits.f64";
  {
    std::ofstream f(tok_path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(tokens.data()),
            static_cast<std::streamsize>(tokens.size() * sizeof(int32_t)));
  }
  const std::string cmd = std::string(kPython) + " " + KVPUSH_REFERENCE_PY + " " + model + " " +
                          tok_path + " " + out_path;
  const int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << cmd;
  if (rc != 0) return {};
  std::ifstream f(out_path, std::ios::binary | std::ios::ate);
  std::vector<double> v(static_cast<size_t>(f.tellg()) / sizeof(double));
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()),
         static_cast<std::streamsize>(v.size() * sizeof(double)));
  return v;
}

/// max |a - ref| / max |ref| over `n` values.
double RelError(const float* a, const double* ref, size_t n) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - ref[i]));
    scale = std::max(scale, std::abs(ref[i]));
  }
  return diff / scale;
}

class ArchReferenceTest : public ::testing::TestWithParam<ArchCase> {};

/// Loads `path` and checks its logits against the reference for prompts of 1, 17 and 300 tokens.
void CompareWithReference(const std::string& path, const std::string& label, const std::string& dir,
                          QuantMath quant = QuantMath::kDequantF32, double tolerance = kTolerance) {
  ModelLoadOptions lo;
  lo.path = path;
  lo.quant_math = quant;
  auto m = LoadModel(lo);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const ModelConfig& c = m->config;
  const auto vocab = static_cast<size_t>(c.vocab_size);
  std::mt19937 rng(42);
  std::vector<int32_t> all(300);
  for (int32_t& t : all) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(c.vocab_size));
  for (size_t n : {size_t{1}, size_t{17}, size_t{300}}) {
    const std::vector<int32_t> prompt(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n));
    const std::vector<double> ref = ReferenceLogits(path, prompt, dir);
    ASSERT_EQ(ref.size(), n * vocab);
    const auto blocks = static_cast<int32_t>((n + 15) / 16);
    // Decode path: one token per step, logits at every position.
    auto kv = testing::MakeCache(c, blocks);
    const auto table = testing::Blocks(0, blocks);
    std::vector<float> logits(n * vocab);
    for (size_t p = 0; p < n; ++p) {
      SequenceChunk ch;
      ch.tokens = std::span<const int32_t>(prompt).subspan(p, 1);
      ch.start_pos = static_cast<int32_t>(p);
      ch.block_table = table;
      ch.want_logits = true;
      ASSERT_TRUE(
          m->executor->Execute({&ch, 1}, *kv, std::span<float>(logits).subspan(p * vocab), nullptr)
              .ok());
    }
    const double decode_err = RelError(logits.data(), ref.data(), n * vocab);
    // Prefill path: the whole prompt in one chunk, logits of the last position.
    auto kv2 = testing::MakeCache(c, blocks);
    SequenceChunk ch;
    ch.tokens = prompt;
    ch.block_table = table;
    ch.want_logits = true;
    std::vector<float> last(vocab);
    ASSERT_TRUE(m->executor->Execute({&ch, 1}, *kv2, last, nullptr).ok());
    const double prefill_err = RelError(last.data(), ref.data() + (n - 1) * vocab, vocab);
    std::printf(
        "%-11s prompt %3zu tokens: max rel error all positions (decode) %.2e, last "
        "(prefill) %.2e\n",
        label.c_str(), n, decode_err, prefill_err);
    EXPECT_LT(decode_err, tolerance) << label << " n=" << n;
    EXPECT_LT(prefill_err, tolerance) << label << " n=" << n;
  }
}

std::string TempDir() {
  std::string dir = (std::filesystem::temp_directory_path() / "kvpush-archref-XXXXXX").string();
  EXPECT_NE(mkdtemp(dir.data()), nullptr);
  return dir;
}

TEST_P(ArchReferenceTest, LogitsMatchNumpyReference) {
  std::string why;
  if (!NumpyAvailable(&why)) GTEST_SKIP() << "NumPy reference unavailable: " << why;
  const ArchCase& ac = GetParam();
  const std::string dir = TempDir();
  const std::string path = dir + "/" + ac.label + ".gguf";
  auto w = BuildRandomLlamaGguf(ac.options);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE(w->WriteFile(path).ok());
  CompareWithReference(path, ac.label, dir);
  const GgmlType t = ac.options.dtype;
  if (t == GgmlType::kQ8_0 || t == GgmlType::kQ4_K || t == GgmlType::kQ6_K) {
    CompareWithReference(path, std::string(ac.label) + " int8", dir, QuantMath::kInt8,
                         kInt8Tolerance);
  }
  std::filesystem::remove_all(dir);
}

// A trained model converted by llama.cpp's own converter (Wq/Wk rows permuted by it): checks the
// reference's un-permutation and the executor on real weights.
TEST(ArchReferenceStories, Stories260KLogitsMatchNumpyReference) {
  std::string why;
  if (!NumpyAvailable(&why)) GTEST_SKIP() << "NumPy reference unavailable: " << why;
  KVP_REQUIRE_SHARED_MODEL(path, "stories260K.gguf");
  const std::string dir = TempDir();
  CompareWithReference(path, "stories260K", dir);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Archs, ArchReferenceTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<ArchCase>& i) {
                           return std::string(i.param.label);
                         });

}  // namespace
}  // namespace kvpush
