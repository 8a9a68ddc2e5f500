// libFuzzer target: POST /kv/transfer_status (src/connector/transfer_status.h), the liveness query
// of a decode instance's quarantined transfers: the query any process reaching a prefill
// instance's port can POST, and the prefill instance's answer a decode instance releases blocks
// on. The input is parsed as JSON and read both ways.
// Asserted:
//   * TransferStatusQuery::FromJson refuses with kInvalidArgument and a message, or returns a
//     query with an engine id of 1..255 bytes and 1..256 distinct valid transfer ids, which
//     re-encodes (ToJson) to one that parses to the same value;
//   * TransferStatusAnswer::FromJson, to a fixed query of two ids and to the parsed query itself,
//     refuses with kInvalidArgument and a message, or answers exactly the ids asked (those not
//     named pending), and re-encodes to one that parses to the same answer; an id settled in
//     the answer is one the input named "settled".
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "connector/transfer_status.h"
#include "fuzz_check.h"
#include "json_boundary.h"
#include "pd/ids.h"

using namespace kvpush;
using namespace kvpush::connector;

namespace {

void CheckRefusal(const Status& s) {
  Check(s.code() == StatusCode::kInvalidArgument && !s.message().empty());
}

void CheckAnswer(const nlohmann::json& j, const TransferStatusQuery& asked) {
  auto a = TransferStatusAnswer::FromJson(j, asked);
  if (!a.ok()) {
    CheckRefusal(a.status());
    return;
  }
  Check(a->settled.size() == asked.transfer_ids.size());
  for (const std::string& id : asked.transfer_ids) {
    auto it = a->settled.find(id);
    Check(it != a->settled.end());
    if (it->second) Check(j["transfers"].contains(id) && j["transfers"][id] == "settled");
  }
  auto again = TransferStatusAnswer::FromJson(a->ToJson(), asked);
  Check(again.ok() && again->settled == a->settled);
}

void CheckDocument(const nlohmann::json& j) {
  auto q = TransferStatusQuery::FromJson(j);
  if (q.ok()) {
    Check(!q->engine_id.empty() && q->engine_id.size() <= 255);
    Check(!q->transfer_ids.empty() && q->transfer_ids.size() <= kMaxStatusTransfers);
    std::set<std::string> ids(q->transfer_ids.begin(), q->transfer_ids.end());
    Check(ids.size() == q->transfer_ids.size());
    for (const std::string& id : ids) Check(pd::IsValidTransferId(id));
    auto again = TransferStatusQuery::FromJson(q->ToJson());
    Check(again.ok() && again->engine_id == q->engine_id && again->transfer_ids == q->transfer_ids);
    CheckAnswer(j, *q);
  } else {
    CheckRefusal(q.status());
  }
  TransferStatusQuery fixed;
  fixed.engine_id = "decode-0";
  fixed.transfer_ids = {std::string(32, '0'), std::string(31, '0') + "1"};
  CheckAnswer(j, fixed);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  CheckDocument(j);
  CheckDocument(kvpush::fuzz::WithBoundaryNumber(j, kvpush::fuzz::BoundarySeed(data, size)));
  return 0;
}
