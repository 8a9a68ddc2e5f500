// Helpers of the router tests: fake prefill (P) and decode (D) instances (httplib servers on free
// ports that record what they receive and answer per docs/pd_protocol.md §1, including
// POST /kv/abort), and a fixture that runs a Router in front of them.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "router/router.h"
#include "test_util.h"

namespace kvpush::router::test {

using nlohmann::json;
using std::chrono::milliseconds;

/// Polls `pred` every 2 ms until it holds or `timeout_ms` passed (kvpush::testing::WaitUntil).
inline bool WaitFor(const std::function<bool()>& pred, int timeout_ms = 3000) {
  return ::kvpush::testing::WaitUntil(pred, milliseconds(timeout_ms));
}

struct Received {
  std::string path;
  json body;
  std::string request_id;
  int64_t arrived_ns = 0;
  int remote_port = 0;  ///< the router's end of the connection it came on
  bool resume_info = false;  ///< it carried `x-kvpush-resume-info: 1`
  bool migration_source = false;  ///< it carried `x-kvpush-migration-source: 1`
};

/// A fake P or D instance (a D one also serves as a colocated instance). Behaviour knobs are
/// atomics so tests can flip them while it runs. `port` 0: any free port. With `tls_cert` and
/// `tls_key` (PEM files) it serves HTTPS only (url() is https://).
class FakeInstance {
 public:
  explicit FakeInstance(bool prefill, int port = 0, const std::string& tls_cert = {},
                        const std::string& tls_key = {})
      : prefill_(prefill),
        tls_(!tls_cert.empty()),
        svr_(tls_ ? std::make_unique<httplib::SSLServer>(tls_cert.c_str(), tls_key.c_str())
                  : std::make_unique<httplib::Server>()) {
    svr_->new_task_queue = [] { return new httplib::ThreadPool(32); };
    svr_->set_keep_alive_max_count(1000);  // as kvpush's own server (src/server/http_server.cc)
    // Idle keep-alive connections hold a worker until this timeout, and Stop() waits for them:
    // 1 s (httplib's default is 5 s). The router's idle limit (max_idle_s_) stays below it.
    svr_->set_keep_alive_timeout(1);
    svr_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      if (health_delay_ms.load() > 0) Hold(health_delay_ms.load());
      if (draining.load()) return AnswerDraining(res);
      res.status = health_status.load();
      std::lock_guard<std::mutex> lock(mu_);
      res.set_content(health_body_, health_body_.empty() ? "text/plain" : "application/json");
    });
    svr_->Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"object":"list","data":[{"id":"fake-model","object":"model"}]})",
                      "application/json");
    });
    svr_->Post("/kv/abort", [this](const httplib::Request& req, httplib::Response& res) {
      const json b = json::parse(req.body, nullptr, false);
      const std::string tid = b.is_object() ? b.value("transfer_id", "") : "";
      {
        std::lock_guard<std::mutex> lock(mu_);
        aborts_.push_back(tid);
      }
      res.set_content(json{{"transfer_id", tid}, {"aborted_requests", 0}}.dump(),
                      "application/json");
    });
    auto completions = [this](const httplib::Request& req, httplib::Response& res) {
      Received r{req.path, json::parse(req.body, nullptr, false),
                 req.get_header_value("x-request-id"), NowNs(), req.remote_port,
                 req.get_header_value("x-kvpush-resume-info") == "1",
                 req.get_header_value("x-kvpush-migration-source") == "1"};
      {
        std::lock_guard<std::mutex> lock(mu_);
        received_.push_back(r);
      }
      if (draining.load()) return AnswerDraining(res);
      if (prefill_) {
        AnswerPrefill(r, res);
      } else {
        AnswerDecode(r, res);
      }
    };
    svr_->Post("/v1/completions", completions);
    svr_->Post("/v1/chat/completions", completions);
    if (port == 0) {
      port_ = svr_->bind_to_any_port("127.0.0.1");
    } else {
      port_ = svr_->bind_to_port("127.0.0.1", port) ? port : -1;
    }
    thread_ = std::thread([this] { svr_->listen_after_bind(); });
    WaitFor([this] { return svr_->is_running(); });
  }
  ~FakeInstance() {
    Release();
    Stop();
  }
  FakeInstance(const FakeInstance&) = delete;
  FakeInstance& operator=(const FakeInstance&) = delete;

  void Stop() {
    svr_->stop();
    if (thread_.joinable()) thread_.join();
  }
  int port() const { return port_; }
  std::string url() const {
    return (tls_ ? "https://127.0.0.1:" : "http://127.0.0.1:") + std::to_string(port_);
  }
  /// The distinct router-side ports the completions came on (one per connection).
  size_t connections() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<int> ports;
    for (const Received& r : received_) ports.push_back(r.remote_port);
    std::sort(ports.begin(), ports.end());
    return static_cast<size_t>(std::unique(ports.begin(), ports.end()) - ports.begin());
  }
  std::vector<Received> received() {
    std::lock_guard<std::mutex> lock(mu_);
    return received_;
  }
  size_t count() {
    std::lock_guard<std::mutex> lock(mu_);
    return received_.size();
  }
  /// Transfer ids of the POST /kv/abort calls received, in order.
  std::vector<std::string> aborts() {
    std::lock_guard<std::mutex> lock(mu_);
    return aborts_;
  }
  /// The body /health answers from now on ("" by default; a kvpush instance's JSON, e.g. with
  /// "block_size" and "load", for the routing tests).
  void SetHealthBody(const std::string& body) {
    std::lock_guard<std::mutex> lock(mu_);
    health_body_ = body;
  }
  /// Ends every wait (held streams, delays, slow health checks) at once.
  void Release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      released_ = true;
    }
    cv_.notify_all();
  }

  // Knobs.
  std::atomic<int> health_status{200};
  /// Shutting down gracefully: /health and completions answer 503 `draining` (kvpush serve's).
  std::atomic<bool> draining{false};
  std::atomic<int> health_delay_ms{0};    ///< /health sleeps this long first (a stalled instance)
  std::atomic<int> delay_ms{0};           ///< sleep before answering (D: non-streamed and headers)
  std::atomic<int> status{200};           ///< answer with this status (non-200: an error body)
  std::atomic<bool> aborted_answer{false};  ///< P: answer 503 {"code":"aborted"} (prefill dropped)
  std::atomic<bool> no_kv_params{false};  ///< P (pull): omit kv_transfer_params
  std::atomic<int> chunks{3};             ///< D stream: text chunks before [DONE]
  std::atomic<int> chunk_delay_ms{0};     ///< D stream: pause before each chunk
  std::atomic<int> drop_after{-1};        ///< D stream: break the connection after N chunks
  std::atomic<bool> preamble{false};      ///< D stream: a chat role-only chunk first, at once
  /// D stream: with `x-kvpush-resume-info: 1`, chunk k carries a kvpush instance's comment
  /// (`: kvpush-resume`, token id 100 + k, text "t<k>"); a continuation (`kvpush_resume` with m
  /// tokens) streams from chunk m on, as kvpush serve does, and never breaks (drop_after).
  std::atomic<bool> resume_comments{false};
  /// D: refuse (400) a migration's first-round leg (kvpush_resume, answered whole).
  std::atomic<bool> refuse_first_round{false};
  /// D: answer a whole (not streamed) request that asks for resume info and is no continuation
  /// as a draining kvpush instance does: 503 draining_handback with the answer so far (tokens
  /// 100, 101, text "t0t1") as kvpush_resume (whole) and kvpush_seed 7.
  std::atomic<bool> hand_back{false};
  // Observations.
  std::atomic<int64_t> answered_ns{0};    ///< P: when it answered
  std::atomic<int> decode_answers{0};     ///< D: answers begun (after delay_ms)
  std::atomic<int64_t> last_chunk_ns{0};  ///< D: when it wrote its last text chunk
  std::atomic<bool> write_failed{false};  ///< D: a stream write failed (client went away)

  static json KvParams(const std::string& transfer_id) {
    return {{"do_remote_prefill", true}, {"do_remote_decode", false},
            {"transfer_mode", "pull"},   {"transfer_id", transfer_id},
            {"remote_engine_id", "p0"},  {"remote_host", "127.0.0.1"},
            {"remote_port", 1234},       {"remote_block_ids", {3, 4, 5}},
            {"first_token_id", 42},      {"lease_ms", 30000}};
  }

 private:
  /// Sleeps `ms`, or less when Release() is called.
  void Hold(int ms) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, milliseconds(ms), [this] { return released_; });
  }

  static void AnswerDraining(httplib::Response& res) {
    res.status = 503;
    res.set_content(
        R"({"error":{"message":"draining","type":"server_error","param":null,"code":"draining"}})",
        "application/json");
  }

  void AnswerPrefill(const Received& r, httplib::Response& res) {
    if (delay_ms.load() > 0) Hold(delay_ms.load());
    answered_ns.store(NowNs());
    if (aborted_answer.load()) {
      res.status = 503;
      res.set_content(
          R"({"error":{"message":"request aborted","type":"server_error","param":null,"code":"aborted"}})",
          "application/json");
      return;
    }
    if (status.load() != 200) {
      res.status = status.load();
      res.set_content(
          R"({"error":{"message":"prefill says no","type":"x","param":null,"code":null}})",
          "application/json");
      return;
    }
    json out = {{"id", "p"}, {"choices", {{{"text", "A"}, {"index", 0}}}}};
    const json& kvp = r.body["kv_transfer_params"];
    if (kvp.is_object() && kvp.value("transfer_mode", "") == "pull" && !no_kv_params.load()) {
      out["kv_transfer_params"] = KvParams(kvp.value("transfer_id", ""));
    }
    res.set_content(out.dump(), "application/json");
  }

  void AnswerDecode(const Received& r, httplib::Response& res) {
    if (delay_ms.load() > 0) Hold(delay_ms.load());
    ++decode_answers;
    if (status.load() != 200) {
      res.status = status.load();
      res.set_content(
          R"({"error":{"message":"bad prompt","type":"invalid_request_error","param":"prompt","code":null}})",
          "application/json");
      return;
    }
    if (refuse_first_round.load() && r.body.is_object() && r.body.contains("kvpush_resume") &&
        !r.body.value("stream", false)) {
      res.status = 400;
      res.set_content(
          R"({"error":{"message":"no first round","type":"invalid_request_error","param":null,"code":null}})",
          "application/json");
      return;
    }
    if (hand_back.load() && r.resume_info && r.body.is_object() &&
        !r.body.value("stream", false) && !r.body.contains("kvpush_resume")) {
      res.status = 503;
      res.set_content(
          R"({"error":{"message":"draining: handed back","type":"server_error","param":null,)"
          R"("code":"draining_handback"},"kvpush_resume":{"whole":true,"choices":[{"index":0,)"
          R"("token_ids":[100,101],"text_bytes":4,"text":"t0t1","finished":false}]},)"
          R"("kvpush_seed":7})",
          "application/json");
      return;
    }
    if (!r.body.value("stream", false)) {
      res.set_content(json{{"id", "d"}, {"choices", {{{"text", "ABC"}, {"index", 0}}}}}.dump(),
                      "application/json");
      return;
    }
    const bool hold = r.body.is_object() && r.body.contains("prompt") && r.body["prompt"] == "hold";
    auto sent = std::make_shared<int>(preamble.load() ? -1 : 0);
    const bool comments = resume_comments.load() && r.resume_info;
    auto bytes = std::make_shared<int64_t>(0);
    const bool resumed = r.body.is_object() && r.body.contains("kvpush_resume");
    if (resumed) {
      const json& c = r.body["kvpush_resume"]["choices"];
      *sent = c.empty() ? 0 : static_cast<int>(c[0]["token_ids"].size());
      *bytes = c.empty() ? 0 : c[0]["text_bytes"].get<int64_t>();
    }
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, hold, sent, comments, bytes, resumed](size_t, httplib::DataSink& sink) {
          if (*sent == -1) {  // the chat stream's opening role chunk
            ++*sent;
            const std::string ev =
                R"(data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]})"
                "\n\n";
            return sink.write(ev.data(), ev.size());
          }
          if (hold) {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [this] { return released_; });
          }
          // The connection closes mid-stream (a continuation never breaks: drop_after counts
          // the first stream's chunks).
          if (*sent == drop_after.load() && !resumed) return false;
          if (*sent == chunks.load()) {
            const std::string done = "data: [DONE]\n\n";
            sink.write(done.data(), done.size());
            sink.done();
            return true;
          }
          if (chunk_delay_ms.load() > 0) Hold(chunk_delay_ms.load());
          const std::string text = "t" + std::to_string(*sent);
          std::string ev = "data: {\"choices\":[{\"text\":\"" + text + "\",\"index\":0}]}\n";
          *bytes += static_cast<int64_t>(text.size());
          if (comments) {
            ev += ": kvpush-resume " + json{{"index", 0},
                                            {"token_ids", {100 + *sent}},
                                            {"text_bytes", *bytes},
                                            {"finished", false},
                                            {"seed", 7}}
                                           .dump() +
                  "\n";
          }
          ev += "\n";
          ++*sent;
          if (!sink.write(ev.data(), ev.size())) {
            write_failed.store(true);
            return false;
          }
          last_chunk_ns.store(NowNs());
          return true;
        });
  }

  bool prefill_;
  bool tls_ = false;
  std::unique_ptr<httplib::Server> svr_;
  std::thread thread_;
  int port_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;
  std::vector<Received> received_;
  std::vector<std::string> aborts_;
  std::string health_body_;
};

