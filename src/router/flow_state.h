// The state one completion request shares between the router's threads (internal to the router
// library): the client's answer when it is ready, the request's legs and who failed first, and a
// streamed answer being relayed; the answers for failed legs (flow_replies.cc). Used by the
// flow files: request_flow.cc, push_flow.cc, pull_flow.cc, relay_flow.cc, prompt_list_flow.cc.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "http/trace_context.h"
#include "router/answering_history.h"
#include "router/client_body.h"
#include "router/decode_stream.h"
#include "router/flow_mode.h"
#include "router/instance_pool.h"
#include "router/leg.h"
#include "router/prompt_echo.h"
#include "router/request_flow.h"
#include "router/resume_ledger.h"
#include "router/router_timeline.h"
#include "router/stream_move.h"

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

/// `s`, cut to its first `n` bytes with "..." when longer (for messages and logs).
std::string Head(const std::string& s, size_t n = 300);

/// An instance's answer, forwarded as-is.
Reply Forwarded(const LegResult& r);

/// The client's answer for a leg to `addr` that gave no usable answer: the instance's own non-200
/// answer as-is, but 502 `upstream_auth_failed` naming the instance for its 401 or 403 (the
/// router's --instance-api-key does not match: a misconfiguration, not the client's fault); 503
/// `<role>_unhealthy` when the health checker cut it; StopReply when the router stopped it; 502
/// `<role>_unreachable` otherwise.
Reply LegFailureReply(const FlowServices& router, Role role, const InstanceAddress& addr,
                      const LegResult& r);

/// The answer when no instance of `role` (outside `exclude`) is healthy: 502
/// `<role>_tls_failed` naming the instance and the reason when one is down because its TLS
/// handshake failed (its certificate refused: InstancePool::TlsFailure), else 503
/// `no_healthy_instance`.
Reply NoHealthyReply(const InstancePool& pool, Role role,
                     const std::vector<std::string>& exclude = {});

/// A leg the instance refused before doing any work for it: it could not be connected to, or
/// it answered 503 `draining` (it is shutting down gracefully). Such a request may be sent to
/// another instance, as long as nothing was written to the client yet.
bool RefusedUnstarted(const LegResult& r);

/// A failed answering leg (D's, or a colocated instance's) of `t` that the request may be sent
/// again for, as a new attempt (RequestFlow::Handle's retries): refused unstarted
/// (RefusedUnstarted), or — a streamed request, whose status line had not reached the client —
/// failed before its status line as ContinuableFailure says (broken, stalled, cut by the health
/// checker, cut by the instance's drain timeout).
bool UnstartedRetryable(const RequestFlow::Transfer& t, const LegResult& r);

/// A leg whose instance failed mid-answer, so that the request may go on on another instance
/// (continuation_flow.cc): its connection broke, stalled past the leg's timeout or was cut by
/// the health checker after the request was written, or it answered 503 `draining_timeout`
/// (its drain cut the request). Not a refusal to connect, and not the router's own Stop().
bool ContinuableFailure(const LegResult& r);

/// What a failed leg's log line says about it.
std::string Describe(const LegResult& r);

/// True for P's answer when its prefill was dropped on request: 503 `aborted` (D said the
/// prefill was not needed, or cancelled it) or 409 `transfer_aborted` (the router aborted the
/// transfer). D's answer decides the request then.
bool IsDroppedPrefillAnswer(const LegResult& r);

/// The 503 a request still in flight gets when the router stops it (FlowServices::StopErrorJson).
Reply StopReply(const FlowServices& router);

/// One request's legs and state, shared by the handler thread, a push request's P-leg thread and
/// a streamed answer's provider. `mu` guards `stage`, `prefill`, `prefill_failure`,
/// `prefill_done` and `prompt_echo`: whichever comes first of "P's leg failed" and "the handler
/// decided the client's answer" wins.
struct RequestFlow::Transfer {
  enum class Stage { kOpen, kStreaming, kDone };
  /// What P's leg came to, as far as the request's outcome goes (push): still running; ended
  /// without failing the request; failed while D's answer was open; failed because P refused it
  /// unstarted (RefusedUnstarted: the request may be retried on another P).
  enum class PrefillOutcome { kRunning, kSettled, kFailed, kRefusedUnstarted };

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
  std::string retry_why = "refused it unstarted";  ///< with retry_url: for the retry's log line
  /// The request skipped its P leg (--local-prefill-threshold): D prefills; no transfer to abort.
  bool local_prefill = false;
  /// Continuation (docs/reliability.md, "Continuation"): a request of one prompt while
  /// --migration-limit > 0 may go on on another instance when the answering one fails
  /// mid-answer, at most `continuations_left` more times. Its body for that: the client's parsed
  /// body (P/D; the minted seed included) or, colocated, the client's bytes.
  bool continuable = false;
  int continuations_left = 0;
  /// The instances that answered it before the answering one: failed on, or moved away from
  /// (answering_history.h). Continuations are chosen from it.
  AnsweringHistory history;
  std::shared_ptr<const ClientBody> client;
  std::string client_text;
  /// The router's phases of this transfer (router_timeline.h); set from the moment it exists.
  RouterTimeline timeline;
  Transfer() { timeline.Mark(RouterPhase::kReceived); }
  /// Tracing on: the router's span of this request (its legs send it as `traceparent`), and
  /// the client's span it continues (zero: the client sent no valid traceparent).
  std::optional<http::TraceContext> trace;
  http::SpanId client_span{};

