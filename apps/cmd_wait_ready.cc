// kvpush wait-ready URL...: waits until every instance or router answers GET /health with 200
// (a router: at least one healthy prefill and one healthy decode instance, or one colocated), so a
// script can send its first request right after starting the servers (docs/deployment.md).
#include <httplib.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "apps/commands.h"

namespace kvpush::apps {
namespace {

struct WaitReadyOptions {
  std::vector<std::string> urls;
  double timeout_s = 120.0;
  double interval_s = 0.2;
  std::string ca_cert;  ///< https URLs: the CA file to verify servers with ("" = the system's)
};

/// One GET /health: "" when it answered 200, else what it answered (or why it did not).
std::string Probe(const std::string& url, const std::string& ca_cert) {
  httplib::Client cli(url);
  if (!ca_cert.empty()) cli.set_ca_cert_path(ca_cert.c_str());
  cli.set_connection_timeout(1, 0);
  cli.set_read_timeout(2, 0);
  auto res = cli.Get("/health");
  if (!res) return "no answer (" + httplib::to_string(res.error()) + ")";
  if (res->status == 200) return "";
  return "HTTP " + std::to_string(res->status) + " " + res->body.substr(0, 300);
}

int RunWaitReady(const WaitReadyOptions& o) {
  using Clock = std::chrono::steady_clock;
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  std::vector<std::string> last(o.urls.size(), "not asked yet");
  for (;;) {
    bool all = true;
    for (size_t i = 0; i < o.urls.size(); ++i) {
      if (last[i].empty()) continue;  // ready once is enough: a server does not become unready
      last[i] = Probe(o.urls[i], o.ca_cert);
      all = all && last[i].empty();
    }
    if (all) return 0;
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(o.interval_s * 1000)));
  }
  for (size_t i = 0; i < o.urls.size(); ++i) {
    if (!last[i].empty()) {
      std::fprintf(stderr, "kvpush wait-ready: %s not ready after %.0f s: %s\n", o.urls[i].c_str(),
                   o.timeout_s, last[i].c_str());
    }
  }
  return 1;
}

}  // namespace

void RegisterWaitReadyCommand(CLI::App& app) {
  auto opts = std::make_shared<WaitReadyOptions>();
  auto* cmd = app.add_subcommand(
      "wait-ready",
      "Wait until every URL answers GET /health with 200 (instances: loaded and serving; a "
      "router: a healthy prefill and decode instance, or a colocated one); exit 1 naming those "
      "that did not within --timeout-s");
  cmd->add_option("urls", opts->urls, "http[s]://HOST:PORT of instances and routers")
      ->required();
  cmd->add_option("--ca-cert", opts->ca_cert,
                  "https: verify servers with this CA file (default: the system's CAs)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--timeout-s", opts->timeout_s, "Give up after this many seconds")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  cmd->add_option("--interval-s", opts->interval_s, "Time between two rounds of probes")
      ->check(CLI::Range(0.01, 60.0))
      ->capture_default_str();
  cmd->callback([opts] {
    const int rc = RunWaitReady(*opts);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace kvpush::apps
