// TransferStatusClient: POST /kv/transfer_status from a worker thread.
#include "connector/transfer_status_client.h"

#include <httplib.h>

#include <algorithm>

#include "common/thread_name.h"

namespace kvpush::connector {

TransferStatusClient::TransferStatusClient(Done done, std::string api_key, int timeout_ms)
    : done_(std::move(done)), api_key_(std::move(api_key)), timeout_ms_(std::max(timeout_ms, 100)) {
  thread_ = std::thread([this] {
    SetThreadName("kvp-status-ask");
    Loop();
  });
}

TransferStatusClient::~TransferStatusClient() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  thread_.join();
}

void TransferStatusClient::Ask(const std::string& peer, const std::string& host, int port,
                               TransferStatusQuery query) {
  {
    MutexLock lock(mu_);
    jobs_.push_back(Job{peer, host, port, std::move(query)});
  }
  cv_.NotifyOne();
}

void TransferStatusClient::Loop() {
  while (true) {
    Job job;
    {
      MutexLock lock(mu_);
      while (!stopping_ && jobs_.empty()) cv_.Wait(lock);
      if (stopping_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    done_(job.peer, job.query, Post(job));
  }
}

Result<TransferStatusAnswer> TransferStatusClient::Post(const Job& job) const {
  httplib::Client cli(job.host, job.port);
  cli.set_tcp_nodelay(true);
  const time_t sec = timeout_ms_ / 1000;
  const time_t usec = static_cast<time_t>(timeout_ms_ % 1000) * 1000;
  cli.set_connection_timeout(sec, usec);
  cli.set_read_timeout(sec, usec);
  if (!api_key_.empty()) cli.set_bearer_token_auth(api_key_);
  const std::string where = job.host + ":" + std::to_string(job.port);
  auto res = cli.Post("/kv/transfer_status", job.query.ToJson().dump(), "application/json");
  if (!res) {
    return Unavailable("transfer status of " + where + ": " + httplib::to_string(res.error()));
  }
  if (res->status != 200) {
    return Unavailable("transfer status of " + where + ": HTTP " + std::to_string(res->status));
  }
  auto j = nlohmann::json::parse(res->body, nullptr, false);
  auto answer = TransferStatusAnswer::FromJson(j, job.query);
  if (!answer.ok()) return Unavailable(answer.status().message() + " (from " + where + ")");
  return answer;
}

}  // namespace kvpush::connector