  Mutex mu;
  CondVar prefill_cv;  ///< notified when prefill_done is set
  Stage stage GUARDED_BY(mu) = Stage::kOpen;
  PrefillOutcome prefill GUARDED_BY(mu) = PrefillOutcome::kRunning;
  Reply prefill_failure GUARDED_BY(mu);      ///< kFailed, kRefusedUnstarted: the client's answer
  bool prefill_done GUARDED_BY(mu) = false;  ///< P's leg is over, whatever its outcome
  /// Push: P's leg runs on a worker (StartPushPrefill), which calls MarkPrefillDone at its end.
  bool prefill_in_background GUARDED_BY(mu) = false;
  /// The request ended while that leg still ran: the outcome its records (spans, timeline) are
  /// written with once the leg is over (DeferRecords, MarkPrefillDone).
  std::optional<bool> deferred_records GUARDED_BY(mu);
  std::optional<PromptEcho> prompt_echo
      GUARDED_BY(mu);  ///< P's answer's prompt_echo (echo_logprobs only)

  /// The handler is about to give the client D's answer (`streaming`: a 200 stream starts). If
  /// P's leg failed first, returns P's failure instead, which the client gets.
  std::optional<Reply> Decide(bool streaming) {
    MutexLock lock(mu);
    if (PrefillFailedLocked()) {
      stage = Stage::kDone;
      return prefill_failure;
    }
    stage = streaming ? Stage::kStreaming : Stage::kDone;
    return std::nullopt;
  }
  void Finish() {
    MutexLock lock(mu);
    stage = Stage::kDone;
  }
  /// Push: P's leg failed. Records `reply` unless D's answer is decided and complete; returns
  /// whether it was recorded (the D leg must then be closed and D must abort).
  bool RecordPrefillFailure(Reply reply, bool refused = false) {
    MutexLock lock(mu);
    if (stage == Stage::kDone) return false;
    prefill_failure = std::move(reply);
    prefill = refused ? PrefillOutcome::kRefusedUnstarted : PrefillOutcome::kFailed;
    return true;
  }
  /// Push: P's leg failed because P refused it before doing any work (may be retried).
  bool PrefillRefused() {
    MutexLock lock(mu);
    return prefill == PrefillOutcome::kRefusedUnstarted;
  }
  /// P's leg ended without failing the request; `echo` is its answer's prompt_echo, if any.
  void SettlePrefill(std::optional<PromptEcho> echo = std::nullopt) {
    MutexLock lock(mu);
    if (prefill == PrefillOutcome::kRunning) prefill = PrefillOutcome::kSettled;
    if (echo) prompt_echo = std::move(echo);
  }
  /// P's leg is over (settled, failed or closed by the router): wakes WaitPrefillDone. Returns
  /// the outcome of a request whose records wait for this (DeferRecords), which the caller
  /// writes.
  std::optional<bool> MarkPrefillDone() {
    std::optional<bool> records;
    {
      MutexLock lock(mu);
      prefill_done = true;
      records.swap(deferred_records);
    }
    prefill_cv.NotifyAll();
    return records;
  }
  /// At the request's end: when its P leg still runs in the background, keeps `ok` for
  /// MarkPrefillDone and returns true (the records wait, so the prefill leg's span and P's
  /// answer time are in them); else false (write them now).
  bool DeferRecords(bool ok) {
    MutexLock lock(mu);
    if (!prefill_in_background || prefill_done) return false;
    deferred_records = ok;
    return true;
  }
  void SetPrefillInBackground(bool on) {
    MutexLock lock(mu);
    prefill_in_background = on;
  }
  /// Waits until MarkPrefillDone, at most `timeout`; returns whether it came.
  bool WaitPrefillDone(std::chrono::milliseconds timeout) {
    MutexLock lock(mu);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!prefill_done) {
      if (!prefill_cv.WaitUntil(lock, deadline)) break;
    }
    return prefill_done;
  }
  /// The request went on without its P leg (a continuation on another instance): whatever P's
  /// leg does from now on no longer decides it, and a failure it recorded is dropped.
  void ForgetPrefill() {
    MutexLock lock(mu);
    stage = Stage::kDone;
    if (PrefillFailedLocked()) prefill = PrefillOutcome::kSettled;
  }
  std::optional<PromptEcho> PromptEchoOf() {
    MutexLock lock(mu);
    return prompt_echo;
  }
  bool PrefillEnded() {
    MutexLock lock(mu);
    return prefill != PrefillOutcome::kRunning;
  }
  std::optional<Reply> PrefillFailure() {
    MutexLock lock(mu);
    return PrefillFailedLocked() ? std::optional<Reply>(prefill_failure) : std::nullopt;
  }
  bool PrefillFailedLocked() const REQUIRES(mu) {
    return prefill == PrefillOutcome::kFailed || prefill == PrefillOutcome::kRefusedUnstarted;
  }
};

