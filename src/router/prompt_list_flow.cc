// RequestFlow for a completion whose `prompt` is a list: every prompt is its own P/D request (its
// own P, D, transfer id and legs, run by RunPd), all running at once; the client gets the answer a
// colocated instance gives for the whole list (docs/router.md, "Lists of prompts").
#include <httplib.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "router/flow_services.h"
#include "router/flow_state.h"
#include "router/prompt_list.h"
#include "router/request_flow.h"
#include "router/sse_splitter.h"

namespace kvpush::router {
namespace {

using nlohmann::json;

/// How long the merged stream waits on one prompt's D for its next events when the previous round
/// over every prompt brought none (a round that brought some waits on none).
constexpr std::chrono::milliseconds kMergedWait{5};

/// Counts the parts still running; the handler thread waits until none is.
struct Latch {
  Mutex mu;
  CondVar cv;
  size_t left GUARDED_BY(mu) = 0;

  void Add(size_t n) {
    MutexLock lock(mu);
    left += n;
  }
  void Done() {
    MutexLock lock(mu);
    if (--left == 0) cv.NotifyAll();
  }
  void Wait() {
    MutexLock lock(mu);
    while (left != 0) cv.Wait(lock);
  }
};

/// Writes `from` (an instance's or the router's answer) to the client's `res`.
void Copy(const httplib::Response& from, httplib::Response& res) {
  const std::string content_type = from.get_header_value("Content-Type");
  res.status = from.status;
  res.set_content(from.body, content_type.empty() ? "application/json" : content_type);
}

}  // namespace

/// One prompt of the list: its request, and its answer once RunPd returned.
struct RequestFlow::PromptPart {
  std::shared_ptr<Transfer> t;
  httplib::Response res;  ///< a complete answer (any status), or status 200 with `stream` set
  std::shared_ptr<StreamState> stream;
};

/// The streams of a list's prompts, relayed as one stream by the client's content provider.
struct RequestFlow::MergedStream {
  std::string id;
  int64_t n = 1;
  std::vector<std::shared_ptr<StreamState>> parts;
  std::vector<bool> ended;  ///< EndStream ran for the part
  UsageSum usage;
  json usage_chunk;  ///< the first part's usage-only chunk (include_usage), the summed one's shape
  bool finished = false;
  std::chrono::milliseconds wait{0};
};

void RequestFlow::HandlePromptList(const Transfer& parent, const json& body,
                                   const std::string& pull_profile, httplib::Response& res) {
  std::vector<PromptPart> parts = RunPromptParts(parent, SplitPromptList(body), pull_profile);
  for (const PromptPart& p : parts) {
    if (p.res.status == 200) continue;
    // The client gets the first failing prompt's answer, as colocated (which checks the prompts in
    // order); the streams that did start are closed and their transfers aborted.
    for (PromptPart& q : parts) {
      if (q.stream) EndStream(router_, *q.stream);
    }
    return Copy(p.res, res);
  }
  const int64_t n = ChoicesPerPrompt(body);
  if (parent.stream) return StreamMerged(parent.request_id, n, parts, res);
  std::vector<json> answers;
  for (const PromptPart& p : parts) {
    answers.push_back(json::parse(p.res.body, nullptr, false));
    if (!answers.back().is_object()) {
      return ErrorReply(502, "decode instance returned a body that is not a JSON object",
                        "server_error", "bad_decode_answer")
          .WriteTo(res);
    }
  }
  const std::string content_type = parts.front().res.get_header_value("Content-Type");
  res.status = 200;
  res.set_content(MergeAnswers(answers, parent.request_id, n)
                      .dump(-1, ' ', false, json::error_handler_t::replace),
                  content_type.empty() ? "application/json" : content_type);
}

std::vector<RequestFlow::PromptPart> RequestFlow::RunPromptParts(const Transfer& parent,
                                                                 std::vector<json> bodies,
                                                                 const std::string& pull_profile) {
  FlowServices& r = router_;
  auto parts = std::make_shared<std::vector<PromptPart>>(bodies.size());
  auto latch = std::make_shared<Latch>();
  latch->Add(bodies.size());
  for (size_t i = 0; i < bodies.size(); ++i) {
    auto t = std::make_shared<Transfer>();
    // Engine request ids stay unique on each instance: "<id>-<prompt>", as colocated names them.
    t->request_id =
        bodies.size() == 1 ? parent.request_id : parent.request_id + "-" + std::to_string(i);
    t->path = parent.path;
    t->mode = parent.mode;
    t->stream = parent.stream;
    t->transfer_id = i == 0 ? parent.transfer_id : r.ids().TransferId();
    (*parts)[i].t = std::move(t);
  }
  auto run = [this, parts, latch, &pull_profile](size_t i, json part_body) {
    PromptPart& p = (*parts)[i];
    RunPd(p.t, ClientBody(std::move(part_body)), pull_profile, p.res,
          p.t->stream ? &p.stream : nullptr);
    latch->Done();
  };
  // Prompts 1.. on the worker pool, prompt 0 on this thread; this thread then waits for all.
  for (size_t i = 1; i < bodies.size(); ++i) {
    bool queued = r.legs().BeginBackground();
    if (queued) {
      queued = r.workers().Submit([run, i, b = std::move(bodies[i]), rp = &r]() mutable {
        run(i, std::move(b));  // runs once
        rp->legs().EndBackground();
      });
      if (!queued) r.legs().EndBackground();
    }
    if (!queued) {
      StopReply(r).WriteTo((*parts)[i].res);
      latch->Done();
    }
  }
  run(0, std::move(bodies[0]));
  latch->Wait();
  return std::move(*parts);
}

void RequestFlow::StreamMerged(const std::string& id, int64_t n, std::vector<PromptPart>& parts,
                               httplib::Response& res) {
  auto ms = std::make_shared<MergedStream>();
  ms->id = id;
  ms->n = n;
  for (PromptPart& p : parts) ms->parts.push_back(std::move(p.stream));
  ms->ended.assign(ms->parts.size(), false);
  std::string content_type = ms->parts.front()->stream->content_type();
  if (content_type.empty()) content_type = "text/event-stream; charset=utf-8";
  FlowServices* rp = &router_;
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      content_type,
      [ms, rp](size_t, httplib::DataSink& sink) -> bool { return PumpMerged(*rp, *ms, sink); },
      [ms, rp](bool) {
        for (size_t i = 0; i < ms->parts.size(); ++i) EndMergedPart(*rp, *ms, i);
      });
}

