// kvpush serve: one instance = model + engine thread + OpenAI HTTP server (docs/configuration.md
// lists every flag; docs/server.md the API). Runs until SIGINT/SIGTERM.
#include <netdb.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "apps/build_info.h"
#include "apps/otlp_tracer.h"
#include "apps/commands.h"
#include "apps/connection_flags.h"
#include "apps/serve_discovery.h"
#include "apps/serve_options.h"
#include "apps/serve_vllm_flags.h"
#include "common/log.h"
#include "connector/handshake.h"
#include "connector/pd_connector.h"
#include "engine/engine.h"
#include "model/model.h"
#include "model/sim_executor.h"
#include "model/worker_pool.h"
#include "server/http_server.h"
#include "xfer/backend_factory.h"

namespace kvpush::apps {
namespace {

/// SIGINT/SIGTERM received so far: the first starts the graceful drain, a second cuts its wait
/// short (open requests end at once with their drain error).
std::atomic<int> g_stop_signals{0};
extern "C" void OnStopSignal(int) {
  g_stop_signals.fetch_add(1);
}

/// --xfer-fault-plan (testing only): SIGUSR1 makes this instance a broken but alive peer (every
/// transfer post fails, xfer::FaultControls::SetBroken), SIGUSR2 heals it.
std::atomic<xfer::FaultControls*> g_fault_controls{nullptr};
extern "C" void OnFaultSignal(int sig) {
  if (xfer::FaultControls* c = g_fault_controls.load()) c->SetBroken(sig == SIGUSR1);
}

/// The graceful drain after the first SIGTERM/SIGINT (docs/server.md, "Graceful drain"):
/// `pre_drain` callbacks in order (leave discovery first, so routers stop choosing this
/// instance), then new requests get 503 `draining`, in-flight requests (and, on P, KV pushes
/// still running) get up to `timeout_s` to finish, then whatever is still open ends with an
/// error (SSE error event / 503 `draining_timeout`). The drain lasts at least kMinDrain (1 s;
/// less when `timeout_s` is shorter). A second signal ends the wait at once.
constexpr std::chrono::milliseconds kMinDrain{1000};

void Drain(server::HttpServer& http, const connector::PdConnector* conn, double timeout_s,
           const std::vector<std::function<void()>>& pre_drain) {
  using Clock = std::chrono::steady_clock;
  for (const auto& f : pre_drain) f();
  http.BeginDrain();
  const auto t0 = Clock::now();
  const auto deadline =
      t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  // P: a transfer whose P leg answered may still be pushing (or, pull, waiting to be read).
  auto busy = [&] {
    return http.inflight() > 0 || (conn != nullptr && conn->stats().producers_active > 0);
  };
  spdlog::info("kvpush serve: draining ({} request(s) in flight, timeout {} s)", http.inflight(),
               timeout_s);
  // At least kMinDrain (within the timeout), even when idle: routers polling /health see the
  // 503 `draining` and stop choosing this instance before its port closes, so none sends a
  // request on a kept-alive connection that the stop then closes unanswered.
  const auto min_end = std::min(deadline, t0 + kMinDrain);
  while ((busy() || Clock::now() < min_end) && Clock::now() < deadline &&
         g_stop_signals.load() < 2) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (http.inflight() > 0) {
    spdlog::warn("kvpush serve: drain {}: ending {} open request(s) with an error",
                 g_stop_signals.load() >= 2 ? "cut short by a second signal" : "timed out",
                 http.inflight());
    http.CutOpenRequests();
    // Streams see the cut within one poll (50 ms); give their last bytes time to go out.
    const auto grace = Clock::now() + std::chrono::seconds(2);
    while (http.inflight() > 0 && Clock::now() < grace) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  spdlog::info("kvpush serve: drained in {:.3f} s",
               std::chrono::duration<double>(Clock::now() - t0).count());
}

/// Fails when host:port cannot be bound now (in use, or not an address of this host), so that a
/// port in use is reported before the model loads (seconds to minutes), not after. Port 0 and a
/// port freed before the server binds it are not errors here; the server's own bind decides.
Status CheckPortBindable(const std::string& host, int port) {
  if (port == 0) return Status::Ok();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res) {
    return InvalidArgument("--host " + host + ": not an address");
  }
  const int fd = ::socket(res->ai_family, res->ai_socktype, res->ai_protocol);
  bool ok = fd >= 0;
  if (ok) {
    int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));  // as the server binds
    ok = ::bind(fd, res->ai_addr, res->ai_addrlen) == 0;
  }
  const int err = errno;  // of socket() or bind(), whichever failed
  if (fd >= 0) ::close(fd);
  freeaddrinfo(res);
  if (!ok) {
    return Unavailable("cannot bind " + host + ":" + std::to_string(port) + ": " +
                       std::strerror(err));
  }
  return Status::Ok();
}

