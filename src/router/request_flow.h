// RequestFlow: one completion request through the router — parse, mint ids, pick P and D, run
// the push or pull flow, relay D's answer, and make the two legs fail together (internal to the
// router library; behaviour in docs/router.md).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "http/tracing.h"
#include "router/client_body.h"
#include "router/instance_pool.h"
#include "router/leg.h"

namespace httplib {
struct Request;
struct Response;
class DataSink;
}  // namespace httplib

namespace kvpush::router {

class FlowServices;
struct Reply;  // flow_state.h

/// Handles POST /v1/completions and /v1/chat/completions on an HTTP worker thread. Short-lived:
/// one per request; what outlives Handle() (a push request's P-leg task, a streamed answer) shares
/// the request's state through a shared pointer. In the router's colocated mode the request goes
/// whole to one colocated instance (HandleColocated), relayed the same way as D's answer. A
/// completion whose `prompt` is a list runs each prompt as its own P/D request and answers with
/// the merged result (HandlePromptList, prompt_list_flow.cc).
class RequestFlow {
 public:
  /// Attempts after the first when an instance refuses a request unstarted (connection refused
  /// or 503 `draining`) before any byte of the answer reached the client (docs/router.md).
  static constexpr int kMaxRetries = 2;
  explicit RequestFlow(FlowServices& router) : router_(router) {}
  void Handle(const httplib::Request& req, httplib::Response& res);

  struct Transfer;      // one request's legs and who failed first (flow_state.h)
  struct StreamState;   // a streamed answer being relayed (flow_state.h)
  struct MergedStream;  // the streams of a list of prompts, relayed as one (prompt_list_flow.cc)
  struct PromptPart;    // one prompt of a list and its answer (prompt_list_flow.cc)
  struct RelaySignals;  // what a relayed batch of events asks for (flow_state.h)
  struct PreCopy;       // a pushed move's first round, under way (flow_state.h)

 private:
  /// P/D mode, one prompt: picks P and D, runs the push or pull flow and answers into `res`.
  /// With `capture` (one prompt of a list), a 200 stream is not installed on `res` but handed
  /// back in `*capture` for the merged stream to relay; `res.status` is then 200.
  void RunPd(const std::shared_ptr<Transfer>& t, const ClientBody& body,
             const std::string& pull_profile, httplib::Response& res,
             std::shared_ptr<StreamState>* capture);
  /// P/D mode, a list of prompts (`parent` holds the parsed request): each prompt runs as its own
  /// P/D request (RunPd) concurrently, on this thread and the router's WorkerPool; the answers
  /// are merged in prompt order (docs/router.md, "Lists of prompts").
  void HandlePromptList(const Transfer& parent, const nlohmann::json& body,
                        const std::string& pull_profile, httplib::Response& res);
  /// Runs every body of a list as its own P/D request (RunPd) at once: the first on this thread,
  /// the others on the router's WorkerPool; returns when each has answered (a stream: its 200
  /// captured, not relayed yet).
  std::vector<PromptPart> RunPromptParts(const Transfer& parent, std::vector<nlohmann::json> bodies,
                                         const std::string& pull_profile);
  /// Answers `res` with one stream relaying every part's (docs/router.md, "Lists of prompts").
  void StreamMerged(const std::string& id, int64_t n, std::vector<PromptPart>& parts,
                    httplib::Response& res);
  /// The merged stream's content provider.
  static bool PumpMerged(FlowServices& r, MergedStream& ms, httplib::DataSink& sink);
  /// Ends prompt `i`'s stream of `ms` once (EndStream), if not ended yet.
  static void EndMergedPart(FlowServices& r, MergedStream& ms, size_t i);

