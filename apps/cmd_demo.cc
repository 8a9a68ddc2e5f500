// kvpush demo: the main job. Starts a router, one prefill and one decode instance (and a colocated
// instance as the reference) on loopback as child processes, warms every mode up, then sends the
// same prompts in push mode and in pull mode (vLLM default and fast options) for several rounds,
// modes interleaved prompt by prompt in rotating order, prints the generated text, a table of
// TTFT / TPOT / end-to-end latency, the handoff overhead H per mode (p50 and p99) with the
// transfer counters behind it, checks that every mode produced the colocated tokens, and shuts
// everything down.
//
// Model: --model, else ../shared/models/stories260K.gguf (looked up beside the checkout), else a
// small random-weight model generated with `kvpush gen-model` into the log folder (its text is
// gibberish, but every path runs).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "apps/child_process.h"
#include "apps/commands.h"
#include "apps/demo_report.h"
#include "client/openai_client.h"
#include "common/clock.h"

namespace kvpush::apps {

namespace {

namespace fs = std::filesystem;

struct DemoOptions {
  std::string model;
  std::string backend = "ucx:tcp";
  int max_tokens = 48;
  // 25 rounds x 8 prompts = 200 requests per mode: a p99 of 40 is the largest value but one, a
  // single scheduling hiccup of this shared 2-core machine; of 200 it is a tail.
  int rounds = 25;
  std::string log_dir;
};

// Every prompt is longer than one KV block (16 tokens) so that every P/D request moves KV in every
// mode: a prompt within one block is the decode instance's to compute (vLLM's rule, push and
// pull alike: pd_protocol.md, NOT_NEEDED), so it would measure no handoff.
const std::vector<std::string>& DemoPrompts() {
  static const std::vector<std::string> prompts = {
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "sun with her friends.",
      "Tom had a big red ball. Every day he took it to the park and kicked it as high as he "
      "could.",
      "The sun was shining and the birds were singing. A little rabbit hopped out of its hole "
      "to look around.",
      "One day, a small dog found a bone in the park. He was very happy and ran home to show "
      "his friend the cat.",
      "Sara and Ben went to the beach with their mom. They built a big castle out of sand and "
      "shells.",
      "The old man had a magic box. When he opened it, a bright light came out and filled the "
      "room.",
      "Once upon a time, in a big forest, there lived a little bear. He liked to eat honey and "
      "sleep under the trees.",
      "Mia wanted to fly like a bird. She made wings out of paper and ran up the hill behind "
      "her house.",
  };
  return prompts;
}

// Finds stories260K.gguf beside the checkout: <repo>/../shared/models, where <repo> is found from
// the binary (<repo>/build/apps/kvpush) or the working directory.
std::string FindDefaultModel() {
  std::vector<fs::path> roots;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) roots.push_back(exe.parent_path().parent_path().parent_path());
  roots.push_back(fs::current_path(ec));
  for (const auto& root : roots) {
    for (const fs::path rel :
         {"../shared/models/stories260K.gguf", "shared/models/stories260K.gguf"}) {
      fs::path p = (root / rel).lexically_normal();
      if (fs::exists(p, ec)) return p.string();
    }
  }
  return "";
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return -1.0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

struct RunStats {
  std::string name;
  std::vector<StreamedCompletion> results;
};

void PrintTable(const std::vector<RunStats>& runs) {
  std::printf("\n%-24s %5s %9s %9s %9s %9s %9s %8s\n", "run", "reqs", "TTFT p50", "TTFT p99",
              "TPOT p50", "TPOT p99", "e2e p50", "tokens");
  std::printf("%-24s %5s %9s %9s %9s %9s %9s %8s\n", "", "", "(ms)", "(ms)", "(ms)", "(ms)", "(ms)",
              "");
  for (const auto& r : runs) {
    std::vector<double> ttft, tpot, e2e;
    int64_t tokens = 0;
    for (const auto& c : r.results) {
      ttft.push_back(c.TtftMs());
      if (c.TpotMs() >= 0) tpot.push_back(c.TpotMs());
      e2e.push_back(static_cast<double>(c.end_ns - c.start_ns) * 1e-6);
      tokens += std::max<int64_t>(c.completion_tokens, 0);
    }
    std::printf("%-24s %5zu %9.2f %9.2f %9.2f %9.2f %9.2f %8lld\n", r.name.c_str(),
                r.results.size(), Percentile(ttft, 0.5), Percentile(ttft, 0.99),
                Percentile(tpot, 0.5), Percentile(tpot, 0.99), Percentile(e2e, 0.5),
                static_cast<long long>(tokens));
  }
}

nlohmann::json CompletionBody(const std::string& model, const std::string& prompt, int max_tokens) {
  return {{"model", model}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0.0}};
}

// The served model name, from /v1/models (first entry).
Result<std::string> ServedModelName(const OpenAiClient& client) {
  KVP_ASSIGN_OR_RETURN(std::string body, client.Get("/v1/models"));
  auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
      !j["data"][0].contains("id") || !j["data"][0]["id"].is_string()) {
    return DataLoss("/v1/models: unexpected body: " + body.substr(0, 200));
  }
  return j["data"][0]["id"].get<std::string>();
}

