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

httplib::Request MakeRequest(const char* method, const std::string& path,
                             const std::string& request_id) {
  httplib::Request req;
  req.method = method;
  req.path = path;
  req.set_header("x-request-id", request_id);
  return req;
}

}  // namespace

Leg::Leg(InstanceAddress address, ConnectionPool* pool)
    : address_(std::move(address)), pool_(pool) {}

Leg::Leg(InstanceAddress address, double connect_timeout_s, double read_timeout_s)
    : address_(std::move(address)),
      connect_timeout_s_(connect_timeout_s),
      read_timeout_s_(read_timeout_s) {}

Leg::~Leg() = default;

void Leg::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  stopped_.store(true);
  if (active_ != nullptr) active_->stop();  // shuts the socket down; httplib's stop() is
                                            // thread-safe against the call in flight
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

std::unique_ptr<httplib::Client> Leg::Borrow() {
  std::unique_ptr<httplib::Client> cli;
  if (pool_ != nullptr) {
    cli = pool_->Take(address_);
  } else {
    cli = std::make_unique<httplib::Client>(address_.host, address_.port);
    time_t sec = 0, usec = 0;
    SplitSeconds(connect_timeout_s_, &sec, &usec);
    cli->set_connection_timeout(sec, usec);
    SplitSeconds(read_timeout_s_, &sec, &usec);
    cli->set_read_timeout(sec, usec);
    cli->set_write_timeout(sec, usec);
    cli->set_keep_alive(false);
    cli->set_tcp_nodelay(true);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_.load()) {
    // Nothing was written on it: an idle pooled connection stays reusable.
    if (pool_ != nullptr) pool_->Put(address_, std::move(cli));
    return nullptr;
  }
  active_ = cli.get();
  return cli;
}

void Leg::GiveBack(std::unique_ptr<httplib::Client> cli, bool clean) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    active_ = nullptr;
    // A Stop() that came after the answer still means "close it": never reuse it then.
    clean = clean && !stopped_.load();
  }
  if (clean && pool_ != nullptr) pool_->Put(address_, std::move(cli));
  // Otherwise `cli` is destroyed here, which closes its socket.
}

LegResult Leg::Send(httplib::Request& req) {
  const FinishOnReturn mark(finished_);
  std::unique_ptr<httplib::Client> cli = Borrow();
  if (!cli) return FromTransportError(httplib::Error::Canceled, *this);
  int status = 0;
  auto on_headers = std::move(req.response_handler);
  req.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    if (stopped()) return false;  // a Stop() that raced with the start of the call
    return on_headers ? on_headers(r) : true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool ok = cli->send(req, res, err);
  GiveBack(std::move(cli), ok);
  if (!ok) {
    LegResult r = FromTransportError(err, *this);
    r.status = status;
    return r;
  }
  LegResult r;
  r.answered = true;
  r.status = res.status;
  r.content_type = res.get_header_value("Content-Type");
  r.body = std::move(res.body);
  return r;
}

LegResult Leg::Post(const std::string& path, const std::string& request_id,
                    const std::string& body) {
  httplib::Request req = MakeRequest("POST", path, request_id);
  req.body = body;
  req.set_header("Content-Type", "application/json");
  return Send(req);
}

LegResult Leg::Get(const std::string& path, const std::string& request_id) {
  httplib::Request req = MakeRequest("GET", path, request_id);
  return Send(req);
}

LegResult Leg::PostStreaming(const std::string& path, const std::string& request_id,
                             const std::string& body,
                             const std::function<bool(int, const std::string&)>& on_headers,
                             const std::function<bool(const char*, size_t)>& on_data) {
  int status = 0;
  std::string other_body;
  httplib::Request req = MakeRequest("POST", path, request_id);
  req.body = body;
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  req.response_handler = [&](const httplib::Response& r) {
    status = r.status;
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
  LegResult r = Send(req);
  if (r.answered && !other_body.empty()) r.body = std::move(other_body);
  return r;
}

}  // namespace kvpush::router