/// The llama executor from --model, or the sim executor from the --sim-* flags.
Result<LoadedModel> LoadServeModel(const ServeOptions& o) {
  if (o.executor == "sim") {
    SimOptions so = o.sim;
    KVP_ASSIGN_OR_RETURN(so.model, FindSimModel(o.sim_model));
    KVP_ASSIGN_OR_RETURN(so.hardware, FindSimHardware(o.sim_hw));
    return MakeSimModel(so);
  }
  if (o.model.empty()) return InvalidArgument("--model is required with --executor llama");
  ModelLoadOptions mo;
  mo.path = o.model;
  mo.tokenizer_path = o.tokenizer;
  mo.blas_threads = o.blas_threads;
  mo.threads = o.threads;
  KVP_ASSIGN_OR_RETURN(mo.cpus, ResolveThreadsBind(o.threads_bind, o.threads));
  return LoadModel(mo);
}

/// The chat template the server renders: the family detected in the model's template text, or
/// the one --chat-template-format forces (its literals still read from the model's template when
/// that is of the same family). An unrecognised template logs one warning and falls back to plain.
ChatTemplate ResolveChatTemplate(std::optional<ChatTemplateFormat> forced,
                                 const std::string& jinja) {
  const DetectedChatTemplate d = DetectChatTemplate(jinja);
  if (forced && (!d.recognised || d.chat_template.format != *forced)) {
    ChatTemplate t;
    t.format = *forced;
    return t;
  }
  if (!d.recognised && !jinja.empty()) {
    spdlog::warn(
        "kvpush serve: the model's chat template is of no family kvpush renders (chatml, qwen3, "
        "llama3, llama2, mistral); chat requests use kvpush's plain template "
        "(\"User: ...\\nAssistant:\"). --chat-template-format chooses one (docs/server.md)");
  }
  return d.chat_template;
}

/// The instance's role: --role when given, else the --kv-transfer-config's kv_role (vLLM sets the
/// role there); "both" without either.
std::string RoleOf(connector::KvRole r) {
  switch (r) {
    case connector::KvRole::kProducer:
      return "prefill";
    case connector::KvRole::kConsumer:
      return "decode";
    case connector::KvRole::kBoth:
      break;
  }
  return "both";
}

/// What the flags resolve to before anything loads (step 1 of RunServe).
struct ServePlan {
  std::optional<ChatTemplate> flag_template;  ///< --chat-template's, when given
  bool pd = false;                            ///< a P/D instance (has a KV connector)
  connector::KvTransferConfig kc;             ///< when pd
  EngineConfig engine;                        ///< validated, before the model resolves it
};

