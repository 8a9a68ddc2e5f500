// ParseJson: nlohmann::json documents parsed by simdjson (Debian's libsimdjson-dev), with
// nlohmann's own parser as the judge of whatever simdjson refuses.
//
// Why: a long prompt is a large JSON array (131,000 token ids are ~800 KB). nlohmann parses such
// a body at ~30–50 MB/s (65,536 ids: ~8 ms); simdjson's DOM parse plus the conversion to
// nlohmann values takes ~3 ms, on every instance's and the router's request path
// (docs/benchmarks/pd.md, *Long contexts*).
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>

namespace kvpush {

/// Parses `text` as one JSON document. The result is what nlohmann::json::parse(text, nullptr,
/// false) gives: the same values and number kinds (non-negative integers unsigned, negative ones
/// signed, the rest float; for a duplicated key the last value), and a discarded value
/// (is_discarded()) for text that is not JSON. One difference: -0 reads as unsigned 0 (nlohmann:
/// signed 0), the same value. simdjson parses whatever it accepts; the rest (invalid JSON, and
/// what only nlohmann accepts, e.g. 1e400 or integers beyond 64 bits) goes to nlohmann, whose
/// verdict stands. Thread-safe (no shared state).
nlohmann::json ParseJson(std::string_view text);

}  // namespace kvpush