void RequestFlow::EndMergedPart(FlowServices& r, MergedStream& ms, size_t i) {
  if (ms.ended[i]) return;
  ms.ended[i] = true;
  EndStream(r, *ms.parts[i]);
}

bool RequestFlow::PumpMerged(FlowServices& r, MergedStream& ms, httplib::DataSink& sink) {
  if (ms.finished) return true;
  bool any = false;
  for (size_t i = 0; i < ms.parts.size(); ++i) {
    if (ms.ended[i]) continue;
    // The part's own relay (Pump) writes into `events`: D's events, [DONE], or the router's
    // error event for a broken leg.
    std::vector<std::string> events;
    bool done = false;
    httplib::DataSink part;
    part.write = [&events](const char* d, size_t l) {
      events.emplace_back(d, l);
      return true;
    };
    part.done = [&done] { done = true; };
    part.is_writable = [] { return true; };
    if (!Pump(r, *ms.parts[i], part, ms.wait)) return false;  // the router is stopping
    for (const std::string& e : events) {
      any = true;
      const SseEventKind kind = ClassifySseEvent(e);
      if (kind == SseEventKind::kDone) continue;  // one [DONE] ends the merged stream
      if (kind == SseEventKind::kError) {
        // Nothing follows an error event (as for one prompt): the other prompts are closed.
        spdlog::warn("request {}: prompt {} of the list failed mid-stream; closing the others",
                     ms.id, i);
        if (!sink.write(e.data(), e.size())) return false;
        for (size_t k = 0; k < ms.parts.size(); ++k) EndMergedPart(r, ms, k);
        ms.finished = true;
        sink.done();
        return true;
      }
      json chunk = ParseSseData(e);
      std::string out = e;
      if (IsUsageChunk(chunk)) {
        ms.usage.Add(chunk["usage"]);
        if (ms.usage_chunk.is_null()) ms.usage_chunk = std::move(chunk);
        continue;
      }
      if (!chunk.is_discarded()) {
        RewriteChunk(chunk, ms.id, static_cast<int64_t>(i), ms.n);
        out = SseEvent(chunk);
      }
      if (!sink.write(out.data(), out.size())) return false;
    }
    if (done) EndMergedPart(r, ms, i);
  }
  ms.wait = any ? std::chrono::milliseconds(0) : kMergedWait;
  for (bool e : ms.ended) {
    if (!e) return true;
  }
  // Every prompt's stream ended with [DONE]: the summed usage, then one [DONE].
  if (!ms.usage_chunk.is_null()) {
    ms.usage_chunk["id"] = ms.id;
    ms.usage_chunk["usage"] = ms.usage.ToJson();
    const std::string u = SseEvent(ms.usage_chunk);
    if (!sink.write(u.data(), u.size())) return false;
  }
  static const std::string kDone = "data: [DONE]\n\n";
  if (!sink.write(kDone.data(), kDone.size())) return false;
  ms.finished = true;
  sink.done();
  return true;
}

}  // namespace kvpush::router
