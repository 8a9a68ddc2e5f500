// libFuzzer target: the router's client-body parser (src/router/client_body.h).
// Input: any bytes, taken as a request body. Asserted:
//   * ParseClientBody accepts exactly what nlohmann::json::parse accepts, and its document equals
//     nlohmann's (== compares values: -0's kind is the one documented difference);
//   * for an object, the leg composed from the client's bytes (ComposeLegBody) parses back to
//     the document, also when built from the Shell (no prompt or messages) with the router's
//     edits (a member set, one erased): then prompt and messages come back from the client's bytes.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "router/client_body.h"

using kvpush::router::ClientBody;
using kvpush::router::ComposeLegBody;
using kvpush::router::ParseClientBody;
using nlohmann::json;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const json want = json::parse(text, nullptr, /*allow_exceptions=*/false);
  const auto got = ParseClientBody(text);
  Check(got.ok() == !want.is_discarded());
  if (!got.ok()) return 0;
  Check(got->doc == want);
  if (!want.is_object()) {
    Check(got->members.empty());
    return 0;
  }
  Check(json::parse(ComposeLegBody(got->doc, *got), nullptr, false) == want);
  // A leg built from the shell, as the router builds them: set one member, erase another.
  json leg = got->Shell();
  for (auto it = leg.begin(); it != leg.end(); ++it) Check(!got->Verbatim(it.key()));
  if (!leg.empty()) leg.erase(leg.begin());
  leg["max_tokens"] = 1;
  json full = leg;
  for (const auto& m : got->members) {
    if (got->Verbatim(m.key)) full[m.key] = want[m.key];
  }
  Check(json::parse(ComposeLegBody(leg, *got), nullptr, false) == full);
  return 0;
}
