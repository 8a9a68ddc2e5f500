#include "http/prometheus.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "http/api_error.h"

namespace kvpush::http {
namespace {

TEST(PrometheusWriter, FamilyLinesAndSamplesWithCommonLabels) {
  PrometheusWriter w(Labels{{"model_name", "m"}});
  w.Scalar({"x_total", "counter", "Things."}, 3.0);
  w.Sample("y", int64_t{7}, {{"role", "decode"}});
  EXPECT_EQ(w.str(),
            "# HELP x_total Things.\n# TYPE x_total counter\nx_total{model_name=\"m\"} 3\n"
            "y{model_name=\"m\",role=\"decode\"} 7\n");
}

TEST(PrometheusWriter, NoLabelsMeansNoBraces) {
  PrometheusWriter w;
  w.Sample("threads", int64_t{12});
  w.Sample("ratio", 0.5);
  EXPECT_EQ(w.str(), "threads 12\nratio 0.5\n");
}

TEST(PrometheusWriter, DoublesAreShortestRoundTripAndIntegersHaveNoPoint) {
  PrometheusWriter w;
  w.Sample("a", 0.1);
  w.Sample("b", 1e20);
  w.Sample("c", -2.0);
  w.Sample("d", int64_t{-9007199254740993});  // beyond a double's exact integers
  w.Sample("e", 0.1 + 0.2);                   // not 0.3: every digit that tells it apart
  EXPECT_EQ(w.str(), "a 0.1\nb 1e+20\nc -2\nd -9007199254740993\ne 0.30000000000000004\n");
}

TEST(PrometheusWriter, BoundsAreWrittenAsVllmsPythonClientWritesThem) {
  // prometheus_client's floatToGoString(repr(float)) for vLLM's own bucket bounds.
  EXPECT_EQ(FormatBound(0.001), "0.001");
  EXPECT_EQ(FormatBound(0.0001), "0.0001");
  EXPECT_EQ(FormatBound(0.00025), "0.00025");
  EXPECT_EQ(FormatBound(0.1), "0.1");
  EXPECT_EQ(FormatBound(0.075), "0.075");
  EXPECT_EQ(FormatBound(1.0), "1.0");
  EXPECT_EQ(FormatBound(2560.0), "2560.0");
  EXPECT_EQ(FormatBound(16384.0), "16384.0");
  EXPECT_EQ(FormatBound(1e-5), "1e-05");
  EXPECT_EQ(FormatBound(HUGE_VAL), "+Inf");
}

TEST(PrometheusWriter, LabelValuesAreEscapedAsTheFormatSays) {
  EXPECT_EQ(EscapeLabelValue("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
  PrometheusWriter w(Labels{{"model_name", "we\"ird\n"}});
  w.Sample("n", int64_t{1}, {{"url", "http://h:1/\\"}});
  EXPECT_EQ(w.str(), "n{model_name=\"we\\\"ird\\n\",url=\"http://h:1/\\\\\"} 1\n");
}

TEST(PrometheusWriter, HistogramSeriesIsCumulativeWithInfSumAndCount) {
  PrometheusWriter w;
  const std::vector<double> bounds = {0.001, 0.5};
  const std::vector<uint64_t> counts = {2, 0, 3};  // the last: above every bound
  w.Family({"lat_seconds", "histogram", "Latency."});
  w.HistogramSeries("lat_seconds", {{"phase", "p"}}, bounds, counts, 4.25, 5);
  EXPECT_EQ(w.str(),
            "# HELP lat_seconds Latency.\n# TYPE lat_seconds histogram\n"
            "lat_seconds_bucket{phase=\"p\",le=\"0.001\"} 2\n"
            "lat_seconds_bucket{phase=\"p\",le=\"0.5\"} 2\n"
            "lat_seconds_bucket{phase=\"p\",le=\"+Inf\"} 5\n"
            "lat_seconds_sum{phase=\"p\"} 4.25\n"
            "lat_seconds_count{phase=\"p\"} 5\n");
}

TEST(PrometheusWriter, AnEmptyHistogramHasOnlyZeros) {
  PrometheusWriter w;
  w.HistogramSeries("h", {}, std::vector<double>{1.0}, std::vector<uint64_t>{}, 0.0, 0);
  EXPECT_EQ(w.str(), "h_bucket{le=\"1.0\"} 0\nh_bucket{le=\"+Inf\"} 0\nh_sum 0\nh_count 0\n");
}

TEST(ApiError, BodyHasNullParamAndCodeWhenEmpty) {
  EXPECT_EQ((ApiError{404, "no", "invalid_request_error", "", ""}.ToJson()),
            R"({"error":{"code":null,"message":"no","param":null,"type":"invalid_request_error"}})");
  EXPECT_EQ(ApiError::Invalid("bad", "n", "c").ToJson(),
            R"({"error":{"code":"c","message":"bad","param":"n","type":"invalid_request_error"}})");
}

}  // namespace
}  // namespace kvpush::http
