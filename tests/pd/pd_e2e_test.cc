// End-to-end tests of P/D disaggregated serving with real processes: a colocated instance (the
// oracle), a prefill instance (P), a decode instance (D) and `kvpush router` in front of P and D.
// Every request sent through the router must give exactly the colocated token ids (greedy and
// seeded sampling, push and both pull profiles, 1 and 32 requests in flight, chunked prefill,
// partial and full prefix hits on D), and after every phase no KV block may stay in use on P or D.
// Faults: P killed while D waits (recompute / fail policy), malformed kv_transfer_params.
// Topology: loopback (ucx:tcp, ucx:shm) and P, D, router in separate network namespaces.
//
// Children's logs go to a temp dir; on failure their tails are printed and the dir is kept.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "pd_fixture.h"

namespace kvpush::pd_test {
namespace {

long ListenOverflows() {
  auto [rc, out] =
      Sh("awk '/^TcpExt:/{if(!h){for(i=1;i<=NF;i++)n[i]=$i;h=1}else{for(i=1;i<=NF;i++)"
         "if(n[i]==\"ListenOverflows\")print $i}}' /proc/net/netstat");
  return rc == 0 && !out.empty() ? std::stol(out) : -1;
}

std::string IpBinary() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (std::filesystem::exists(p)) return p;
  }
  return "";
}

struct Cluster {
  Proc* colo = nullptr;
  Proc* p = nullptr;
  Proc* d = nullptr;
  Proc* router = nullptr;
  std::string model_label;
  int vocab = 512;
};

struct Phase {
  std::string mode;  ///< x-kvpush-mode: push | pull-vllm | pull-fast
  bool seeded = false;
  int concurrency = 1;
  uint32_t prompt_seed = 1;
  int n_short = 5, n_long = 6, n_prefix = 6, n_repeat = 5;
  int max_tokens = 16;
};

