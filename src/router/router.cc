#include "router/router.h"

#include <httplib.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <chrono>
#include <csignal>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/drain.h"
#include "common/listen_backlog.h"
#include "discovery/membership.h"
#include "pd/ids.h"
#include "router/leg.h"
#include "router/request_flow.h"

namespace kvpush::router {
namespace {

using nlohmann::json;

/// Leg worker threads started with the router (more are added on demand, up to the maximum).
constexpr size_t kInitialWorkers = 8;

void ReplyError(httplib::Response& res, int status, const std::string& message,
                const std::string& type, const std::string& code = {}) {
  res.status = status;
  res.set_content(ErrorJson(message, type, code), "application/json");
}

/// Paths with a handler and the one method each accepts; other methods get 405.
struct RouteSpec {
  const char* path;
  const char* method;
};
constexpr RouteSpec kRoutes[] = {{"/v1/completions", "POST"},
                                 {"/v1/chat/completions", "POST"},
                                 {"/v1/models", "GET"},
                                 {"/health", "GET"},
                                 {"/metrics", "GET"},
                                 {"/debug/handoff_timeline", "GET"},
                                 {"/tokenize", "POST"},
                                 {"/detokenize", "POST"}};

/// Prometheus label value escaping (backslash, quote, newline).
std::string LabelValue(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

Status RouterOptions::Validate() const {
  if (colocated()) {
    if (!prefill_urls.empty() || !decode_urls.empty()) {
      return InvalidArgument("--colocated cannot be combined with --prefill/--decode");
    }
    if (discovered()) return InvalidArgument("--colocated cannot be combined with --discovery");
  } else if (!discovered()) {
    if (prefill_urls.empty()) {
      return InvalidArgument(
          "at least one --prefill URL is required (or use --discovery or --colocated)");
    }
    if (decode_urls.empty()) {
      return InvalidArgument(
          "at least one --decode URL is required (or use --discovery or --colocated)");
    }
  }
  if (discovered()) {
    if (auto e = discovery::ParseDiscoveryUrl(discovery); !e.ok()) return e.status();
    if (Status s = discovery::ValidatePrefix(discovery_prefix); !s.ok()) return s;
  }
  for (const auto* urls : {&prefill_urls, &decode_urls, &colocated_urls}) {
    for (const std::string& u : *urls) {
      if (auto a = ParseInstanceUrl(u); !a.ok()) return a.status();
    }
  }
  if (!pull_profile.empty() && pull_profile != "vllm" && pull_profile != "fast") {
    return InvalidArgument("--pull-profile must be vllm or fast, not '" + pull_profile + "'");
  }
  if (port < 0 || port > 65535) return InvalidArgument("--port must be in [0, 65535]");
  if (health_interval_ms < 10) return InvalidArgument("--health-interval-ms must be >= 10");
  if (health_timeout_ms < 1) return InvalidArgument("health timeout must be >= 1 ms");
  if (!(request_timeout_s > 0)) return InvalidArgument("--request-timeout-s must be > 0");
  if (!(connect_timeout_s > 0)) return InvalidArgument("connect timeout must be > 0");
  if (max_concurrent_streams < 1) return InvalidArgument("max concurrent streams must be >= 1");
  if (!(max_idle_connection_s >= 0)) return InvalidArgument("max idle connection age must be >= 0");
  if (!(cache_aware.load_cap >= 1.0)) return InvalidArgument("--cache-aware-load-cap must be >= 1");
  if (local_prefill_threshold < 0) {
    return InvalidArgument("--local-prefill-threshold must be >= 0 (0 = off)");
  }
  if (block_size < 0) return InvalidArgument("--block-size must be >= 0 (0 = from the instances)");
  if (prefix_index_blocks < 1) return InvalidArgument("--prefix-index-blocks must be >= 1");
  const bool needs_tokens = routing == RoutingPolicy::kCacheAware || local_prefill_threshold > 0;
  if (needs_tokens && colocated()) {
    return InvalidArgument(
        "--routing cache-aware and --local-prefill-threshold apply to P/D mode, not --colocated");
  }
  if (needs_tokens && !prompt_tokenizer) {
    return InvalidArgument(
        "--routing cache-aware and --local-prefill-threshold need the prompt's token ids: give "
        "--tokenizer MODEL (the instances' model file)");
  }
  return Status::Ok();
}

std::string RouterOptions::ToString() const {
  std::ostringstream s;
  auto list = [&s](const char* name, const std::vector<std::string>& urls) {
    s << name << "=[";
    for (size_t i = 0; i < urls.size(); ++i) s << (i ? "," : "") << urls[i];
    s << "] ";
  };
  if (colocated()) {
    list("colocated", colocated_urls);
    s << "selection=round_robin";
  } else {
    list("prefill", prefill_urls);
    list("decode", decode_urls);
    if (discovered()) {
      s << "discovery=" << discovery << " prefix=" << discovery_prefix
        << " model=" << (discovery_model.empty() ? "(any)" : discovery_model) << " ";
    }
    s << "mode=" << TransferModeName(mode)
      << " pull_profile=" << (pull_profile.empty() ? "(decode default)" : pull_profile)
      << " routing=" << RoutingPolicyName(routing)
      << " cache_aware_load_cap=" << cache_aware.load_cap
      << " local_prefill_threshold=" << local_prefill_threshold << " block_size="
      << (block_size > 0 ? std::to_string(block_size) : std::string("(from instances)"))
      << " prefix_index_blocks=" << prefix_index_blocks
      << " tokenizer=" << (tokenizer_path.empty() ? "(none)" : tokenizer_path);
  }
  s << " host=" << host << " port=" << port << " health_interval_ms=" << health_interval_ms
    << " health_timeout_ms=" << health_timeout_ms << " request_timeout_s=" << request_timeout_s
    << " connect_timeout_s=" << connect_timeout_s
    << " max_concurrent_streams=" << max_concurrent_streams
    << " max_idle_connections=" << max_idle_connections
    << " max_idle_connection_s=" << max_idle_connection_s;
  return s.str();
}

Router::Router(RouterOptions options)
    : options_(std::move(options)),
      server_(std::make_unique<httplib::Server>()),
      aborter_(std::make_unique<TransferAborter>(options_.abort)),
      connections_(std::make_unique<ConnectionPool>(
          ConnectionPoolOptions{options_.max_idle_connections, options_.max_idle_connection_s})) {}

Router::~Router() {
  Stop();
}

RouterCounters Router::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

std::vector<InstanceSnapshot> Router::Snapshot() const {
  return pool_ ? pool_->Snapshot() : std::vector<InstanceSnapshot>{};
}

void Router::CountRequest(TransferMode mode, bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.requests[static_cast<int>(mode)][ok ? 0 : 1];
}

void Router::CountLegFailure(Role role) {
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.leg_failures[RoleIndex(role)];
}

void Router::CountRetry(Role refused_by) {
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.retries[RoleIndex(refused_by)];
}

std::shared_ptr<Leg> Router::NewLeg(const InstanceAddress& address, Role role) {
  std::shared_ptr<Leg> leg(
      new Leg(address, connections_.get(), options_.connect_timeout_s, options_.request_timeout_s),
      [this](Leg* l) {
        ForgetLeg(l);
        delete l;
      });
  std::lock_guard<std::mutex> lock(legs_mu_);
  if (stopping_.load()) leg->Stop();
  legs_.emplace(leg.get(), role);
  // Marked unhealthy between selection and now: CutLegsTo ran before this leg was registered.
  if (pool_ && !pool_->IsHealthy(address.url)) {
    leg->Cut(std::string(RoleName(role)) + " instance " + address.url + " is unhealthy");
  }
  return leg;
}

void Router::CutLegsTo(Role role, const std::string& url, const std::string& reason) {
  connections_->Clear(url);  // its idle connections may be dead too
  int cut = 0;
  {
    std::lock_guard<std::mutex> lock(legs_mu_);
    for (const auto& [leg, r] : legs_) {
      if (leg->address().url != url || leg->stopped() || leg->finished()) continue;
      leg->Cut(reason);
      ++cut;
    }
  }
  if (cut == 0) return;
  spdlog::warn("router: closed {} leg(s) in flight to {} instance {} ({})", cut, RoleName(role),
               url, reason);
  std::lock_guard<std::mutex> lock(mu_);
  counters_.legs_cut[RoleIndex(role)] += cut;
}

void Router::AbortTransfer(const InstanceAddress& instance, Role role,
                           const std::string& transfer_id, const std::string& request_id) {
  aborter_->Abort(instance, role, transfer_id, request_id);
}

void Router::ForgetLeg(Leg* leg) {
  std::lock_guard<std::mutex> lock(legs_mu_);
  legs_.erase(leg);
}

bool Router::BeginBackground() {
  std::lock_guard<std::mutex> lock(legs_mu_);
  if (stopping_.load()) return false;
  ++background_;
  return true;
}

void Router::EndBackground() {
  std::lock_guard<std::mutex> lock(legs_mu_);
  --background_;
  legs_cv_.notify_all();
}

std::string Router::RenderMetrics() const {
  const RouterCounters c = counters();
  const bool colo = options_.colocated();
  // Only the rows of this router's mode: push/pull and prefill/decode, or colocated.
  const std::vector<TransferMode> modes =
      colo ? std::vector<TransferMode>{TransferMode::kColocated}
           : std::vector<TransferMode>{TransferMode::kPush, TransferMode::kPull};
  const std::vector<Role> roles =
      colo ? std::vector<Role>{Role::kColocated} : std::vector<Role>{Role::kPrefill, Role::kDecode};
  std::ostringstream s;
  s << "# HELP kvpush_router_requests_total Completion requests by transfer mode and outcome.\n"
    << "# TYPE kvpush_router_requests_total counter\n";
  for (TransferMode m : modes) {
    for (int o = 0; o < 2; ++o) {
      s << "kvpush_router_requests_total{mode=\"" << TransferModeName(m) << "\",outcome=\""
        << (o == 0 ? "ok" : "error") << "\"} " << c.requests[static_cast<int>(m)][o] << "\n";
    }
  }
  s << "# HELP kvpush_router_leg_failures_total Legs that failed (unreachable, non-200, broken "
       "stream).\n"
    << "# TYPE kvpush_router_leg_failures_total counter\n";
  for (Role r : roles) {
    s << "kvpush_router_leg_failures_total{leg=\"" << RoleName(r) << "\"} "
      << c.leg_failures[RoleIndex(r)] << "\n";
  }
  s << "# HELP kvpush_router_legs_cut_total Legs closed because their instance was marked "
       "unhealthy while they were in flight.\n"
    << "# TYPE kvpush_router_legs_cut_total counter\n";
  for (Role r : roles) {
    s << "kvpush_router_legs_cut_total{leg=\"" << RoleName(r) << "\"} " << c.legs_cut[RoleIndex(r)]
      << "\n";
  }
  s << "# HELP kvpush_router_retries_total Requests sent again to another instance after the "
       "instance in this role refused them unstarted (connection refused, 503 draining), before "
       "any byte reached the client.\n"
    << "# TYPE kvpush_router_retries_total counter\n";
  for (Role r : roles) {
    s << "kvpush_router_retries_total{refused_by=\"" << RoleName(r) << "\"} "
      << c.retries[RoleIndex(r)] << "\n";
  }
  if (!colo) {
    const AbortCounts a = aborter_->counts();
    s << "# HELP kvpush_router_transfer_aborts_total POST /kv/abort calls to the instance of the "
         "other leg after a leg failed.\n"
      << "# TYPE kvpush_router_transfer_aborts_total counter\n";
    for (int k = 0; k < 2; ++k) {
      const char* role = k == 0 ? "prefill" : "decode";
      s << "kvpush_router_transfer_aborts_total{role=\"" << role << "\",outcome=\"ok\"} " << a.ok[k]
        << "\n"
        << "kvpush_router_transfer_aborts_total{role=\"" << role << "\",outcome=\"error\"} "
        << a.failed[k] << "\n";
    }
  }
  if (!colo) RenderRoutingMetrics(c, s);
  const ConnectionPoolCounts cc = connections_->counts();
  s << "# HELP kvpush_router_connections_total Connections to instances handed to legs: opened "
       "(new), reused (idle keep-alive), discarded (idle ones closed: stale or too old).\n"
    << "# TYPE kvpush_router_connections_total counter\n"
    << "kvpush_router_connections_total{event=\"opened\"} " << cc.opened << "\n"
    << "kvpush_router_connections_total{event=\"reused\"} " << cc.reused << "\n"
    << "kvpush_router_connections_total{event=\"discarded\"} " << cc.discarded << "\n";
  s << "# HELP kvpush_router_worker_threads Leg worker threads (created on demand, kept).\n"
    << "# TYPE kvpush_router_worker_threads gauge\n"
    << "kvpush_router_worker_threads " << worker_threads() << "\n";
  const std::vector<InstanceSnapshot> snap = Snapshot();
  s << "# HELP kvpush_router_instance_healthy 1 when the instance passes its health check.\n"
    << "# TYPE kvpush_router_instance_healthy gauge\n";
  for (const auto& i : snap) {
    s << "kvpush_router_instance_healthy{role=\"" << RoleName(i.role) << "\",url=\""
      << LabelValue(i.url) << "\"} " << (i.healthy ? 1 : 0) << "\n";
  }
  s << "# HELP kvpush_router_instance_draining 1 when the instance answered 503 draining (it "
       "is shutting down gracefully: no new legs go there, those in flight finish).\n"
    << "# TYPE kvpush_router_instance_draining gauge\n";
  for (const auto& i : snap) {
    s << "kvpush_router_instance_draining{role=\"" << RoleName(i.role) << "\",url=\""
      << LabelValue(i.url) << "\"} " << (i.draining ? 1 : 0) << "\n";
  }
  s << "# HELP kvpush_router_instance_outstanding Legs in flight to the instance.\n"
    << "# TYPE kvpush_router_instance_outstanding gauge\n";
  for (const auto& i : snap) {
    s << "kvpush_router_instance_outstanding{role=\"" << RoleName(i.role) << "\",url=\""
      << LabelValue(i.url) << "\"} " << i.outstanding << "\n";
  }
  if (!colo) {
    s << "# HELP kvpush_router_instance_prefill_tokens Estimated prompt tokens queued or being "
         "prefilled on the prefill instance (its /health load plus legs sent since).\n"
      << "# TYPE kvpush_router_instance_prefill_tokens gauge\n";
    for (const auto& i : snap) {
      if (i.role != Role::kPrefill) continue;
      s << "kvpush_router_instance_prefill_tokens{url=\"" << LabelValue(i.url) << "\"} "
        << i.prefill_tokens << "\n";
    }
  }
  return s.str();
}

void Router::RouteModels() {
  // Answered by one decode (P/D) or colocated instance: every instance serves the same model,
  // tokenizer and chat template, so any one's answer is the deployment's.
  auto proxy = [this](const httplib::Request& req, httplib::Response& res) {
    std::string id = req.get_header_value("x-request-id");
    if (!pd::IsValidRequestId(id))
      id = ids_.RequestId(req.path == "/v1/models" ? "models-" : "tok-");
    res.set_header("x-request-id", id);
    const Role role = options_.colocated() ? Role::kColocated : Role::kDecode;
    const std::string name = RoleName(role);
    std::optional<InstanceLease> d = pool_->Acquire(role);
    if (!d) {
      return ReplyError(res, 503, "no healthy " + name + " instance", "server_error",
                        "no_healthy_instance");
    }
    LegResult r = req.method == "GET" ? NewLeg(d->address(), role)->Get(req.path, id)
                                      : NewLeg(d->address(), role)->Post(req.path, id, req.body);
    if (!r.answered) {
      if (r.connect_failed) d->MarkUnhealthy(req.method + " " + req.path + ": " + r.error);
      return ReplyError(res, 502,
                        name + " instance " + d->address().url + " unreachable: " + r.error,
                        "server_error", name + "_unreachable");
    }
    res.status = r.status;
    res.set_content(r.body, r.content_type.empty() ? "application/json" : r.content_type);
  };
  server_->Get("/v1/models", proxy);
  server_->Post("/tokenize", proxy);
  server_->Post("/detokenize", proxy);
}

void Router::RouteHealth() {
  server_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const std::vector<InstanceSnapshot> snap = Snapshot();
    int healthy[3] = {0, 0, 0}, total[3] = {0, 0, 0};
    std::string down;
    json instances = json::array();
    for (const auto& i : snap) {
      const int k = RoleIndex(i.role);
      ++total[k];
      healthy[k] += i.healthy ? 1 : 0;
      if (!i.healthy)
        down += (down.empty() ? "" : ", ") + std::string(RoleName(i.role)) + " " + i.url;
      instances.push_back({{"role", RoleName(i.role)},
                           {"url", i.url},
                           {"healthy", i.healthy},
                           {"draining", i.draining},
                           {"outstanding", i.outstanding}});
      if (i.role == Role::kPrefill) instances.back()["prefill_tokens"] = i.prefill_tokens;
    }
    // P/D: at least one P and one D healthy; colocated: at least one instance healthy.
    const std::vector<Role> roles = options_.colocated()
                                        ? std::vector<Role>{Role::kColocated}
                                        : std::vector<Role>{Role::kPrefill, Role::kDecode};
    json body = json::object();
    std::string msg;
    for (Role r : roles) {
      const int k = RoleIndex(r);
      body[RoleName(r)] = {{"healthy", healthy[k]}, {"total", total[k]}};
      if (healthy[k] == 0) {
        msg += (msg.empty() ? "" : "; ") + std::string("no healthy ") + RoleName(r) + " instance";
      }
    }
    body["instances"] = instances;
    if (stopping_.load() || draining_.load()) {
      res.status = 503;
      body["status"] = "unavailable";
      body["error"] = json::parse(
          stopping_.load() ? ErrorJson("router is shutting down", "server_error", "shutting_down")
                           : ErrorJson(kDrainingMessage, "server_error", kDrainingCode))["error"];
    } else if (msg.empty()) {
      res.status = 200;
      body["status"] = "ok";
    } else {
      res.status = 503;
      body["status"] = "unavailable";
      body["error"] = json::parse(
          ErrorJson(msg + " (down: " + down + ")", "server_error", "no_healthy_instance"))["error"];
    }
    res.set_content(body.dump(), "application/json");
  });
}

void Router::Route() {
  httplib::Server& s = *server_;
  auto completions = [this](const httplib::Request& req, httplib::Response& res) {
    if (draining_.load())
      return ReplyError(res, 503, kDrainingMessage, "server_error", kDrainingCode);
    RequestFlow(*this).Handle(req, res);
  };
  s.Post("/v1/completions", completions);
  s.Post("/v1/chat/completions", completions);
  RouteModels();
  RouteHealth();
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(RenderMetrics(), "text/plain; version=0.0.4; charset=utf-8");
  });
  // The router's part of the handoff timelines of the latest P/D requests (pd_protocol.md §7).
  s.Get("/debug/handoff_timeline", [this](const httplib::Request& req, httplib::Response& res) {
    const auto limit = req.has_param("limit")
                           ? ParseListLimit(req.get_param_value("limit"), 4096)
                           : std::optional<size_t>(256);
    if (!limit) {
      res.status = 400;
      res.set_content(ErrorJson("limit must be an integer in [1, 4096]", "invalid_request_error",
                                "invalid_limit", "limit"),
                      "application/json");
      return;
    }
    nlohmann::json data = nlohmann::json::array();
    for (nlohmann::json& r : timelines_.Newest(*limit)) data.push_back(std::move(r));
    const nlohmann::json body = {{"object", "list"}, {"data", std::move(data)}};
    res.set_content(body.dump(), "application/json");
  });
  // Wrong method on a known path: 405 with an Allow header.
  for (const RouteSpec& r : kRoutes) {
    const std::string allow = r.method;
    auto not_allowed = [allow](const httplib::Request& req, httplib::Response& res) {
      res.set_header("Allow", allow);
      ReplyError(res, 405,
                 "method " + req.method + " is not allowed on " + req.path + " (use " + allow + ")",
                 "invalid_request_error", "method_not_allowed");
    };
    if (allow != "GET") s.Get(r.path, not_allowed);
    if (allow != "POST") s.Post(r.path, not_allowed);
    s.Put(r.path, not_allowed);
    s.Delete(r.path, not_allowed);
    s.Patch(r.path, not_allowed);
    s.Options(r.path, not_allowed);
  }
  // Errors without a body (unknown path -> 404, 413, httplib's own 400s) get an OpenAI body.
  s.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        std::string msg;
        switch (res.status) {
          case 404:
            msg = "no route for " + req.method + " " + req.path;
            break;
          case 400:  // the instances' words (one error vocabulary: docs/server.md, "Errors")
            msg =
                "malformed HTTP request (unreadable body, headers or content encoding; send a "
                "JSON body with Content-Type: application/json)";
            break;
          case 413:
            msg = "request body too large";
            break;
          case 414:
            msg = "request URI too long";
            break;
          default:
            msg = "HTTP error " + std::to_string(res.status);
            break;
        }
        res.set_content(ErrorJson(msg, res.status >= 500 ? "server_error" : "invalid_request_error",
                                  res.status == 404 ? "not_found" : ""),
                        "application/json");
        return httplib::Server::HandlerResponse::Handled;
      }));
  s.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, const std::exception_ptr& ep) {
        std::string what = "internal error";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        ReplyError(res, 500, what, "server_error");
      });
  s.set_logger([](const httplib::Request& req, const httplib::Response& res) {
    spdlog::debug("{} {} -> {}", req.method, req.path, res.status);
  });
}

