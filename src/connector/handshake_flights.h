// HandshakeFlights: outgoing handshakes that never queue behind a dead peer (docs/pd_protocol.md
// §2, *Handshake flights*). Every caller naming one endpoint ("host:port") shares a single
// attempt and its result; a failure is remembered and answered at once while a background probe
// retries the endpoint; every wait ends at the caller's own deadline or when the caller is
// cancelled. The attempt itself (the HTTP exchange) is injected, so the policy is tested with a
// fake one and no network.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"

namespace kvpush::connector {

/// Thread-safe. One background thread per endpoint runs while its attempt or its probes do
/// (started on demand, ended when the endpoint answers or nobody asked for it within
/// `interest`); the destructor stops the probes and joins every thread, waiting for attempts
/// under way (each is bounded by the attempt's own timeouts).
class HandshakeFlights {
 public:
  using Clock = std::chrono::steady_clock;
  /// One handshake with `key` ("host:port"): the peer's engine id, or why not. Called on a
  /// flight thread, never two at once for one key; must return within its own timeouts.
  using Attempt = std::function<Result<std::string>(const std::string& key)>;

  struct Options {
    /// After a failure, the probe retries the endpoint after `probe_min`, doubling up to
    /// `probe_max`, for as long as some caller asked for it within the last `interest`.
    std::chrono::milliseconds probe_min{200};
    std::chrono::milliseconds probe_max{2000};
    std::chrono::milliseconds interest{30000};
  };

  explicit HandshakeFlights(Attempt attempt);
  HandshakeFlights(Attempt attempt, Options options);
  ~HandshakeFlights();
  HandshakeFlights(const HandshakeFlights&) = delete;
  HandshakeFlights& operator=(const HandshakeFlights&) = delete;

  /// The engine id at `key`, from the attempt running for it (joined), a new attempt (started
  /// and waited for), or, while a probe retries an endpoint whose last attempt failed, that
  /// failure at once (kUnavailable, saying when it failed and that it is being retried).
  /// Waits until `deadline` at most (kDeadlineExceeded naming the endpoint) and returns
  /// kAborted soon (<= 20 ms) after `cancelled` (may be empty; called without locks held, from
  /// this thread) turns true. Errors: the attempt's, or those above.
  Result<std::string> Await(const std::string& key, Clock::time_point deadline,
                            const std::function<bool()>& cancelled = {});

  /// Attempts started so far (counter; probes included).
  int64_t attempts() const;

 private:
  struct Flight {
    bool running = false;  ///< an attempt is under way or a probe is scheduled
    bool probing = false;  ///< the last attempt failed and a probe will retry it
    uint64_t generation = 0;  ///< attempts finished
    Status failure;           ///< of the last finished attempt (ok: it succeeded)
    std::string engine_id;    ///< of the last successful attempt
    Clock::time_point failed_at{};
    Clock::time_point last_asked{};
    std::thread thread;
  };

  /// The flight thread: attempts, then probes while the endpoint fails and is asked for.
  void Run(const std::string& key);
  /// The finished attempt's answer to a caller.
  static Result<std::string> Answer(const std::string& key, const Flight& f, bool at_once);

  const Attempt attempt_;
  const Options options_;
  mutable Mutex mu_;
  CondVar cv_;  ///< an attempt finished, or stopping_
  std::map<std::string, std::unique_ptr<Flight>, std::less<>> flights_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  int64_t attempts_ GUARDED_BY(mu_) = 0;
};

}  // namespace kvpush::connector