  /// P/D mode, a request that skips its P leg (Router::SelectPd, --local-prefill-threshold):
  /// the client's body goes to D as to a colocated instance; answered as RunPd.
  void RunLocalPrefill(const std::shared_ptr<Transfer>& t, const ClientBody& body,
                       InstanceLease d_lease, httplib::Response& res,
                       std::shared_ptr<StreamState>* capture);
  /// Colocated mode: forwards the client's body as-is to the next healthy colocated instance.
  void HandleColocated(const std::shared_ptr<Transfer>& t, const httplib::Request& req,
                       httplib::Response& res);
  /// Request id, mode, body (client_body.h), seed, transfer id. Replies (and returns false) on a
  /// bad request.
  bool ParseClient(const httplib::Request& req, httplib::Response& res, Transfer* t,
                   ClientBody* body, std::string* pull_profile);
  /// Push: writes P's leg on this thread and awaits its answer as a task of the router's
  /// WorkerPool. False when the router is stopping.
  bool StartPushPrefill(std::shared_ptr<Transfer> t, InstanceLease lease, const std::string& body);
  /// Push, on the worker: P's answer `pr` decides whether the request fails (see docs/router.md).
  static void RunPushPrefill(FlowServices& r, Transfer& t, InstanceLease& lease,
                             const LegResult& pr);
  /// Pull: runs P's leg on this thread; D's body, or nullopt after replying P's failure.
  std::optional<nlohmann::json> RunPullPrefill(Transfer& t, InstanceLease& lease,
                                               const ClientBody& body,
                                               const std::string& pull_profile,
                                               httplib::Response& res);
  /// D's (or the colocated instance's) leg with `d_body` (serialized JSON), answered whole.
  void AnswerJson(const std::shared_ptr<Transfer>& t, const std::string& d_body,
                  InstanceLease d_lease, httplib::Response& res);
  /// The same leg, streamed: relayed event by event (push: the 200 is held back, docs/router.md).
  void AnswerStream(const std::shared_ptr<Transfer>& t, const std::string& d_body,
                    InstanceLease d_lease, httplib::Response& res,
                    std::shared_ptr<StreamState>* capture);
  /// Continuation (docs/reliability.md, "Continuation"; continuation_flow.cc). A stream whose
  /// answering instance failed (`why`) — or, `offered`, is draining and offered it — goes on on
  /// another one of the same role, resumed after what `st.ledger` says the client got; true when
  /// the new stream is relayed from now on (its 200 came; the old leg is closed, P's aborted).
  /// False (nothing changed: the caller reports the failure, or keeps relaying an offered stream)
  /// when the request is not continuable, its limit is spent, the router stops or no instance
  /// took it.
  /// `first`: the instance to try first (a pushed move's target, which holds its first round);
  /// `push`: an offered stream may move with its KV pushed by the offering instance
  /// (--migration-transfer push); false after a first round, whose target computes the rest.
  /// `rounds`: the pushed move's rounds that ran before (for its log line).
  static bool ContinueStream(FlowServices& r, StreamState& st, const std::string& why,
                             bool offered = false,
                             std::optional<InstanceLease> first = std::nullopt, bool push = true,
                             int rounds = 0);
  /// Pump's step: an operator asked to move this stream (st.move): moves it (MoveOffered) and
  /// answers the ask once it moved or could not.
  static void AnswerMove(FlowServices& r, StreamState& st);
  /// The answering instance offered the stream (drain) or an operator asked to move it
  /// (`for_move`). A move by push (docs/reliability.md, *Migration*) begins with a first round
  /// (StartPreCopy) while the stream goes on here, and FinishPreCopy switches once it is done;
  /// any other continues it at once (ContinueStream). True when the stream switched now.
  static bool MoveOffered(FlowServices& r, StreamState& st, const std::string& why,
                          bool for_move);
  /// A pushed move's first round: the target takes the context's KV so far from the answering
  /// instance into its prefix cache (a one-token P/D pair, answered on a worker) while the
  /// stream goes on; `st.precopy` tracks it. False (nothing started) when the move is not a
  /// pushed one or no target is free.
  static bool StartPreCopy(FlowServices& r, StreamState& st, const std::string& why,
                           bool for_move);
  /// A pushed move's round ended ok with a long tail (StreamMove::kStartNextRound): starts
  /// another round to the same target from the stream's output now. False when none started.
  static bool NextRound(FlowServices& r, StreamState& st);
  /// Pump's step, when StreamMove says so: the last round of a pushed move ended and the
  /// stream switches to its target, which computes the rest (the blocks filled since that
  /// round) over the context it holds — or, `push_all` (that round failed), takes it all pushed
  /// (ContinueStream) — and an operator's ask is answered.
  static bool FinishPreCopy(FlowServices& r, StreamState& st, bool push_all);
  /// A whole (non-streamed) answer whose instance failed mid-answer (ContinuableFailure): sent
  /// again, as a colocated request of the same seed, to other instances of the role while
  /// continuations are left; returns the last leg's result (`failed` when none could be
  /// tried). `d_lease` becomes the answering instance's lease.
  LegResult ResendWhole(Transfer& t, InstanceLease& d_lease, LegResult failed);
  /// A whole answer's D (or colocated) answer `dr`, continued while it is a hand-back (a
  /// draining instance's 503 kHandBackCode: ContinueWhole) or a continuable failure
  /// (ResendWhole), within --migration-limit. continuation_flow.cc.
  LegResult FinishWhole(Transfer& t, InstanceLease& d_lease, LegResult dr);
  /// Continues a handed-back whole answer (`handed`: its kvpush_resume and kvpush_seed) on
  /// another healthy instance of the role — or, with none, on the instance that handed it back,
  /// which then finishes it (it admits it while draining: x-kvpush-migration-source). The new
  /// answer includes the handed-back output (docs/reliability.md, *Continuation*).
  LegResult ContinueWhole(Transfer& t, InstanceLease& d_lease, const LegResult& handed);
  /// D's leg failed before its answer was committed: the client gets D's error, P aborts.
  void DecodeFailed(Transfer& t, InstanceLease& d_lease, const LegResult& dr,
                    httplib::Response& res);
  /// Push, when P's failure (`failure`, the client's answer) decided it: true (and
  /// `t.retry_url`, `t.refused_reply` set) when P refused the leg unstarted and the request may
  /// be retried on another P; nothing was written then.
  static bool PrefillRetry(Transfer& t, const Reply& failure);
  /// D's leg failed or the client left: closes P's leg (push) and has P abort the transfer.
  static void AbortPrefill(FlowServices& r, Transfer& t);
  /// The streamed answer's content provider (waiting at most `wait` for D's next events) and
  /// releaser.
  static bool Pump(FlowServices& r, StreamState& st, httplib::DataSink& sink,
                   std::chrono::milliseconds wait);
  /// Pump's step: relays `events` (taken from D's stream) to the client, feeding st.ledger and
  /// holding back what asks for a continuation (`*sig`). False when a write failed.
  static bool RelayEvents(FlowServices& r, StreamState& st, httplib::DataSink& sink,
                          std::vector<std::string>& events, RelaySignals* sig);
  /// The error event for a stream that ended without [DONE] or an error of its own (counted
  /// as a leg failure when D's).
  static std::string EndedStreamEvent(FlowServices& r, StreamState& st);
  static void EndStream(FlowServices& r, StreamState& st);
  /// Marks `t` done now and records its e2e latency when `ok`; adds its router timeline to the
  /// router's log (P/D transfers only).
  static void RecordTimeline(FlowServices& r, Transfer& t, bool ok);
  /// The request's spans (tracing on) and its timeline record; RecordTimeline calls it at the
  /// request's end, or, when a push request's P leg is still running then, that leg's worker
  /// when the leg is over (Transfer::DeferRecords).
  static void WriteRecords(FlowServices& r, Transfer& t, bool ok);
  /// Tracing: the router's span of `t` (continuing the client's traceparent) and its phases.
  static void RecordSpans(http::Tracer& tracer, const Transfer& t, bool ok);
  /// A data event of `st` was relayed: its TTFT (the first) or ITL observation.
  static void NoteDataRelayed(FlowServices& r, StreamState& st);

  FlowServices& router_;
};

}  // namespace kvpush::router
