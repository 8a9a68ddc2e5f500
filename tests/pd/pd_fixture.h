// The fixture of the P/D end-to-end tests: a temp dir for logs, child kvpush processes started
// and stopped in order (their log tails printed on failure), ports, serve arguments, the idle
// check (no KV block used, no request waiting for KV) and a generated model for machines without
// ../shared/models. Plus the small helpers those tests share.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "pd_test_util.h"
#include "test_util.h"

namespace kvpush::pd_test {

using Clock = std::chrono::steady_clock;

inline double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// Polls `pred` every 50 ms until it holds or `timeout_ms` passed (kvpush::testing::WaitUntil).
inline bool WaitFor(const std::function<bool()>& pred, int timeout_ms) {
  return ::kvpush::testing::WaitUntil(pred, std::chrono::milliseconds(timeout_ms),
                                      std::chrono::milliseconds(50));
}

/// SIGSTOPs `pid` and returns once every one of its threads is stopped (/proc/PID/task/*/stat
/// state 'T'), at most `timeout_ms`: kill() only queues the signal, and a process running on the
/// other core went on for a few ms — long enough to answer a request the test sent right after
/// (stop 36: a P leg answered after its P was "stopped"). False if it did not stop in time.
inline bool StopProcess(pid_t pid, int timeout_ms = 5000) {
  if (::kill(pid, SIGSTOP) != 0) return false;
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  return WaitFor(
      [&] {
        std::error_code ec;
        for (const auto& t : std::filesystem::directory_iterator(tasks, ec)) {
          FILE* f = std::fopen((t.path() / "stat").c_str(), "r");
          if (f == nullptr) continue;  // the thread ended
          char buf[512] = {};
          const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
          std::fclose(f);
          // "pid (comm) S ...": the state follows the last ')' (comm may hold one).
          const char* close = std::strrchr(buf, ')');
          if (n == 0 || close == nullptr || close[1] != ' ' || close[2] != 'T') return false;
        }
        return !ec;
      },
      timeout_ms);
}

inline std::string IdsToString(const std::vector<int32_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

/// TcpExtListenOverflows of this network namespace (/proc/net/netstat); -1 if unreadable. A

inline constexpr const char* kReady = "kvpush_kv_transfer_kv_ready_received_total";
inline constexpr const char* kReadySent = "kvpush_kv_transfer_kv_ready_sent_total";
inline constexpr const char* kPrefillNotNeeded = "kvpush_pd_prefill_legs_not_needed_total";
inline constexpr const char* kReads = "kvpush_kv_transfer_reads_total";
inline constexpr const char* kNotNeeded = "kvpush_kv_transfer_not_needed_total";
inline constexpr const char* kFailed = "kvpush_kv_transfer_failed_total";
inline constexpr const char* kWatchdog = "kvpush_kv_transfer_watchdog_expired_total";
inline constexpr const char* kRecomputes = "kvpush_kv_load_recomputes_total";
inline constexpr const char* kBlocksUsed = "kvpush_kv_blocks_used";
inline constexpr const char* kWaitingForKv = "kvpush_num_requests_waiting_for_kv";

/// The P leg of a request (max_tokens 1, not streamed).
inline json PLegBody(const Req& r, const std::string& mode, const std::string& tid) {
  json b = r.Body();
  b["max_tokens"] = 1;
  b["stream"] = false;
  b["kv_transfer_params"] = {{"do_remote_decode", true},
                             {"do_remote_prefill", false},
                             {"transfer_mode", mode},
                             {"transfer_id", tid}};
  return b;
}

/// The extra body of a push D leg for transfer `tid`, naming `p` as the prefill instance.
inline json PushDExtra(const std::string& tid, const Proc& p) {
  return {{"kv_transfer_params",
           {{"do_remote_prefill", true},
            {"do_remote_decode", false},
            {"transfer_mode", "push"},
            {"transfer_id", tid},
            {"remote_host", p.host},
            {"remote_port", p.port}}}};
}

class PdFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kvpush-pd-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }

