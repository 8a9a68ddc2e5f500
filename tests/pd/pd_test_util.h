// Helpers of the P/D end-to-end tests: real kvpush processes (serve --role both|prefill|decode,
// router), plain HTTP against them, /metrics parsing, prompt sets, network namespaces.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "apps/child_process.h"

namespace kvpush::pd_test {

using nlohmann::json;
using Headers = std::vector<std::pair<std::string, std::string>>;

/// The kvpush binary built next to the tests.
inline std::string KvpushBin() {
  return std::string(KVPUSH_BINARY_DIR) + "/apps/kvpush";
}

/// One child process (a kvpush serve or router) with its log file.
struct Proc {
  std::string name;
  std::string host;
  int port = 0;
  std::string log;
  apps::ChildProcess child;
  std::string url() const { return "http://" + host + ":" + std::to_string(port); }
};

/// One completion request of a test: the prompt as token ids (first id 1 = BOS) and sampling.
struct Req {
  std::string label;  ///< says which prompt this is in failure messages
  std::vector<int32_t> prompt;
  int max_tokens = 16;
  bool seeded = false;  ///< temperature 0.8, top_p 0.95, seed; else greedy
  int64_t seed = 0;
  bool stream = false;
  json Body() const;
};

/// What came back for one request.
struct Res {
  int status = 0;
  std::vector<int32_t> ids;
  std::string error;  ///< error message (error body, SSE error event, or transport failure)
  std::string raw;    ///< raw body (non-streamed) for messages
};

/// Sends `r` to host:port (/v1/completions), streamed when r.stream. Thread-safe.
Res Send(const std::string& host, int port, const Req& r, const Headers& headers = {},
         const json* extra_body = nullptr, double timeout_s = 120.0);

/// Posts `body` as is (non-streamed) with `headers` and returns status and body.
Res PostRaw(const std::string& host, int port, const json& body, double timeout_s = 60.0,
            const Headers& headers = {});

/// Sends every request with `concurrency` requests in flight at once (threads).
std::vector<Res> SendAll(const std::string& host, int port, const std::vector<Req>& reqs,
                         int concurrency, const Headers& headers = {});

/// Sum of every sample of metric `name` in /metrics of host:port; -1 when unreachable, -2 when
/// the metric is absent.
double Metric(const std::string& host, int port, const std::string& name);

/// A prompt of `n` token ids (BOS first, then ids in [3, 503) from a xorshift32 sequence started
/// at 2463534242 ^ `seed`) asking for `max_tokens` tokens.
Req RandomPrompt(int n, int max_tokens, uint32_t seed);

/// The `error` object of an OpenAI error body; null when the body has none.
json ErrorOf(const std::string& body);

/// A prompt set: `n_short` prompts of < 16 tokens, `n_long` of 60..200 tokens, `n_prefix`
/// sharing a prefix (whole and partial blocks) with a long one, `n_repeat` exact repeats of
/// earlier prompts (the last ones, so that with one request in flight D has them cached).
std::vector<Req> MakePrompts(int vocab, uint32_t seed, int n_short, int n_long, int n_prefix,
                             int n_repeat, int max_tokens);

/// Random 32-hex transfer id.
std::string NewTransferId();

/// Last `lines` lines of a file.
std::string Tail(const std::string& path, int lines);

/// The first sanitizer report, uncaught-exception abort or failed assertion in the log file at
/// `path` (from its first line, up to 40 lines); empty when there is none or no such file. The
/// markers are those of the chaos harness (tests/pylib/kvpush_harness.py CRASH_PATTERNS) that
/// cannot occur in a healthy kvpush log.
std::string CrashReport(const std::string& path);

/// Runs a command line through /bin/sh; returns its exit status and output.
std::pair<int, std::string> Sh(const std::string& cmd);

/// Network namespaces joined by a bridge in the root namespace (10.77.<k>.0/24, bridge .1,
/// namespace i gets .(i+2)). Everything is deleted in the destructor.
class NetnsTopology {
 public:
  NetnsTopology() = default;
  ~NetnsTopology();
  NetnsTopology(const NetnsTopology&) = delete;
  NetnsTopology& operator=(const NetnsTopology&) = delete;
  /// Creates `names.size()` namespaces. Returns "" on success, else why it failed.
  std::string Create(const std::vector<std::string>& names);
  std::string ns(size_t i) const { return ns_[i]; }
  std::string ip(size_t i) const { return subnet_ + std::to_string(i + 2); }
  std::string dev(size_t i) const { return devs_[i]; }
  void Destroy();

 private:
  std::string bridge_;
  std::string subnet_;  ///< "10.77.k."
  std::vector<std::string> ns_;
  std::vector<std::string> devs_;   ///< device name inside namespace i
  std::vector<std::string> hosts_;  ///< root-side veth names
};

}  // namespace kvpush::pd_test