class PdE2E : public PdFixture {
 protected:
  /// `serve_extra` goes to every instance (e.g. the sim executor's flags), `pd_extra` to P and D
  /// only (e.g. --kv-auth-key-file).
  void StartLoopback(const std::string& model, const std::string& label, int vocab,
                     const std::string& backend, Cluster* c,
                     const std::vector<std::string>& serve_extra = {},
                     const std::vector<std::string>& pd_extra = {}) {
    const std::string h = "127.0.0.1";
    const std::string cfg = KvCfg(backend);
    std::vector<std::string> chunked = {"--max-num-batched-tokens", "32"};
    chunked.insert(chunked.end(), serve_extra.begin(), serve_extra.end());
    std::vector<std::string> p_args = chunked, d_args = serve_extra;
    p_args.insert(p_args.end(), pd_extra.begin(), pd_extra.end());
    d_args.insert(d_args.end(), pd_extra.begin(), pd_extra.end());
    int pc = Port(), pp = Port(), pd = Port();
    c->colo = Spawn("colocated", ServeArgs(model, "both", h, pc, "", chunked), h, pc);
    c->p = Spawn("prefill", ServeArgs(model, "prefill", h, pp, cfg, p_args), h, pp);
    c->d = Spawn("decode", ServeArgs(model, "decode", h, pd, cfg, d_args), h, pd);
    ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({c->colo, c->p, c->d}));
    int pr = Port();
    c->router = Spawn("router",
                      {"router", "--prefill", c->p->url(), "--decode", c->d->url(), "--mode",
                       "push", "--pull-profile", "vllm", "--host", h, "--port", std::to_string(pr),
                       "--health-interval-ms", "500"},
                      h, pr);
    ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({c->router}));
    c->model_label = label;
    c->vocab = vocab;
  }

  /// Polls /metrics until no block is used and no request waits for KV (5 s).

  void RunPhase(const Cluster& c, const Phase& ph) {
    std::vector<Req> reqs = MakePrompts(c.vocab, ph.prompt_seed, ph.n_short, ph.n_long, ph.n_prefix,
                                        ph.n_repeat, ph.max_tokens);
    for (size_t i = 0; i < reqs.size(); ++i) reqs[i].seeded = ph.seeded;
    const std::string what = "[" + c.model_label + " mode=" + ph.mode +
                             (ph.seeded ? " seeded(T=0.8,top_p=0.95)" : " greedy") +
                             " concurrency=" + std::to_string(ph.concurrency) + "]";
    const long overflows0 = ListenOverflows();
    const auto t0 = Clock::now();
    std::vector<Res> ref = SendAll(c.colo->host, c.colo->port, reqs, ph.concurrency);
    const double t_ref = SecondsSince(t0);
    for (size_t i = 0; i < reqs.size(); ++i) reqs[i].stream = i % 3 == 1;  // SSE via the router

    const double d_ready0 = Metric(c.d->host, c.d->port, kReady);
    const double d_reads0 = Metric(c.d->host, c.d->port, kReads);
    const double d_nn0 = Metric(c.d->host, c.d->port, kNotNeeded);
    const double d_failed0 = Metric(c.d->host, c.d->port, kFailed);
    const double d_wd0 = Metric(c.d->host, c.d->port, kWatchdog);
    const double d_rec0 = Metric(c.d->host, c.d->port, kRecomputes);
    const double p_failed0 = Metric(c.p->host, c.p->port, kFailed);
    const double p_sent0 = Metric(c.p->host, c.p->port, kReadySent);
    const double p_skipped0 = Metric(c.p->host, c.p->port, kPrefillNotNeeded);

    const auto t1 = Clock::now();
    std::vector<Res> got =
        SendAll(c.router->host, c.router->port, reqs, ph.concurrency, {{"x-kvpush-mode", ph.mode}});
    const double t_pd = SecondsSince(t1);
    const long overflows = ListenOverflows() - overflows0;
    std::printf("%s %zu requests: colocated %.2f s, router+P+D %.2f s, listen overflows +%ld\n",
                what.c_str(), reqs.size(), t_ref, t_pd, overflows);
    std::fflush(stdout);

    for (size_t i = 0; i < reqs.size(); ++i) {
      const std::string who = what + " request #" + std::to_string(i) + " " + reqs[i].label +
                              (reqs[i].stream ? " (streamed)" : "") +
                              (reqs[i].seeded ? " seed=" + std::to_string(reqs[i].seed) : "");
      const std::string overflow_note =
          overflows > 0 ? " (TcpExtListenOverflows rose by " + std::to_string(overflows) +
                              " during the phase: an accept queue overflowed)"
                        : "";
      ASSERT_EQ(ref[i].status, 200)
          << who << ": colocated failed: " << ref[i].error << " " << ref[i].raw << overflow_note;
      ASSERT_EQ(ref[i].ids.size(), static_cast<size_t>(reqs[i].max_tokens))
          << who << ": colocated token count";
      EXPECT_EQ(got[i].status, 200) << who << ": router answered " << got[i].status << " "
                                    << got[i].error << " " << got[i].raw << overflow_note;
      EXPECT_TRUE(got[i].error.empty()) << who << ": error " << got[i].error;
      EXPECT_EQ(got[i].ids, ref[i].ids)
          << who << ": P/D tokens differ from colocated\n  colocated: " << IdsToString(ref[i].ids)
          << "\n  P/D:       " << IdsToString(got[i].ids);
    }

    ExpectIdle(c.p, true, what);
    ExpectIdle(c.d, true, what);
    ExpectIdle(c.colo, false, what);

    const double n = static_cast<double>(reqs.size());
    const double ready = Metric(c.d->host, c.d->port, kReady) - d_ready0;
    const double reads = Metric(c.d->host, c.d->port, kReads) - d_reads0;
    const double nn = Metric(c.d->host, c.d->port, kNotNeeded) - d_nn0;
    EXPECT_EQ(Metric(c.d->host, c.d->port, kFailed) - d_failed0, 0)
        << what << ": D counted failed transfers (a recompute would hide them from the tokens)";
    EXPECT_EQ(Metric(c.d->host, c.d->port, kWatchdog) - d_wd0, 0) << what << ": D watchdog expired";
    EXPECT_EQ(Metric(c.d->host, c.d->port, kRecomputes) - d_rec0, 0)
        << what << ": D recomputed prompts whose KV load failed (see its log)";
    EXPECT_EQ(Metric(c.p->host, c.p->port, kFailed) - p_failed0, 0)
        << what << ": P counted failed transfers";
    // Prompts of <= 16 tokens (less than one full block beyond the last token) are full hits.
    EXPECT_GE(nn, ph.n_short) << what << ": " << kNotNeeded << " did not count the short prompts";
    if (ph.concurrency == 1) {
      EXPECT_GE(nn, ph.n_short + ph.n_repeat)
          << what << ": the repeated prompts were not full prefix hits on D";
    }
    const double skipped = Metric(c.p->host, c.p->port, kPrefillNotNeeded) - p_skipped0;
    if (ph.mode == "push") {
      // P answers the legs of prompts within one block at once, without a prefill: D computes
      // them (NOT_NEEDED); the tokens above are still colocated's.
      EXPECT_GE(skipped, ph.n_short) << what << ": P prefilled prompts within one KV block";
      EXPECT_LE(skipped, nn) << what << ": P skipped a prefill whose KV D took";
      EXPECT_GT(ready, 0) << what << ": D received no KV_READY";
      EXPECT_EQ(ready + nn, n) << what << ": every push request takes KV_READY or NOT_NEEDED ("
                               << kReady << " +" << ready << ", " << kNotNeeded << " +" << nn
                               << ")";
      EXPECT_EQ(Metric(c.p->host, c.p->port, kReadySent) - p_sent0, ready)
          << what << ": P's KV_READY sent != D's received";
      EXPECT_EQ(reads, 0) << what << ": push phase did pull READs";
    } else {
      EXPECT_EQ(skipped, 0) << what << ": P skipped a pull leg's prefill (pull waits for it)";
      EXPECT_GT(reads, 0) << what << ": D did no pull READ";
      EXPECT_EQ(reads + nn, n) << what << ": every pull request READs or is a full hit (" << kReads
                               << " +" << reads << ", " << kNotNeeded << " +" << nn << ")";
      EXPECT_EQ(ready, 0) << what << ": pull phase received KV_READY";
    }
    ExpectTimelines(c, ph.mode == "push", what);
  }

  /// The handoff timelines P and D recorded (GET /debug/handoff_timeline) join by transfer id
  /// and their phases follow the protocol's order, across the two processes (one host: one
  /// monotonic clock). Checks every transfer of `push` mode that moved KV so far.
  void ExpectTimelines(const Cluster& c, bool push, const std::string& what) {
    auto fetch = [](const Proc* p) {
      httplib::Client cli(p->host, p->port);
      auto r = cli.Get("/debug/handoff_timeline?limit=4096");
      EXPECT_TRUE(r && r->status == 200) << p->name << ": /debug/handoff_timeline failed";
      return r ? json::parse(r->body, nullptr, false) : json();
    };
    const std::string mode = push ? "push" : "pull";
    // P adds its record when its part ends (blocks released), which may come a moment after the
    // engine freed the blocks: wait until every D record of the mode has its P record.
    json pj, dj;
    std::map<std::string, json> by_tid;
    auto joined = [&] {
      pj = fetch(c.p);
      dj = fetch(c.d);
      if (!pj.contains("data") || !dj.contains("data")) return false;
      by_tid.clear();
      for (const json& r : pj["data"]) by_tid[r["transfer_id"].get<std::string>()] = r;
      for (const json& d : dj["data"]) {
        if (d["mode"] == mode && d["ok"].get<bool>() && by_tid.count(d["transfer_id"]) == 0) {
          return false;
        }
      }
      return true;
    };
    WaitFor(joined, 5000);
    ASSERT_TRUE(pj.contains("data") && dj.contains("data")) << what;
    int checked = 0;
    for (const json& d : dj["data"]) {
      if (d["mode"] != mode || !d["ok"].get<bool>()) continue;
      const std::string tid = d["transfer_id"];
      ASSERT_EQ(by_tid.count(tid), 1u) << what << ": no P record of transfer " << tid;
      const json& p = by_tid[tid];
      const json& dt = d["t_ns"];
      const json& pt = p["t_ns"];
      auto le = [&](const json& a, const char* x, const json& b, const char* y) {
        ASSERT_TRUE(a.contains(x) && b.contains(y))
            << what << " " << tid << ": no " << x << " or " << y << "\nP " << p.dump() << "\nD "
            << d.dump();
        EXPECT_LE(a[x].get<int64_t>(), b[y].get<int64_t>())
            << what << " " << tid << ": " << x << " after " << y << "\nP " << p.dump() << "\nD "
            << d.dump();
      };
      le(pt, "producer_start", pt, "prefill_done");
      le(dt, "consumer_start", dt, "request_sent");
      le(dt, "kv_arrived", dt, "verified");
      le(dt, "verified", dt, "load_finished");
      if (push) {
        le(pt, "prefill_done", pt, "kv_ready_posted");
        le(pt, "kv_ready_posted", dt, "kv_arrived");  // the notification follows the data
        le(pt, "first_write_posted", pt, "writes_done");
        EXPECT_GE(p["writes"].get<int>(), 1) << what << " " << tid;
      } else {
        le(pt, "prefill_done", pt, "pin_answered");
        le(pt, "pin_answered", dt, "pinned_received");
        le(dt, "pinned_received", dt, "read_posted");
        le(dt, "read_posted", dt, "kv_arrived");
        EXPECT_EQ(d["reads"].get<int>(), 1) << what << " " << tid;
      }
      ++checked;
    }
    EXPECT_GT(checked, 0) << what << ": no " << mode << " transfer in D's handoff timeline";
  }

  /// Generates a small Llama-shaped GGUF in the temp dir.
};