/// Step 1 of RunServe: every check that needs no model, so a bad flag or a port in use fails in
/// milliseconds; sets o.role from kv_role when --role was not given, and installs a
/// --xfer-fault-plan. Returns 0, or the exit status after printing why (2: a flag; 1: the port).
int PlanServe(ServeOptions& o, ServePlan* plan) {
  if (Status s = ResolveServeModelPath(o); !s.ok()) {
    std::fprintf(stderr, "kvpush serve: %s\n", s.message().c_str());
    return 2;
  }
  if (!o.chat_template.empty()) {
    auto t = LoadChatTemplateFlag(o.chat_template);
    if (!t.ok()) {
      std::fprintf(stderr, "kvpush serve: %s\n", t.status().message().c_str());
      return 2;
    }
    plan->flag_template = *t;
  }
  const bool pd = plan->pd = (o.role_given && o.role != "both") || !o.kv_transfer_config.empty();
  if (auto tracer = MakeTracer(o.otlp_traces_endpoint, "check"); !tracer.ok()) {
    std::fprintf(stderr, "kvpush serve: %s\n", tracer.status().message().c_str());
    return 2;
  }
  if (!pd && !o.kv_auth_key_file.empty()) {
    std::fprintf(stderr,
                 "kvpush serve: --kv-auth-key-file needs P/D serving (--role prefill|decode or "
                 "--kv-transfer-config)\n");
    return 2;
  }
  connector::KvTransferConfig& kc = plan->kc;
  if (pd) {
    auto parsed =
        connector::KvTransferConfig::Parse(o.kv_transfer_config, o.role_given ? o.role : "");
    if (!parsed.ok()) {
      std::fprintf(stderr, "kvpush serve: %s\n", parsed.status().message().c_str());
      return 2;
    }
    kc = *parsed;
    o.role = RoleOf(kc.role);
  }
  if (!o.xfer_fault_plan.empty()) {
    auto faults = xfer::ParseFaultPlan(o.xfer_fault_plan);
    if (!faults.ok()) {
      std::fprintf(stderr, "kvpush serve: --xfer-fault-plan: %s\n",
                   faults.status().message().c_str());
      return 2;
    }
    spdlog::warn("kvpush serve: injecting KV transfer faults (testing only): {}",
                 xfer::FaultPlanToString(*faults));
    xfer::SetProcessFaultPlan(*faults);
    g_fault_controls.store(xfer::ProcessFaultControls());
    std::signal(SIGUSR1, OnFaultSignal);
    std::signal(SIGUSR2, OnFaultSignal);
  }
  if (o.port < 0 || o.port > 65535) {
    std::fprintf(stderr, "kvpush serve: --port must be in [0, 65535]\n");
    return 2;
  }
  if (Status s = ValidateServeDiscoveryFlags(o.discovery, o.host, !o.ssl_certfile.empty());
      !s.ok()) {
    std::fprintf(stderr, "kvpush serve: %s\n", s.message().c_str());
    return 2;
  }
  if (Status s = CheckPortBindable(o.host, o.port); !s.ok()) {
    std::fprintf(stderr, "kvpush serve: %s (before loading the model)\n", s.message().c_str());
    return 1;
  }
  EngineConfig& ec = plan->engine;
  ec = o.engine;
  ec.enable_prefix_caching = o.enable_prefix_caching;
  if (Status s = ec.Validate(); !s.ok()) {
    std::fprintf(stderr, "kvpush serve: %s\n", s.message().c_str());
    return 2;
  }
  return 0;
}

