#include "server/request_trace.h"

#include <utility>

#include "common/clock.h"

namespace kvpush::server {
namespace {

http::Span Child(http::Tracer& tracer, const http::TraceContext& parent, std::string name,
                 int64_t from_ns, int64_t to_ns, int64_t offset) {
  http::Span c;
  c.trace_id = parent.trace_id;
  c.span_id = tracer.NewSpanId();
  c.parent_span_id = parent.span_id;
  c.name = std::move(name);
  c.kind = http::SpanKind::kInternal;
  c.start_unix_ns = http::Tracer::UnixNanos(from_ns, offset);
  c.end_unix_ns = http::Tracer::UnixNanos(to_ns, offset);
  return c;
}

}  // namespace

void RecordRequestSpans(http::Tracer& tracer, const RequestTrace& trace, const std::string& name,
                        std::vector<http::SpanAttribute> attributes, const std::string& error,
                        const RequestOutput* timing) {
  const int64_t now = NowNs();
  const int64_t offset = http::Tracer::UnixOffset();
  if (timing != nullptr) {
    const struct {
      const char* name;
      int64_t from, to;
    } phases[] = {{"engine queue", timing->arrival_ns, timing->first_scheduled_ns},
                  {"engine prefill", timing->first_scheduled_ns, timing->first_token_ns},
                  {"engine decode", timing->first_token_ns, timing->last_token_ns}};
    for (const auto& p : phases) {
      if (p.from == 0 || p.to == 0 || p.to < p.from) continue;
      tracer.Record(Child(tracer, trace.context, p.name, p.from, p.to, offset));
    }
  }
  http::Span s;
  s.trace_id = trace.context.trace_id;
  s.span_id = trace.context.span_id;
  s.parent_span_id = trace.parent;
  s.name = name;
  s.kind = http::SpanKind::kServer;
  s.start_unix_ns = http::Tracer::UnixNanos(trace.start_ns, offset);
  s.end_unix_ns = http::Tracer::UnixNanos(now, offset);
  s.attributes = std::move(attributes);
  s.error = !error.empty();
  s.status_message = error;
  tracer.Record(std::move(s));
}

void HandoffTraces::Register(const std::string& transfer_id,
                             const http::TraceContext& request_span) {
  MutexLock lock(mu_);
  if (by_transfer_.emplace(transfer_id, request_span).second) order_.push_back(transfer_id);
  while (order_.size() > capacity_) {
    by_transfer_.erase(order_.front());
    order_.pop_front();
  }
}

void HandoffTraces::OnRecord(const connector::HandoffRecord& r) {
  http::TraceContext parent;
  {
    MutexLock lock(mu_);
    auto it = by_transfer_.find(r.transfer_id);
    if (it == by_transfer_.end()) return;
    parent = it->second;
    by_transfer_.erase(it);  // its id stays in order_ until evicted: erase of a gone key is a no-op
  }
  const int64_t offset = http::Tracer::UnixOffset();
  for (const connector::HandoffInterval& iv : connector::HandoffIntervals()) {
    const int64_t from = r.at(iv.from), to = r.at(iv.to);
    if (from == 0 || to == 0 || to < from) continue;
    http::Span s = Child(*tracer_, parent, std::string("handoff ") + iv.name, from, to,
                        offset);
    s.attributes = {{"kvpush.transfer_id", r.transfer_id},
                    {"kvpush.mode", std::string(r.push ? "push" : "pull")},
                    {"kvpush.kv_ok", r.ok}};
    if (r.blocks > 0) s.attributes.push_back({"kvpush.blocks", static_cast<int64_t>(r.blocks)});
    if (r.bytes > 0) s.attributes.push_back({"kvpush.bytes", r.bytes});
    tracer_->Record(std::move(s));
  }
}

}  // namespace kvpush::server