std::vector<Phase> FullMatrix() {
  std::vector<Phase> out;
  uint32_t seed = 100;
  for (const char* mode : {"push", "pull-vllm", "pull-fast"}) {
    for (int conc : {1, 32}) {
      for (bool seeded : {false, true}) {
        Phase ph;
        ph.mode = mode;
        ph.seeded = seeded;
        ph.concurrency = conc;
        ph.prompt_seed = seed++;
        if (conc == 32) ph.n_short = ph.n_long = ph.n_prefix = ph.n_repeat = 8;  // 32 in flight
        out.push_back(ph);
      }
    }
  }
  return out;
}

// The fixture's crash check (PdFixture::TearDown) finds a report wherever it is in a log and
// nothing in a clean one.
TEST(PdFixtureCheck, CrashReportFindsSanitizerReportsOnly) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("kvpush-crash-" + std::to_string(getpid())))
          .string();
  std::ofstream(path) << "kvpush serve: listening\nrequest aborted: client went away\n";
  EXPECT_EQ(CrashReport(path), "");
  std::ofstream(path, std::ios::app)
      << "==1==ERROR: AddressSanitizer: heap-use-after-free\n    #0 0x1 in f\n";
  EXPECT_EQ(CrashReport(path),
            "==1==ERROR: AddressSanitizer: heap-use-after-free\n    #0 0x1 in f\n");
  std::ofstream(path) << "x\nWARNING: ThreadSanitizer: data race (pid=1)\n";
  EXPECT_NE(CrashReport(path).find("data race"), std::string::npos);
  std::ofstream(path) << "a.cc:3:5: runtime error: signed integer overflow\n";
  EXPECT_NE(CrashReport(path), "");
  std::filesystem::remove(path);
  EXPECT_EQ(CrashReport(path), "");  // no file
}