// Prints the KV block gauges from /metrics (lines whose name mentions kv_blocks).
void PrintKvGauges(const OpenAiClient& client, const char* when) {
  auto m = client.Get("/metrics");
  if (!m.ok()) return;
  std::printf("KV blocks %s:", when);
  size_t start = 0;
  const std::string& body = *m;
  while (start < body.size()) {
    size_t eol = body.find('\n', start);
    if (eol == std::string::npos) eol = body.size();
    std::string line = body.substr(start, eol - start);
    const std::string prefix = "kvpush_kv_blocks_";
    if (line.rfind(prefix, 0) == 0) {
      // "kvpush_kv_blocks_free{labels} 13107" -> " free 13107"
      const size_t name_end = line.find_first_of("{ ");
      const size_t value_start = line.rfind(' ');
      if (name_end != std::string::npos && value_start != std::string::npos) {
        std::printf(" %s %s", line.substr(prefix.size(), name_end - prefix.size()).c_str(),
                    line.substr(value_start + 1).c_str());
      }
    }
    start = eol + 1;
  }
  std::printf("\n");
}

// One started instance (or router) of the demo.
struct Proc {
  std::string name;
  int port = 0;
  ChildProcess child;
};

Status StartProc(Proc& p, const std::vector<std::string>& args, const std::string& log_dir) {
  KVP_ASSIGN_OR_RETURN(p.port, PickFreePort());
  std::vector<std::string> a = args;
  a.insert(a.end(),
           {"--host", "127.0.0.1", "--port", std::to_string(p.port), "--log-level", "warn"});
  KVP_RETURN_IF_ERROR(p.child.Start(a, log_dir + "/" + p.name + ".log"));
  return Status::Ok();
}

// The log folder: --log-dir, else a fresh temp dir. "" on failure (printed).
std::string MakeLogDir(const DemoOptions& opt) {
  std::string log_dir = opt.log_dir;
  if (log_dir.empty()) {
    char tmpl[] = "/tmp/kvpush-demo-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      std::perror("mkdtemp");
      return "";
    }
    log_dir = tmpl;
  }
  fs::create_directories(log_dir);
  return log_dir;
}