int RunServe(ServeOptions o) {
  if (Status s = InitLogging(o.log_level, o.log_format); !s.ok()) {
    std::fprintf(stderr, "kvpush serve: %s\n", s.ToString().c_str());
    return 2;
  }
  ServePlan plan;
  if (const int rc = PlanServe(o, &plan); rc != 0) return rc;
  const bool pd = plan.pd;
  const connector::KvTransferConfig& kc = plan.kc;
  const EngineConfig& ec = plan.engine;
  const std::optional<ChatTemplate>& flag_template = plan.flag_template;
  auto loaded = LoadServeModel(o);
  if (!loaded.ok()) {
    std::fprintf(stderr, "kvpush serve: loading %s: %s\n",
                 o.executor == "sim" ? o.sim_model.c_str() : o.model.c_str(),
                 loaded.status().ToString().c_str());
    return loaded.status().code() == StatusCode::kInvalidArgument ||
                   loaded.status().code() == StatusCode::kNotFound
               ? 2
               : 1;
  }
  LoadedModel model = std::move(loaded).value();
  auto resolved = ec.Resolve(model.config);
  if (!resolved.ok()) {
    std::fprintf(stderr, "kvpush serve: %s\n", resolved.status().message().c_str());
    return 2;
  }
  std::unique_ptr<connector::PdConnector> conn;
  if (pd) {
    connector::ConnectorOptions co;
    co.config = kc;
    co.layout = EngineCore::LayoutFor(*resolved, model.config);
    co.model_fingerprint = model.config.fingerprint;
    co.role_name = o.role;
    co.advertise_host = !o.advertise_host.empty()                 ? o.advertise_host
                        : (o.host == "0.0.0.0" || o.host == "::") ? "127.0.0.1"
                                                                  : o.host;
    co.advertise_port = o.port;
    co.auth_key_file = o.kv_auth_key_file;
    co.advertise_https = !o.ssl_certfile.empty();
    co.tls_ca_file = o.ssl_ca_certs;
    co.api_key = o.api_key;
    auto c = connector::PdConnector::Create(co);
    if (!c.ok()) {
      std::fprintf(stderr, "kvpush serve: KV connector: %s\n", c.status().ToString().c_str());
      return 1;
    }
    conn = std::move(c).value();
  }
  auto engine = Engine::Create(*resolved, std::move(model.executor), *model.tokenizer, conn.get(),
                               conn ? conn->kv_memory() : std::span<std::byte>{});
  if (!engine.ok()) {
    std::fprintf(stderr, "kvpush serve: %s\n", engine.status().message().c_str());
    return 2;
  }
  server::ServerOptions so;
  so.host = o.host;
  so.port = o.port;
  so.connector = conn.get();
  so.enable_prompt_tokens_details = o.enable_prompt_tokens_details;
  so.chat_template = flag_template
                         ? *flag_template
                         : ResolveChatTemplate(*ParseChatTemplateFormat(o.chat_template_format),
                                               model.chat_template);
  so.served_model_name = !o.served_model_names.empty() ? o.served_model_names[0]
                         : o.executor == "sim"         ? o.sim_model
                                               : std::filesystem::path(o.model).filename().string();
  if (o.served_model_names.size() > 1) {
    so.served_model_aliases.assign(o.served_model_names.begin() + 1, o.served_model_names.end());
  }
  so.api_key = o.api_key;
  so.build = ThisBuild();
  so.seed = o.seed;
  so.log_requests = o.log_requests;
  so.tls_cert_file = o.ssl_certfile;
  so.tls_key_file = o.ssl_keyfile;
  so.connections = o.connections;
  // Checked by PlanServe: only the role was left to know.
  so.tracer = MakeTracer(o.otlp_traces_endpoint,
                         conn != nullptr ? o.role : std::string("colocated"))
                  .value();
  spdlog::info(
      "kvpush serve: model={} ({}; layers={} kv_heads={} head_dim={} vocab={} context={}) "
      "role={} served_model_name={} host={} port={} https={} ssl_ca_certs={} chat_template={} "
      "timeout_keep_alive={} request_head_timeout_s={} max_connections={} {}",
      o.model, model.config.architecture, model.config.num_layers, model.config.num_kv_heads,
      model.config.head_dim, model.config.vocab_size, model.config.context_length, o.role,
      so.served_model_name, so.host, so.port, !so.tls_cert_file.empty(),
      o.ssl_ca_certs.empty() ? "(system)" : o.ssl_ca_certs,
      ChatTemplateFormatName(so.chat_template.format), so.connections.keep_alive_timeout_s,
      so.connections.header_timeout_s,
      so.connections.max_connections > 0 ? std::to_string(so.connections.max_connections)
                                         : std::string("(auto)"),
      (*engine)->config().ToString());
  server::HttpServer http(**engine, so);
  if (Status s = http.Start(); !s.ok()) {
    std::fprintf(stderr, "kvpush serve: %s\n", s.ToString().c_str());
    return 1;
  }
  if (conn) conn->set_advertised_port(http.port());
  std::signal(SIGINT, OnStopSignal);
  std::signal(SIGTERM, OnStopSignal);
  // etcd discovery: registered while serving and not stopping (docs/deployment.md).
  connector::HandshakeInfo compat;  // a colocated instance's compat hash: no transfer backend
  compat.model_fingerprint = model.config.fingerprint;
  compat.layout = EngineCore::LayoutFor(*resolved, model.config);
  auto registration = StartServeRegistration(
      o.discovery,
      ServeIdentity{o.role, so.served_model_name, o.host, http.port(),
                    conn ? conn->compat_hash() : compat.CompatHash(),
                    conn ? conn->incarnation() : 0, !so.tls_cert_file.empty()},
      [] { return g_stop_signals.load() == 0; });
  if (!registration.ok()) {
    std::fprintf(stderr, "kvpush serve: %s\n", registration.status().message().c_str());
    http.Stop();
    (*engine)->Stop();
    return 2;
  }
  std::printf("kvpush serve: listening on %s://%s:%d\n",
              so.tls_cert_file.empty() ? "http" : "https", so.host.c_str(), http.port());
  std::fflush(stdout);
  // Shutdown, step 1: what must happen before the drain, in order (e.g. leaving discovery, so
  // routers stop sending requests here). Registered above as the instance comes up.
  std::vector<std::function<void()>> pre_drain;
  // First: leave discovery so routers stop sending here.
  pre_drain.push_back([&registration] {
    if (*registration) (*registration)->Leave();
  });
  while (g_stop_signals.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  spdlog::info("kvpush serve: shutting down");
  Drain(http, conn.get(), o.drain_timeout_s, pre_drain);
  http.Stop();
  (*engine)->Stop();
  return 0;
}

}  // namespace

