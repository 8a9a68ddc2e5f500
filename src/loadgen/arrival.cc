#include "loadgen/arrival.h"

#include <cmath>
#include <limits>
#include <random>

namespace kvpush::loadgen {

Result<std::vector<double>> InterArrivalGaps(size_t n, double rate, double burstiness,
                                             uint64_t seed) {
  if (!(rate > 0)) return InvalidArgument("--request-rate must be > 0 (inf = all at once)");
  if (!(burstiness > 0)) return InvalidArgument("--burstiness must be > 0");
  std::vector<double> gaps(n, 0.0);
  if (std::isinf(rate)) return gaps;
  if (std::isinf(burstiness)) {
    for (auto& g : gaps) g = 1.0 / rate;
    return gaps;
  }
  std::mt19937_64 rng(seed);
  std::gamma_distribution<double> gamma(burstiness, 1.0 / (rate * burstiness));
  for (auto& g : gaps) g = gamma(rng);
  return gaps;
}

Result<std::vector<double>> ArrivalSchedule(size_t n, double rate, double burstiness,
                                            uint64_t seed) {
  KVP_ASSIGN_OR_RETURN(std::vector<double> t, InterArrivalGaps(n, rate, burstiness, seed));
  for (size_t i = 1; i < t.size(); ++i) t[i] += t[i - 1];
  if (!t.empty() && t.back() > 0 && !std::isinf(rate)) {
    const double scale = (static_cast<double>(n) / rate) / t.back();
    for (auto& v : t) v *= scale;
  }
  return t;
}

}  // namespace kvpush::loadgen