Status Router::Start() {
  if (thread_.joinable()) return FailedPrecondition("Router already started");
  if (Status st = options_.Validate(); !st.ok()) return st;
  std::vector<InstanceAddress> prefill, decode, colocated;
  for (const auto& u : options_.prefill_urls) prefill.push_back(*ParseInstanceUrl(u));
  for (const auto& u : options_.decode_urls) decode.push_back(*ParseInstanceUrl(u));
  for (const auto& u : options_.colocated_urls) colocated.push_back(*ParseInstanceUrl(u));
  std::signal(SIGPIPE, SIG_IGN);
  spdlog::default_logger_raw();  // create the registry before worker threads log (TSan)
  pool_ = std::make_unique<InstancePool>(
      std::move(prefill), std::move(decode),
      HealthOptions{options_.health_interval_ms, options_.health_timeout_ms}, std::move(colocated));
  pool_->SetUnhealthyCallback([this](Role role, const std::string& url, const std::string& why) {
    CutLegsTo(role, url, why);
  });
  pool_->SetRoundCallback([this] { connections_->CloseExpired(); });
  pool_->SetPrefixIndexCapacity(options_.prefix_index_blocks);
  pool_->Start();
  if (Status st = StartDiscovery(); !st.ok()) {
    pool_->Stop();
    return st;
  }

  const int threads = options_.max_concurrent_streams + 16;
  // A push request's wait for P's answer runs on a worker (one task per request), and so does
  // each prompt after the first of a list (docs/router.md, "Lists of prompts"). At most `threads`
  // requests are in flight; the pool is sized for one task of each kind per request, so a task
  // waits for a thread only under lists of prompts beyond that (it then starts late, never
  // deadlocks: no task waits for a queued one).
  workers_ = std::make_unique<WorkerPool>(kInitialWorkers, 2 * static_cast<size_t>(threads));
  server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server_->set_payload_max_length(options_.max_body_bytes);
  server_->set_tcp_nodelay(true);  // SSE chunks go out at once (no Nagle delay)
  server_->set_keep_alive_max_count(1000);
  const auto timeout_s = static_cast<time_t>(options_.request_timeout_s);
  server_->set_write_timeout(timeout_s > 0 ? timeout_s : 1, 0);
  // SO_REUSEADDR only (not httplib's SO_REUSEPORT): a port in use makes Start() fail.
  server_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  Route();
  if (options_.port == 0) {
    port_ = server_->bind_to_any_port(options_.host);
    if (port_ <= 0) {
      if (membership_) membership_->Stop();
      pool_->Stop();
      return Unavailable("cannot bind " + options_.host + ":<any>");
    }
  } else {
    if (!server_->bind_to_port(options_.host, options_.port)) {
      if (membership_) membership_->Stop();
      pool_->Stop();
      return Unavailable("cannot bind " + options_.host + ":" + std::to_string(options_.port));
    }
    port_ = options_.port;
  }
  // The library listens with a backlog of 5: too small for bursts of concurrent clients.
  RaiseListenBacklog(port_, 1024);
  aborter_->Start();
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  // httplib's stop() is a no-op until the listen loop runs: wait for it so Stop() cannot race.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!server_->is_running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!server_->is_running()) return Unavailable("HTTP server did not start listening");
  return Status::Ok();
}

