#include "common/encoding.h"

#include <cstdio>

namespace kvpush {
namespace {

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

}  // namespace

std::string Base64Encode(const std::vector<uint8_t>& in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (in[i] << 16) | (in[i + 1] << 8) | in[i + 2];
    for (int k = 3; k >= 0; --k) out.push_back(kB64[(v >> (6 * k)) & 63]);
  }
  if (i + 1 == in.size()) {
    const uint32_t v = in[i] << 16;
    out.push_back(kB64[(v >> 18) & 63]);
    out.push_back(kB64[(v >> 12) & 63]);
    out += "==";
  } else if (i + 2 == in.size()) {
    const uint32_t v = (in[i] << 16) | (in[i + 1] << 8);
    out.push_back(kB64[(v >> 18) & 63]);
    out.push_back(kB64[(v >> 12) & 63]);
    out.push_back(kB64[(v >> 6) & 63]);
    out += "=";
  }
  return out;
}

Result<std::vector<uint8_t>> Base64Decode(const std::string& in) {
  if (in.size() % 4 != 0) return InvalidArgument("base64: length is not a multiple of 4");
  std::vector<uint8_t> out;
  out.reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    uint32_t v = 0;
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = in[i + k];
      uint32_t d = 0;
      if (c >= 'A' && c <= 'Z') {
        d = static_cast<uint32_t>(c - 'A');
      } else if (c >= 'a' && c <= 'z') {
        d = static_cast<uint32_t>(c - 'a' + 26);
      } else if (c >= '0' && c <= '9') {
        d = static_cast<uint32_t>(c - '0' + 52);
      } else if (c == '+') {
        d = 62;
      } else if (c == '/') {
        d = 63;
      } else if (c == '=' && i + 4 == in.size() && k >= 2) {
        ++pad;
      } else {
        return InvalidArgument("base64: bad character");
      }
      if (pad > 0 && c != '=') return InvalidArgument("base64: data after padding");
      v = (v << 6) | d;
    }
    out.push_back(static_cast<uint8_t>(v >> 16));
    if (pad < 2) out.push_back(static_cast<uint8_t>(v >> 8));
    if (pad < 1) out.push_back(static_cast<uint8_t>(v));
  }
  return out;
}

std::string Hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

Result<uint64_t> ParseHex64(const std::string& s) {
  if (s.empty() || s.size() > 16) return InvalidArgument("expected 1-16 hex digits");
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else {
      return InvalidArgument("expected hex digits");
    }
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  return v;
}

std::string Base64Encode(std::string_view in) {
  return Base64Encode(std::vector<uint8_t>(in.begin(), in.end()));
}

Result<std::string> Base64DecodeString(const std::string& in) {
  KVP_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, Base64Decode(in));
  return std::string(bytes.begin(), bytes.end());
}

bool IsVisibleAsciiId(std::string_view s) {
  if (s.empty() || s.size() > 256) return false;
  for (const char c : s) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

}  // namespace kvpush
