// RequestFlow, continuation: a request whose answering instance (D, or a colocated instance)
// fails mid-answer goes on on another one — a stream resumed after the last token the client got,
// a whole answer sent again (docs/reliability.md, "Continuation"; --migration-limit).
#include <spdlog/spdlog.h>

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/drain.h"
#include "common/json_parse.h"
#include "pd/legs.h"
#include "router/decode_stream.h"
#include "router/flow_services.h"
#include "router/flow_state.h"
#include "router/leg.h"
#include "router/pushed_move.h"
#include "router/request_flow.h"
#include "router/resume_ledger.h"

namespace kvpush::router {

using nlohmann::json;

namespace {

/// The body of a continuation: the client's request as a colocated instance takes it (P/D: the
/// parsed body with the router's seed; colocated: the client's bytes), plus `add` applied to it
/// (null: sent again as it is). "" when the colocated body cannot be parsed (it was forwarded
/// as-is: the instance refused it, nothing to continue).
std::string ResumedBody(const RequestFlow::Transfer& t, const std::function<void(json&)>& add) {
  if (t.client) {
    json leg = t.client->Shell();
    if (add) add(leg);
    return ComposeLegBody(leg, *t.client);
  }
  if (!add) return t.client_text;
  Result<ClientBody> parsed = ParseClientBody(t.client_text);
  if (!parsed.ok() || !parsed->doc.is_object()) return {};
  json leg = parsed->doc;
  add(leg);
  return ComposeLegBody(leg, *parsed);
}

/// A stream's continuation body (`kvpush_resume` = what the client got), or — null `ledger` —
/// the request sent again whole (ResumedBody).
std::string ContinuationBody(const RequestFlow::Transfer& t, const ResumeLedger* ledger) {
  if (ledger == nullptr) return ResumedBody(t, nullptr);
  return ResumedBody(t, [ledger](json& leg) { AddResume(leg, *ledger); });
}

/// Writes `body` on `leg` (POST `path`) on this thread and reads the answer on a worker, which
/// then calls `done` with it. False (nothing queued; `leg` stopped, `done` not called) when the
/// router is stopping or no worker took it.
bool SendThenReadOnWorker(FlowServices& r, const std::shared_ptr<Leg>& leg, const std::string& path,
                          const std::string& request_id, const std::string& body,
                          std::function<void(const LegResult&)> done) {
  if (!r.legs().BeginBackground()) return false;
  auto sent = std::make_shared<std::optional<LegResult>>();
  LegResult failed;
  if (!leg->Send("POST", path, request_id, body, /*sse=*/false, &failed)) {
    *sent = std::move(failed);
  }
  const bool queued = r.workers().Submit([&r, leg, sent, done = std::move(done)]() {
    done(*sent ? **sent : leg->ReadAnswer());
    r.legs().EndBackground();
  });
  if (!queued) {
    leg->Stop();
    r.legs().EndBackground();
  }
  return queued;
}

/// Whether a stream of `t` that its instance offered (drain, an operator's ask) may move by
/// push: P/D, --migration-transfer push, a body the router parsed (pushed_move.h plans the legs).
bool MayPush(const FlowServices& r, const RequestFlow::Transfer& t, bool offered) {
  return offered && r.options().migration_push && t.d_role == Role::kDecode && t.client;
}

/// Writes a pushed move's P leg to its source and reads the answer on a worker. P's token goes
/// to D in KV_READY; the answer only says whether the source took the leg. When it did not,
/// the source is told to abort the transfer (it then refuses the new instance's target, which
/// computes the context itself: kv_load_failure_policy).
void StartPushedMovePrefill(FlowServices& r, const RequestFlow::Transfer& t, const PushedMove& m,
                            const std::string& tid) {
  std::shared_ptr<Leg> leg = OpenLeg(r, t, m.source, Role::kPrefill);
  leg->set_migration_source();
  const std::string rid = t.request_id;
  auto fail = [&r, source = m.source, tid, rid](const std::string& why) {
    spdlog::warn(
        "request {}: migration P leg to {} failed ({}); aborting transfer {} there (the "
        "new instance computes the context)",
        rid, source.url, why, tid);
    r.AbortTransfer(source, Role::kPrefill, tid, rid);
  };
  if (!SendThenReadOnWorker(r, leg, t.path, rid, m.PrefillBody(*t.client, tid),
                            [fail](const LegResult& pr) {
                              if (!pr.answered || pr.status != 200) fail(Describe(pr));
                            })) {
    fail("the router is stopping or no worker took it");
  }
}

}  // namespace

namespace {

/// The answer to an operator's ask, once the stream moved (from `from`) or could not.
void AnswerAsk(RequestFlow::StreamState& st, const std::string& from, bool moved) {
  MoveOutcome o;
  o.from = from;
  if (moved) {
    o.moved = true;
    o.to = st.answering.url;
  } else {
    o.error =
        "no other healthy instance took it, its --migration-limit is spent, or its output "
        "cannot be resumed";
  }
  st.move->Answer(std::move(o));
}

/// Every instance a continuation of `st` may not go to: those that refused or failed the
/// request, and the answering one.
std::vector<std::string> ExcludedFor(const RequestFlow::Transfer& t,
                                     const RequestFlow::StreamState& st) {
  return t.history.Excluded(t.exclude, st.answering.url);
}

}  // namespace

void RequestFlow::AnswerMove(FlowServices& r, StreamState& st) {
  if (st.terminal_sent) {
    MoveOutcome o;
    o.from = st.answering.url;
    o.error = "its stream is ending";
    st.move->Answer(std::move(o));
    return;
  }
  MoveOffered(r, st, "an operator asked: POST /admin/migrate", /*for_move=*/true);
}

bool RequestFlow::MoveOffered(FlowServices& r, StreamState& st, const std::string& why,
                              bool for_move) {
  const bool pushable = r.options().migration_push && st.t->d_role == Role::kDecode;
  StreamMove::Step step = st.mover.OnMoveWanted(pushable);
  if (step == StreamMove::Step::kNothing) return false;  // a move is under way already
  if (step == StreamMove::Step::kStartFirstRound) {
    if (StartPreCopy(r, st, why, for_move)) return false;
    st.mover.OnFirstRoundNotStarted();  // continue now, the new instance computing it
  }
  const std::string from = st.answering.url;
  const bool moved = ContinueStream(r, st, why, /*offered=*/true);
  if (for_move) AnswerAsk(st, from, moved);
  return moved;
}

namespace {

/// Starts one first round of a pushed move (`m`, one sequence) to `target`: its D leg, then its P
/// leg to the source. The worker that reads the target's answer counts it down in `pc` (and
/// marks `pc` failed, telling the source to drop the transfer, unless it was a 200). False
/// (nothing sent; `pc` untouched) when no worker took the D leg.
bool StartFirstRound(FlowServices& r, const RequestFlow::Transfer& t, const PushedMove& m,
                     const InstanceAddress& target,
                     const std::shared_ptr<RequestFlow::PreCopy>& pc) {
  // The target's leg first (its PUSH_TARGET is what the source's short prefill waits for), then
  // the source's.
  const std::string tid = r.ids().TransferId();
  const std::string rid = t.request_id;
  const InstanceAddress source = m.source;
  auto done = [&r, pc, rid, target, source, tid](const LegResult& dr) {
    if (!dr.answered || dr.status != 200) {
      spdlog::warn(
          "request {}: a first round of its move to {} failed ({}); the move goes on "
          "without it",
          rid, target.url, Describe(dr));
      pc->failed.store(true);
      // The source may hold the context for a target that will never come: let it go now.
      r.AbortTransfer(source, Role::kPrefill, tid, rid);
    }
    pc->pending.fetch_sub(1);
  };
  if (!SendThenReadOnWorker(r, OpenLeg(r, t, target, Role::kDecode), t.path, rid,
                            m.DecodeBody(*t.client, tid, /*first_round=*/true), done)) {
    return false;
  }
  StartPushedMovePrefill(r, t, m, tid);
  return true;
}

/// Starts `rounds` (one per sequence) to `target` under `pc`, which counts them down; records
/// the ledger's tokens as the round's start. The output tokens they move, or -1 when none
/// started (the first could not: nothing under way). A round after the first that cannot
/// start marks `pc` failed.
int64_t LaunchRounds(FlowServices& r, const RequestFlow::Transfer& t,
                     const std::vector<PushedMove>& rounds, const ResumeLedger& ledger,
                     const InstanceAddress& target,
                     const std::shared_ptr<RequestFlow::PreCopy>& pc) {
  pc->round_tokens = ledger.tokens();
  ++pc->rounds;
  pc->sequences = static_cast<int64_t>(rounds.size());
  pc->pending.store(static_cast<int>(rounds.size()));
  int64_t resumed = 0;
  for (const PushedMove& m : rounds) {
    if (!StartFirstRound(r, t, m, target, pc)) {
      if (&m == &rounds.front()) {
        pc->pending.store(0);  // nothing under way
        return -1;
      }
      pc->failed.store(true);
      pc->pending.fetch_sub(1);
      continue;
    }
    resumed += m.resumed;
  }
  return resumed;
}

}  // namespace

bool RequestFlow::StartPreCopy(FlowServices& r, StreamState& st, const std::string& why,
                               bool for_move) {
  Transfer& t = *st.t;
  if (!t.continuable || t.continuations_left <= 0 || r.stopping() || st.ledger.broken() ||
      !MayPush(r, t, /*offered=*/true)) {
    return false;
  }
  const std::vector<PushedMove> rounds = PlanFirstRounds(*t.client, st.ledger, st.answering);
  if (rounds.empty()) return false;
  std::optional<InstanceLease> lease = r.pool().Acquire(t.d_role, ExcludedFor(t, st));
  if (!lease) return false;
  auto pc = std::make_shared<PreCopy>();
  const InstanceAddress target = lease->address();
  pc->lease = std::move(lease);
  pc->why = why;
  pc->for_move = for_move;
  pc->start_ns = NowNs();
  const int64_t resumed = LaunchRounds(r, t, rounds, st.ledger, target, pc);
  if (resumed < 0) return false;
  spdlog::info(
      "request {}: moving it from {} to {} ({}): pushing its context ({} output "
      "token(s), {} sequence(s)) there while it goes on",
      t.request_id, st.answering.url, target.url, why, resumed, rounds.size());
  st.precopy = std::move(pc);
  return true;
}

bool RequestFlow::NextRound(FlowServices& r, StreamState& st) {
  Transfer& t = *st.t;
  PreCopy& pc = *st.precopy;
  if (r.stopping() || st.ledger.broken() || !pc.lease) return false;
  const std::vector<PushedMove> rounds = PlanFirstRounds(*t.client, st.ledger, st.answering);
  if (rounds.empty()) return false;
  const int64_t before = pc.round_tokens;
  const int64_t resumed = LaunchRounds(r, t, rounds, st.ledger, pc.lease->address(), st.precopy);
  if (resumed < 0) return false;
  spdlog::info(
      "request {}: another round of its move: {} output token(s) streamed since the "
      "last began",
      t.request_id, st.ledger.tokens() - before);
  return true;
}

bool RequestFlow::FinishPreCopy(FlowServices& r, StreamState& st, bool push_all) {
  std::shared_ptr<PreCopy> pc = std::move(st.precopy);
  const std::string from = st.answering.url;
  spdlog::debug("request {}: first round of its move done in {:.1f} ms", st.t->request_id,
                static_cast<double>(NowNs() - pc->start_ns) / 1e6);
  // After an ok first round the target holds the context but the blocks filled since:
  // computing those (a few tokens, up to a block more) is faster than another round trip
  // through the source's engine (docs/benchmarks/continuation.md).
  const bool moved =
      ContinueStream(r, st, pc->why, /*offered=*/true, std::move(pc->lease), push_all, pc->rounds);
  if (pc->for_move) AnswerAsk(st, from, moved);
  return moved;
}

bool ContinuableFailure(const LegResult& r) {
  if (r.answered) {
    return r.status == 503 && r.body.find(kDrainTimeoutCode) != std::string::npos;
  }
  // Broken mid-answer (reset, closed, timed out) or cut by the health checker; not a refusal
  // to connect (retried as such) and not the router's own Stop().
  return !r.connect_failed && (!r.stopped || !r.cut_reason.empty());
}

bool RequestFlow::ContinueStream(FlowServices& r, StreamState& st, const std::string& why,
                                 bool offered, std::optional<InstanceLease> first, bool push,
                                 int rounds) {
  Transfer& t = *st.t;
  if (!t.continuable || t.continuations_left <= 0 || r.stopping() || st.ledger.broken()) {
    return false;
  }
  const std::string body = ContinuationBody(t, &st.ledger);
  if (body.empty()) return false;
  const std::string from_url = st.answering.url;
  const std::optional<PushedMove> pushed = push && MayPush(r, t, offered)
                                               ? PlanWholePush(*t.client, st.ledger, st.answering)
                                               : std::nullopt;
  std::vector<std::string> exclude = ExcludedFor(t, st);
  st.precopy.reset();  // the stream switches now, or stays for good
  st.mover.Reset();
  while (t.continuations_left > 0 && !r.stopping()) {
    std::optional<InstanceLease> lease =
        first ? std::exchange(first, std::nullopt) : r.pool().Acquire(t.d_role, exclude);
    if (!lease) break;
    --t.continuations_left;
    const InstanceAddress addr = lease->address();
    std::shared_ptr<Leg> leg = OpenLeg(r, t, addr, t.d_role);
    auto ds = std::make_shared<DecodeStream>(leg);
    std::string tid;
    std::string d_body = body;
    if (pushed) {
      // D's leg first (its PUSH_TARGET is what the source's short prefill waits for), then P's.
      tid = r.ids().TransferId();
      d_body = pushed->DecodeBody(*t.client, tid);
      leg->SendAhead("POST", t.path, t.request_id, d_body, /*sse=*/true);
      StartPushedMovePrefill(r, t, *pushed, tid);
    }
    const int status = ds->Start(t.path, t.request_id, d_body);
    if (status == 200) {
      const std::string how = pushed  ? " with the context's KV pushed from " + from_url
                              : !push ? " with the context's KV pushed from " + from_url + " in " +
                                            std::to_string(rounds) + " round(s) while it went on"
                                      : "";
      spdlog::warn("request {}: {} instance {} {} ({}) after {} token(s); continuing on {}{}",
                   t.request_id, RoleName(t.d_role), from_url,
                   offered ? "offered the stream" : "failed mid-stream", why, st.ledger.tokens(),
                   addr.url, how);
      r.CountContinuation(t.d_role, how.empty() ? FlowServices::ContinuationKind::kStream
                                                : FlowServices::ContinuationKind::kPushed);
      // A move is not a failure: the stream may come back to an instance it moved away from.
      if (offered) {
        t.history.NoteMovedFrom(from_url);
      } else {
        t.history.NoteFailed(from_url);
      }
      // P's leg (push) is moot from now on: the continuation computes the whole context itself.
      t.ForgetPrefill();
      AbortPrefill(r, t);
      st.stream = std::move(ds);  // the failed one's destructor closes its leg (it aborts)
      st.decode_lease.Release();
      st.decode_lease = std::move(*lease);
      st.answering = addr;
      return true;
    }
    const LegResult lr = ds->WaitFinished();
    spdlog::warn("request {}: continuation on {} failed: {}", t.request_id, addr.url, Describe(lr));
    if (pushed) r.AbortTransfer(pushed->source, Role::kPrefill, tid, t.request_id);
    exclude.push_back(addr.url);
  }
  if (offered) {
    spdlog::info(
        "request {}: {} instance {} offered the stream ({}); no other instance took "
        "it, it stays there",
        t.request_id, RoleName(t.d_role), from_url, why);
  } else {
    t.history.NoteFailed(from_url);
    spdlog::warn("request {}: {} instance {} failed mid-stream ({}); no continuation possible",
                 t.request_id, RoleName(t.d_role), from_url, why);
  }
  return false;
}

LegResult RequestFlow::ResendWhole(Transfer& t, InstanceLease& d_lease, LegResult failed) {
  FlowServices& r = router_;
  if (!t.continuable || r.stopping()) return failed;
  const std::string body = ContinuationBody(t, nullptr);
  t.ForgetPrefill();
  AbortPrefill(r, t);
  while (t.continuations_left > 0 && !r.stopping() &&
         (ContinuableFailure(failed) || RefusedUnstarted(failed))) {
    // The answering instance failed it (or refused it, once continued there).
    t.history.NoteFailed(d_lease.address().url);
    std::optional<InstanceLease> lease =
        r.pool().Acquire(t.d_role, t.history.Excluded(t.exclude, d_lease.address().url));
    if (!lease) break;
    --t.continuations_left;
    const InstanceAddress addr = lease->address();
    spdlog::warn("request {}: {} instance failed mid-answer ({}); sending it again to {}",
                 t.request_id, RoleName(t.d_role), Describe(failed), addr.url);
    r.CountContinuation(t.d_role, FlowServices::ContinuationKind::kWhole);
    failed = OpenLeg(r, t, addr, t.d_role)->Post(t.path, t.request_id, body);
    d_lease.Release();
    d_lease = std::move(*lease);
  }
  return failed;
}

namespace {

/// A whole answer a draining instance handed back: its 503 kHandBackCode with `kvpush_resume`.
bool HandedBack(const LegResult& r) {
  return r.answered && r.status == 503 && r.body.find(kHandBackCode) != std::string::npos &&
         r.body.find("\"kvpush_resume\"") != std::string::npos;
}

/// The continuation body of a handed-back whole answer: the client's request (ResumedBody) with
/// the hand-back's `kvpush_resume` and `kvpush_seed` (AddResume); `*tokens`: the output tokens
/// handed back. "" when the hand-back or the client's body cannot be read.
std::string WholeContinuationBody(const RequestFlow::Transfer& t, const LegResult& handed,
                                  int64_t* tokens) {
  const json answer = ParseJson(handed.body);
  if (!answer.is_object() || !answer.contains("kvpush_resume")) return {};
  const json& resume = answer["kvpush_resume"];
  const json& choices = resume.value("choices", json::array());
  for (const json& c : choices.is_array() ? choices : json::array()) {
    const auto ids = c.find("token_ids");
    if (ids != c.end() && ids->is_array()) *tokens += static_cast<int64_t>(ids->size());
  }
  const auto seed = answer.find("kvpush_seed");
  const std::optional<int64_t> s = seed != answer.end() && seed->is_number_integer()
                                       ? std::optional<int64_t>(seed->get<int64_t>())
                                       : std::nullopt;
  return ResumedBody(t, [&](json& leg) { AddResume(leg, resume, s); });
}

}  // namespace

LegResult RequestFlow::FinishWhole(Transfer& t, InstanceLease& d_lease, LegResult dr) {
  while (t.continuable && !router_.stopping()) {
    if (HandedBack(dr)) {
      dr = ContinueWhole(t, d_lease, dr);
    } else if (ContinuableFailure(dr)) {
      dr = ResendWhole(t, d_lease, std::move(dr));
      if (!HandedBack(dr)) break;
    } else {
      break;
    }
  }
  return dr;
}

LegResult RequestFlow::ContinueWhole(Transfer& t, InstanceLease& d_lease, const LegResult& handed) {
  FlowServices& r = router_;
  const InstanceAddress from = d_lease.address();
  int64_t tokens = 0;
  std::string body = WholeContinuationBody(t, handed, &tokens);
  if (body.empty()) {
    spdlog::warn(
        "request {}: {} instance {} handed back a whole answer the router cannot read; "
        "sending the request again whole",
        t.request_id, RoleName(t.d_role), from.url);
    body = ContinuationBody(t, nullptr);
  }
  t.ForgetPrefill();  // P's part is moot: the continuation computes the context itself
  AbortPrefill(r, t);
  // A hand-back is a move, not a failure; the instance is draining (the pool skips it until a
  // health check passes again).
  t.history.NoteMovedFrom(from.url);
  d_lease.MarkDraining();
  std::optional<InstanceLease> lease;
  if (t.continuations_left > 0) {
    lease = r.pool().Acquire(t.d_role, t.history.Excluded(t.exclude, from.url));
  }
  // With no other instance, the one that handed it back finishes it (bounded by its drain
  // timeout): it admits the continuation while draining and does not hand it back again.
  const InstanceAddress to = lease ? lease->address() : from;
  std::shared_ptr<Leg> leg = OpenLeg(r, t, to, t.d_role);
  if (!lease) leg->set_migration_source();
  if (lease) --t.continuations_left;
  spdlog::warn(
      "request {}: {} instance {} began draining and handed back the answer so far "
      "({} token(s)); continuing it on {}",
      t.request_id, RoleName(t.d_role), from.url, tokens,
      lease ? to.url : "the same instance (no other took it)");
  r.CountContinuation(t.d_role, FlowServices::ContinuationKind::kWholeResumed);
  LegResult out = leg->Post(t.path, t.request_id, body);
  if (lease) {
    d_lease.Release();
    d_lease = std::move(*lease);
  }
  if (out.answered && out.status == 400 && out.body.find("kvpush_resume") != std::string::npos) {
    // The new instance could not take the answer so far (a router or instance bug): it answers
    // the whole request itself, from the start (the same seed: the same answer).
    spdlog::error(
        "request {}: {} refused the handed-back answer ({}); sending it the request "
        "whole",
        t.request_id, to.url, Describe(out));
    out = OpenLeg(r, t, to, t.d_role)->Post(t.path, t.request_id, ContinuationBody(t, nullptr));
  }
  return out;
}

}  // namespace kvpush::router