/// What a streamed request through the router saw.
struct StreamSeen {
  int status = 0;
  std::string body;
  int64_t first_chunk_ns = 0;
  bool ok = false;
};

/// A Router over fake instances.
class RouterTest : public ::testing::Test {
 protected:
  void StartRouter(int num_prefill = 1, int num_decode = 1, TransferMode mode = TransferMode::kPush,
                   std::string pull_profile = "", int health_interval_ms = 50) {
    for (int i = 0; i < num_prefill; ++i) {
      p_.push_back(std::make_unique<FakeInstance>(true, 0, fake_tls_cert_, fake_tls_key_));
    }
    for (int i = 0; i < num_decode; ++i) {
      d_.push_back(std::make_unique<FakeInstance>(false, 0, fake_tls_cert_, fake_tls_key_));
    }
    RouterOptions o;
    for (auto& p : p_) o.prefill_urls.push_back(p->url());
    for (auto& d : d_) o.decode_urls.push_back(d->url());
    o.mode = mode;
    o.pull_profile = std::move(pull_profile);
    o.port = 0;
    o.health_interval_ms = health_interval_ms;
    o.health_timeout_ms = 500;
    o.request_timeout_s = 10;
    o.max_concurrent_streams = 16;
    o.max_idle_connection_s = max_idle_s_;
    if (options_hook_) options_hook_(o);
    router_ = std::make_unique<Router>(o);
    Status st = router_->Start();
    ASSERT_TRUE(st.ok()) << st.ToString();
  }

