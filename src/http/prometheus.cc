#include "http/prometheus.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace kvpush::http {
namespace {

std::string Number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest round-trip form
  return std::string(buf, r.ptr);
}

void AppendLabels(std::string& out, const Labels& labels) {
  for (const auto& [k, v] : labels) {
    if (!out.empty()) out += ',';
    out += k;
    out += "=\"";
    out += EscapeLabelValue(v);
    out += '"';
  }
}

}  // namespace

std::string FormatBound(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  const double a = std::fabs(v);
  char buf[400];
  std::to_chars_result r{};
  if (a != 0.0 && (a < 1e-4 || a >= 1e16)) {
    r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  } else {
    r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed);  // shortest digits
  }
  std::string s(buf, r.ptr);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string EscapeLabelValue(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

PrometheusWriter::PrometheusWriter(const Labels& common) {
  AppendLabels(common_, common);
}

void PrometheusWriter::Family(const MetricFamily& family) {
  out_ << "# HELP " << family.name << " " << family.help << "\n# TYPE " << family.name << " "
       << family.type << "\n";
}

void PrometheusWriter::Line(std::string_view name, const Labels& labels, std::string_view value) {
  std::string l = common_;
  AppendLabels(l, labels);
  out_ << name;
  if (!l.empty()) out_ << "{" << l << "}";
  out_ << " " << value << "\n";
}

void PrometheusWriter::Sample(std::string_view name, double value, const Labels& labels) {
  Line(name, labels, Number(value));
}

void PrometheusWriter::Sample(std::string_view name, int64_t value, const Labels& labels) {
  Line(name, labels, std::to_string(value));
}

void PrometheusWriter::HistogramSeries(std::string_view name, const Labels& labels,
                                       std::span<const double> bounds,
                                       std::span<const uint64_t> counts, double sum,
                                       uint64_t count) {
  const std::string bucket = std::string(name) + "_bucket";
  Labels with_le = labels;
  with_le.emplace_back("le", "");
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds.size(); ++i) {
    cum += i < counts.size() ? counts[i] : 0;
    with_le.back().second = FormatBound(bounds[i]);
    Sample(bucket, static_cast<double>(cum), with_le);
  }
  cum += counts.size() > bounds.size() ? counts.back() : 0;
  with_le.back().second = "+Inf";
  Sample(bucket, static_cast<double>(cum), with_le);
  Sample(std::string(name) + "_sum", sum, labels);
  Sample(std::string(name) + "_count", static_cast<double>(count), labels);
}

}  // namespace kvpush::http