size_t Router::inflight() {
  std::lock_guard<std::mutex> lock(legs_mu_);
  return legs_.size() + static_cast<size_t>(background_);
}

std::string Router::StopErrorJson() const {
  return draining_.load() ? ErrorJson(kDrainTimeoutMessage, "server_error", kDrainTimeoutCode)
                          : ErrorJson("router is shutting down", "server_error", "shutting_down");
}

void Router::Stop() {
  {
    std::lock_guard<std::mutex> lock(legs_mu_);
    stopping_.store(true);
    for (const auto& [l, role] : legs_) l->Stop();
  }
  // Requests in flight end now that their legs are closed: each open client stream writes its
  // `shutting_down` error event before the server stops (once stopped, the server ends a
  // stream's body without calling its provider again). Bounded.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (inflight() > 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
  {
    // Legs created while the server drained were stopped at creation; close any still open.
    std::unique_lock<std::mutex> lock(legs_mu_);
    for (const auto& [l, role] : legs_) l->Stop();
    legs_cv_.wait(lock, [this] { return background_ == 0; });
  }
  if (workers_) workers_->Stop();  // P-answer waits end once their legs are closed
  aborter_->Stop();
  connections_->Close();
  if (membership_) membership_->Stop();
  if (pool_) pool_->Stop();
}

Status Router::StartDiscovery() {
  if (!options_.discovered()) return Status::Ok();
  discovery::MembershipOptions mo;
  mo.endpoints = *discovery::ParseDiscoveryUrl(options_.discovery);
  mo.prefix = options_.discovery_prefix;
  mo.model = options_.discovery_model;
  auto w = discovery::MembershipWatcher::Create(
      std::move(mo), [this](const discovery::MembershipChange& c) {
        const Role role = c.record.role == "prefill" ? Role::kPrefill : Role::kDecode;
        auto address = ParseInstanceUrl(c.record.url);  // validated by the record's parser
        if (!address.ok()) return;
        if (c.type == discovery::MembershipChange::Type::kAdd) {
          pool_->AddInstance(role, *address);
        } else {
          pool_->RemoveInstance(role, address->url);
        }
      });
  if (!w.ok()) return w.status();
  membership_ = std::move(w).value();
  membership_->Start();
  return Status::Ok();
}

}  // namespace kvpush::router