  /// A router in colocated mode over `n` fake instances (in d_; they answer as D does).
  void StartColocatedRouter(int n, int health_interval_ms = 50) {
    for (int i = 0; i < n; ++i) d_.push_back(std::make_unique<FakeInstance>(false));
    RouterOptions o;
    for (auto& d : d_) o.colocated_urls.push_back(d->url());
    o.port = 0;
    o.health_interval_ms = health_interval_ms;
    o.health_timeout_ms = 500;
    o.request_timeout_s = 10;
    o.max_concurrent_streams = 16;
    o.max_idle_connection_s = max_idle_s_;
    router_ = std::make_unique<Router>(o);
    Status st = router_->Start();
    ASSERT_TRUE(st.ok()) << st.ToString();
  }

  void TearDown() override {
    for (auto& p : p_) p->Release();
    for (auto& d : d_) d->Release();
    if (router_) router_->Stop();
  }

  httplib::Result Post(const json& body, const httplib::Headers& headers = {},
                       const std::string& path = "/v1/completions") {
    httplib::Client cli("127.0.0.1", router_->port());
    cli.set_read_timeout(10, 0);
    return cli.Post(path, headers, body.dump(), "application/json");
  }

  httplib::Result Get(const std::string& path) {
    httplib::Client cli("127.0.0.1", router_->port());
    return cli.Get(path);
  }

