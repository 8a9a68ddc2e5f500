// libFuzzer target: kv_transfer_params (src/pd/kv_transfer_params.h), the object a client or
// the router puts in a /v1/completions or /v1/chat/completions body for a P/D leg.
// Input: JSON text (not JSON: ignored); checked as given and with one of its numbers replaced
// by a boundary value (json_boundary.h). Asserted:
//   * a refusal has a message and a param that names "kv_transfer_params...";
//   * an accepted object has role kNone exactly when neither do_remote_decode nor
//     do_remote_prefill is true, and otherwise a valid transfer id and every field equal to the
//     value the JSON gave: integers exactly (no wrap-around of a number beyond int64), ids in
//     [0, 2^31), port in [0, 65535], a finite first_token_logprob, transfer_mode / pull_profile
//     / remote_scheme as spelled;
//   * an accepted object written back (pd::ToJson) parses back equal.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "common/encoding.h"
#include "fuzz_check.h"
#include "json_boundary.h"
#include "pd/ids.h"
#include "pd/kv_transfer_params.h"

using namespace kvpush;
using nlohmann::json;

namespace {

bool Given(const json& j, const char* k) {
  return j.contains(k) && !j[k].is_null();
}

/// True when the JSON number `v` is exactly the integer `x` (unsigned JSON numbers compared as
/// unsigned, so 2^64-1 is not -1).
bool SameInteger(const json& v, int64_t x) {
  if (v.is_number_unsigned()) return x >= 0 && v.get<uint64_t>() == static_cast<uint64_t>(x);
  return v.is_number_integer() && v.get<int64_t>() == x;
}

bool Flag(const json& j, const char* k) {
  return Given(j, k) && j[k].is_boolean() && j[k].get<bool>();
}

void Run(const json& j) {
  auto r = pd::ParseKvTransferParams(j);
  if (const auto* e = std::get_if<pd::ParamError>(&r)) {
    Check(e->param.rfind("kv_transfer_params", 0) == 0 && !e->message.empty());
    return;
  }
  const pd::KvTransferParams& p = std::get<pd::KvTransferParams>(r);
  using Role = pd::KvTransferParams::Role;
  const bool decode = Flag(j, "do_remote_decode");
  const bool prefill = Flag(j, "do_remote_prefill");
  Check(!(decode && prefill));
  if (!decode && !prefill) {
    Check(p.role == Role::kNone);
    return;
  }
  Check(p.role == (decode ? Role::kProducer : Role::kConsumer));
  Check(pd::IsValidTransferId(p.transfer_id));
  if (Given(j, "transfer_id") && j["transfer_id"] != "") Check(j["transfer_id"] == p.transfer_id);
  const bool push = Given(j, "transfer_mode") && j["transfer_mode"] == "push";
  Check(p.mode == (push ? pd::KvTransferParams::Mode::kPush : pd::KvTransferParams::Mode::kPull));
  if (Given(j, "remote_engine_id")) Check(j["remote_engine_id"] == p.remote_engine_id);
  if (Given(j, "remote_host")) Check(j["remote_host"] == p.remote_host);
  Check(p.remote_port >= 0 && p.remote_port <= 65535);
  if (Given(j, "remote_port")) Check(SameInteger(j["remote_port"], p.remote_port));
  Check(p.remote_https == (Given(j, "remote_scheme") && j["remote_scheme"] == "https"));
  if (Given(j, "remote_scheme")) {
    Check(j["remote_scheme"] == "https" || j["remote_scheme"] == "http");
  }
  if (Given(j, "remote_block_ids")) {
    const json& b = j["remote_block_ids"];
    Check(b.size() == p.remote_block_ids.size());
    for (size_t i = 0; i < b.size(); ++i) {
      Check(p.remote_block_ids[i] >= 0 && SameInteger(b[i], p.remote_block_ids[i]));
    }
  }
  Check(p.num_prompt_tokens >= 0);
  if (Given(j, "num_prompt_tokens"))
    Check(SameInteger(j["num_prompt_tokens"], p.num_prompt_tokens));
  Check(p.first_token_id >= -1);
  if (Given(j, "first_token_id")) Check(SameInteger(j["first_token_id"], p.first_token_id));
  Check(std::isfinite(p.first_token_logprob));
  if (Given(j, "prompt_hash") && !j["prompt_hash"].get<std::string>().empty()) {
    Check(ParseHex64(j["prompt_hash"].get<std::string>()).value() == p.prompt_hash);
  }
  if (Given(j, "pull_profile") && !j["pull_profile"].get<std::string>().empty()) {
    Check(p.pull_profile && pd::PullProfileName(*p.pull_profile) == j["pull_profile"]);
  } else {
    Check(!p.pull_profile);
  }
  auto again = pd::ParseKvTransferParams(pd::ToJson(p));
  Check(std::holds_alternative<pd::KvTransferParams>(again) &&
        std::get<pd::KvTransferParams>(again) == p);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto j = json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  Run(j);
  Run(kvpush::fuzz::WithBoundaryNumber(j, kvpush::fuzz::BoundarySeed(data, size)));
  return 0;
}
