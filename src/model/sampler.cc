// Sample() and SamplingParams::Validate (declared in model/sampler.h).
#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

namespace kvpush {

namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

/// SplitMix64 finaliser (Steele, Lea, Flood 2014).
uint64_t SplitMix64(uint64_t x) {
  uint64_t z = x + kGolden;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// Uniform double in [0, 1) for output token `index` of a request seeded `seed`.
double CounterUniform(uint64_t seed, int64_t index) {
  const uint64_t r = SplitMix64(seed ^ (kGolden * (static_cast<uint64_t>(index) + 1)));
  return static_cast<double>(r >> 11) * 0x1.0p-53;
}

int32_t Argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  }
  return best;
}

}  // namespace

Status SamplingParams::Validate() const {
  if (!std::isfinite(temperature) || temperature < 0.0f) {
    return InvalidArgument("temperature must be a finite number >= 0, got " +
                           std::to_string(temperature));
  }
  if (top_k < -1)
    return InvalidArgument("top_k must be -1, 0 or positive, got " + std::to_string(top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return InvalidArgument("top_p must be in (0, 1], got " + std::to_string(top_p));
  }
  if (logprobs < -1)
    return InvalidArgument("logprobs must be >= 0, got " + std::to_string(logprobs));
  return Status::Ok();
}

SampleResult Sample(std::span<const float> logits, const SamplingParams& params,
                    int64_t output_index) {
  SampleResult result;
  if (logits.empty()) return result;
  const size_t n = logits.size();

  if (params.temperature == 0.0f) {
    result.token = Argmax(logits);
  } else {
    // Candidates sorted by logit (descending, lowest id first on ties), truncated by top-k.
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    auto by_logit = [&](int32_t a, int32_t b) {
      const float la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
      return la != lb ? la > lb : a < b;
    };
    size_t keep = n;
    if (params.top_k > 0 && static_cast<size_t>(params.top_k) < n) {
      keep = static_cast<size_t>(params.top_k);
      std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep),
                        order.end(), by_logit);
    } else {
      std::sort(order.begin(), order.end(), by_logit);
    }
    // Softmax of logits / T over the candidates, in double, fixed order.
    const double inv_t = 1.0 / static_cast<double>(params.temperature);
    const double top = static_cast<double>(logits[static_cast<size_t>(order[0])]);
    std::vector<double> prob(keep);
    double sum = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      prob[i] =
          std::exp((static_cast<double>(logits[static_cast<size_t>(order[i])]) - top) * inv_t);
      sum += prob[i];
    }
    // Top-p: the smallest prefix whose probability mass reaches top_p (at least one token).
    if (params.top_p < 1.0f) {
      const double target = static_cast<double>(params.top_p) * sum;
      double cum = 0.0;
      size_t cut = keep;
      for (size_t i = 0; i < keep; ++i) {
        cum += prob[i];
        if (cum >= target) {
          cut = i + 1;
          break;
        }
      }
      keep = cut;
      sum = 0.0;
      for (size_t i = 0; i < keep; ++i) sum += prob[i];
    }
    const double u = CounterUniform(params.seed, output_index) * sum;
    double cum = 0.0;
    result.token = order[keep - 1];
    for (size_t i = 0; i < keep; ++i) {
      cum += prob[i];
      if (u < cum) {
        result.token = order[i];
        break;
      }
    }
  }

  // Log-softmax of the raw logits (temperature 1), as OpenAI/vLLM report logprobs.
  double max = logits[static_cast<size_t>(Argmax(logits))];
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max);
  const double log_z = max + std::log(sum);
  result.logprob =
      static_cast<float>(static_cast<double>(logits[static_cast<size_t>(result.token)]) - log_z);
  if (params.logprobs > 0) {
    const size_t k = std::min(n, static_cast<size_t>(params.logprobs));
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                      [&](int32_t a, int32_t b) {
                        const float la = logits[static_cast<size_t>(a)];
                        const float lb = logits[static_cast<size_t>(b)];
                        return la != lb ? la > lb : a < b;
                      });
    result.top_logprobs.reserve(k);
    for (size_t i = 0; i < k; ++i) {
      result.top_logprobs.emplace_back(
          order[i],
          static_cast<float>(static_cast<double>(logits[static_cast<size_t>(order[i])]) - log_z));
    }
  }
  return result;
}

}  // namespace kvpush
