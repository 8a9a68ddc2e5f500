#include "router/request_flow.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "router/decode_stream.h"
#include "router/leg.h"
#include "router/router.h"
#include "router/sse_splitter.h"

namespace kvpush::router {
namespace {

using nlohmann::json;

void ReplyError(httplib::Response& res, int status, const std::string& message,
                const std::string& type, const std::string& code = {}) {
  res.status = status;
  res.set_content(ErrorJson(message, type, code), "application/json");
}

/// Forwards an instance's non-streamed answer (status, body, content type) as-is.
void ReplyForward(httplib::Response& res, const LegResult& r) {
  res.status = r.status;
  res.set_content(r.body, r.content_type.empty() ? "application/json" : r.content_type);
}

std::string Head(const std::string& s, size_t n = 300) {
  return s.size() <= n ? s : s.substr(0, n) + "...";
}

/// State of a streamed answer, shared by the content provider and the releaser.
struct StreamState {
  std::string request_id;
  TransferMode mode = TransferMode::kPush;
  std::string decode_url;
  std::shared_ptr<DecodeStream> stream;
  std::shared_ptr<Leg> prefill_leg;  ///< push: stopped if the client goes away
  InstanceLease decode_lease;
  bool terminal_sent = false;  ///< [DONE] or an error event was relayed
  bool failed = false;
  bool completed = false;  ///< sink.done() was called
};

}  // namespace

void RequestFlow::Handle(const httplib::Request& req, httplib::Response& res) {
  Router& r = router_;
  const RouterOptions& o = r.options_;
  const std::string path = req.path;
  const bool chat = path == "/v1/chat/completions";

  std::string request_id = req.get_header_value("x-request-id");
  if (!IsValidRequestId(request_id)) request_id = r.ids_.RequestId(chat ? "chatcmpl-" : "cmpl-");
  res.set_header("x-request-id", request_id);

  ModeChoice mode{o.mode, o.mode == TransferMode::kPull ? o.pull_profile : ""};
  if (req.has_header("x-kvpush-mode")) {
    auto m = ParseModeHeader(req.get_header_value("x-kvpush-mode"), o.pull_profile);
    if (!m.ok()) {
      r.CountRequest(mode.mode, false);
      return ReplyError(res, 400, m.status().message(), "invalid_request_error",
                        "invalid_kvpush_mode");
    }
    mode = *m;
  }
  const TransferMode tm = mode.mode;
  auto fail = [&](int status, const std::string& message, const std::string& type,
                  const std::string& code) {
    r.CountRequest(tm, false);
    ReplyError(res, status, message, type, code);
  };

  json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) {
    return fail(400, "request body is not valid JSON", "invalid_request_error", "invalid_json");
  }
  if (!body.is_object()) {
    return fail(400, "request body must be a JSON object", "invalid_request_error", "invalid_json");
  }
  if (!body.contains("seed") || body["seed"].is_null()) body["seed"] = r.ids_.Seed();
  const std::string transfer_id = r.ids_.TransferId();
  const bool stream =
      body.contains("stream") && body["stream"].is_boolean() && body["stream"].get<bool>();

  std::optional<InstanceLease> p_lease = r.pool_->Acquire(Role::kPrefill);
  if (!p_lease) {
    return fail(503, "no healthy prefill instance", "server_error", "no_healthy_instance");
  }
  std::optional<InstanceLease> d_lease = r.pool_->Acquire(Role::kDecode);
  if (!d_lease) {
    return fail(503, "no healthy decode instance", "server_error", "no_healthy_instance");
  }
  const InstanceAddress p_addr = p_lease->address();
  const InstanceAddress d_addr = d_lease->address();
  spdlog::debug("request {}: mode={}{} transfer_id={} P={} D={} stream={}", request_id,
                TransferModeName(tm), mode.pull_profile.empty() ? "" : "/" + mode.pull_profile,
                transfer_id, p_addr.url, d_addr.url, stream);

  json d_body;
  std::shared_ptr<Leg> p_leg = r.NewLeg(p_addr);
  if (tm == TransferMode::kPush) {
    // P leg on a thread of its own; its answer is only logged and counted.
    if (!r.BeginBackground()) {
      return fail(503, "router is shutting down", "server_error", "shutting_down");
    }
    std::string p_body = MakePrefillBody(body, tm, transfer_id).dump();
    std::thread([&r, leg = p_leg, lease = std::move(*p_lease), p_body = std::move(p_body), path,
                 request_id]() mutable {
      {
        std::shared_ptr<Leg> l = std::move(leg);
        InstanceLease held = std::move(lease);
        LegResult pr = l->Post(path, request_id, p_body);
        if (!pr.answered) {
          if (pr.stopped) {
            spdlog::debug("request {}: prefill leg to {} stopped", request_id, held.address().url);
          } else {
            spdlog::warn("request {}: prefill leg to {} failed: {}", request_id, held.address().url,
                         pr.error);
            if (pr.connect_failed) held.MarkUnhealthy("prefill leg: " + pr.error);
            r.CountLegFailure(Role::kPrefill);
          }
        } else if (pr.status != 200) {
          spdlog::warn("request {}: prefill leg to {} answered HTTP {}: {}", request_id,
                       held.address().url, pr.status, Head(pr.body));
          r.CountLegFailure(Role::kPrefill);
        } else {
          spdlog::debug("request {}: prefill leg answered: {}", request_id, Head(pr.body));
        }
      }
      r.EndBackground();
    }).detach();
    p_lease.reset();
    d_body = MakeDecodePushBody(body, transfer_id, p_addr);
  } else {
    // Pull: P first, on this thread; D gets P's kv_transfer_params.
    LegResult pr = p_leg->Post(path, request_id, MakePrefillBody(body, tm, transfer_id).dump());
    if (pr.connect_failed) p_lease->MarkUnhealthy("prefill leg: " + pr.error);
    p_lease->Release();
    if (!pr.answered) {
      if (pr.stopped) return fail(503, "router is shutting down", "server_error", "shutting_down");
      r.CountLegFailure(Role::kPrefill);
      spdlog::warn("request {}: prefill leg to {} failed: {}", request_id, p_addr.url, pr.error);
      return fail(502, "prefill instance " + p_addr.url + " unreachable: " + pr.error,
                  "server_error", "prefill_unreachable");
    }
    if (pr.status != 200) {
      r.CountLegFailure(Role::kPrefill);
      r.CountRequest(tm, false);
      spdlog::warn("request {}: prefill leg to {} answered HTTP {}: {}", request_id, p_addr.url,
                   pr.status, Head(pr.body));
      return ReplyForward(res, pr);
    }
    auto d = MakeDecodePullBody(body, json::parse(pr.body, nullptr, false), mode.pull_profile);
    if (!d.ok()) {
      r.CountLegFailure(Role::kPrefill);
      return fail(502, d.status().message() + " (" + p_addr.url + ")", "server_error",
                  "bad_prefill_answer");
    }
    d_body = std::move(d).value();
    p_leg.reset();
  }

