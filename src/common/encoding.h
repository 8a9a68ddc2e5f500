// Text encodings shared by layers that speak JSON to peers: standard base64 (RFC 4648, with
// padding) and fixed-width lower-case hex of 64-bit values. Pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kvpush {

/// Standard base64 with '=' padding.
std::string Base64Encode(const std::vector<uint8_t>& in);
/// As above, of a byte string.
std::string Base64Encode(std::string_view in);
/// Decodes standard base64 (length a multiple of 4, padding only at the end).
/// Errors: kInvalidArgument (bad length, character, or data after padding).
Result<std::vector<uint8_t>> Base64Decode(const std::string& in);
/// As Base64Decode, into a byte string.
Result<std::string> Base64DecodeString(const std::string& in);
/// 16 lower-case hex digits.
std::string Hex64(uint64_t v);
/// 1-16 hex digits (either case). Errors: kInvalidArgument.
Result<uint64_t> ParseHex64(const std::string& s);
/// True for 1..256 visible ASCII characters (0x21..0x7e): the rule a client's x-request-id must
/// pass to be kept (pd::IsValidRequestId) and to be logged as the request's id (http/).
bool IsVisibleAsciiId(std::string_view s);

}  // namespace kvpush