TEST_F(PdE2E, Stories260KUcxTcpRouterBitIdentical) {
  KVP_REQUIRE_SHARED_MODEL(model, "stories260K.gguf");
  Cluster c;
  ASSERT_NO_FATAL_FAILURE(StartLoopback(model, "stories260K ucx:tcp", 512, "ucx:tcp", &c));
  for (const Phase& ph : FullMatrix()) RunPhase(c, ph);
}

TEST_F(PdE2E, Stories260KUcxShmRouterBitIdentical) {
  const std::string model = ModelOrGenerated();
  ASSERT_FALSE(model.empty());
  Cluster c;
  ASSERT_NO_FATAL_FAILURE(StartLoopback(model, "stories260K ucx:shm", 512, "ucx:shm", &c));
  uint32_t seed = 200;
  for (const char* mode : {"push", "pull-vllm", "pull-fast"}) {
    for (int conc : {1, 32}) {
      Phase ph;
      ph.mode = mode;
      ph.concurrency = conc;
      ph.seeded = conc == 32;
      ph.prompt_seed = seed++;
      if (conc == 32) ph.n_short = ph.n_long = ph.n_prefix = ph.n_repeat = 8;
      RunPhase(c, ph);
    }
  }
}

TEST_F(PdE2E, GeneratedModelUcxTcpRouterBitIdentical) {
  const auto t0 = Clock::now();
  const std::string model = GenModel();
  ASSERT_FALSE(model.empty());
  std::printf("gen-model: %.2f s\n", SecondsSince(t0));
  Cluster c;
  ASSERT_NO_FATAL_FAILURE(StartLoopback(model, "gen-model(dim128,4 layers)", 512, "ucx:tcp", &c));
  uint32_t seed = 300;
  for (const char* mode : {"push", "pull-vllm", "pull-fast"}) {
    for (bool seeded : {false, true}) {
      Phase ph;
      ph.mode = mode;
      ph.seeded = seeded;
      ph.concurrency = seeded ? 32 : 1;  // all 12 in flight at once
      ph.prompt_seed = seed++;
      ph.n_short = ph.n_long = ph.n_prefix = ph.n_repeat = 3;
      ph.max_tokens = 12;
      RunPhase(c, ph);
    }
  }
}

