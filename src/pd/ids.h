// The identifiers of the P/D protocol (docs/pd_protocol.md §1): transfer ids, request ids and the
// prompt hash. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace kvpush::pd {

/// True when `id` is a transfer id: exactly 32 lowercase hex characters (the router mints them).
bool IsValidTransferId(std::string_view id);

/// True for a client-supplied `x-request-id` that the router and the instances keep: 1..256
/// visible ASCII characters (0x21..0x7e). Any other value is replaced by a minted id.
bool IsValidRequestId(std::string_view id);

/// The protocol's prompt_hash: XXH3-64 of the token ids as int32 little-endian (the byte order
/// of every machine we target, x86-64 and aarch64).
uint64_t PromptHash(std::span<const int32_t> tokens);

}  // namespace kvpush::pd
