// The tracer behind vLLM's --otlp-traces-endpoint on `kvpush serve` and `kvpush router`
// (http/tracing.h; docs/server.md, "Traces").
#pragma once

#include <memory>
#include <string>

#include "apps/build_info.h"
#include "common/status.h"
#include "http/tracing.h"

namespace kvpush::apps {

/// Null when `endpoint` is empty (tracing off); else a tracer exporting to it as service
/// "kvpush" with resource attribute kvpush.role = `role` (router, prefill, decode, colocated)
/// and this build's version. Errors: those of http::Tracer::Create.
inline Result<std::shared_ptr<http::Tracer>> MakeTracer(const std::string& endpoint,
                                                        const std::string& role) {
  if (endpoint.empty()) return std::shared_ptr<http::Tracer>();
  http::Tracer::Options o;
  o.endpoint = endpoint;
  o.version = ThisBuild().version;
  o.resource = {{"kvpush.role", role}};
  auto t = http::Tracer::Create(std::move(o));
  if (!t.ok()) return t.status();
  return std::shared_ptr<http::Tracer>(std::move(t).value());
}

}  // namespace kvpush::apps
