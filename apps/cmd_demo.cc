// kvpush demo: the main job. Starts a kvpush instance on loopback as a child process, sends a
// handful of prompts (one at a time, then all at once), prints the generated text and a table of
// TTFT / TPOT / end-to-end latency, and shuts everything down.
//
// Model: --model, else ../shared/models/stories260K.gguf (looked up beside the checkout), else a
// small random-weight model generated with `kvpush gen-model` into the log folder (its text is
// gibberish, but every path runs).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "apps/child_process.h"
#include "apps/commands.h"
#include "client/openai_client.h"

namespace kvpush::apps {

namespace {

namespace fs = std::filesystem;

struct DemoOptions {
  std::string model;
  int max_tokens = 48;
  std::string log_dir;
};

const std::vector<std::string>& DemoPrompts() {
  static const std::vector<std::string> prompts = {
      "Once upon a time, there was a little girl named Lily.",
      "Tom had a big red ball.",
      "The sun was shining and the birds were singing.",
      "One day, a small dog found a bone in the park.",
      "Sara and Ben went to the beach with their mom.",
      "The old man had a magic box.",
      "Once upon a time, in a big forest, there lived a little bear.",
      "Mia wanted to fly like a bird.",
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

int RunDemo(const DemoOptions& opt) {
  std::string log_dir = opt.log_dir;
  if (log_dir.empty()) {
    char tmpl[] = "/tmp/kvpush-demo-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      std::perror("mkdtemp");
      return 1;
    }
    log_dir = tmpl;
  }
  fs::create_directories(log_dir);
  std::string model = opt.model.empty() ? FindDefaultModel() : opt.model;
  if (model.empty()) {
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
      return 1;
    }
  }
  std::printf("kvpush demo\n  model:    %s\n  logs:     %s\n", model.c_str(), log_dir.c_str());

  auto port = PickFreePort();
  if (!port.ok()) {
    std::fprintf(stderr, "demo: %s\n", port.status().ToString().c_str());
    return 1;
  }
  ChildProcess server;
  const std::string host = "127.0.0.1";
  Status s = server.Start({"serve", "--model", model, "--role", "both", "--host", host, "--port",
                           std::to_string(*port), "--log-level", "warn"},
                          log_dir + "/colocated.log");
  if (s.ok()) s = WaitHealthy(host, *port, server, 60000);
  if (!s.ok()) {
    std::fprintf(stderr, "demo: colocated instance did not start: %s (see %s/colocated.log)\n",
                 s.ToString().c_str(), log_dir.c_str());
    return 1;
  }
  std::printf("  instance: colocated (--role both) on http://%s:%d\n\n", host.c_str(), *port);
  OpenAiClient client(host, *port);
  auto served = ServedModelName(client);
  if (!served.ok()) {
    std::fprintf(stderr, "demo: %s\n", served.status().ToString().c_str());
    return 1;
  }
  const std::string model_name = *served;
  PrintKvGauges(client, "at start");

  const auto& prompts = DemoPrompts();
  std::vector<RunStats> runs;
  int failures = 0;

  RunStats seq{"colocated, 1 at a time", {}};
  for (const auto& p : prompts) {
    auto r = client.Stream("/v1/completions", CompletionBody(model_name, p, opt.max_tokens));
    if (!r.ok() || r->http_status != 200 || !r->error.empty()) {
      ++failures;
      std::fprintf(stderr, "request failed: %s\n",
                   r.ok() ? r->error.c_str() : r.status().ToString().c_str());
      continue;
    }
    std::printf("> %s\n%s\n\n", p.c_str(), r->text.c_str());
    seq.results.push_back(std::move(*r));
  }
  runs.push_back(std::move(seq));

  RunStats conc{"colocated, " + std::to_string(prompts.size()) + " at once", {}};
  std::mutex mu;
  std::vector<std::thread> threads;
  threads.reserve(prompts.size());
  for (const auto& p : prompts) {
    threads.emplace_back([&, p] {
      OpenAiClient c(host, *port);
      auto r = c.Stream("/v1/completions", CompletionBody(model_name, p, opt.max_tokens));
      std::lock_guard<std::mutex> lock(mu);
      if (!r.ok() || r->http_status != 200 || !r->error.empty()) {
        ++failures;
        return;
      }
      conc.results.push_back(std::move(*r));
    });
  }
  for (auto& t : threads) t.join();
  runs.push_back(std::move(conc));

  if (failures == static_cast<int>(2 * prompts.size())) {
    std::fprintf(stderr, "demo: every request failed; see the errors above and %s/colocated.log\n",
                 log_dir.c_str());
    server.Stop();
    return 1;
  }
  PrintTable(runs);
  std::printf("\n");
  PrintKvGauges(client, "at end  ");
  const int st = server.Stop();
  std::printf("colocated instance stopped (%s)\n",
              WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "clean exit" : "killed or failed");
  if (failures > 0) {
    std::fprintf(stderr, "demo: %d request(s) failed\n", failures);
    return 1;
  }
  return 0;
}

}  // namespace

void RegisterDemoCommand(CLI::App& app) {
  auto opt = std::make_shared<DemoOptions>();
  auto* cmd = app.add_subcommand(
      "demo", "Start an instance on loopback, run a few prompts, print text and TTFT/TPOT");
  cmd->add_option("--model", opt->model,
                  "GGUF or llama2.c .bin (default: ../shared/models/stories260K.gguf, else a "
                  "generated random model)");
  cmd->add_option("--max-tokens", opt->max_tokens, "Tokens to generate per prompt")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--log-dir", opt->log_dir,
                  "Folder for the instances' logs (default: a temp dir)");
  cmd->callback([opt] {
    const int rc = RunDemo(*opt);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace kvpush::apps
