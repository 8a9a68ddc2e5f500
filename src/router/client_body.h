// ClientBody: a client's JSON request body as the router needs it, parsed fast and kept as its
// own bytes, so that a P or D leg forwards the members the router leaves alone byte for byte.
//
// Why: a long prompt is a large JSON array (131,000 token ids are ~800 KB). nlohmann parses that
// at ~30 MB/s and re-serializes it at ~100 MB/s; the router did both on the request's critical
// path (parse once, dump P's leg, dump D's leg: ~20 ms at 65,536 tokens, docs/benchmarks/pd.md
// *Long contexts*). simdjson (Debian's libsimdjson-dev) parses at GB/s, and the members the
// router does not set are copied from the client's text instead of being dumped again.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kvpush::router {

/// A parsed client body. `doc` is what nlohmann::json::parse gives for the same text (same
/// values and number kinds: non-negative integers unsigned, negative ones signed, the rest float;
/// for a duplicated key the last value; only -0 differs: unsigned 0 here, signed there). `text`
/// and `members` hold the client's bytes of each top-level member's value when `doc` is an
/// object; they are empty for a body the router built itself (ClientBody{json}) or one only
/// nlohmann accepted. Thread-safety: a value type.
struct ClientBody {
  /// One top-level member: its unescaped key and where its value's bytes lie in `text`.
  struct Member {
    std::string key;
    size_t offset = 0;
    size_t length = 0;
  };
  ClientBody() = default;
  /// A body the router built: no client bytes, legs are dumped from `doc`.
  explicit ClientBody(nlohmann::json d) : doc(std::move(d)) {}

  nlohmann::json doc;
  std::string text;
  std::vector<Member> members;  // in the text's order; a duplicated key: its last value

  /// The member named `key`, or nullptr.
  const Member* Find(std::string_view key) const;
  /// True for a member a leg forwards as the client's bytes without the router ever reading it
  /// into a leg's document: `prompt` and `messages` (no leg builder sets or erases them), when
  /// their bytes are held.
  bool Verbatim(std::string_view key) const;
  /// `doc` without its Verbatim members: what leg builders (pd/legs.h) start from, so that a long
  /// prompt is neither copied nor destroyed per leg (65,536 ids: ~2 ms each). ComposeLegBody puts
  /// the members back from the client's bytes.
  nlohmann::json Shell() const;
};

/// Parses `text` (ParseJson, common/json_parse.h: simdjson, nlohmann's verdicts); `members`
/// are filled when it is an object. Errors: kInvalidArgument when it is not JSON.
Result<ClientBody> ParseClientBody(std::string_view text);

/// The JSON text of a leg built from the client's body: `leg` (an object: client.Shell() or
/// client.doc with members the router set, replaced or erased), where every member whose value
/// equals the client's (same kind and value) is written as the client's own bytes and the rest is
/// dumped, followed by the client's Verbatim members the leg lacks, as the client's bytes. The
/// same JSON as leg.dump() with those members; a non-object leg or a client without members:
/// leg.dump().
std::string ComposeLegBody(const nlohmann::json& leg, const ClientBody& client);

}  // namespace kvpush::router
