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
  // The best value stays in a register: comparing against logits[best] made every iteration
  // wait for the previous select and a dependent load (~0.4 ms per 152k-entry row, perf).
  int32_t best = 0;
  float best_value = logits[0];
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > best_value) {
      best_value = logits[i];
      best = static_cast<int32_t>(i);
    }
  }
  return best;
}

/// Sorted (id, count) of `ids`, ids ascending.
std::vector<std::pair<int32_t, int32_t>> Counts(std::span<const int32_t> ids) {
  std::vector<int32_t> sorted(ids.begin(), ids.end());
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::pair<int32_t, int32_t>> out;
  for (int32_t t : sorted) {
    if (!out.empty() && out.back().first == t) {
      ++out.back().second;
    } else {
      out.emplace_back(t, 1);
    }
  }
  return out;
}

/// Temperature / min-p / top-k / top-p sampling over (processed) `logits`; T > 0.
int32_t SampleRandom(std::span<const float> logits, const SamplingParams& params,
                     int64_t output_index) {
  const size_t n = logits.size();
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
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep), order.end(),
                      by_logit);
  } else {
    std::sort(order.begin(), order.end(), by_logit);
  }
  // Softmax of logits / T over the candidates, in double, fixed order; prob[i] is relative to
  // the most likely token (prob[0] == 1), which is what min-p compares against.
  const double inv_t = 1.0 / static_cast<double>(params.temperature);
  const double top = static_cast<double>(logits[static_cast<size_t>(order[0])]);
  std::vector<double> prob(keep);
  for (size_t i = 0; i < keep; ++i) {
    prob[i] = std::exp((static_cast<double>(logits[static_cast<size_t>(order[i])]) - top) * inv_t);
  }
  // Min-p: drop the tail below min_p * p(top) (the order is descending, so it is a cut).
  if (params.min_p > 0.0f) {
    const double floor = static_cast<double>(params.min_p);
    size_t cut = 1;
    while (cut < keep && prob[cut] >= floor) ++cut;
    keep = cut;
  }
  // Suppressed tokens (-inf) have probability 0 and never count.
  while (keep > 1 && prob[keep - 1] == 0.0) --keep;
  double sum = 0.0;
  for (size_t i = 0; i < keep; ++i) sum += prob[i];
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
  for (size_t i = 0; i < keep; ++i) {
    cum += prob[i];
    if (u < cum) return order[i];
  }
  return order[keep - 1];
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
  if (!(min_p >= 0.0f && min_p <= 1.0f)) {
    return InvalidArgument("min_p must be in [0, 1], got " + std::to_string(min_p));
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return InvalidArgument("presence_penalty must be in [-2, 2], got " +
                           std::to_string(presence_penalty));
  }
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return InvalidArgument("frequency_penalty must be in [-2, 2], got " +
                           std::to_string(frequency_penalty));
  }
  if (!(repetition_penalty > 0.0f && repetition_penalty <= 10.0f)) {
    return InvalidArgument("repetition_penalty must be in (0, 10], got " +
                           std::to_string(repetition_penalty));
  }
  for (size_t i = 0; i < logit_bias.size(); ++i) {
    const auto& [id, bias] = logit_bias[i];
    if (id < 0 || (i > 0 && id <= logit_bias[i - 1].first)) {
      return InvalidArgument("logit_bias token ids must be >= 0, ascending and unique");
    }
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return InvalidArgument("logit_bias values must be in [-100, 100], got " +
                             std::to_string(bias));
    }
  }
  if (logprobs < -1)
    return InvalidArgument("logprobs must be >= 0, got " + std::to_string(logprobs));
  return Status::Ok();
}

void ApplyLogitsProcessors(std::span<float> logits, const SamplingParams& params,
                           const SamplingHistory& history) {
  const auto vocab = static_cast<int64_t>(logits.size());
  auto in_vocab = [&](int32_t t) { return t >= 0 && t < vocab; };
  for (const auto& [id, bias] : params.logit_bias) {
    if (in_vocab(id)) logits[static_cast<size_t>(id)] += bias;
  }
  bool any_left = history.suppressed.empty();
  if (!any_left) {
    std::vector<int32_t> s(history.suppressed.begin(), history.suppressed.end());
    std::sort(s.begin(), s.end());
    s.erase(std::unique(s.begin(), s.end()), s.end());
    std::erase_if(s, [&](int32_t t) { return !in_vocab(t); });
    if (static_cast<int64_t>(s.size()) < vocab) {  // never suppress the whole vocabulary
      for (int32_t t : s) logits[static_cast<size_t>(t)] = -INFINITY;
    }
  }
  if (params.repetition_penalty != 1.0f) {
    std::vector<int32_t> seen(history.prompt.begin(), history.prompt.end());
    seen.insert(seen.end(), history.output.begin(), history.output.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int32_t t : seen) {
      if (!in_vocab(t)) continue;
      float& l = logits[static_cast<size_t>(t)];
      l = l > 0.0f ? l / params.repetition_penalty : l * params.repetition_penalty;
    }
  }
  if (params.frequency_penalty != 0.0f || params.presence_penalty != 0.0f) {
    for (const auto& [t, count] : Counts(history.output)) {
      if (!in_vocab(t)) continue;
      float& l = logits[static_cast<size_t>(t)];
      l -= params.frequency_penalty * static_cast<float>(count);
      l -= params.presence_penalty;
    }
  }
}

SampleResult Sample(std::span<const float> logits, const SamplingParams& params,
                    int64_t output_index, const SamplingHistory& history) {
  SampleResult result;
  if (logits.empty()) return result;

  std::vector<float> processed;
  std::span<const float> scores = logits;
  if (params.has_processors() || !history.suppressed.empty()) {
    processed.assign(logits.begin(), logits.end());
    ApplyLogitsProcessors(processed, params, history);
    scores = processed;
  }
  result.token =
      params.temperature == 0.0f ? Argmax(scores) : SampleRandom(scores, params, output_index);

  // Log-softmax of the raw logits (temperature 1), as OpenAI/vLLM report logprobs. Only when
  // logprobs were asked for: over a 152k vocabulary it costs ~1 ms per token on a CPU core, 6x
  // the argmax (perf of a sim decode instance; vLLM too computes logprobs only on request).
  if (params.logprobs < 0) return result;
  SampleResult lp = TokenLogprobs(logits, result.token, params.logprobs);
  result.logprob = lp.logprob;
  result.top_logprobs = std::move(lp.top_logprobs);
  return result;
}

SampleResult TokenLogprobs(std::span<const float> logits, int32_t token, int32_t k) {
  SampleResult result;
  result.token = token;
  const size_t n = logits.size();
  if (n == 0 || token < 0 || static_cast<size_t>(token) >= n) return result;
  double max = logits[static_cast<size_t>(Argmax(logits))];
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max);
  const double log_z = max + std::log(sum);
  result.logprob =
      static_cast<float>(static_cast<double>(logits[static_cast<size_t>(token)]) - log_z);
  if (k > 0) {
    const size_t top = std::min(n, static_cast<size_t>(k));
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(top), order.end(),
                      [&](int32_t a, int32_t b) {
                        const float la = logits[static_cast<size_t>(a)];
                        const float lb = logits[static_cast<size_t>(b)];
                        return la != lb ? la > lb : a < b;
                      });
    result.top_logprobs.reserve(top);
    for (size_t i = 0; i < top; ++i) {
      result.top_logprobs.emplace_back(
          order[i],
          static_cast<float>(static_cast<double>(logits[static_cast<size_t>(order[i])]) - log_z));
    }
  }
  return result;
}

}  // namespace kvpush
