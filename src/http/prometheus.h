// PrometheusWriter: the one writer of Prometheus text for both front doors (/metrics of the
// instances and of the router). Format: the text exposition format 0.0.4,
// https://prometheus.io/docs/instrumenting/exposition_formats/ ("# HELP", "# TYPE", one sample a
// line, label values escaped as the format says: backslash, double quote, newline).
#pragma once

#include <cstdint>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvpush::http {

/// Label pairs in the order written: {{"role", "decode"}, {"url", "http://..."}}.
using Labels = std::vector<std::pair<std::string, std::string>>;

/// One family of a metrics table: its name, type ("counter", "gauge", "histogram") and help.
struct MetricFamily {
  const char* name;
  const char* type;
  const char* help;
};

/// `s` escaped for a label value (\\ for \, \" for ", \n for a newline). Pure.
std::string EscapeLabelValue(std::string_view s);

/// A histogram bound as an `le` label value, written as vLLM's Python client writes it (so a
/// fleet mixing vLLM and kvpush sums by the same `le`): the shortest decimal that reads back as
/// `v`, with ".0" on integral values ("0.001", "0.5", "1.0", "2560.0"); scientific below 1e-4
/// and from 1e16; "+Inf". Pure.
std::string FormatBound(double v);

/// Builds a Prometheus text page. Every sample carries the writer's `common` labels first (the
/// instances' model_name), then its own; a sample with no labels at all is written without
/// braces. Doubles are written in their shortest form that reads back exactly (std::to_chars:
/// "0.1", "3", "1e+20"), integers as integers. Not thread-safe (one writer per page).
class PrometheusWriter {
 public:
  explicit PrometheusWriter(const Labels& common = {});

  /// The # HELP and # TYPE lines of a family; its samples follow.
  void Family(const MetricFamily& family);
  void Sample(std::string_view name, double value, const Labels& labels = {});
  void Sample(std::string_view name, int64_t value, const Labels& labels = {});
  /// A family of one sample (a scalar counter or gauge).
  void Scalar(const MetricFamily& family, double value) {
    Family(family);
    Sample(family.name, value);
  }
  /// One series of a histogram family (call Family first): cumulative `name_bucket{le=...}` per
  /// bound and +Inf, then `name_sum` and `name_count`. `counts[i]` = observations in
  /// (bounds[i-1], bounds[i]]; counts has bounds.size() + 1 entries, the last for +Inf.
  void HistogramSeries(std::string_view name, const Labels& labels, std::span<const double> bounds,
                       std::span<const uint64_t> counts, double sum, uint64_t count);

  /// The page so far.
  std::string str() const { return out_.str(); }

 private:
  void Line(std::string_view name, const Labels& labels, std::string_view value);

  std::string common_;  ///< the common labels, written and escaped once
  std::ostringstream out_;
};

}  // namespace kvpush::http
