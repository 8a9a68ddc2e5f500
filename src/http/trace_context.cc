#include "http/trace_context.h"

namespace kvpush::http {
namespace {

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;  // upper case is invalid in traceparent
}

/// Decodes 2 * n lower-case hex digits into out[0..n); false on any other character.
bool DecodeHex(std::string_view s, uint8_t* out, size_t n) {
  if (s.size() != 2 * n) return false;
  for (size_t i = 0; i < n; ++i) {
    const int hi = HexDigit(s[2 * i]), lo = HexDigit(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return true;
}

template <size_t N>
bool AllZero(const std::array<uint8_t, N>& a) {
  for (uint8_t b : a) {
    if (b != 0) return false;
  }
  return true;
}

}  // namespace

std::optional<TraceContext> ParseTraceparent(std::string_view v) {
  // version(2) - trace-id(32) - parent-id(16) - flags(2) = 55 characters.
  constexpr size_t kLen = 55;
  if (v.size() < kLen || v[2] != '-' || v[35] != '-' || v[52] != '-') return std::nullopt;
  uint8_t version = 0;
  if (!DecodeHex(v.substr(0, 2), &version, 1) || version == 0xff) return std::nullopt;
  if (version == 0 && v.size() != kLen) return std::nullopt;
  if (version != 0 && v.size() > kLen && v[kLen] != '-') return std::nullopt;
  TraceContext c;
  if (!DecodeHex(v.substr(3, 32), c.trace_id.data(), 16) ||
      !DecodeHex(v.substr(36, 16), c.span_id.data(), 8) ||
      !DecodeHex(v.substr(53, 2), &c.flags, 1)) {
    return std::nullopt;
  }
  if (AllZero(c.trace_id) || AllZero(c.span_id)) return std::nullopt;
  return c;
}

std::string Hex(const uint8_t* bytes, size_t n) {
  static const char* kDigits = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[bytes[i] >> 4];
    out[2 * i + 1] = kDigits[bytes[i] & 15];
  }
  return out;
}

std::string FormatTraceparent(const TraceContext& c) {
  return "00-" + Hex(c.trace_id.data(), 16) + "-" + Hex(c.span_id.data(), 8) + "-" +
         Hex(&c.flags, 1);
}

TraceId NewTraceId(std::mt19937_64& rng) {
  TraceId id{};
  while (AllZero(id)) {
    for (size_t i = 0; i < id.size(); i += 8) {
      const uint64_t r = rng();
      for (size_t k = 0; k < 8; ++k) id[i + k] = static_cast<uint8_t>(r >> (8 * k));
    }
  }
  return id;
}

SpanId NewSpanId(std::mt19937_64& rng) {
  SpanId id{};
  while (AllZero(id)) {
    const uint64_t r = rng();
    for (size_t k = 0; k < 8; ++k) id[k] = static_cast<uint8_t>(r >> (8 * k));
  }
  return id;
}

}  // namespace kvpush::http