  void TearDown() override {
    // Stop in reverse start order (router before instances), then remove namespaces.
    for (auto it = procs_.rbegin(); it != procs_.rend(); ++it) (*it)->child.Stop(3000);
    netns_.Destroy();
    // A child's sanitizer report (ASan/UBSan/LSan/TSan builds) or abort fails the test even when
    // every answer was right: it may come at exit, after the last request.
    for (const auto& p : procs_) {
      const std::string report = CrashReport(p->log);
      if (!report.empty()) ADD_FAILURE() << p->name << " logged a crash report:\n" << report;
    }
    if (HasFailure()) {
      for (const auto& p : procs_) {
        std::printf("---- %s (%s) log tail: %s\n%s", p->name.c_str(), p->url().c_str(),
                    p->log.c_str(), Tail(p->log, 40).c_str());
      }
      std::printf("logs kept in %s\n", dir_.c_str());
    } else {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
    procs_.clear();
  }

  /// Spawns `exe prefix... args...` with its log in the temp dir (does not wait).
  Proc* Spawn(const std::string& name, const std::vector<std::string>& args,
              const std::string& host, int port, const std::vector<std::string>& prefix = {},
              const std::string& exe = KvpushBin()) {
    auto p = std::make_unique<Proc>();
    p->name = name;
    p->host = host;
    p->port = port;
    p->log = dir_ + "/" + name + ".log";
    std::vector<std::string> full = prefix;
    full.insert(full.end(), args.begin(), args.end());
    Status s = p->child.Start(full, p->log, exe);
    EXPECT_TRUE(s.ok()) << name << ": " << s.ToString();
    procs_.push_back(std::move(p));
    return procs_.back().get();
  }

  /// Waits until every process answers /health (60 s each, they start in parallel).
  void WaitHealthyAll(const std::vector<Proc*>& ps) {
    for (Proc* p : ps) {
      Status s = apps::WaitHealthy(p->host, p->port, p->child, 60000);
      ASSERT_TRUE(s.ok()) << p->name << " did not become healthy: " << s.ToString() << "\n"
                          << Tail(p->log, 30);
    }
  }

  static int Port() {
    auto p = apps::PickFreePort();
    EXPECT_TRUE(p.ok());
    return p.ok() ? *p : 0;
  }

  static std::vector<std::string> ServeArgs(const std::string& model, const std::string& role,
                                            const std::string& host, int port,
                                            const std::string& kv_cfg,
                                            const std::vector<std::string>& extra = {}) {
    std::vector<std::string> a = {"serve",
                                  "--model",
                                  model,
                                  "--role",
                                  role,
                                  "--host",
                                  host,
                                  "--port",
                                  std::to_string(port),
                                  "--num-kv-blocks",
                                  "1024",
                                  "--log-level",
                                  "info"};
    if (!kv_cfg.empty()) {
      a.push_back("--kv-transfer-config");
      a.push_back(kv_cfg);
    }
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }

  static std::string KvCfg(const std::string& backend, const json& extra = json::object()) {
    json x = extra;
    x["backend"] = backend;
    return json{{"kv_connector_extra_config", x}}.dump();
  }

  /// Colocated + P + D (+ router) on loopback. P and the colocated instance prefill in chunks of
  /// 32 tokens; D keeps the default budget.
  void ExpectIdle(Proc* p, bool pd, const std::string& what) {
    double used = 0, waiting = 0;
    const bool ok = WaitFor(
        [&] {
          used = Metric(p->host, p->port, kBlocksUsed);
          waiting = pd ? Metric(p->host, p->port, kWaitingForKv) : 0;
          return used == 0 && waiting == 0;
        },
        5000);
    EXPECT_TRUE(ok) << what << ": " << p->name << " still has " << kBlocksUsed << "=" << used << " "
                    << kWaitingForKv << "=" << waiting << " 5 s after the phase";
  }

  /// Runs one phase: the prompt set on the colocated instance, then through the router with the
  /// phase's mode header; compares every request's token ids and checks blocks and counters.

  /// Generates a small Llama-shaped GGUF in the temp dir; `extra` gen-model flags (e.g. "--arch
  /// qwen3 --head-dim 64") change the architecture, `name` the file stem.
  std::string GenModel(const std::string& extra = "", const std::string& name = "gen-model",
                       int context = 512) {
    const std::string out = dir_ + "/" + name + ".gguf";
    auto [rc, text] = Sh(KvpushBin() +
                         " gen-model --dim 128 --layers 4 --heads 4 --kv-heads 2 --hidden-dim 256"
                         " --vocab 512 --context " +
                         std::to_string(context) + " --seed 7 " + extra + " --out " + out);
    EXPECT_EQ(rc, 0) << text;
    return rc == 0 ? out : "";
  }

  /// stories260K when present, else a generated Llama-shaped model with its vocabulary size and
  /// context (2,048 tokens: tests that use it send prompts and outputs past 512).
  std::string ModelOrGenerated() {
    std::string model = ::kvpush::testing::SharedModel("stories260K.gguf");
    return model.empty() ? GenModel("", "gen-model", 2048) : model;
  }

  std::string dir_;
  std::vector<std::unique_ptr<Proc>> procs_;
  NetnsTopology netns_;
};

}  // namespace kvpush::pd_test
