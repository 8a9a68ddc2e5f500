// The state one completion request shares between the router's threads (internal to the router
// library): the client's answer when it is ready, the request's legs and who failed first, and a
// streamed answer being relayed. Used by request_flow.cc and prompt_list_flow.cc.
#pragma once

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "router/decode_stream.h"
#include "router/flow_mode.h"
#include "router/instance_pool.h"
#include "router/leg.h"
#include "router/prompt_echo.h"
#include "router/request_flow.h"
#include "router/router_timeline.h"

namespace kvpush::router {

/// A ready answer for the client: an instance's own answer forwarded as-is, or the router's.
struct Reply {
  int status = 0;
  std::string body;
  std::string content_type = "application/json";

  void WriteTo(httplib::Response& res) const {
    res.status = status;
    res.set_content(body, content_type);
  }
  /// The same failure as one SSE event, for a stream whose 200 was already sent: the body when it
  /// is an OpenAI error object, else an error quoting the status.
  std::string AsSseEvent() const;
};

/// The router's own error answer (an OpenAI error body).
inline Reply ErrorReply(int status, const std::string& message, const std::string& type,
                        const std::string& code, const std::string& param = {}) {
  return Reply{status, ErrorJson(message, type, code, param), "application/json"};
}

/// The 503 a request still in flight gets when the router stops it (Router::StopErrorJson).
Reply StopReply(const Router& router);

/// One request's legs and state, shared by the handler thread, a push request's P-leg thread and
/// a streamed answer's provider. `mu` guards `stage`, `prefill_settled`, `prefill_failure`,
/// `prefill_done` and `prompt_echo`: whichever comes first of "P's leg failed" and "the handler
/// decided the client's answer" wins.
struct RequestFlow::Transfer {
  enum class Stage { kOpen, kStreaming, kDone };

  std::string request_id;
  std::string transfer_id;
  std::string path;
  TransferMode mode = TransferMode::kPush;
  bool stream = false;
  Role d_role = Role::kDecode;  ///< the answering instance: D, or colocated (no P, no transfer)
  InstanceAddress p_addr, d_addr;
  std::shared_ptr<Leg> p_leg, d_leg;
  /// Echo with logprobs (WantsPromptEcho): D's choices get P's prompt_echo (set before the legs).
  bool echo_logprobs = false;
  /// Retries (docs/router.md, "Retries"): instances this request must not be sent to (they
  /// refused an earlier attempt), how many more attempts it may make, and the instance that
  /// refused this attempt before any byte reached the client (set: the caller retries instead of
  /// answering; nothing was written to the client's response).
  std::vector<std::string> exclude;
  int retries_left = 0;
  std::string retry_url;
  Role retry_role = Role::kDecode;
  std::optional<Reply> refused_reply;  ///< with retry_url: the answer if no retry can be made
  /// The request skipped its P leg (--local-prefill-threshold): D prefills; no transfer to abort.
  bool local_prefill = false;
  /// The router's phases of this transfer (router_timeline.h); set from the moment it exists.
  RouterTimeline timeline;
  Transfer() { timeline.Mark(RouterPhase::kReceived); }

  std::mutex mu;
  std::condition_variable prefill_cv;  ///< notified when prefill_done is set
  Stage stage = Stage::kOpen;
  bool prefill_settled = false;           ///< push: P's leg ended without failing the request
  std::optional<Reply> prefill_failure;   ///< push: P's leg failed while D's answer was open
  bool prefill_refused = false;  ///< push: ... and P refused it unstarted (RefusedUnstarted)
  bool prefill_done = false;              ///< P's leg is over, whatever its outcome
  std::optional<PromptEcho> prompt_echo;  ///< P's answer's prompt_echo (echo_logprobs only)

  /// The handler is about to give the client D's answer (`streaming`: a 200 stream starts). If
  /// P's leg failed first, returns P's failure instead, which the client gets.
  std::optional<Reply> Decide(bool streaming) {
    std::lock_guard<std::mutex> lock(mu);
    if (prefill_failure) {
      stage = Stage::kDone;
      return prefill_failure;
    }
    stage = streaming ? Stage::kStreaming : Stage::kDone;
    return std::nullopt;
  }
  void Finish() {
    std::lock_guard<std::mutex> lock(mu);
    stage = Stage::kDone;
  }
  /// Push: P's leg failed. Records `reply` unless D's answer is decided and complete; returns
  /// whether it was recorded (the D leg must then be closed and D must abort).
  bool RecordPrefillFailure(Reply reply, bool refused = false) {
    std::lock_guard<std::mutex> lock(mu);
    if (stage == Stage::kDone) return false;
    prefill_failure = std::move(reply);
    prefill_refused = refused;
    return true;
  }
  /// Push: P's leg failed because P refused it before doing any work (may be retried).
  bool PrefillRefused() {
    std::lock_guard<std::mutex> lock(mu);
    return prefill_failure.has_value() && prefill_refused;
  }
  /// P's leg ended without failing the request; `echo` is its answer's prompt_echo, if any.
  void SettlePrefill(std::optional<PromptEcho> echo = std::nullopt) {
    std::lock_guard<std::mutex> lock(mu);
    prefill_settled = true;
    if (echo) prompt_echo = std::move(echo);
  }
  /// P's leg is over (settled, failed or closed by the router): wakes WaitPrefillDone.
  void MarkPrefillDone() {
    {
      std::lock_guard<std::mutex> lock(mu);
      prefill_done = true;
    }
    prefill_cv.notify_all();
  }
  /// Waits until MarkPrefillDone, at most `timeout`; returns whether it came.
  bool WaitPrefillDone(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu);
    return prefill_cv.wait_for(lock, timeout, [this] { return prefill_done; });
  }
  std::optional<PromptEcho> PromptEchoOf() {
    std::lock_guard<std::mutex> lock(mu);
    return prompt_echo;
  }
  bool PrefillEnded() {
    std::lock_guard<std::mutex> lock(mu);
    return prefill_settled || prefill_failure.has_value();
  }
  std::optional<Reply> PrefillFailure() {
    std::lock_guard<std::mutex> lock(mu);
    return prefill_failure;
  }
};

/// A streamed answer being relayed: owned by the content provider and the releaser.
struct RequestFlow::StreamState {
  std::shared_ptr<Transfer> t;
  std::shared_ptr<DecodeStream> stream;
  InstanceLease decode_lease;
  std::vector<std::string> held;  ///< events taken before the client's stream started
  /// Echo with logprobs: P's prompt part, put before each choice's first event (`echoed`).
  std::optional<PromptEcho> prompt_echo;
  std::set<int64_t> echoed;
  bool terminal_sent = false;  ///< [DONE] or an error event was relayed
  bool failed = false;
  bool completed = false;  ///< sink.done() was called
};

}  // namespace kvpush::router
