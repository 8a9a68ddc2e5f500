#include "http/tracing.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <cstring>
#include <ctime>

#include "common/clock.h"

namespace kvpush::http {
namespace {

// Protobuf wire format (https://protobuf.dev/programming-guides/encoding/): a field is its tag
// varint (field number << 3 | wire type) then its value.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2 };

void PutVarint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}

void PutTag(std::string& out, uint32_t field, WireType type) {
  PutVarint(out, (static_cast<uint64_t>(field) << 3) | type);
}

void PutBytes(std::string& out, uint32_t field, std::string_view bytes) {
  PutTag(out, field, kLengthDelimited);
  PutVarint(out, bytes.size());
  out.append(bytes.data(), bytes.size());
}

void PutFixed64(std::string& out, uint32_t field, uint64_t v) {
  PutTag(out, field, kFixed64);
  for (int i = 0; i < 8; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

template <size_t N>
std::string_view View(const std::array<uint8_t, N>& a) {
  return {reinterpret_cast<const char*>(a.data()), N};
}

// common.proto: AnyValue { string_value = 1; bool_value = 2; int_value = 3; double_value = 4 }
std::string AnyValue(const SpanAttribute& a) {
  std::string v;
  if (const auto* s = std::get_if<std::string>(&a.value)) {
    PutBytes(v, 1, *s);
  } else if (const auto* b = std::get_if<bool>(&a.value)) {
    PutTag(v, 2, kVarint);
    PutVarint(v, *b ? 1 : 0);
  } else if (const auto* i = std::get_if<int64_t>(&a.value)) {
    PutTag(v, 3, kVarint);
    PutVarint(v, static_cast<uint64_t>(*i));  // int64: two's complement, 10 bytes if negative
  } else {
    const double d = std::get<double>(a.value);
    uint64_t bits = 0;
    std::memcpy(&bits, &d, sizeof bits);
    PutFixed64(v, 4, bits);
  }
  return v;
}

// common.proto: KeyValue { string key = 1; AnyValue value = 2 }
void PutAttributes(std::string& out, uint32_t field, const std::vector<SpanAttribute>& attrs) {
  for (const SpanAttribute& a : attrs) {
    std::string kv;
    PutBytes(kv, 1, a.key);
    PutBytes(kv, 2, AnyValue(a));
    PutBytes(out, field, kv);
  }
}

bool IsZero(const SpanId& id) {
  for (uint8_t b : id) {
    if (b != 0) return false;
  }
  return true;
}

// trace.proto: Span { trace_id = 1; span_id = 2; parent_span_id = 4; name = 5; kind = 6;
// start_time_unix_nano = 7 (fixed64); end_time_unix_nano = 8 (fixed64); attributes = 9;
// status = 15 }, Status { message = 2; code = 3 (0 unset, 2 error) }.
std::string EncodeSpan(const Span& s) {
  std::string out;
  PutBytes(out, 1, View(s.trace_id));
  PutBytes(out, 2, View(s.span_id));
  if (!IsZero(s.parent_span_id)) PutBytes(out, 4, View(s.parent_span_id));
  PutBytes(out, 5, s.name);
  PutTag(out, 6, kVarint);
  PutVarint(out, static_cast<uint64_t>(s.kind));
  PutFixed64(out, 7, s.start_unix_ns);
  PutFixed64(out, 8, s.end_unix_ns);
  PutAttributes(out, 9, s.attributes);
  if (s.error) {
    std::string status;
    if (!s.status_message.empty()) PutBytes(status, 2, s.status_message);
    PutTag(status, 3, kVarint);
    PutVarint(status, 2);
    PutBytes(out, 15, status);
  }
  return out;
}

}  // namespace

std::string EncodeOtlpTraces(const std::vector<SpanAttribute>& resource,
                             std::string_view scope_name, std::string_view scope_version,
                             std::span<const Span> spans) {
  // resource.proto: Resource { attributes = 1 }. common.proto: InstrumentationScope { name = 1;
  // version = 2 }. trace.proto: ScopeSpans { scope = 1; spans = 2 }, ResourceSpans { resource =
  // 1; scope_spans = 2 }. trace_service.proto: ExportTraceServiceRequest { resource_spans = 1 }.
  std::string res;
  PutAttributes(res, 1, resource);
  std::string scope;
  PutBytes(scope, 1, scope_name);
  PutBytes(scope, 2, scope_version);
  std::string scope_spans;
  PutBytes(scope_spans, 1, scope);
  for (const Span& s : spans) PutBytes(scope_spans, 2, EncodeSpan(s));
  std::string resource_spans;
  PutBytes(resource_spans, 1, res);
  PutBytes(resource_spans, 2, scope_spans);
  std::string request;
  PutBytes(request, 1, resource_spans);
  return request;
}

Result<std::unique_ptr<Tracer>> Tracer::Create(Options options) {
  const std::string& e = options.endpoint;
  const std::string scheme = "http://";
  if (e.rfind(scheme, 0) != 0) {
    return InvalidArgument("--otlp-traces-endpoint '" + e +
                           "': OTLP/HTTP endpoints only (http://HOST:PORT[/PATH]; https and "
                           "gRPC are not supported)");
  }
  const std::string rest = e.substr(scheme.size());
  const size_t slash = rest.find('/');
  const std::string hostport = rest.substr(0, slash);
  std::string path = slash == std::string::npos ? "" : rest.substr(slash);
  if (path.empty() || path == "/") path = "/v1/traces";
  const size_t colon = hostport.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return InvalidArgument("--otlp-traces-endpoint '" + e + "': needs HOST:PORT");
  }
  char* end = nullptr;
  const std::string port_text = hostport.substr(colon + 1);
  const long port = std::strtol(port_text.c_str(), &end, 10);
  if (port_text.empty() || *end != '\0' || port <= 0 || port > 65535) {
    return InvalidArgument("--otlp-traces-endpoint '" + e + "': bad port");
  }
  return std::unique_ptr<Tracer>(
      new Tracer(std::move(options), hostport.substr(0, colon), static_cast<int>(port), path));
}

Tracer::Tracer(Options options, std::string host, int port, std::string path)
    : options_(std::move(options)), host_(std::move(host)), path_(std::move(path)), port_(port) {
  {
    MutexLock lock(mu_);
    rng_.seed(std::random_device{}());
  }
  thread_ = std::thread([this] { Run(); });
}

Tracer::~Tracer() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  thread_.join();
}

