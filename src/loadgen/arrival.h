// Request arrival schedule of `kvpush bench`: Poisson or gamma inter-arrival gaps, as vLLM's
// vllm/benchmarks/serve.py get_request (--request-rate, --burstiness, --seed).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace kvpush::loadgen {

/// `n` raw inter-arrival gaps in seconds, each drawn from Gamma(shape = burstiness,
/// scale = 1 / (rate · burstiness)): mean 1/rate, variance 1/(burstiness · rate²), so
/// burstiness 1 is a Poisson process, < 1 burstier, > 1 more regular. rate = +inf gives zeros;
/// burstiness = +inf gives exactly 1/rate. Deterministic in (n, rate, burstiness, seed)
/// (std::mt19937_64 + std::gamma_distribution; not numpy's stream). Errors: kInvalidArgument
/// for rate ≤ 0 or burstiness ≤ 0.
Result<std::vector<double>> InterArrivalGaps(size_t n, double rate, double burstiness,
                                             uint64_t seed);

/// Send times in seconds from the benchmark start: the cumulative sum of InterArrivalGaps,
/// then, like vLLM (no ramp-up), rescaled so the last request is sent at exactly n / rate (vLLM
/// does this to make the throughput of different seeds comparable). All zeros for rate = +inf.
/// Errors: as InterArrivalGaps.
Result<std::vector<double>> ArrivalSchedule(size_t n, double rate, double burstiness,
                                            uint64_t seed);

}  // namespace kvpush::loadgen
