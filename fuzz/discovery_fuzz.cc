// libFuzzer target: what etcd (or anyone who can write to it) hands kvpush's discovery
// (src/discovery): a watch-stream line, a range answer, and an instance record value.
// Input: the bytes, used as all three. Asserted:
//   * ParseWatchLine / ParseRangeResponse / InstanceRecord::Parse never crash nor throw;
//   * a record that parses writes back (ToJson) to a document that parses to the same record,
//     under the same key;
//   * MembershipCore fed the record (put, then delete) ends with nothing admitted.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "discovery/etcd_client.h"
#include "discovery/instance_record.h"
#include "discovery/membership.h"
#include "fuzz_check.h"

using namespace kvpush::discovery;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  (void)ParseWatchLine(text);
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_discarded()) (void)ParseRangeResponse(j);
  auto any = InstanceRecord::FromJson(j.is_discarded() ? nlohmann::json() : j);
  if (!any.ok()) return 0;
  const std::string key = any->Key("/kvpush/");
  auto r = InstanceRecord::Parse("/kvpush/", key, text);
  Check(r.ok());
  auto back = InstanceRecord::Parse("/kvpush/", key, r->ToJson().dump());
  Check(back.ok() && *back == *r);
  MembershipCore core("/kvpush/");
  core.Put(KeyValue{key, text, 1, 0});
  core.Delete(key);
  Check(core.admitted().empty());
  return 0;
}