// Authenticated peers (--kv-auth-key-file on P and D, a 0600 key in the temp dir): push and both
// pulls still give the colocated tokens with no refusal counted; a handshake without the key is
// refused and counted on P; a world-readable or short key file stops `serve` with a clear error.
TEST_F(PdE2E, GeneratedModelUcxTcpAuthenticatedPeersRouterBitIdentical) {
  const std::string model = GenModel();
  ASSERT_FALSE(model.empty());
  const std::string key = dir_ + "/kv-auth.key";
  auto write_key = [](const std::string& path, const std::string& content, mode_t mode) {
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fputs(content.c_str(), f);
    std::fclose(f);
    ASSERT_EQ(::chmod(path.c_str(), mode), 0);
  };
  ASSERT_NO_FATAL_FAILURE(
      write_key(key, "0123456789abcdef0123456789abcdef0123456789abcdef\n", 0600));
  Cluster c;
  ASSERT_NO_FATAL_FAILURE(
      StartLoopback(model, "gen-model auth", 512, "ucx:tcp", &c, {}, {"--kv-auth-key-file", key}));
  const std::string kAuthFailures = "kvpush_kv_auth_failures_total";
  uint32_t seed = 700;
  for (const char* mode : {"push", "pull-vllm", "pull-fast"}) {
    for (bool seeded : {false, true}) {
      Phase ph;
      ph.mode = mode;
      ph.seeded = seeded;
      ph.concurrency = seeded ? 12 : 1;
      ph.prompt_seed = seed++;
      ph.n_short = ph.n_long = ph.n_prefix = ph.n_repeat = 3;
      ph.max_tokens = 12;
      RunPhase(c, ph);
    }
  }
  EXPECT_EQ(Metric(c.p->host, c.p->port, kAuthFailures), 0);
  EXPECT_EQ(Metric(c.d->host, c.d->port, kAuthFailures), 0);
  EXPECT_GE(Metric(c.d->host, c.d->port, "kvpush_kv_transfer_handshakes_total"), 1);

  // A peer without the key: its plain handshake is refused (409) and counted on P.
  httplib::Client cli(c.p->host, c.p->port);
  auto r = cli.Post("/kv/handshake", R"({"engine_id": "intruder"})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 409) << r->body;
  EXPECT_NE(r->body.find("requires authenticated peers"), std::string::npos) << r->body;
  EXPECT_EQ(Metric(c.p->host, c.p->port, kAuthFailures), 1);

  // Key files that must not be used.
  const std::string loose = dir_ + "/loose.key", short_key = dir_ + "/short.key";
  ASSERT_NO_FATAL_FAILURE(write_key(loose, std::string(40, 'k'), 0644));
  ASSERT_NO_FATAL_FAILURE(write_key(short_key, std::string(20, 'k'), 0600));
  for (const auto& [file, says] :
       {std::pair<std::string, std::string>{loose, "chmod 600"}, {short_key, "at least 32"}}) {
    auto [rc, text] = Sh("timeout 60 " + KvpushBin() + " serve --model " + model +
                         " --role prefill --port 0 --kv-transfer-config '" + KvCfg("ucx:tcp") +
                         "' --kv-auth-key-file " + file + " 2>&1");
    EXPECT_NE(rc, 0) << text;
    EXPECT_NE(text.find(says), std::string::npos) << text;
  }
}

// Qwen3- and Llama-3-shaped generated models through the real executor: per-head q/k RMSNorm,
// NeoX RoPE and head_dim 64 != dim / heads (qwen3, tied classifier); rope_freqs, GQA 2:1 and an
// untied classifier (llama3). Greedy and seeded, push and both pulls: colocated == P/D.
class PdArchE2E : public PdE2E, public ::testing::WithParamInterface<const char*> {};

TEST_P(PdArchE2E, GeneratedModelUcxTcpRouterBitIdentical) {
  const std::string arch = GetParam();
  const std::string flags = arch == "qwen3" ? "--arch qwen3 --head-dim 64 --tied" : "--arch llama3";
  const std::string model = GenModel(flags, "gen-" + arch);
  ASSERT_FALSE(model.empty());
  Cluster c;
  ASSERT_NO_FATAL_FAILURE(StartLoopback(model, "gen-model " + arch, 512, "ucx:tcp", &c));
  uint32_t seed = arch == "qwen3" ? 500 : 600;
  for (const char* mode : {"push", "pull-vllm", "pull-fast"}) {
    for (bool seeded : {false, true}) {
      Phase ph;
      ph.mode = mode;
      ph.seeded = seeded;
      ph.concurrency = seeded ? 12 : 1;
      ph.prompt_seed = seed++;
      ph.n_short = ph.n_long = ph.n_prefix = ph.n_repeat = 3;
      ph.max_tokens = 12;
      RunPhase(c, ph);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, PdArchE2E, ::testing::Values("qwen3", "llama3"),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           return std::string(i.param);
                         });

// The sim executor (Qwen3-32B on an H200, timed layer by layer, bf16 KV of 1/8 the real size):
// colocated == push == pull token for token, every received block verified, pools back to idle.
TEST_F(PdE2E, SimQwen3RouterBitIdentical) {
  Cluster c;
  ASSERT_NO_FATAL_FAILURE(
      StartLoopback("", "sim qwen3-32b@h200", 151936, "ucx:tcp", &c,
                    {"--executor", "sim", "--sim-model", "qwen3-32b", "--sim-hw", "h200"}));
  uint32_t seed = 400;
  for (const char* mode : {"push", "pull-vllm", "pull-fast"}) {
    for (bool seeded : {false, true}) {
      Phase ph;
      ph.mode = mode;
      ph.seeded = seeded;
      ph.concurrency = seeded ? 12 : 1;
      ph.prompt_seed = seed++;
      ph.n_short = ph.n_long = ph.n_prefix = ph.n_repeat = 3;
      ph.max_tokens = 8;
      RunPhase(c, ph);
    }
  }
  EXPECT_GT(Metric(c.d->host, c.d->port, "kvpush_kv_transfer_blocks_verified_total"), 0);
  EXPECT_EQ(Metric(c.d->host, c.d->port, "kvpush_kv_transfer_checksum_mismatches_total"), 0);
}

// P, D and the router each in their own network namespace, joined by veth pairs on a bridge;
// the test talks to the router over the bridge. UCX is told the namespace's device.
TEST_F(PdE2E, NetnsRouterPrefillDecodeUcxTcp) {
  const std::string model = ModelOrGenerated();
  ASSERT_FALSE(model.empty());
  const std::string ipbin = IpBinary();
  if (geteuid() != 0 || ipbin.empty()) {
    GTEST_SKIP() << "needs root and iproute2 (ip) to create network namespaces; skipping";
  }
  if (std::string e = netns_.Create({"p", "d", "r"}); !e.empty()) {
    netns_.Destroy();
    GTEST_SKIP() << "cannot create network namespaces here (" << e << "); skipping";
  }
  const json x = {{"stall_ms", 2000}, {"watchdog_ms", 4000}};
  const std::string cfg = KvCfg("ucx:tcp", x);
  const std::vector<std::string> chunked = {"--max-num-batched-tokens", "32"};
  auto in_ns = [&](size_t i) {
    return std::vector<std::string>{
        "netns",    "exec", netns_.ns(i), "/usr/bin/env", "UCX_NET_DEVICES=" + netns_.dev(i),
        KvpushBin()};
  };
  Cluster c;
  const int pc = Port(), pp = Port(), pd = Port(), pr = Port();
  c.colo =
      Spawn("colocated", ServeArgs(model, "both", "127.0.0.1", pc, "", chunked), "127.0.0.1", pc);
  std::vector<std::string> pargs = ServeArgs(model, "prefill", netns_.ip(0), pp, cfg, chunked);
  pargs.push_back("--advertise-host");
  pargs.push_back(netns_.ip(0));
  c.p = Spawn("prefill@" + netns_.ns(0), pargs, netns_.ip(0), pp, in_ns(0), ipbin);
  c.d = Spawn("decode@" + netns_.ns(1), ServeArgs(model, "decode", netns_.ip(1), pd, cfg),
              netns_.ip(1), pd, in_ns(1), ipbin);
  ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({c.colo, c.p, c.d}));
  c.router = Spawn("router@" + netns_.ns(2),
                   {"router", "--prefill", c.p->url(), "--decode", c.d->url(), "--host",
                    netns_.ip(2), "--port", std::to_string(pr), "--pull-profile", "fast"},
                   netns_.ip(2), pr, in_ns(2), ipbin);
  ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({c.router}));
  c.model_label = "stories260K netns ucx:tcp";
  uint32_t seed = 400;
  for (const char* mode : {"push", "pull-fast", "pull-vllm"}) {
    Phase ph;
    ph.mode = mode;
    ph.seeded = std::string(mode) == "pull-fast";
    ph.concurrency = ph.seeded ? 32 : 1;
    ph.prompt_seed = seed++;
    ph.n_short = 3;
    ph.n_long = ph.n_prefix = 3;
    ph.n_repeat = 2;
    RunPhase(c, ph);
    if (HasFailure()) break;  // the next modes would fail the same way, slowly
  }
}