  // D leg.
  std::shared_ptr<Leg> d_leg = r.NewLeg(d_addr);
  auto decode_failed = [&](const LegResult& dr) {
    r.CountLegFailure(Role::kDecode);
    if (p_leg) p_leg->Stop();  // push: P's work is moot without D
    if (dr.answered) {
      spdlog::warn("request {}: decode leg to {} answered HTTP {}: {}", request_id, d_addr.url,
                   dr.status, Head(dr.body));
      r.CountRequest(tm, false);
      return ReplyForward(res, dr);
    }
    if (dr.stopped) return fail(503, "router is shutting down", "server_error", "shutting_down");
    if (dr.connect_failed) d_lease->MarkUnhealthy("decode leg: " + dr.error);
    spdlog::warn("request {}: decode leg to {} failed: {}", request_id, d_addr.url, dr.error);
    return fail(502, "decode instance " + d_addr.url + " unreachable: " + dr.error, "server_error",
                "decode_unreachable");
  };

  if (!stream) {
    LegResult dr = d_leg->Post(path, request_id, d_body.dump());
    if (!dr.answered || dr.status != 200) return decode_failed(dr);
    r.CountRequest(tm, true);
    return ReplyForward(res, dr);
  }

  auto ds = std::make_shared<DecodeStream>(d_leg, path, request_id, d_body.dump());
  const int status = ds->WaitHeaders();
  if (status != 200) return decode_failed(ds->WaitFinished());

  auto st = std::make_shared<StreamState>();
  st->request_id = request_id;
  st->mode = tm;
  st->decode_url = d_addr.url;
  st->stream = ds;
  st->prefill_leg = p_leg;
  st->decode_lease = std::move(*d_lease);
  Router* rp = &r;
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  std::string content_type = ds->content_type();
  if (content_type.empty()) content_type = "text/event-stream";
  res.set_chunked_content_provider(
      content_type,
      [st, rp](size_t, httplib::DataSink& sink) -> bool {
        if (rp->stopping_.load()) return false;
        std::vector<std::string> events;
        const bool finished = st->stream->TakeEvents(std::chrono::milliseconds(100), &events);
        for (const std::string& e : events) {
          if (st->terminal_sent) break;  // nothing may follow [DONE] or an error event
          const SseEventKind kind = ClassifySseEvent(e);
          if (!sink.write(e.data(), e.size())) return false;
          if (kind == SseEventKind::kDone) st->terminal_sent = true;
          if (kind == SseEventKind::kError) {
            st->terminal_sent = true;
            st->failed = true;
            rp->CountLegFailure(Role::kDecode);
          }
        }
        if (!finished) return true;
        if (!st->terminal_sent) {
          const LegResult lr = st->stream->result();
          const std::string msg =
              lr.answered ? "decode instance " + st->decode_url + " ended the stream without [DONE]"
                          : "decode instance " + st->decode_url + " stream broke: " + lr.error;
          spdlog::warn("request {}: {}", st->request_id, msg);
          const std::string ev =
              "data: " + ErrorJson(msg, "server_error", "decode_stream_broken") + "\n\n";
          st->failed = true;
          st->terminal_sent = true;
          rp->CountLegFailure(Role::kDecode);
          if (!sink.write(ev.data(), ev.size())) return false;
        }
        st->completed = true;
        sink.done();
        return true;
      },
      [st, rp](bool) {
        if (!st->completed) {
          // The client went away (or the router is stopping): close D's connection so D aborts
          // the request, and stop the P leg if it still runs.
          spdlog::info("request {}: client disconnected mid-stream; closing the decode leg",
                       st->request_id);
          st->stream->Stop();
          if (st->prefill_leg) st->prefill_leg->Stop();
        }
        rp->CountRequest(st->mode, st->completed && !st->failed);
        st->stream.reset();  // joins the pump thread
        st->prefill_leg.reset();
        st->decode_lease.Release();
      });
}

}  // namespace kvpush::router
