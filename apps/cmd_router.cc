// kvpush router: the P/D front door (docs/router.md). Picks a prefill and a decode instance per
// request and runs the push or pull flow of docs/pd_protocol.md §1; with --colocated, forwards
// each request to the next healthy colocated instance (round robin). Runs until SIGINT/SIGTERM.
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "apps/build_info.h"
#include "apps/connection_flags.h"
#include "apps/otlp_tracer.h"
#include "apps/commands.h"
#include "apps/router_tokenizer.h"
#include "common/log.h"
#include "router/router.h"

namespace kvpush::apps {
namespace {

/// SIGINT/SIGTERM received: the first starts the drain, a second ends it at once.
std::atomic<int> g_stop_signals{0};
extern "C" void OnRouterStopSignal(int) {
  g_stop_signals.fetch_add(1);
}

struct RouterCliOptions {
  router::RouterOptions router;
  std::string mode = "push";
  std::string routing = "least-outstanding";
  std::string log_level = "info";
  std::string log_format = "text";
  double drain_timeout_s = 30.0;
  bool instance_api_key_given = false;  ///< else the instances get --api-key
  std::string otlp_traces_endpoint;    ///< --otlp-traces-endpoint ("" = no tracing)
};

int RunRouter(RouterCliOptions o) {
  if (Status s = InitLogging(o.log_level, o.log_format); !s.ok()) {
    std::fprintf(stderr, "kvpush router: %s\n", s.ToString().c_str());
    return 2;
  }
  o.router.mode = o.mode == "pull" ? router::TransferMode::kPull : router::TransferMode::kPush;
  o.router.routing = *router::ParseRoutingPolicy(o.routing);  // CLI11 checked the value
  o.router.build = ThisBuild();
  if (!o.instance_api_key_given) o.router.instance_api_key = o.router.api_key;
  if (!o.router.tokenizer_path.empty()) {
    auto tok = LoadRouterTokenizer(o.router.tokenizer_path);
    if (!tok.ok()) {
      std::fprintf(stderr, "kvpush router: --tokenizer %s: %s\n", o.router.tokenizer_path.c_str(),
                   tok.status().ToString().c_str());
      return 2;
    }
    o.router.prompt_tokenizer = std::move(tok).value();
  }
  auto tracer = MakeTracer(o.otlp_traces_endpoint, "router");
  if (!tracer.ok()) {
    std::fprintf(stderr, "kvpush router: %s\n", tracer.status().message().c_str());
    return 2;
  }
  o.router.tracer = std::move(tracer).value();
  if (Status s = o.router.Validate(); !s.ok()) {
    std::fprintf(stderr, "kvpush router: %s\n", s.message().c_str());
    return 2;
  }
  spdlog::info("kvpush router: {}", o.router.ToString());
  router::Router r(o.router);
  if (Status s = r.Start(); !s.ok()) {
    std::fprintf(stderr, "kvpush router: %s\n", s.ToString().c_str());
    return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::signal(SIGINT, OnRouterStopSignal);
  std::signal(SIGTERM, OnRouterStopSignal);
  std::printf("kvpush router: listening on %s://%s:%d\n",
              o.router.tls_cert_file.empty() ? "http" : "https", o.router.host.c_str(), r.port());
  std::fflush(stdout);
  while (g_stop_signals.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  // Drain (docs/router.md "Shutdown"): new requests get 503 draining, requests in flight get up
  // to --drain-timeout-s to finish; then Stop() ends open streams with an SSE error event.
  spdlog::info("kvpush router: draining ({} leg(s) in flight, timeout {} s)", r.inflight(),
               o.drain_timeout_s);
  r.BeginDrain();
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(o.drain_timeout_s * 1000));
  while (r.inflight() > 0 && std::chrono::steady_clock::now() < deadline &&
         g_stop_signals.load() < 2) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  spdlog::info("kvpush router: shutting down ({} leg(s) still in flight)", r.inflight());
  r.Stop();
  return 0;
}

}  // namespace

void RegisterRouterCommand(CLI::App& app) {
  auto opts = std::make_shared<RouterCliOptions>();
  auto* cmd = app.add_subcommand(
      "router",
      "P/D router: OpenAI-compatible front door over prefill and decode instances (or, with "
      "--colocated, round robin over colocated instances)");
  AddConnectionFlags(cmd, &opts->router.connections);
  cmd->add_option("--drain-timeout-s", opts->drain_timeout_s,
                  "On SIGTERM/SIGINT: seconds requests in flight get to finish (new ones get 503 "
                  "draining) before open streams end with an error event; a second signal cuts "
                  "it short")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  cmd->add_option("--prefill", opts->router.prefill_urls,
                  "Prefill instance URLs (http[s]://HOST:PORT), one or more");
  cmd->add_option("--decode", opts->router.decode_urls,
                  "Decode instance URLs (http[s]://HOST:PORT), one or more");
  cmd->add_option("--colocated", opts->router.colocated_urls,
                  "Colocated (--role both) instance URLs (http[s]://HOST:PORT), one or more: each "
                  "request goes whole to the next healthy one (round robin); excludes "
                  "--prefill/--decode (RouterOptions::Validate: exit status 2)");
  cmd->add_option("--discovery", opts->router.discovery,
                  "etcd://HOST:PORT[,HOST:PORT...]: take P and D instances from etcd discovery "
                  "(as they register and leave; combinable with --prefill/--decode; "
                  "docs/deployment.md)");
  cmd->add_option("--discovery-prefix", opts->router.discovery_prefix,
                  "etcd key prefix the instances register under")
      ->capture_default_str();
  cmd->add_option("--model", opts->router.discovery_model,
                  "With --discovery: only instances serving this model name (default: any)");
  cmd->add_option("--mode", opts->mode, "KV transfer mode: push | pull")
      ->check(CLI::IsMember({"push", "pull"}))
      ->capture_default_str();
  cmd->add_option("--pull-profile", opts->router.pull_profile,
                  "Pull profile sent to decode instances: vllm | fast (default: the decode "
                  "instance's own default)")
      ->check(CLI::IsMember({"vllm", "fast"}));
  cmd->add_option("--routing", opts->routing,
                  "How P and D are chosen: least-outstanding (fewest legs in flight) | "
                  "cache-aware (D by the prompt's prefix-block hashes, rendezvous hashing with a "
                  "load cap; P by outstanding prefill tokens; needs --tokenizer)")
      ->check(CLI::IsMember({"least-outstanding", "cache-aware"}))
      ->capture_default_str();
  cmd->add_option("--cache-aware-load-cap", opts->router.cache_aware.load_cap,
                  "cache-aware: a D is skipped when its outstanding legs + 1 exceed ceil(cap x "
                  "(all Ds' outstanding legs + 1) / number of healthy Ds) (>= 1)")
      ->capture_default_str();
  cmd->add_option("--local-prefill-threshold", opts->router.local_prefill_threshold,
                  "Tokens; a request whose uncached prompt part (prompt tokens - D's predicted "
                  "prefix hit) is below this gets no P leg: D prefills it locally (0 = off; "
                  "needs --tokenizer)")
      ->capture_default_str();
  cmd->add_option("--migration-limit", opts->router.migration_limit,
                  "Times one request may be continued on another decode (or colocated) instance "
                  "after the one answering it failed mid-answer: a stream resumes after the last "
                  "token the client got, a whole answer is sent again (0 = off)")
      ->capture_default_str();
  cmd->add_option_function<std::string>(
         "--migration-transfer",
         [opts](const std::string& v) { opts->router.migration_push = v == "push"; },
         "P/D: how a stream its decode instance offers (drain, POST /admin/migrate) moves: push "
         "(the offering instance computes the context from its prefix cache and pushes its KV "
         "to the new one) or recompute (the new one computes it)")
      ->check(CLI::IsMember({"push", "recompute"}))
      ->default_str("push");
  cmd->add_option("--tokenizer", opts->router.tokenizer_path,
                  "The instances' model file (.gguf: only its tokenizer and chat template are "
                  "read): the router tokenizes prompts for --routing cache-aware and "
                  "--local-prefill-threshold");
  cmd->add_option("--block-size", opts->router.block_size,
                  "Tokens per block of the router's prefix hashes (0 = the block size the decode "
                  "instances report in /health)")
      ->capture_default_str();
  cmd->add_option("--prefix-index-blocks", opts->router.prefix_index_blocks,
                  "Block hashes the router remembers per decode instance (LRU; about the decode "
                  "instances' --num-kv-blocks)")
      ->capture_default_str();
  cmd->add_option("--host", opts->router.host, "Address to bind")->capture_default_str();
  cmd->add_option("--port", opts->router.port, "Port to bind (0 = any free port)")
      ->capture_default_str();
  cmd->add_option("--health-interval-ms", opts->router.health_interval_ms,
                  "Time between two GET /health rounds over the instances")
      ->capture_default_str();
  cmd->add_option("--request-timeout-s", opts->router.request_timeout_s,
                  "Read/write timeout of each leg to an instance")
      ->capture_default_str();
  cmd->add_option("--api-key", opts->router.api_key,
                  "Require `Authorization: Bearer KEY` from clients on every path but /health, "
                  "/version and /metrics (default: $VLLM_API_KEY)")
      ->envname("VLLM_API_KEY");
  cmd->add_option("--otlp-traces-endpoint", opts->otlp_traces_endpoint,
                  "vLLM's flag: export a span per request (and its legs' phases) over OTLP/HTTP "
                  "(protobuf) to this URL, e.g. http://127.0.0.1:4318/v1/traces; the legs carry "
                  "W3C traceparent so the instances' spans join the trace");
  cmd->add_option("--ssl-certfile", opts->router.tls_cert_file,
                  "Serve clients over HTTPS only with this PEM certificate (with --ssl-keyfile)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--ssl-keyfile", opts->router.tls_key_file,
                  "The PEM private key of --ssl-certfile")
      ->check(CLI::ExistingFile);
  cmd->add_option("--ssl-ca-certs", opts->router.tls_ca_file,
                  "The PEM CA certificates that https:// instances' certificates must chain to "
                  "(legs, health checks, aborts; default: the system's CAs)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--instance-api-key", opts->router.instance_api_key,
                  "The Bearer token of the router's calls to the instances (their --api-key; "
                  "default: --api-key)");
  cmd->add_flag("--disable-log-requests{false},--enable-log-requests{true}",
                opts->router.log_requests,
                "Turn the access log (one line per request at info) off or on (default: on)");
  cmd->add_option("--log-format", opts->log_format,
                  "text | json (one JSON object a line: time, level, tid, message)")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  cmd->add_option("--log-level", opts->log_level, "trace|debug|info|warn|error|off")
      ->capture_default_str();
  cmd->callback([opts, cmd] {
    opts->instance_api_key_given = cmd->count("--instance-api-key") > 0;
    int rc = RunRouter(*opts);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace kvpush::apps
