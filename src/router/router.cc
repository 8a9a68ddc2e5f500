#include "router/router.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <csignal>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/drain.h"
#include "discovery/membership.h"
#include "pd/ids.h"
#include "router/flow_state.h"
#include "router/leg.h"
#include "router/request_flow.h"

namespace kvpush::router {
namespace {

using nlohmann::json;

/// Leg worker threads started with the router (more are added on demand, up to the maximum).
constexpr size_t kInitialWorkers = 8;

void ReplyError(http::Response& res, int status, const std::string& message,
                const std::string& type, const std::string& code = {}) {
  http::ReplyError(res, http::ApiError{status, message, type, "", code});
}

AbortOptions WithInstanceAccess(AbortOptions o, const std::string& api_key,
                                std::shared_ptr<const TlsClientContext> tls) {
  o.api_key = api_key;
  o.tls = std::move(tls);
  return o;
}

/// The router's TLS settings when an instance may be https (an https URL, a CA file, or
/// discovery, which may add https instances); null otherwise (no CA store is read for nothing).
/// A CA file that does not load sets `*status`.
std::shared_ptr<const TlsClientContext> MakeTls(const RouterOptions& o, Status* status) {
  bool https = !o.tls_ca_file.empty() || o.discovered();
  for (const auto* urls : {&o.prefill_urls, &o.decode_urls, &o.colocated_urls}) {
    for (const std::string& u : *urls) https = https || u.rfind("https://", 0) == 0;
  }
  if (!https) return nullptr;
  auto ctx = TlsClientContext::Create(o.tls_ca_file);
  if (!ctx.ok()) {
    *status = ctx.status();
    return nullptr;
  }
  return std::move(ctx).value();
}

}  // namespace

Router::Router(RouterOptions options)
    : options_(std::move(options)),
      tls_(MakeTls(options_, &tls_status_)),
      aborter_(std::make_unique<TransferAborter>(
          WithInstanceAccess(options_.abort, options_.instance_api_key, tls_))),
      connections_(std::make_unique<ConnectionPool>(ConnectionPoolOptions{
          options_.max_idle_connections, options_.max_idle_connection_s, tls_})),
      legs_(std::make_unique<LegRegistry>(
          connections_.get(), options_.connect_timeout_s, options_.request_timeout_s,
          [this](const std::string& url) { return !pool_ || pool_->IsHealthy(url); },
          options_.instance_api_key)) {}

Router::~Router() {
  Stop();
}

RouterCounters Router::counters() const {
  MutexLock lock(mu_);
  return counters_;
}

std::vector<InstanceSnapshot> Router::Snapshot() const {
  return pool_ ? pool_->Snapshot() : std::vector<InstanceSnapshot>{};
}

void Router::CountRequest(TransferMode mode, bool ok) {
  MutexLock lock(mu_);
  ++counters_.requests[static_cast<int>(mode)][ok ? 0 : 1];
}

void Router::CountLegFailure(Role role) {
  MutexLock lock(mu_);
  ++counters_.leg_failures[RoleIndex(role)];
}

void Router::CountRetry(Role refused_by) {
  MutexLock lock(mu_);
  ++counters_.retries[RoleIndex(refused_by)];
}

void Router::CountContinuation(Role failed, ContinuationKind kind) {
  MutexLock lock(mu_);
  ++counters_.continuations[RoleIndex(failed)][static_cast<int>(kind)];
}

void Router::CutLegsTo(Role role, const std::string& url, const std::string& reason) {
  connections_->Clear(url);  // its idle connections may be dead too
  const int cut = legs_->CutTo(url, reason);
  if (cut == 0) return;
  spdlog::warn("router: closed {} leg(s) in flight to {} instance {} ({})", cut, RoleName(role),
               url, reason);
  MutexLock lock(mu_);
  counters_.legs_cut[RoleIndex(role)] += cut;
}

void Router::AbortTransfer(const InstanceAddress& instance, Role role,
                           const std::string& transfer_id, const std::string& request_id) {
  aborter_->Abort(instance, role, transfer_id, request_id);
}

void Router::RouteModels() {
  // Answered by one decode (P/D) or colocated instance: every instance serves the same model,
  // tokenizer and chat template, so any one's answer is the deployment's.
  auto proxy = [this](const http::Request& req, http::Response& res) {
    std::string id = req.get_header_value("x-request-id");
    if (!pd::IsValidRequestId(id))
      id = ids_.RequestId(req.path == "/v1/models" ? "models-" : "tok-");
    res.set_header("x-request-id", id);
    http::SetCurrentRequestId(id);
    const Role role = options_.colocated() ? Role::kColocated : Role::kDecode;
    const std::string name = RoleName(role);
    std::optional<InstanceLease> d = pool_->Acquire(role);
    if (!d) return NoHealthyReply(*pool_, role).WriteTo(res);
    LegResult r = req.method == "GET"
                      ? legs_->NewLeg(d->address(), role)->Get(req.path, id)
                      : legs_->NewLeg(d->address(), role)->Post(req.path, id, req.body);
    if (!r.answered) {
      if (r.connect_failed) d->MarkUnhealthy(req.method + " " + req.path + ": " + r.error);
      return ReplyError(res, 502,
                        name + " instance " + d->address().url + " unreachable: " + r.error,
                        "server_error", name + "_unreachable");
    }
    res.status = r.status;
    res.set_content(r.body, r.content_type.empty() ? "application/json" : r.content_type);
  };
  door_->Get("/v1/models", proxy);
  door_->Post("/tokenize", proxy);
  door_->Post("/detokenize", proxy);
}

void Router::RouteResetPrefixCache() {
  // vLLM's endpoint, fanned out: each member instance (P, D or colocated) resets its prefix
  // cache; 200 when every one did, else the first refusal's status (409 a block in use, 502 an
  // instance unreachable) naming each instance that did not. The router's estimates of what
  // each D caches are forgotten either way (some may have been reset).
  door_->Post("/reset_prefix_cache", [this](const http::Request& req, http::Response& res) {
    std::string id = req.get_header_value("x-request-id");
    if (!pd::IsValidRequestId(id)) id = ids_.RequestId("reset-");
    http::SetCurrentRequestId(id);
    json instances = json::array();
    int status = 200;
    std::string failed;
    for (const InstanceSnapshot& s : Snapshot()) {
      auto address = ParseInstanceUrl(s.url);
      if (!address.ok()) continue;
      const LegResult r = legs_->NewLeg(*address, s.role)->Post(req.path, id, "{}");
      const int st = r.answered ? r.status : 502;
      json entry = {{"role", RoleName(s.role)}, {"url", s.url}, {"status", st}};
      const json body = json::parse(r.body, nullptr, false);
      if (st == 200 && body.is_object() && body.contains("blocks_freed")) {
        entry["blocks_freed"] = body["blocks_freed"];
      }
      if (st != 200) {
        if (status == 200) status = st == 409 ? 409 : 502;
        std::string why = r.answered ? r.body.substr(0, 200) : r.error;
        if (body.is_object() && body.contains("error") && body["error"].contains("message")) {
          why = body["error"]["message"].get<std::string>();
        }
        failed += (failed.empty() ? "" : "; ") + std::string(RoleName(s.role)) + " " + s.url +
                  ": " + why;
      }
      instances.push_back(std::move(entry));
    }
    pool_->ClearPrefixIndexes();
    if (status != 200) {
      return ReplyError(res, status, "prefix cache not reset on " + failed,
                        status == 409 ? "invalid_request_error" : "server_error",
                        status == 409 ? "prefix_cache_in_use" : "instance_unreachable");
    }
    res.set_content(json{{"reset", true}, {"instances", instances}}.dump(), "application/json");
  });
}

void Router::RouteMigrate() {
  // An operator moves one stream to another instance of its role (the request's continuation,
  // docs/reliability.md): 200 {"request_id", "from", "to"} once the other instance's stream is
  // relayed; 404 when no continuable stream has that id; 409 when it could not be moved (it
  // stays where it was).
  door_->Post("/admin/migrate", [this](const http::Request& req, http::Response& res) {
    const json body = json::parse(req.body, nullptr, false);
    if (!body.is_object() || !body.contains("request_id") || !body["request_id"].is_string()) {
      return ReplyError(res, 400, "body must be {\"request_id\": \"<the stream's request id>\"}",
                        "invalid_request_error", "invalid_json");
    }
    const std::string id = body["request_id"].get<std::string>();
    http::SetCurrentRequestId(id);
    std::shared_ptr<MoveSlot> slot = streams_.Find(id);
    if (slot == nullptr) {
      return ReplyError(res, 404,
                        "no stream that can be moved is in flight with request id " + id +
                            " (streams of one prompt, with --migration-limit > 0)",
                        "invalid_request_error", "stream_not_found");
    }
    const std::optional<MoveOutcome> o = slot->Ask(std::chrono::seconds(30));
    if (!o) return ReplyError(res, 504, "the stream did not answer within 30 s", "server_error", "timeout");
    if (!o->moved) {
      return ReplyError(res, 409, "request " + id + " was not moved: " + o->error,
                        "invalid_request_error", "not_moved");
    }
    spdlog::info("request {}: moved from {} to {} (POST /admin/migrate)", id, o->from, o->to);
    res.set_content(json{{"request_id", id}, {"from", o->from}, {"to", o->to}}.dump(),
                    "application/json");
  });
}

void Router::RouteHealth() {
  door_->Get("/health", [this](const http::Request&, http::Response& res) {
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
  http::FrontDoor& s = *door_;
  auto completions = [this](const http::Request& req, http::Response& res) {
    if (draining_.load())
      return ReplyError(res, 503, kDrainingMessage, "server_error", kDrainingCode);
    RequestFlow(*this).Handle(req, res);
  };
  s.Post("/v1/completions", completions);
  s.Post("/v1/chat/completions", completions);
  RouteModels();
  RouteResetPrefixCache();
  RouteMigrate();
  RouteHealth();
  s.Get("/metrics", [this](const http::Request&, http::Response& res) {
    res.set_content(RenderMetrics(), "text/plain; version=0.0.4; charset=utf-8");
  });
  // The router's part of the handoff timelines of the latest P/D requests (pd_protocol.md §7).
  s.Get("/debug/handoff_timeline", [this](const http::Request& req, http::Response& res) {
    const auto limit = req.has_param("limit") ? ParseListLimit(req.get_param_value("limit"), 4096)
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
}

Status Router::Start() {
  if (door_ != nullptr) return FailedPrecondition("Router already started");
  if (Status st = options_.Validate(); !st.ok()) return st;
  if (!tls_status_.ok()) return tls_status_;
  std::vector<InstanceAddress> prefill, decode, colocated;
  for (const auto& u : options_.prefill_urls) prefill.push_back(*ParseInstanceUrl(u));
  for (const auto& u : options_.decode_urls) decode.push_back(*ParseInstanceUrl(u));
  for (const auto& u : options_.colocated_urls) colocated.push_back(*ParseInstanceUrl(u));
  std::signal(SIGPIPE, SIG_IGN);
  spdlog::default_logger_raw();  // create the registry before worker threads log (TSan)
  pool_ = std::make_unique<InstancePool>(
      std::move(prefill), std::move(decode),
      HealthOptions{options_.health_interval_ms, options_.health_timeout_ms, tls_},
      std::move(colocated));
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
  // Client connections: a fixed pool of `threads` (no extra threads), writes bounded by the
  // request timeout (whole seconds, at least 1).
  const int write_timeout_s = static_cast<int>(options_.request_timeout_s);
  door_ = std::make_unique<http::FrontDoor>(
      http::FrontDoorOptions{options_.host, options_.port, options_.max_body_bytes,
                             static_cast<size_t>(threads), 0, std::max(1, write_timeout_s),
                             /*listen_backlog=*/1024, options_.build, options_.api_key,
                             options_.log_requests, options_.tls_cert_file,
                             options_.tls_key_file, options_.connections});
  Route();
  aborter_->Start();
  if (Status st = door_->Start(); !st.ok()) {
    door_.reset();
    aborter_->Stop();
    if (membership_) membership_->Stop();
    pool_->Stop();
    return st;
  }
  port_ = door_->port();
  return Status::Ok();
}

size_t Router::inflight() {
  return legs_->inflight();
}

std::string Router::StopErrorJson() const {
  return draining_.load() ? ErrorJson(kDrainTimeoutMessage, "server_error", kDrainTimeoutCode)
                          : ErrorJson("router is shutting down", "server_error", "shutting_down");
}

void Router::Stop() {
  stopping_.store(true);
  legs_->StopAll();
  // Requests in flight end now that their legs are closed: each open client stream writes its
  // `shutting_down` error event before the server stops (once stopped, the server ends a
  // stream's body without calling its provider again). Bounded.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (inflight() > 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (door_) door_->Stop();
  // Legs created while the server drained were stopped at creation; close any still open.
  legs_->StopAll();
  legs_->WaitBackground();
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
