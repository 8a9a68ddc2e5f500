#include "router/leg.h"

#include <httplib.h>

namespace kvpush::router {
namespace {

void SplitSeconds(double s, time_t* sec, time_t* usec) {
  *sec = static_cast<time_t>(s);
  *usec = static_cast<time_t>((s - static_cast<double>(*sec)) * 1e6);
}

/// A failed call's result: `stopped` (and `cut_reason`) from the leg's state.
LegResult FromTransportError(httplib::Error err, const Leg& leg) {
  LegResult r;
  r.stopped = leg.stopped() || err == httplib::Error::Canceled;
  if (r.stopped) r.cut_reason = leg.cut_reason();
  r.connect_failed = err == httplib::Error::Connection || err == httplib::Error::ConnectionTimeout;
  r.error = httplib::to_string(err);
  return r;
}

/// Sets a leg's `finished` flag when a call returns, whichever way.
class FinishOnReturn {
 public:
  explicit FinishOnReturn(std::atomic<bool>& flag) : flag_(flag) {}
  ~FinishOnReturn() { flag_.store(true); }
  FinishOnReturn(const FinishOnReturn&) = delete;
  FinishOnReturn& operator=(const FinishOnReturn&) = delete;

 private:
  std::atomic<bool>& flag_;
};

}  // namespace

Leg::Leg(InstanceAddress address, double connect_timeout_s, double read_timeout_s)
    : address_(std::move(address)),
      cli_(std::make_unique<httplib::Client>(address_.host, address_.port)) {
  time_t sec = 0, usec = 0;
  SplitSeconds(connect_timeout_s, &sec, &usec);
  cli_->set_connection_timeout(sec, usec);
  SplitSeconds(read_timeout_s, &sec, &usec);
  cli_->set_read_timeout(sec, usec);
  cli_->set_write_timeout(sec, usec);
  cli_->set_keep_alive(false);
  cli_->set_tcp_nodelay(true);  // small legs and SSE chunks: no Nagle delay
}

Leg::~Leg() = default;

void Leg::Stop() {
  stopped_.store(true);
  cli_->stop();
}

void Leg::Cut(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cut_reason_.empty()) cut_reason_ = reason.empty() ? "instance unhealthy" : reason;
  }
  Stop();
}

std::string Leg::cut_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cut_reason_;
}

LegResult Leg::Post(const std::string& path, const std::string& request_id,
                    const std::string& body) {
  const FinishOnReturn mark(finished_);
  if (stopped()) return FromTransportError(httplib::Error::Canceled, *this);
  httplib::Headers headers = {{"x-request-id", request_id}};
  auto res = cli_->Post(path, headers, body, "application/json");
  if (!res) return FromTransportError(res.error(), *this);
  LegResult r;
  r.answered = true;
  r.status = res->status;
  r.content_type = res->get_header_value("Content-Type");
  r.body = std::move(res->body);
  return r;
}

LegResult Leg::Get(const std::string& path, const std::string& request_id) {
  const FinishOnReturn mark(finished_);
  if (stopped()) return FromTransportError(httplib::Error::Canceled, *this);
  httplib::Headers headers = {{"x-request-id", request_id}};
  auto res = cli_->Get(path, headers);
  if (!res) return FromTransportError(res.error(), *this);
  LegResult r;
  r.answered = true;
  r.status = res->status;
  r.content_type = res->get_header_value("Content-Type");
  r.body = std::move(res->body);
  return r;
}

LegResult Leg::PostStreaming(const std::string& path, const std::string& request_id,
                             const std::string& body,
                             const std::function<bool(int, const std::string&)>& on_headers,
                             const std::function<bool(const char*, size_t)>& on_data) {
  const FinishOnReturn mark(finished_);
  if (stopped()) return FromTransportError(httplib::Error::Canceled, *this);
  int status = 0;
  std::string other_body;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body;
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  req.set_header("x-request-id", request_id);
  req.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    if (stopped()) return false;
    return on_headers(r.status, r.get_header_value("Content-Type"));
  };
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    if (stopped()) return false;
    if (status != 200) {
      other_body.append(data, len);
      return true;
    }
    return on_data(data, len);
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool ok = cli_->send(req, res, err);
  if (!ok) {
    LegResult r = FromTransportError(err, *this);
    r.status = status;
    return r;
  }
  LegResult r;
  r.answered = true;
  r.status = res.status;
  r.content_type = res.get_header_value("Content-Type");
  r.body = other_body.empty() ? std::move(res.body) : std::move(other_body);
  return r;
}

}  // namespace kvpush::router
