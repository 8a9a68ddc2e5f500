// TransferStatusClient: D's side of POST /kv/transfer_status (transfer_status.h) — the liveness
// query of its quarantined push transfers, asked of their prefill instance over HTTP. One worker
// thread with a queue, so the connector thread never waits on the network: each Ask is answered
// exactly once through the callback (the answer, or why there is none).
#pragma once

#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "connector/transfer_status.h"

namespace kvpush::connector {

class TransferStatusClient {
 public:
  /// Called on the worker thread with the peer asked, its query, and P's validated answer (or
  /// kUnavailable: unreachable, an HTTP error or an answer that does not validate).
  using Done = std::function<void(const std::string& peer, const TransferStatusQuery& query,
                                  Result<TransferStatusAnswer> answer)>;

  /// `api_key`: the Bearer token of the peers' HTTP API ("" = none). `timeout_ms`: connect and
  /// read timeout of one query, milliseconds (at least 100).
  TransferStatusClient(Done done, std::string api_key, int timeout_ms);
  /// Joins the worker; queued queries are dropped unanswered.
  ~TransferStatusClient();
  TransferStatusClient(const TransferStatusClient&) = delete;
  TransferStatusClient& operator=(const TransferStatusClient&) = delete;

  /// Queues `query` for the instance at host:port (the engine `peer`). Thread-safe, never
  /// blocks.
  void Ask(const std::string& peer, const std::string& host, int port, TransferStatusQuery query);

 private:
  struct Job {
    std::string peer, host;
    int port = 0;
    TransferStatusQuery query;
  };
  void Loop();
  Result<TransferStatusAnswer> Post(const Job& job) const;

  const Done done_;
  const std::string api_key_;
  const int timeout_ms_;
  Mutex mu_;
  CondVar cv_;
  std::deque<Job> jobs_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace kvpush::connector
