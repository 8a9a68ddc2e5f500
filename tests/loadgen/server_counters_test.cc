#include "loadgen/server_counters.h"

#include <gtest/gtest.h>

namespace kvpush::loadgen {
namespace {

constexpr const char* kPage =
    "# HELP vllm:prefix_cache_queries_total Prefix cache queries.\n"
    "# TYPE vllm:prefix_cache_queries_total counter\n"
    "vllm:prefix_cache_queries_total{model_name=\"m\"} 1000\n"
    "vllm:prefix_cache_hits_total{model_name=\"m\"} 250\n"
    "vllm:prefix_cache_hits_total_extra{model_name=\"m\"} 7\n"  // another family: not summed
    "vllm:external_prefix_cache_queries_total{model_name=\"m\"} 900\n"
    "vllm:external_prefix_cache_hits_total{model_name=\"m\"} 600\n";

TEST(ServerCounters, SumSamplesMatchesTheWholeNameOverEveryLabelSet) {
  EXPECT_EQ(SumSamples(kPage, "vllm:prefix_cache_hits_total"), 250.0);
  EXPECT_EQ(SumSamples("a{x=\"1\"} 2\na{x=\"2\"} 3.5\nab 100\na 1\n", "a"), 6.5);
  EXPECT_FALSE(SumSamples(kPage, "vllm:absent").has_value());
  EXPECT_FALSE(SumSamples("# TYPE a counter\n", "a").has_value());
}

TEST(ServerCounters, PagesWithoutTheCountersAreNotCounted) {
  PrefixCacheCounters c;
  AddPrefixCacheCounters(kPage, &c);
  AddPrefixCacheCounters("kvpush_router_requests_total{mode=\"push\"} 3\n", &c);  // a router
  EXPECT_EQ(c.pages, 1);
  EXPECT_EQ(c.queries, 1000);
  EXPECT_EQ(c.hits, 250);
  EXPECT_EQ(c.external_queries, 900);
  EXPECT_EQ(c.external_hits, 600);
}

TEST(ServerCounters, LinesGiveTheRunsDifferenceOrSayWhyNone) {
  PrefixCacheCounters before, after;
  after.pages = before.pages = 1;
  before.queries = 100;
  before.hits = 10;
  after.queries = 300;
  after.hits = 60;
  const std::string lines = FormatPrefixCacheLines(before, after, {"http://h:1"});
  EXPECT_NE(lines.find("Prefix cache hit rate (%):"), std::string::npos);
  EXPECT_NE(lines.find("25.00"), std::string::npos);
  EXPECT_NE(lines.find("(50 of 200 prompt tokens)"), std::string::npos);
  EXPECT_EQ(lines.find("KV from a peer"), std::string::npos);  // no connector counters moved
  PrefixCacheCounters none;
  const std::string why = FormatPrefixCacheLines(none, none, {"http://router:8192"});
  EXPECT_NE(why.find("not reported by http://router:8192"), std::string::npos);
  EXPECT_NE(why.find("--metrics-url"), std::string::npos);
}

}  // namespace
}  // namespace kvpush::loadgen