/// A streamed answer being relayed: owned by the content provider and the releaser.
struct RequestFlow::StreamState {
  std::shared_ptr<Transfer> t;
  std::shared_ptr<DecodeStream> stream;
  InstanceLease decode_lease;
  /// The instance whose stream is relayed now (t->d_addr until a continuation moved it).
  InstanceAddress answering;
  /// What the client got of each choice (the stream's `: kvpush-resume` comments), for a
  /// continuation (which instances it may go to: Transfer::history).
  ResumeLedger ledger;
  /// An operator's move (POST /admin/migrate): set for a continuable stream, registered in the
  /// router's StreamRegistry while it is relayed.
  std::shared_ptr<MoveSlot> move;
  /// Its move to another instance (POST /admin/migrate, a drain's offer): the state machine,
  /// and a pushed move's first round under way (null: none), dropped when the stream switches
  /// or ends for another reason.
  StreamMove mover;
  std::shared_ptr<PreCopy> precopy;
  std::vector<std::string> held;  ///< events taken before the client's stream started
  /// Echo with logprobs: P's prompt part, put before each choice's first event (`echoed`).
  std::optional<PromptEcho> prompt_echo;
  std::set<int64_t> echoed;
  bool terminal_sent = false;  ///< [DONE] or an error event was relayed
  bool failed = false;
  bool completed = false;    ///< sink.done() was called
  int64_t last_data_ns = 0;  ///< steady ns the last data event was relayed (0: none yet)
};

/// A pushed move's first round (docs/reliability.md, *Migration*): the target took the
/// context's KV so far (prompt + the output streamed) from the answering instance (a P/D pair
/// of one token per sequence — n > 1: one per choice with output — not relayed) into its prefix
/// cache, while the stream went on there. `pending` and `failed` are set by the workers that read
/// the target's answers; the rest is the relaying thread's.
struct RequestFlow::PreCopy {
  std::atomic<int> pending{0};      ///< rounds whose answer is not in yet
  std::atomic<bool> failed{false};  ///< a round's answer was not a 200 (or it never started)
  bool done() const { return pending.load() == 0; }
  bool ok() const { return !failed.load(); }  ///< the target holds every sequence's context
  std::optional<InstanceLease> lease;         ///< the target, held until the switch
  std::string why;                            ///< the offer's or the ask's reason
  bool for_move = false;                      ///< an operator's ask waits for the switch
  int64_t start_ns = 0;                       ///< steady ns the move began
  int64_t round_tokens = 0;                   ///< the ledger's output tokens when this round began
  int64_t sequences = 1;                      ///< sequences this round moves (n > 1: choices)
  int rounds = 0;                             ///< rounds started (StreamMove::kMaxRounds at most)
};

/// A new leg of `t` to `addr` (the router's LegRegistry); with tracing on it carries the
/// router's span as `traceparent`, and the answering leg of a continuable stream asks for the
/// instance's resume comments (Leg::set_resume_info). request_flow.cc.
std::shared_ptr<Leg> OpenLeg(FlowServices& r, const RequestFlow::Transfer& t,
                             const InstanceAddress& addr, Role role);

/// What RequestFlow::RelayEvents saw that Pump acts on once the events before it are relayed.
struct RequestFlow::RelaySignals {
  std::string drain_cut;     ///< the answering instance's drain cut the stream (its error event)
  bool drain_offer = false;  ///< the answering instance began draining and offers the stream
};

/// The 502 for a P/D request with echo and logprobs whose P answered no usable prompt_echo.
Reply NoPromptEcho(const RequestFlow::Transfer& t, const std::string& why);

}  // namespace kvpush::router