void RegisterServeCommand(CLI::App& app) {
  auto opts = std::make_shared<ServeOptions>();
  auto* cmd = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  cmd->add_option("--model", opts->model,
                  "Model file (.gguf or llama2.c .bin); required with --executor llama");
  cmd->add_option("--executor", opts->executor,
                  "llama (real model from --model) | sim (latency model of --sim-model on "
                  "--sim-hw, docs/sim.md)")
      ->check(CLI::IsMember({"llama", "sim"}))
      ->capture_default_str();
  cmd->add_option("--sim-model", opts->sim_model,
                  "sim: model preset (qwen3-32b, llama-3.1-8b, "
                  "llama-3.1-70b)")
      ->capture_default_str();
  cmd->add_option("--sim-hw", opts->sim_hw, "sim: accelerator preset (h100-sxm, h200)")
      ->capture_default_str();
  cmd->add_option("--sim-kv-scale", opts->sim.kv_scale,
                  "sim: KV bytes per token as a fraction of the real model's (bf16)")
      ->capture_default_str();
  cmd->add_option("--sim-compute-eff", opts->sim.efficiency.compute,
                  "sim: achieved fraction of peak FLOP/s")
      ->capture_default_str();
  cmd->add_option("--sim-mem-eff", opts->sim.efficiency.memory,
                  "sim: achieved fraction of peak HBM bandwidth")
      ->capture_default_str();
  cmd->add_option("--tokenizer", opts->tokenizer,
                  "llama2.c tokenizer (default: tok<vocab>.bin beside a .bin model)");
  cmd->add_option("--role", opts->role,
                  "both (colocated) | prefill (P) | decode (D) of P/D disaggregated serving")
      ->check(CLI::IsMember({"both", "prefill", "decode"}))
      ->capture_default_str();
  cmd->add_option("--kv-transfer-config", opts->kv_transfer_config,
                  "P/D connector config, JSON (vLLM shape): {\"kv_connector\": "
                  "\"PushConnector\"|\"PullConnector\", \"kv_role\": ..., "
                  "\"kv_connector_extra_config\": {\"backend\": \"ucx:tcp\", \"lease_ms\": ..., "
                  "\"watchdog_ms\": ..., \"failure_policy\": \"recompute\"|\"fail\", "
                  "\"pull_profile\": \"vllm\"|\"fast\"}} (docs/configuration.md)");
  cmd->add_option("--kv-auth-key-file", opts->kv_auth_key_file,
                  "P/D: authenticate peers with the shared key in this file (>= 32 bytes, mode "
                  "0600): HMAC-SHA256 over the handshake and every control message; peers "
                  "without the same key are refused (docs/pd_protocol.md §5)");
  cmd->add_option("--advertise-host", opts->advertise_host,
                  "Address peers use to reach this instance (default: --host)");
  cmd->add_option("--host", opts->host, "Address to bind")->capture_default_str();
  cmd->add_option("--port", opts->port, "Port to bind (0 = any free port)")->capture_default_str();
  cmd->add_option("--served-model-name", opts->served_model_names,
                  "Model name(s) in the API (default: the model file name): responses carry the "
                  "first, requests may name any");
  cmd->add_option("--block-size", opts->engine.block_size, "Tokens per KV block")
      ->capture_default_str();
  cmd->add_option("--num-kv-blocks,--num-gpu-blocks-override", opts->engine.num_kv_blocks,
                  "KV blocks in the pool (overrides --kv-cache-memory)");
  cmd->add_option("--kv-cache-memory,--kv-cache-memory-bytes", opts->engine.kv_cache_memory_bytes,
                  "KV arena bytes when --num-kv-blocks is not given")
      ->capture_default_str();
  cmd->add_option("--max-num-seqs", opts->engine.max_num_seqs, "Max running requests per step")
      ->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", opts->engine.max_num_batched_tokens,
                  "Token budget per engine step (longer prompts are prefilled in chunks)")
      ->capture_default_str();
  cmd->add_option("--max-model-len", opts->engine.max_model_len,
                  "Max prompt + output tokens (default: the model's context length)");
  cmd->add_flag("--enable-prefix-caching{true},--no-enable-prefix-caching{false}",
                opts->enable_prefix_caching, "Enable (default) or disable the prefix cache");
  cmd->add_flag("--enable-prompt-tokens-details", opts->enable_prompt_tokens_details,
                "Add usage.prompt_tokens_details.cached_tokens (this instance's prefix-cache "
                "hit; never KV that came from a peer) to responses, as vLLM does");
  cmd->add_option("--chat-template-format", opts->chat_template_format,
                  "Chat template family: auto (detected from the model's tokenizer.chat_template), "
                  "plain, chatml, qwen3, llama3, llama2, mistral")
      ->check([](const std::string& v) {
        auto f = ParseChatTemplateFormat(v);
        return f.ok() ? std::string() : f.status().message();
      })
      ->capture_default_str();
  cmd->add_option_function<std::string>(
         "--kv-block-allocation",
         [opts](const std::string& v) { opts->engine.scatter_kv_blocks = v == "scattered"; },
         "contiguous (default: runs of adjacent blocks, descriptors coalesce) | scattered "
         "(fragmented KV memory: blocks drawn pseudo-randomly, nothing coalesces; benchmarks)")
      ->check(CLI::IsMember({"contiguous", "scattered"}));
  cmd->add_option("--max-pending-requests", opts->engine.max_pending_requests,
                  "Waiting requests beyond which new ones get HTTP 503")
      ->capture_default_str();
  cmd->add_option("--blas-threads", opts->blas_threads, "OpenBLAS threads of the executor")
      ->capture_default_str();
  cmd->add_option("--threads", opts->threads,
                  "Executor threads, this one included: each GEMM and attention split by output "
                  "rows; every value keeps its summation order, so logits and KV are the same at "
                  "any count (P and D may differ; docs/model.md, Threading)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_option("--threads-bind", opts->threads_bind,
                  "CPUs of the --threads executor threads, as vLLM's VLLM_CPU_OMP_THREADS_BIND: "
                  "auto (with 2 or more threads, the first N CPUs this process may use, when "
                  "there are N), nobind, or a list of N CPUs such as 0-1 or 2,5")
      ->capture_default_str();
  cmd->add_option("--xfer-fault-plan", opts->xfer_fault_plan,
                  "Testing only: inject KV transfer failures and delays (fault backend), e.g. "
                  "post_failure_rate=0.02,completion_failure_rate=0.02,max_post_delay_us=2000,"
                  "max_completion_delay_us=2000,seed=7; then SIGUSR1 makes every post fail "
                  "(a broken but alive peer) until SIGUSR2 (docs/reliability.md)");
  cmd->add_option("--drain-timeout-s", opts->drain_timeout_s,
                  "On SIGTERM/SIGINT: seconds in-flight requests get to finish (new ones get 503 "
                  "draining) before open ones end with an error; a second signal cuts it short")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  AddConnectionFlags(cmd, &opts->connections);
  AddServeDiscoveryFlags(cmd, &opts->discovery);
  cmd->add_option("--log-format", opts->log_format,
                  "text | json (one JSON object a line: time, level, tid, message)")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  cmd->add_option("--log-level", opts->log_level, "trace|debug|info|warn|error|off")
      ->capture_default_str();
  AddVllmServeFlags(cmd, opts.get());
  cmd->callback([opts, cmd] {
    opts->role_given = cmd->count("--role") > 0;
    int rc = RunServe(*opts);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace kvpush::apps