  /// POSTs a streamed request; `cancel_after_first` makes the client go away after one chunk.
  StreamSeen PostStream(json body, bool cancel_after_first = false,
                        const httplib::Headers& headers = {}) {
    body["stream"] = true;
    httplib::Client cli("127.0.0.1", router_->port());
    cli.set_read_timeout(10, 0);
    StreamSeen seen;
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = body.dump();
    req.headers = headers;
    req.set_header("Content-Type", "application/json");
    req.response_handler = [&](const httplib::Response& r) {
      seen.status = r.status;
      return true;
    };
    req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
      if (seen.first_chunk_ns == 0) seen.first_chunk_ns = NowNs();
      seen.body.append(data, len);
      return !cancel_after_first;
    };
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    seen.ok = cli.send(req, res, err);
    return seen;
  }

  std::string Metrics() {
    auto r = Get("/metrics");
    return r ? r->body : std::string();
  }

  /// True when /metrics has the exact sample line `line`.
  bool HasMetric(const std::string& line) { return Metrics().find(line + "\n") != std::string::npos; }

  std::vector<std::unique_ptr<FakeInstance>> p_, d_;
  std::unique_ptr<Router> router_;
  /// Changes StartRouter's options before the router is made (e.g. the routing policy).
  std::function<void(RouterOptions&)> options_hook_;
  /// The router's idle-connection age limit: below the fakes' 1 s keep-alive timeout.
  double max_idle_s_ = 0.5;
  /// Set before StartRouter: its fake instances serve HTTPS with this certificate and key.
  std::string fake_tls_cert_, fake_tls_key_;
};

}  // namespace kvpush::router::test