// ---- faults ----

struct Leg {
  std::string tid;
  json params;
};

/// The D leg of a push request as the router builds it (docs/pd_protocol.md §1).
json PushDParams(const std::string& tid, const Proc& p) {
  return {{"do_remote_prefill", true}, {"do_remote_decode", false}, {"transfer_mode", "push"},
          {"transfer_id", tid},        {"remote_host", p.host},     {"remote_port", p.port}};
}

/// P is SIGKILLed while D waits for its KV (push: D's PUSH_TARGET is held by P, no P leg sent;
/// pull: P answered, then died before D's READ). recompute -> colocated tokens; fail -> an error,
/// never a 200 with tokens.
TEST_F(PdE2E, FaultPrefillKilledWhileDecodeWaits) {
  const std::string model = ModelOrGenerated();
  ASSERT_FALSE(model.empty());
  const std::string h = "127.0.0.1";
  const std::string pcfg = KvCfg("ucx:tcp", {{"lease_ms", 5000}});
  const std::string rec = KvCfg("ucx:tcp", {{"watchdog_ms", 1500},
                                            {"cancel_ack_ms", 500},
                                            {"stall_ms", 1000},
                                            {"failure_policy", "recompute"}});
  const std::string fail = KvCfg("ucx:tcp", {{"watchdog_ms", 1500},
                                             {"cancel_ack_ms", 500},
                                             {"stall_ms", 1000},
                                             {"failure_policy", "fail"}});
  const int pc = Port(), dr = Port(), df = Port();
  Proc* colo = Spawn("colocated", ServeArgs(model, "both", h, pc, ""), h, pc);
  Proc* d_rec = Spawn("decode-recompute", ServeArgs(model, "decode", h, dr, rec), h, dr);
  Proc* d_fail = Spawn("decode-fail", ServeArgs(model, "decode", h, df, fail), h, df);
  std::vector<Proc*> ps;
  for (int i = 0; i < 4; ++i) {
    const int port = Port();
    ps.push_back(
        Spawn("prefill-" + std::to_string(i), ServeArgs(model, "prefill", h, port, pcfg), h, port));
  }
  std::vector<Proc*> all = {colo, d_rec, d_fail};
  all.insert(all.end(), ps.begin(), ps.end());
  ASSERT_NO_FATAL_FAILURE(WaitHealthyAll(all));

  std::vector<Req> prompts = MakePrompts(512, 77, 0, 4, 0, 0, 12);
  std::vector<Res> ref = SendAll(colo->host, colo->port, prompts, 1);
  for (const Res& r : ref) ASSERT_EQ(r.status, 200) << r.raw;

  auto kill_p = [](Proc* p) {
    ::kill(p->child.pid(), SIGKILL);
    p->child.Stop(1000);
  };
  // Push: send the D leg only, wait until D waits for KV (PUSH_TARGET sent), kill P.
  auto push_case = [&](Proc* d, Proc* p, const Req& r) {
    const std::string tid = NewTransferId();
    json extra = {{"kv_transfer_params", PushDParams(tid, *p)}};
    const double waiting0 = Metric(d->host, d->port, kWaitingForKv);
    Res out;
    std::thread t([&] { out = Send(d->host, d->port, r, {}, &extra, 60.0); });
    const bool waiting =
        WaitFor([&] { return Metric(d->host, d->port, kWaitingForKv) > waiting0; }, 10000);
    EXPECT_TRUE(waiting) << d->name << " never waited for KV";
    kill_p(p);
    const auto t0 = Clock::now();
    t.join();
    std::printf("%s: answered %.2f s after P was killed (status %d)\n", d->name.c_str(),
                SecondsSince(t0), out.status);
    return out;
  };

  // (1) recompute: colocated tokens.
  {
    Res out = push_case(d_rec, ps[0], prompts[0]);
    EXPECT_EQ(out.status, 200) << "push, P killed, policy recompute: " << out.error << out.raw;
    EXPECT_EQ(out.ids, ref[0].ids)
        << "push, P killed, policy recompute: tokens differ from "
           "colocated\n  colocated: "
        << IdsToString(ref[0].ids) << "\n  got: " << IdsToString(out.ids);
    ExpectIdle(d_rec, true, "push, P killed, recompute");
  }
  // (2) fail, not streamed: an HTTP error.
  {
    Res out = push_case(d_fail, ps[1], prompts[1]);
    EXPECT_GE(out.status, 500) << "push, P killed, policy fail: expected HTTP 5xx, got "
                               << out.status << " " << out.raw;
    EXPECT_TRUE(out.ids.empty()) << "policy fail returned tokens " << IdsToString(out.ids);
    EXPECT_FALSE(out.error.empty()) << "policy fail: no error message: " << out.raw;
    ExpectIdle(d_fail, true, "push, P killed, fail");
  }
  // (3) fail, streamed: an HTTP error or an SSE error event; never a clean 200 stream.
  {
    Req r = prompts[2];
    r.stream = true;
    Res out = push_case(d_fail, ps[2], r);
    EXPECT_TRUE(out.status >= 500 || !out.error.empty())
        << "push streamed, P killed, policy fail: got status " << out.status
        << " without an error, tokens " << IdsToString(out.ids);
    EXPECT_TRUE(out.ids.empty()) << "policy fail streamed tokens " << IdsToString(out.ids);
    ExpectIdle(d_fail, true, "push streamed, P killed, fail");
  }
  // (4) pull, recompute: P answers (blocks leased), dies, then D's leg arrives. A first pull
  // request warms up the handshake so that D holds P's metadata when P dies.
  {
    Proc* p = ps[3];
    for (int k : {3, 2}) {  // warm-up with prompts[3] (checked), then the faulty one
      const std::string tid = NewTransferId();
      Res pres = PostRaw(p->host, p->port, PLegBody(prompts[k], "pull", tid));
      ASSERT_EQ(pres.status, 200) << "pull P leg: " << pres.raw;
      json pj = json::parse(pres.raw);
      ASSERT_TRUE(pj.contains("kv_transfer_params")) << pres.raw;
      if (k == 2) kill_p(p);
      json extra = {{"kv_transfer_params", pj["kv_transfer_params"]}, {"pull_profile", "fast"}};
      const auto t0 = Clock::now();
      Res out = Send(d_rec->host, d_rec->port, prompts[k], {}, &extra, 60.0);
      const std::string who = k == 3 ? "pull warm-up"
                                     : "pull, P killed after answering, "
                                       "policy recompute";
      std::printf("%s: %.2f s\n", who.c_str(), SecondsSince(t0));
      if (k == 3) {
        EXPECT_EQ(out.status, 200) << who << ": " << out.raw;
      } else if (out.status != 200) {
        // P is already known dead when D's leg arrives (not in flight): a clear 5xx is fine.
        EXPECT_GE(out.status, 500) << who << ": " << out.raw;
        EXPECT_FALSE(out.error.empty()) << who << ": no message: " << out.raw;
        std::printf("%s: HTTP %d: %s\n", who.c_str(), out.status, out.error.c_str());
        continue;
      }
      EXPECT_EQ(out.ids, ref[static_cast<size_t>(k)].ids)
          << who << ": tokens differ from colocated\n  colocated: "
          << IdsToString(ref[static_cast<size_t>(k)].ids) << "\n  got: " << IdsToString(out.ids);
    }
    ExpectIdle(d_rec, true, "pull, P killed, recompute");
  }
  EXPECT_GE(Metric(d_rec->host, d_rec->port, kRecomputes), 1)
      << "D (recompute) counted no " << kRecomputes;
  EXPECT_TRUE(apps::WaitHealthy(d_rec->host, d_rec->port, d_rec->child, 2000).ok());
  EXPECT_TRUE(apps::WaitHealthy(d_fail->host, d_fail->port, d_fail->child, 2000).ok());
}

