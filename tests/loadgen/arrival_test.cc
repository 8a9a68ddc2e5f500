// Arrival process: gap statistics over many draws (tolerances from the sample size), the effect
// of burstiness on the variance, determinism in the seed, vLLM's rescaling of the schedule.
#include "loadgen/arrival.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>

namespace kvpush::loadgen {
namespace {

constexpr size_t kDraws = 200000;

struct Moments {
  double mean = 0, var = 0;
};
Moments Of(const std::vector<double>& v) {
  Moments m;
  m.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  for (double x : v) m.var += (x - m.mean) * (x - m.mean);
  m.var /= static_cast<double>(v.size() - 1);
  return m;
}

TEST(LoadgenArrival, MeanGapIsOneOverRate) {
  const double rate = 4.0;
  for (double b : {0.5, 1.0, 3.0}) {
    auto gaps = InterArrivalGaps(kDraws, rate, b, 7);
    ASSERT_TRUE(gaps.ok());
    // A gap has mean 1/rate and std 1/(rate·√b); the mean of n gaps has std 1/(rate·√(b·n))
    // (0.16 % of the mean for b = 1, n = 200,000). Five standard errors: a false failure has
    // probability < 1e-6.
    const double se = 1.0 / (rate * std::sqrt(b * static_cast<double>(kDraws)));
    EXPECT_NEAR(Of(*gaps).mean, 1.0 / rate, 5 * se) << "burstiness " << b;
  }
}

TEST(LoadgenArrival, BurstinessSetsTheVariance) {
  const double rate = 2.0;
  // Var(gap) = 1 / (b · rate²). The sample variance's relative standard error is
  // √((excess kurtosis + 2) / n) = √((6/b + 2) / n): 1.1 % for b = 0.25, n = 200,000; 10 %
  // is > 8 standard errors for every b below.
  for (double b : {0.25, 1.0, 4.0}) {
    auto gaps = InterArrivalGaps(kDraws, rate, b, 11);
    ASSERT_TRUE(gaps.ok());
    const double want = 1.0 / (b * rate * rate);
    EXPECT_NEAR(Of(*gaps).var, want, 0.10 * want) << "burstiness " << b;
  }
  auto bursty = InterArrivalGaps(kDraws, rate, 0.25, 1);
  auto regular = InterArrivalGaps(kDraws, rate, 4.0, 1);
  EXPECT_GT(Of(*bursty).var, 10 * Of(*regular).var);  // 16x in expectation
}

TEST(LoadgenArrival, SameSeedSameSchedule) {
  auto a = ArrivalSchedule(100, 3.0, 0.7, 42);
  auto b = ArrivalSchedule(100, 3.0, 0.7, 42);
  auto c = ArrivalSchedule(100, 3.0, 0.7, 43);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *c);
}

TEST(LoadgenArrival, ScheduleIsRescaledToEndAtNOverRate) {
  auto t = ArrivalSchedule(50, 5.0, 1.0, 3);
  ASSERT_TRUE(t.ok());
  EXPECT_NEAR(t->back(), 10.0, 1e-9);  // vLLM's normalize_factor: last send at n / rate
  for (size_t i = 1; i < t->size(); ++i) EXPECT_GE((*t)[i], (*t)[i - 1]);
  EXPECT_GT(t->front(), 0.0);
}

TEST(LoadgenArrival, InfiniteRateAndBurstiness) {
  const double inf = std::numeric_limits<double>::infinity();
  auto all_now = ArrivalSchedule(10, inf, 1.0, 0);
  ASSERT_TRUE(all_now.ok());
  for (double v : *all_now) EXPECT_EQ(v, 0.0);
  auto even = ArrivalSchedule(4, 2.0, inf, 0);
  ASSERT_TRUE(even.ok());
  EXPECT_EQ(*even, (std::vector<double>{0.5, 1.0, 1.5, 2.0}));
}

TEST(LoadgenArrival, RefusesNonPositiveRateOrBurstiness) {
  EXPECT_FALSE(ArrivalSchedule(3, 0.0, 1.0, 0).ok());
  EXPECT_FALSE(ArrivalSchedule(3, 1.0, 0.0, 0).ok());
  EXPECT_FALSE(ArrivalSchedule(3, -1.0, 1.0, 0).ok());
}

}  // namespace
}  // namespace kvpush::loadgen