// The model to serve: --model, else stories260K beside the checkout, else a generated random
// model in the log folder. "" on failure (printed).
std::string ResolveModel(const DemoOptions& opt, const std::string& log_dir) {
  std::string model = opt.model.empty() ? FindDefaultModel() : opt.model;
  if (!model.empty()) {
    if (fs::exists(model)) return model;
    std::fprintf(stderr, "demo: model %s does not exist\n", model.c_str());
    return "";
  }
  model = log_dir + "/random-llama.gguf";
  std::printf(
      "No model given and ../shared/models/stories260K.gguf not found: generating a small "
      "random-weight Llama model at %s (its text is gibberish).\n",
      model.c_str());
  ChildProcess gen;
  Status s = gen.Start({"gen-model", "--out", model, "--dim", "128", "--layers", "4", "--heads",
                        "4", "--kv-heads", "2", "--hidden-dim", "344", "--vocab", "512"},
                       log_dir + "/gen-model.log");
  if (s.ok()) {
    while (gen.Running()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!s.ok() || gen.Stop() != 0 || !fs::exists(model)) {
    std::fprintf(stderr, "demo: gen-model failed (%s); see %s/gen-model.log\n",
                 s.ToString().c_str(), log_dir.c_str());
    return "";
  }
  return model;
}

// The demo's processes: a colocated reference, one prefill, one decode and a router over them.
struct DemoCluster {
  Proc colocated{"colocated", 0, {}};
  Proc prefill{"prefill", 0, {}};
  Proc decode{"decode", 0, {}};
  Proc router{"router", 0, {}};
};

// Starts the cluster and waits until every process answers /health. False on failure (printed).
bool StartCluster(DemoCluster& c, const DemoOptions& opt, const std::string& model,
                  const std::string& log_dir) {
  // The prefix cache is off so that every mode moves the whole prompt's KV (the same prompts
  // are sent in every mode).
  const std::string kv_config =
      R"({"kv_connector_extra_config":{"backend":")" + opt.backend + R"("}})";
  const std::vector<std::string> serve = {"serve", "--model", model, "--no-enable-prefix-caching"};
  auto with = [](std::vector<std::string> a, std::initializer_list<std::string> more) {
    a.insert(a.end(), more);
    return a;
  };
  Status s = StartProc(c.colocated, with(serve, {"--role", "both"}), log_dir);
  if (s.ok()) {
    s = StartProc(c.prefill, with(serve, {"--role", "prefill", "--kv-transfer-config", kv_config}),
                  log_dir);
  }
  if (s.ok()) {
    s = StartProc(c.decode, with(serve, {"--role", "decode", "--kv-transfer-config", kv_config}),
                  log_dir);
  }
  for (Proc* p : {&c.colocated, &c.prefill, &c.decode}) {
    if (s.ok()) s = WaitHealthy("127.0.0.1", p->port, p->child, 60000);
    if (!s.ok()) {
      std::fprintf(stderr, "demo: %s instance did not start: %s (see %s/%s.log)\n", p->name.c_str(),
                   s.ToString().c_str(), log_dir.c_str(), p->name.c_str());
      return false;
    }
  }
  s = StartProc(c.router,
                {"router", "--prefill", "http://127.0.0.1:" + std::to_string(c.prefill.port),
                 "--decode", "http://127.0.0.1:" + std::to_string(c.decode.port), "--mode", "push"},
                log_dir);
  if (s.ok()) s = WaitHealthy("127.0.0.1", c.router.port, c.router.child, 30000);
  if (!s.ok()) {
    std::fprintf(stderr, "demo: router did not start: %s (see %s/router.log)\n",
                 s.ToString().c_str(), log_dir.c_str());
    return false;
  }
  std::printf(
      "  colocated http://127.0.0.1:%d   prefill http://127.0.0.1:%d   decode "
      "http://127.0.0.1:%d   router http://127.0.0.1:%d\n\n",
      c.colocated.port, c.prefill.port, c.decode.port, c.router.port);
  return true;
}

// A demo mode: the colocated reference (no header) or a P/D mode through the router.
struct DemoMode {
  const char* name;
  const char* header;  // x-kvpush-mode, or null for the colocated instance
};
constexpr DemoMode kDemoModes[] = {{"colocated", nullptr},
                                   {"push", "push"},
                                   {"pull (vLLM default)", "pull-vllm"},
                                   {"pull (fast)", "pull-fast"}};
constexpr size_t kNumModes = std::size(kDemoModes);

// Sends requests in the demo's modes and gathers what they returned.
class DemoSession {
 public:
  DemoSession(const DemoCluster& c, std::string model_name, int max_tokens)
      : colo_("127.0.0.1", c.colocated.port),
        router_("127.0.0.1", c.router.port),
        model_name_(std::move(model_name)),
        max_tokens_(max_tokens) {
    for (const DemoMode& m : kDemoModes) runs_.push_back(RunStats{m.name, {}});
  }

  // One streamed request in mode `k`; nullopt (counted, printed) when it failed.
  std::optional<StreamedCompletion> Send(size_t k, const std::string& prompt,
                                         const char* what = "") {
    nlohmann::json body = CompletionBody(model_name_, prompt, max_tokens_);
    body["return_token_ids"] = true;
    const DemoMode& m = kDemoModes[k];
    auto r = m.header == nullptr ? OpenAiClient(colo_).Stream("/v1/completions", body)
                                 : OpenAiClient(router_).Stream("/v1/completions", body,
                                                                {{"x-kvpush-mode", m.header}});
    if (!r.ok() || r->http_status != 200 || !r->error.empty()) {
      failures_.fetch_add(1);
      std::fprintf(stderr, "%s%s request failed: %s\n", m.name, what,
                   r.ok() ? r->error.c_str() : r.status().ToString().c_str());
      return std::nullopt;
    }
    return std::move(*r);
  }

  // Warm-up (not measured): every prompt once in every mode, so that connections, handshakes,
  // first-touched pages and the instances' code paths are warm for every mode alike.
  void WarmUp(const std::vector<std::string>& prompts) {
    for (const auto& p : prompts) {
      for (size_t k = 0; k < kNumModes; ++k) (void)Send(k, p, " warm-up");
    }
  }

  // `rounds` rounds over `prompts`, one request at a time, every prompt in every mode in
  // rotating order. Records H = TTFT(mode) - TTFT(colocated) of the same prompt and round, and
  // whether the tokens equal colocated's; prints each prompt's push text once.
  void MeasureInterleaved(const std::vector<std::string>& prompts, int rounds) {
    prompt_tokens_.assign(prompts.size(), -1);
    for (int round = 0; round < rounds; ++round) {
      for (size_t i = 0; i < prompts.size(); ++i) {
        std::vector<std::optional<StreamedCompletion>> got(kNumModes);
        for (size_t j = 0; j < kNumModes; ++j) {
          const size_t k = (j + i + static_cast<size_t>(round)) % kNumModes;
          got[k] = Send(k, prompts[i]);
        }
        if (round == 0 && got[1]) {
          prompt_tokens_[i] = got[1]->prompt_tokens;
          std::printf("> %s\n%s\n\n", prompts[i].c_str(), got[1]->text.c_str());
        }
        Record(got);
      }
    }
  }

  // Every prompt at once in mode `k`; adds a run named after it.
  void Concurrent(size_t k, const std::vector<std::string>& prompts) {
    RunStats conc{
        std::string(kDemoModes[k].name) + ", " + std::to_string(prompts.size()) + " at once", {}};
    std::mutex mu;
    std::vector<std::thread> threads;
    threads.reserve(prompts.size());
    for (const auto& p : prompts) {
      threads.emplace_back([&, p] {
        auto r = Send(k, p, " (concurrent)");
        std::lock_guard<std::mutex> lock(mu);
        if (r) conc.results.push_back(std::move(*r));
      });
    }
    for (auto& t : threads) t.join();
    runs_.push_back(std::move(conc));
  }

  void PrintH() const {
    std::printf(
        "\nHandoff overhead H = TTFT(mode) - TTFT(colocated) of the same prompt in the "
        "same round:\n");
    for (size_t k = 1; k < kNumModes; ++k) {
      std::printf(
          "  %-20s H p50 = %6.2f ms  p90 = %6.2f ms  p99 = %6.2f ms  (%zu)  tokens "
          "identical to colocated: %s\n",
          kDemoModes[k].name, Percentile(h_[k], 0.5), Percentile(h_[k], 0.9),
          Percentile(h_[k], 0.99), h_[k].size(), same_[k] ? "yes" : "NO");
    }
  }

  const std::vector<RunStats>& runs() const { return runs_; }
  const std::vector<int64_t>& prompt_tokens() const { return prompt_tokens_; }
  int failures() const { return failures_.load(); }
  bool identical() const {
    return std::all_of(same_.begin() + 1, same_.end(), [](bool b) { return b; });
  }

 private:
  void Record(std::vector<std::optional<StreamedCompletion>>& got) {
    for (size_t k = 1; k < kNumModes; ++k) {
      if (!got[k] || !got[0]) continue;
      if (got[k]->token_ids != got[0]->token_ids) same_[k] = false;
      h_[k].push_back(got[k]->TtftMs() - got[0]->TtftMs());
    }
    for (size_t k = 0; k < kNumModes; ++k) {
      if (got[k]) runs_[k].results.push_back(std::move(*got[k]));
    }
  }

  const OpenAiClient colo_;
  const OpenAiClient router_;
  const std::string model_name_;
  const int max_tokens_;
  std::vector<RunStats> runs_;
  std::vector<std::vector<double>> h_ = std::vector<std::vector<double>>(kNumModes);
  std::vector<bool> same_ = std::vector<bool>(kNumModes, true);
  std::vector<int64_t> prompt_tokens_;
  std::atomic<int> failures_{0};
};

// Stops every process; true when all exited cleanly.
bool StopCluster(DemoCluster& c) {
  bool clean = true;
  for (Proc* p : {&c.router, &c.decode, &c.prefill, &c.colocated}) {
    const int st = p->child.Stop();
    clean = clean && WIFEXITED(st) && WEXITSTATUS(st) == 0;
  }
  std::printf("all instances stopped (%s)\n", clean ? "clean exit" : "killed or failed");
  return clean;
}

int RunDemo(const DemoOptions& opt) {
  const std::string log_dir = MakeLogDir(opt);
  if (log_dir.empty()) return 1;
  const std::string model = ResolveModel(opt, log_dir);
  if (model.empty()) return 1;
  std::printf("kvpush demo: router + 1 prefill + 1 decode on loopback, push vs pull\n");
  std::printf("  model:    %s\n  backend:  %s\n  logs:     %s\n", model.c_str(),
              opt.backend.c_str(), log_dir.c_str());
  DemoCluster cluster;
  if (!StartCluster(cluster, opt, model, log_dir)) return 1;
  OpenAiClient p_client("127.0.0.1", cluster.prefill.port);
  OpenAiClient d_client("127.0.0.1", cluster.decode.port);
  auto served = ServedModelName(OpenAiClient("127.0.0.1", cluster.colocated.port));
  if (!served.ok()) {
    std::fprintf(stderr, "demo: %s\n", served.status().ToString().c_str());
    return 1;
  }
  DemoSession session(cluster, *served, opt.max_tokens);
  const auto& prompts = DemoPrompts();
  session.WarmUp(prompts);
  const ConnectorCounters p_before = ReadConnectorCounters(p_client);
  const ConnectorCounters d_before = ReadConnectorCounters(d_client);
  const int64_t measured_from_ns = NowNs();
  session.MeasureInterleaved(prompts, opt.rounds);
  const int64_t measured_until_ns = NowNs();
  const ConnectorCounters p_after = ReadConnectorCounters(p_client);
  const ConnectorCounters d_after = ReadConnectorCounters(d_client);
  session.Concurrent(1, prompts);  // push
  session.Concurrent(2, prompts);  // pull (vLLM default)
  if (session.runs()[1].results.empty()) {
    std::fprintf(stderr, "demo: every push request failed; see the errors above and %s\n",
                 log_dir.c_str());
    return 1;
  }
  std::printf("Prompt lengths (tokens):");
  for (int64_t n : session.prompt_tokens()) std::printf(" %lld", static_cast<long long>(n));
  std::printf("  (all > 16: every P/D request moves KV; one of <= 16 tokens, within one KV block,\n"
              "   is computed by the decode instance itself in every mode)\n");
  std::printf(
      "Measured: %d round(s) x %zu prompts per mode after a warm-up round, modes "
      "interleaved in rotating order, one request at a time.\n",
      opt.rounds, prompts.size());
  PrintTable(session.runs());
  session.PrintH();
  PrintTransferCounters(p_after - p_before, d_after - d_before);
  PrintHandoffMedians(p_client, d_client, measured_from_ns, measured_until_ns);
  std::printf("\n");
  PrintKvGauges(p_client, "on prefill at end");
  PrintKvGauges(d_client, "on decode at end ");
  const bool clean = StopCluster(cluster);
  if (session.failures() > 0) {
    std::fprintf(stderr, "demo: %d request(s) failed\n", session.failures());
    return 1;
  }
  if (!session.identical()) {
    std::fprintf(stderr, "demo: P/D output differs from colocated output\n");
    return 1;
  }
  return clean ? 0 : 1;
}

}  // namespace

void RegisterDemoCommand(CLI::App& app) {
  auto opt = std::make_shared<DemoOptions>();
  auto* cmd = app.add_subcommand(
      "demo",
      "Start router + prefill + decode (and a colocated reference) on loopback, run prompts in "
      "push and pull mode, print text, TTFT/TPOT and handoff time");
  cmd->add_option("--model", opt->model,
                  "GGUF or llama2.c .bin (default: ../shared/models/stories260K.gguf, else a "
                  "generated random model)");
  cmd->add_option("--backend", opt->backend, "KV transfer backend between P and D")
      ->check(CLI::IsMember({"ucx:tcp", "ucx:shm", "libfabric:tcp", "libfabric:shm"}))
      ->capture_default_str();
  cmd->add_option("--max-tokens", opt->max_tokens, "Tokens to generate per prompt")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--rounds", opt->rounds,
                  "Measured rounds over the prompts, after one warm-up round (H p50/p99 are over "
                  "rounds x 8 requests per mode)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  cmd->add_option("--log-dir", opt->log_dir,
                  "Folder for the instances' logs (default: a temp dir)");
  cmd->callback([opt] {
    const int rc = RunDemo(*opt);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace kvpush::apps
