// RequestFlow, the answer: D's (or a colocated instance's) leg relayed to the client, whole or
// streamed event by event, and what a failure of it does to P's leg (docs/router.md).
#include <httplib.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/drain.h"
#include "common/json_parse.h"
#include "http/front_door.h"
#include "pd/ids.h"
#include "pd/legs.h"
#include "router/decode_stream.h"
#include "router/flow_services.h"
#include "router/flow_state.h"
#include "router/leg.h"
#include "router/prompt_echo.h"
#include "router/prompt_list.h"
#include "router/request_flow.h"
#include "router/resume_ledger.h"
#include "router/sse_splitter.h"

namespace kvpush::router {

using nlohmann::json;

namespace {

/// The access line's tokens from an answer (a JSON body, or one SSE chunk's JSON) that carries a
/// `usage` object; nothing when it has none (a stream without include_usage). The text is
/// parsed only when it names a usage object. Returns whether it names one.
bool NoteUsage(const std::string& text) {
  if (text.find("\"usage\":{") == std::string::npos &&
      text.find("\"usage\": {") == std::string::npos) {
    return false;
  }
  const size_t start = text.find('{');
  if (start == std::string::npos) return true;
  const json doc =
      json::parse(text.begin() + static_cast<std::ptrdiff_t>(start), text.end(), nullptr,
                  /*allow_exceptions=*/false);
  if (!doc.is_object() || !doc.contains("usage") || !doc["usage"].is_object()) return true;
  const json& u = doc["usage"];
  http::AccessNote& note = http::CurrentAccessNote();
  if (u.contains("prompt_tokens") && u["prompt_tokens"].is_number_integer()) {
    note.prompt_tokens = u["prompt_tokens"].get<int64_t>();
  }
  if (u.contains("completion_tokens") && u["completion_tokens"].is_number_integer()) {
    note.output_tokens = u["completion_tokens"].get<int64_t>();
  }
  return true;
}

/// Push, streamed: keeps the client's 200 back until D's stream carries output, P's leg ended
/// (well or not) or D's leg ended, so that an early failure of P reaches the client as a plain
/// HTTP error, as colocated serving gives it. Returns the events taken meanwhile, in order.
std::vector<std::string> HoldUntilOutput(const std::function<bool()>& prefill_ended,
                                         DecodeStream& ds) {
  std::vector<std::string> held;
  for (;;) {
    if (prefill_ended()) return held;
    const size_t before = held.size();
    if (ds.TakeEvents(std::chrono::milliseconds(10), &held)) return held;
    for (size_t i = before; i < held.size(); ++i) {
      if (!IsPreambleEvent(held[i])) return held;
    }
  }
}

/// Push with echo and logprobs, streamed: keeps the client's 200 back until P's leg is over, so
/// that its prompt_echo (or its failure) is known before D's first event is relayed. Returns the
/// events taken meanwhile, in order.
std::vector<std::string> HoldUntilPrefillDone(RequestFlow::Transfer& t, DecodeStream& ds,
                                              std::chrono::milliseconds limit) {
  std::vector<std::string> held;
  while (!t.WaitPrefillDone(std::chrono::milliseconds(0))) {
    if (ds.TakeEvents(std::chrono::milliseconds(10), &held)) {
      t.WaitPrefillDone(limit);  // D's stream is over; P's answer follows its KV
      break;
    }
  }
  return held;
}

}  // namespace

void RequestFlow::DecodeFailed(Transfer& t, InstanceLease& d_lease, const LegResult& dr,
                               httplib::Response& res) {
  FlowServices& r = router_;
  const std::string role = RoleName(t.d_role);
  // The instance that answered `dr`: d_addr unless the answer was continued on another one.
  const InstanceAddress& d_addr = d_lease.address();
  if (dr.answered || !dr.stopped || !dr.cut_reason.empty()) r.CountLegFailure(t.d_role);
  if (dr.connect_failed) d_lease.MarkUnhealthy(role + " leg: " + dr.error);
  const bool retry = UnstartedRetryable(t, dr) && t.retries_left > 0;
  if (dr.answered && RefusedUnstarted(dr)) d_lease.MarkDraining();
  if (t.mode == TransferMode::kColocated || t.local_prefill) {
    spdlog::warn("request {}: {} leg to {} {}", t.request_id, role, d_addr.url, Describe(dr));
  } else {
    spdlog::warn("request {}: decode leg to {} {}; aborting transfer {} on {}", t.request_id,
                 d_addr.url, Describe(dr), t.transfer_id, t.p_addr.url);
  }
  AbortPrefill(r, t);
  if (retry) {  // nothing written: Handle retries (or writes refused_reply)
    if (!RefusedUnstarted(dr)) {
      t.retry_why = "failed it before any byte reached the client (" + Describe(dr) + ")";
    }
    t.retry_url = d_addr.url;
    t.retry_role = t.d_role;
    t.refused_reply = LegFailureReply(r, t.d_role, d_addr, dr);
    return;
  }
  r.CountRequest(t.mode, false);
  LegFailureReply(r, t.d_role, d_addr, dr).WriteTo(res);
}

void RequestFlow::AnswerJson(const std::shared_ptr<Transfer>& t, const std::string& d_body,
                             InstanceLease d_lease, httplib::Response& res) {
  FlowServices& r = router_;
  t->timeline.Mark(RouterPhase::kDecodeLegWritten);  // unless D's leg was sent ahead (push)
  LegResult dr = t->d_leg->Post(t->path, t->request_id, d_body);
  dr = FinishWhole(*t, d_lease, std::move(dr));
  if (t->echo_logprobs && dr.answered && dr.status == 200) {
    // P's answer (its prompt_echo) follows the KV that D already has.
    t->WaitPrefillDone(std::chrono::milliseconds(t->d_leg->io_timeout_ms()));
  }
  if (std::optional<Reply> p_failed = t->Decide(/*streaming=*/false)) {
    if (PrefillRetry(*t, *p_failed)) return;
    r.CountRequest(t->mode, false);
    return p_failed->WriteTo(res);
  }
  if (!dr.answered || dr.status != 200) return DecodeFailed(*t, d_lease, dr, res);
  // A JSON answer is handed to the HTTP layer whole: its first byte goes with the rest.
  t->timeline.Mark(RouterPhase::kFirstOutputRelayed);
  if (t->echo_logprobs) {
    const std::optional<PromptEcho> echo = t->PromptEchoOf();
    json answer = json::parse(dr.body, nullptr, /*allow_exceptions=*/false);
    if (!echo) {
      r.CountLegFailure(Role::kPrefill);
      r.CountRequest(t->mode, false);
      return NoPromptEcho(*t, "prefill instance returned no prompt_echo").WriteTo(res);
    }
    if (!answer.is_object()) {
      r.CountLegFailure(t->d_role);
      r.CountRequest(t->mode, false);
      return ErrorReply(502, "decode instance returned a body that is not a JSON object",
                        "server_error", "bad_decode_answer")
          .WriteTo(res);
    }
    PrependPromptEchoToAnswer(answer, *echo);
    r.CountRequest(t->mode, true);
    Reply merged = Forwarded(dr);
    merged.body = answer.dump(-1, ' ', false, json::error_handler_t::replace);
    RecordTimeline(r, *t, true);
    return merged.WriteTo(res);
  }
  r.CountRequest(t->mode, true);
  RecordTimeline(r, *t, true);
  NoteUsage(dr.body);
  Forwarded(dr).WriteTo(res);
}

void RequestFlow::RecordSpans(http::Tracer& tracer, const Transfer& t, bool ok) {
  const RouterTimeline& tl = t.timeline;
  const int64_t offset = http::Tracer::UnixOffset();
  http::Span root;
  root.trace_id = t.trace->trace_id;
  root.span_id = t.trace->span_id;
  root.parent_span_id = t.client_span;
  root.name = "POST " + t.path;
  root.kind = http::SpanKind::kServer;
  root.start_unix_ns = http::Tracer::UnixNanos(tl.at(RouterPhase::kReceived), offset);
  root.end_unix_ns = http::Tracer::UnixNanos(tl.at(RouterPhase::kDone), offset);
  root.attributes = {{"http.request.method", std::string("POST")},
                     {"url.path", t.path},
                     {"kvpush.request_id", t.request_id},
                     {"kvpush.mode", std::string(TransferModeName(t.mode))},
                     {"kvpush.stream", t.stream}};
  if (!t.transfer_id.empty()) root.attributes.push_back({"kvpush.transfer_id", t.transfer_id});
  root.error = !ok;
  // The router's phases of the request, as children: its legs (client spans: the instances'
  // server spans are their children through traceparent) and the time to the first output.
  const struct {
    const char* name;
    RouterPhase from, to;
    http::SpanKind kind;
  } phases[] = {
      {"prefill leg", RouterPhase::kPrefillLegWritten, RouterPhase::kPrefillAnswered,
       http::SpanKind::kClient},
      {"decode leg", RouterPhase::kDecodeLegWritten, RouterPhase::kDone, http::SpanKind::kClient},
      {"time to first output", RouterPhase::kReceived, RouterPhase::kFirstOutputRelayed,
       http::SpanKind::kInternal},
  };
  for (const auto& ph : phases) {
    const int64_t from = tl.at(ph.from), to = tl.at(ph.to);
    if (from == 0 || to < from) continue;
    http::Span c;
    c.trace_id = root.trace_id;
    c.span_id = tracer.NewSpanId();
    c.parent_span_id = root.span_id;
    c.name = ph.name;
    c.kind = ph.kind;
    c.start_unix_ns = http::Tracer::UnixNanos(from, offset);
    c.end_unix_ns = http::Tracer::UnixNanos(to, offset);
    tracer.Record(std::move(c));
  }
  tracer.Record(std::move(root));
}

void RequestFlow::NoteDataRelayed(FlowServices& r, StreamState& st) {
  Transfer& t = *st.t;
  t.timeline.Mark(RouterPhase::kFirstOutputRelayed);
  const int64_t now = NowNs();
  const bool first = st.last_data_ns == 0;
  const int64_t since = first ? t.timeline.at(RouterPhase::kReceived) : st.last_data_ns;
  const double seconds = static_cast<double>(now - since) * 1e-9;
  r.RecordLatency(t.mode, first ? ClientLatency::kTtft : ClientLatency::kItl, seconds);
  if (first) http::CurrentAccessNote().ttft_ms = seconds * 1e3;
  st.last_data_ns = now;
}

void RequestFlow::RecordTimeline(FlowServices& r, Transfer& t, bool ok) {
  t.timeline.Mark(RouterPhase::kDone);
  if (ok) {
    const int64_t e2e = t.timeline.at(RouterPhase::kDone) - t.timeline.at(RouterPhase::kReceived);
    r.RecordLatency(t.mode, ClientLatency::kE2e, static_cast<double>(e2e) * 1e-9);
  }
  if (!t.DeferRecords(ok)) WriteRecords(r, t, ok);
}

void RequestFlow::WriteRecords(FlowServices& r, Transfer& t, bool ok) {
  if (t.trace && r.tracer() != nullptr) RecordSpans(*r.tracer(), t, ok);
  if (t.mode == TransferMode::kColocated || t.local_prefill) return;
  r.RecordTimeline(t.timeline.ToJson(t.request_id, t.transfer_id,
                                     t.mode == TransferMode::kPush ? "push" : "pull", ok));
}

void RequestFlow::AnswerStream(const std::shared_ptr<Transfer>& t, const std::string& d_body,
                               InstanceLease d_lease, httplib::Response& res,
                               std::shared_ptr<StreamState>* capture) {
  FlowServices& r = router_;
  auto ds = std::make_shared<DecodeStream>(t->d_leg);
  t->timeline.Mark(RouterPhase::kDecodeLegWritten);  // unless D's leg was sent ahead (push)
  const int status = ds->Start(t->path, t->request_id, d_body);
  std::vector<std::string> held;
  if (status == 200 && t->mode == TransferMode::kPush && !t->local_prefill) {
    held = t->echo_logprobs
               ? HoldUntilPrefillDone(*t, *ds, std::chrono::milliseconds(t->d_leg->io_timeout_ms()))
               : HoldUntilOutput([&t] { return t->PrefillEnded(); }, *ds);
  }
  std::optional<LegResult> failed;
  if (status != 200) {
    failed = ds->WaitFinished();
    // D failed on its own before its status line (P's failure would have closed D's leg): no
    // byte reached the client, so the request is sent again (*Retries*), whatever P's leg did
    // meanwhile (its WRITEs to the dead D fail too).
    if (t->retries_left > 0 && UnstartedRetryable(*t, *failed)) {
      t->Finish();
      return DecodeFailed(*t, d_lease, *failed, res);
    }
  }
  if (std::optional<Reply> p_failed = t->Decide(/*streaming=*/status == 200)) {
    if (PrefillRetry(*t, *p_failed)) return;  // ds's destructor closes D's leg
    r.CountRequest(t->mode, false);
    return p_failed->WriteTo(res);  // ds's destructor closes D's leg
  }
  if (failed) return DecodeFailed(*t, d_lease, *failed, res);
  std::optional<PromptEcho> echo;
  if (t->echo_logprobs) {
    echo = t->PromptEchoOf();
    if (!echo) {  // nothing relayed yet: a plain error; ds's destructor closes D's leg
      t->Finish();
      r.CountLegFailure(Role::kPrefill);
      r.CountRequest(t->mode, false);
      return NoPromptEcho(*t, "prefill instance returned no prompt_echo").WriteTo(res);
    }
  }

  auto st = std::make_shared<StreamState>();
  st->t = t;
  st->stream = ds;
  st->decode_lease = std::move(d_lease);
  st->answering = t->d_addr;
  st->held = std::move(held);
  st->prompt_echo = std::move(echo);
  res.status = 200;
  if (t->continuable && capture == nullptr) {
    st->move = std::make_shared<MoveSlot>();
    r.streams().Add(t->request_id, st->move);
  }
  if (capture != nullptr) {  // one prompt of a list: the merged stream relays it
    *capture = std::move(st);
    return;
  }
  FlowServices* rp = &r;
  res.set_header("Cache-Control", "no-cache");
  std::string content_type = ds->content_type();
  if (content_type.empty()) content_type = "text/event-stream; charset=utf-8";
  res.set_chunked_content_provider(
      content_type,
      [st, rp](size_t, httplib::DataSink& sink) -> bool {
        return Pump(*rp, *st, sink, std::chrono::milliseconds(100));
      },
      [st, rp](bool) { EndStream(*rp, *st); });
}

bool RequestFlow::RelayEvents(FlowServices& r, StreamState& st, httplib::DataSink& sink,
                              std::vector<std::string>& events, RelaySignals* sig) {
  for (std::string& e : events) {
    if (st.terminal_sent) break;  // nothing may follow [DONE] or an error event
    const std::optional<std::string> info = TakeResumeInfo(&e);
    if (info) st.ledger.Note(*info);  // exactly what the client gets: whole events only
    if (e.empty()) continue;          // an output with no event for the client
    if (IsDrainOffer(e)) {
      sig->drain_offer = true;  // taken by Pump, once the events before it are relayed
      continue;
    }
    const SseEventKind kind = ClassifySseEvent(e);
    if (!info && kind == SseEventKind::kData && e.find("\"choices\":[{") != std::string::npos) {
      st.ledger.MarkBroken();  // output the ledger does not know of: never continue past it
    }
    if (kind == SseEventKind::kError && st.t->continuable &&
        e.find(kDrainTimeoutCode) != std::string::npos) {
      sig->drain_cut = e;  // not relayed: the stream may go on elsewhere
      break;
    }
    std::string out;
    if (st.prompt_echo && kind == SseEventKind::kData) {
      // Echo with logprobs: P's prompt part leads each choice's first event.
      json chunk = ParseSseData(e);
      if (PrependPromptEchoToChunk(chunk, *st.prompt_echo, &st.echoed)) out = SseEvent(chunk);
    }
    const std::string& ev = out.empty() ? e : out;
    if (!sink.write(ev.data(), ev.size())) return false;
    if (kind == SseEventKind::kData) {
      NoteDataRelayed(r, st);
      if (NoteUsage(ev)) st.ledger.NoteUsageRelayed();
    }
    if (kind == SseEventKind::kDone) st.terminal_sent = true;
    if (kind == SseEventKind::kError) {
      st.terminal_sent = true;
      st.failed = true;
      r.CountLegFailure(st.t->d_role);
    }
  }
  return true;
}

std::string RequestFlow::EndedStreamEvent(FlowServices& r, StreamState& st) {
  if (r.stopping()) return "data: " + r.StopErrorJson() + "\n\n";  // Stop() closed D's leg
  if (std::optional<Reply> p_failed = st.t->PrefillFailure()) {
    return p_failed->AsSseEvent();  // P's leg failed mid-stream and closed D's leg
  }
  const LegResult lr = st.stream->result();
  const std::string role = RoleName(st.t->d_role);
  const std::string d = role + " instance " + st.answering.url;
  const std::string msg = lr.answered ? d + " ended the stream without [DONE]"
                          : !lr.cut_reason.empty()
                              ? d + " was marked unhealthy mid-stream (" + lr.cut_reason + ")"
                              : d + " stream broke: " + lr.error;
  spdlog::warn("request {}: {}", st.t->request_id, msg);
  const std::string code = role + (lr.cut_reason.empty() ? "_stream_broken" : "_unhealthy");
  r.CountLegFailure(st.t->d_role);
  return "data: " + ErrorJson(msg, "server_error", code) + "\n\n";
}

namespace {
/// How long Pump waits for events while a pushed move's first round runs: its end switches the
/// stream, so it is looked at this often.
constexpr std::chrono::milliseconds kPreCopyPoll{2};
}  // namespace

bool RequestFlow::Pump(FlowServices& r, StreamState& st, httplib::DataSink& sink,
                       std::chrono::milliseconds wait) {
  // Ends the client's stream with `ev` (an error event; "" for none): never a silent cut.
  auto end = [&](const std::string& ev) {
    if (!ev.empty() && !st.terminal_sent) {
      st.terminal_sent = st.failed = true;
      if (!sink.write(ev.data(), ev.size())) return false;
    }
    st.completed = true;
    sink.done();
    return true;
  };
  if (r.stopping()) return end("data: " + r.StopErrorJson() + "\n\n");
  // An operator's move, once the events held before the client's stream began went out (they
  // are the old stream's: relaying them after the switch would repeat tokens).
  if (st.move && st.held.empty() && !st.mover.moving() && st.move->Asked()) AnswerMove(r, st);
  std::vector<std::string> events;
  events.swap(st.held);
  const bool finished = st.stream->TakeEvents(
      events.empty() ? (st.mover.moving() ? std::min(wait, kPreCopyPoll) : wait)
                     : std::chrono::milliseconds(0),
      &events);
  RelaySignals sig;
  const bool took_events = !events.empty();
  if (!RelayEvents(r, st, sink, events, &sig)) return false;
  // A pushed move whose first round ended switches when StreamMove says (right after an event
  // of the old stream went out, or after a silence).
  if (st.precopy && st.precopy->done()) {
    const PreCopy& pc = *st.precopy;
    const int64_t tail =
        (st.ledger.tokens() - pc.round_tokens) / std::max<int64_t>(1, pc.sequences);
    if (st.mover.OnRoundEnded(pc.ok(), tail) == StreamMove::Step::kStartNextRound &&
        !NextRound(r, st)) {
      st.mover.OnNextRoundNotStarted();
    }
  }
  const StreamMove::Step step = st.mover.OnRelayRound(
      took_events, NowNs() - st.last_data_ns, st.held.empty() && !st.terminal_sent && !finished);
  if (step != StreamMove::Step::kNothing &&
      FinishPreCopy(r, st, step == StreamMove::Step::kSwitchPushingAll)) {
    return true;
  }
  if (sig.drain_offer && !st.terminal_sent && sig.drain_cut.empty() &&
      MoveOffered(r, st, "its drain began", /*for_move=*/false)) {
    return true;
  }
  if (!sig.drain_cut.empty()) {
    st.stream->Stop();
    if (ContinueStream(r, st, "its drain timeout cut the request")) return true;
    r.CountLegFailure(st.t->d_role);
    return end(sig.drain_cut);
  }
  if (!finished) return true;
  if (!st.terminal_sent && !r.stopping() && !st.t->PrefillFailure()) {
    const LegResult& lr = st.stream->result();
    const std::string why = lr.answered              ? "the stream ended without [DONE]"
                            : !lr.cut_reason.empty() ? "marked unhealthy: " + lr.cut_reason
                                                     : lr.error;
    if (ContinueStream(r, st, why)) return true;
  }
  return end(st.terminal_sent ? std::string() : EndedStreamEvent(r, st));
}

void RequestFlow::EndStream(FlowServices& r, StreamState& st) {
  Transfer& t = *st.t;
  if (!st.completed) {
    // The client went away (or the router is stopping): close D's connection so D aborts.
    spdlog::info("request {}: client disconnected mid-stream; closing the {} leg", t.request_id,
                 RoleName(t.d_role));
    st.stream->Stop();
  }
  if (st.move) {
    st.move->Close("the stream ended");
    r.streams().Remove(t.request_id, st.move.get());
  }
  t.Finish();
  RecordTimeline(r, t, st.completed && !st.failed);
  // D failed or the client left (not P: P's failure already aborted D): P's part is moot.
  if ((!st.completed || st.failed) && !t.PrefillFailure()) AbortPrefill(r, t);
  r.CountRequest(t.mode, st.completed && !st.failed);
  st.stream.reset();  // waits until the reader task let go of the leg
  st.decode_lease.Release();
}

}  // namespace kvpush::router
