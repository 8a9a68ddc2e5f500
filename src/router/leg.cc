#include "router/leg.h"

#include <algorithm>

namespace kvpush::router {

Leg::Leg(InstanceAddress address, ConnectionPool* pool, double connect_timeout_s,
         double io_timeout_s, const std::string& api_key,
         std::shared_ptr<const TlsClientContext> tls)
    : address_(std::move(address)),
      pool_(pool),
      connect_timeout_s_(connect_timeout_s),
      io_timeout_s_(io_timeout_s),
      auth_header_(api_key.empty() ? std::string() : "Authorization: Bearer " + api_key + "\r\n"),
      tls_(std::move(tls)) {}

Leg::~Leg() {
  std::unique_ptr<HttpConn> conn;
  {
    MutexLock lock(mu_);
    conn = std::move(conn_);
  }
  // An unfinished call's connection closes here (the instance sees it and aborts).
}

void Leg::Stop() {
  MutexLock lock(mu_);
  stopped_.store(true);
  if (conn_) conn_->Shutdown();
}

void Leg::Cut(const std::string& reason) {
  {
    MutexLock lock(mu_);
    if (cut_reason_.empty()) cut_reason_ = reason.empty() ? "instance unhealthy" : reason;
  }
  Stop();
}

std::string Leg::cut_reason() const {
  MutexLock lock(mu_);
  return cut_reason_;
}

void Leg::End() {
  std::unique_ptr<HttpConn> conn;
  {
    MutexLock lock(mu_);
    conn = std::move(conn_);
    finished_.store(true);
    // A Stop() that came after the answer still means "close it": never reuse it then.
    if (stopped_.load()) return;
  }
  if (pool_ != nullptr && conn && conn->reusable()) pool_->Put(address_, std::move(conn));
}

LegResult Leg::Failed(const std::string& fallback_error) {
  LegResult r;
  if (conn_) {
    r.connect_failed = conn_->connect_failed();
    r.error = conn_->error();
  }
  if (r.error.empty()) r.error = fallback_error;
  r.stopped = stopped();
  if (r.stopped) {
    r.cut_reason = cut_reason();
    r.connect_failed = false;
    r.error = "stopped";
  }
  End();
  return r;
}

bool Leg::Send(const std::string& method, const std::string& path, const std::string& request_id,
               const std::string& body, bool sse, LegResult* failed) {
  std::unique_ptr<HttpConn> conn =
      pool_ != nullptr ? pool_->Take(address_) : std::make_unique<HttpConn>(address_, tls_);
  std::unique_ptr<HttpConn> unsent;  // the connection, when the leg was stopped before sending
  {
    MutexLock lock(mu_);
    (stopped_.load() ? unsent : conn_) = std::move(conn);
  }
  if (unsent != nullptr) {
    // Nothing was written on it: an idle pooled connection stays reusable.
    if (pool_ != nullptr && unsent->connected()) pool_->Put(address_, std::move(unsent));
    *failed = Failed("stopped");
    return false;
  }
  if (!conn_->connected() && !conn_->Connect(connect_timeout_s_)) {
    *failed = Failed("connect failed");
    return false;
  }
  std::string headers = "x-request-id: " + request_id + "\r\n" + auth_header_ + trace_header_ +
                        resume_header_;
  if (method == "POST") headers += "Content-Type: application/json\r\n";
  if (sse) headers += "Accept: text/event-stream\r\n";
  if (!conn_->WriteRequest(method, path, headers, method == "POST" ? body : "", io_timeout_s_)) {
    *failed = Failed("write failed");
    return false;
  }
  return true;
}

bool Leg::ReadHead(LegResult* r) {
  HttpHead head;
  if (stopped() || !conn_->ReadHead(io_timeout_s_, &head)) {
    *r = Failed("stopped");
    return false;
  }
  r->status = head.status;
  r->content_type = head.content_type;
  return true;
}

BodyRead Leg::ReadBody(int timeout_ms, std::string* out, bool* ended, LegResult* failed) {
  *ended = false;
  const BodyRead br = stopped() ? BodyRead::kFailed : conn_->ReadBody(timeout_ms, out, ended);
  if (br == BodyRead::kFailed) {
    const int status = failed->status;
    *failed = Failed("stopped");
    failed->status = status;
    return br;
  }
  if (*ended) End();
  return br;
}

LegResult Leg::ReadAnswer() {
  LegResult r;
  if (!ReadHead(&r)) return r;
  const int io_ms = io_timeout_ms();
  bool ended = false;
  while (!ended) {
    const BodyRead br = ReadBody(io_ms, &r.body, &ended, &r);
    if (br == BodyRead::kFailed) return r;
    if (br == BodyRead::kTimeout) {
      if (conn_) conn_->Shutdown();
      LegResult t = Failed("read timed out");
      t.status = r.status;
      return t;
    }
  }
  r.answered = true;
  return r;
}

LegResult Leg::Post(const std::string& path, const std::string& request_id,
                    const std::string& body) {
  LegResult failed;
  switch (TakeSentAhead(&failed)) {
    case Ahead::kWritten:
      return ReadAnswer();
    case Ahead::kFailed:
      return failed;
    case Ahead::kNone:
      break;
  }
  if (!Send("POST", path, request_id, body, /*sse=*/false, &failed)) return failed;
  return ReadAnswer();
}

bool Leg::SendAhead(const std::string& method, const std::string& path,
                    const std::string& request_id, const std::string& body, bool sse) {
  sent_ahead_ = true;
  LegResult failed;
  if (Send(method, path, request_id, body, sse, &failed)) return true;
  ahead_failure_ = std::move(failed);
  return false;
}

Leg::Ahead Leg::TakeSentAhead(LegResult* failed) {
  if (!sent_ahead_) return Ahead::kNone;
  sent_ahead_ = false;
  if (!ahead_failure_) return Ahead::kWritten;
  *failed = std::move(*ahead_failure_);
  ahead_failure_.reset();
  return Ahead::kFailed;
}

LegResult Leg::Get(const std::string& path, const std::string& request_id) {
  LegResult failed;
  if (!Send("GET", path, request_id, "", /*sse=*/false, &failed)) return failed;
  return ReadAnswer();
}

}  // namespace kvpush::router