void Tracer::Record(Span span) {
  bool wake = false;
  {
    MutexLock lock(mu_);
    if (queue_.size() >= options_.max_queue) {
      ++dropped_;
      return;
    }
    queue_.push_back(std::move(span));
    wake = queue_.size() >= options_.max_batch;
  }
  if (wake) cv_.NotifyOne();
}

TraceContext Tracer::NewSpan(const std::optional<TraceContext>& parent) {
  MutexLock lock(mu_);
  TraceContext c;
  c.trace_id = parent ? parent->trace_id : NewTraceId(rng_);
  c.flags = parent ? parent->flags : 1;
  c.span_id = http::NewSpanId(rng_);
  return c;
}

SpanId Tracer::NewSpanId() {
  MutexLock lock(mu_);
  return http::NewSpanId(rng_);
}

int64_t Tracer::UnixOffset() {
  timespec real{};
  clock_gettime(CLOCK_REALTIME, &real);
  return static_cast<int64_t>(real.tv_sec) * 1'000'000'000 + real.tv_nsec - NowNs();
}

uint64_t Tracer::exported() const {
  MutexLock lock(mu_);
  return exported_;
}

uint64_t Tracer::dropped() const {
  MutexLock lock(mu_);
  return dropped_;
}

void Tracer::Run() {
  for (;;) {
    std::vector<Span> batch;
    bool stop = false;
    {
      MutexLock lock(mu_);
      if (!stopping_ && queue_.size() < options_.max_batch) {
        cv_.WaitFor(lock, options_.flush_interval);
      }
      stop = stopping_;
      while (!queue_.empty() && batch.size() < options_.max_batch) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      if (stop && batch.empty()) return;
    }
    if (!batch.empty()) Export(std::move(batch));
  }
}

void Tracer::Export(std::vector<Span> batch) {
  std::vector<SpanAttribute> resource = options_.resource;
  resource.insert(resource.begin(), SpanAttribute{"service.name", options_.service_name});
  const std::string body = EncodeOtlpTraces(resource, "kvpush", options_.version, batch);
  httplib::Client client(host_, port_);
  const auto timeout = std::chrono::duration<double>(options_.timeout_s);
  client.set_connection_timeout(std::chrono::duration_cast<std::chrono::microseconds>(timeout));
  client.set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(timeout));
  client.set_write_timeout(std::chrono::duration_cast<std::chrono::microseconds>(timeout));
  const auto res = client.Post(path_, body, "application/x-protobuf");
  const bool ok = res && res->status >= 200 && res->status < 300;
  MutexLock lock(mu_);
  if (ok) {
    exported_ += batch.size();
    return;
  }
  dropped_ += batch.size();
  if (failures_++ % 100 == 0) {
    spdlog::warn("traces: export of {} spans to http://{}:{}{} failed ({}); dropped ({} failures)",
                 batch.size(), host_, port_, path_,
                 res ? "HTTP " + std::to_string(res->status) : httplib::to_string(res.error()),
                 failures_);
  }
}

}  // namespace kvpush::http
