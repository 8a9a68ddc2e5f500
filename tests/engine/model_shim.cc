// Stand-ins for the model layer's sampler and streaming detokenizer, compiled into the engine
// tests ONLY while src/model is still an INTERFACE placeholder (tests/engine/CMakeLists.txt).
// Once the model layer has real sources, its implementations are used instead.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "model/sampler.h"
#include "model/tokenizer.h"

namespace kvpush {

Status SamplingParams::Validate() const {
  if (!(temperature >= 0.0f)) return InvalidArgument("temperature must be >= 0");
  if (!(top_p > 0.0f && top_p <= 1.0f)) return InvalidArgument("top_p must be in (0, 1]");
  if (top_k < -1) return InvalidArgument("top_k must be >= -1");
  if (logprobs < -1 || logprobs > 20) return InvalidArgument("logprobs must be in [0, 20]");
  return Status::Ok();
}

SampleResult Sample(std::span<const float> logits, const SamplingParams& params,
                    int64_t output_index) {
  SampleResult r;
  const size_t n = logits.size();
  float mx = *std::max_element(logits.begin(), logits.end());
  double z = 0;
  for (float l : logits) z += std::exp(static_cast<double>(l - mx));
  auto lp = [&](size_t i) { return static_cast<float>(logits[i] - mx - std::log(z)); };
  size_t pick =
      static_cast<size_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  if (params.temperature > 0.0f) {
    uint64_t x = params.seed ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(output_index + 1));
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    double u = static_cast<double>(x >> 11) * 0x1.0p-53;
    std::vector<double> p(n);
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += p[i] = std::exp((logits[i] - mx) / params.temperature);
    double acc = 0;
    pick = n - 1;
    for (size_t i = 0; i < n; ++i) {
      acc += p[i] / s;
      if (u < acc) {
        pick = i;
        break;
      }
    }
  }
  r.token = static_cast<int32_t>(pick);
  if (params.logprobs >= 0) {
    r.logprob = lp(pick);
    std::vector<size_t> idx(n);
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(),
                     [&](size_t a, size_t b) { return logits[a] > logits[b]; });
    for (size_t i = 0; i < static_cast<size_t>(params.logprobs) && i < n; ++i) {
      r.top_logprobs.emplace_back(static_cast<int32_t>(idx[i]), lp(idx[i]));
    }
  }
  return r;
}

namespace {
// Length of the longest prefix of `s` made of complete UTF-8 characters (invalid bytes count as
// complete so they are flushed).
size_t CompletePrefix(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i + len > s.size()) break;
    i += len;
  }
  return i;
}
}  // namespace

std::string StreamingDetokenizer::Push(int32_t id) {
  if (tokenizer_->IsControl(id)) return {};
  std::string piece = tokenizer_->TokenBytes(id);
  if (first_ && !piece.empty()) {
    if (piece[0] == ' ') piece.erase(0, 1);
    first_ = false;
  }
  pending_ += piece;
  size_t k = CompletePrefix(pending_);
  std::string out = pending_.substr(0, k);
  pending_.erase(0, k);
  return out;
}

std::string StreamingDetokenizer::Flush() {
  std::string out = pending_.empty() ? "" : "\xEF\xBF\xBD";
  pending_.clear();
  return out;
}

std::string DecodeTokens(const Tokenizer& tokenizer, std::span<const int32_t> ids) {
  StreamingDetokenizer d(tokenizer);
  std::string out;
  for (int32_t id : ids) out += d.Push(id);
  return out + d.Flush();
}

}  // namespace kvpush