/// Malformed kv_transfer_params get a 4xx/502 with a message, quickly, and leave nothing behind.
TEST_F(PdE2E, FaultMalformedTransferParams) {
  const std::string model = ModelOrGenerated();
  ASSERT_FALSE(model.empty());
  const std::string h = "127.0.0.1";
  const std::string cfg = KvCfg("ucx:tcp");
  const int pp = Port(), pd = Port(), pc = Port();
  Proc* colo = Spawn("colocated", ServeArgs(model, "both", h, pc, ""), h, pc);
  Proc* p = Spawn("prefill", ServeArgs(model, "prefill", h, pp, cfg), h, pp);
  Proc* d = Spawn("decode", ServeArgs(model, "decode", h, pd, cfg), h, pd);
  ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({colo, p, d}));
  const Req r = MakePrompts(512, 91, 0, 1, 0, 0, 8)[0];
  const int nothing = Port();  // nobody listens there

  struct Case {
    std::string name;
    Proc* target;
    json kv;
    std::vector<int> statuses;
  };
  json pull_ok;  // a real pull answer, then broken copies of it
  {
    Res pres = PostRaw(p->host, p->port, PLegBody(r, "pull", NewTransferId()));
    ASSERT_EQ(pres.status, 200) << pres.raw;
    pull_ok = json::parse(pres.raw)["kv_transfer_params"];
  }
  json bad_hash = pull_ok;
  bad_hash["prompt_hash"] = "0123456789abcdef";
  json bad_blocks = pull_ok;
  bad_blocks["remote_block_ids"] = {999999};
  json bad_count = pull_ok;
  bad_count["num_prompt_tokens"] = 3;
  const std::vector<Case> cases = {
      {"D push, transfer_id not 32 hex",
       d,
       {{"do_remote_prefill", true},
        {"transfer_mode", "push"},
        {"transfer_id", "xyz"},
        {"remote_host", h},
        {"remote_port", p->port}},
       {400}},
      {"D push, remote_port with nothing listening",
       d,
       {{"do_remote_prefill", true},
        {"transfer_mode", "push"},
        {"transfer_id", NewTransferId()},
        {"remote_host", h},
        {"remote_port", nothing}},
       {400, 502, 503}},
      {"D push, remote_port out of range",
       d,
       {{"do_remote_prefill", true},
        {"transfer_mode", "push"},
        {"transfer_id", NewTransferId()},
        {"remote_host", h},
        {"remote_port", 70000}},
       {400, 502}},
      {"D pull, wrong prompt_hash", d, bad_hash, {400}},
      {"D pull, remote block id out of range", d, bad_blocks, {400}},
      {"D pull, wrong num_prompt_tokens", d, bad_count, {400}},
      {"P leg, transfer_id not 32 hex",
       p,
       {{"do_remote_decode", true}, {"transfer_mode", "push"}, {"transfer_id", "ABC"}},
       {400}},
      {"D leg sent to P", p, pull_ok, {400, 502}},
  };
  for (const Case& c : cases) {
    json extra = {{"kv_transfer_params", c.kv}};
    const auto t0 = Clock::now();
    Res out = Send(c.target->host, c.target->port, r, {}, &extra, 30.0);
    const double secs = SecondsSince(t0);
    bool status_ok = false;
    for (int s : c.statuses) status_ok |= out.status == s;
    EXPECT_TRUE(status_ok) << c.name << ": got HTTP " << out.status << " " << out.raw;
    EXPECT_FALSE(out.error.empty()) << c.name << ": no error message: " << out.raw;
    EXPECT_TRUE(out.ids.empty()) << c.name << ": returned tokens";
    EXPECT_LT(secs, 15.0) << c.name << ": took " << secs << " s";
    std::printf("%s -> %d in %.2f s: %s\n", c.name.c_str(), out.status, secs, out.error.c_str());
  }
  // The broken pull copies did not consume the lease: the real one still works.
  {
    json extra = {{"kv_transfer_params", pull_ok}};
    Res out = Send(d->host, d->port, r, {}, &extra, 30.0);
    Res ref = Send(colo->host, colo->port, r);
    EXPECT_EQ(out.status, 200) << "valid pull after malformed ones: " << out.raw;
    EXPECT_EQ(out.ids, ref.ids) << "valid pull after malformed ones: tokens differ";
  }
  ExpectIdle(p, true, "after malformed params");
  ExpectIdle(d, true, "after malformed params");
}

}  // namespace
}  // namespace kvpush::pd_test
