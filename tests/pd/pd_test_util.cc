#include "pd_test_util.h"

#include <httplib.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <deque>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "client/openai_client.h"

namespace kvpush::pd_test {

json Req::Body() const {
  json b;
  b["prompt"] = prompt;
  b["max_tokens"] = max_tokens;
  b["ignore_eos"] = true;
  b["return_token_ids"] = true;
  if (seeded) {
    b["temperature"] = 0.8;
    b["top_p"] = 0.95;
    b["seed"] = seed;
  } else {
    b["temperature"] = 0.0;
  }
  return b;
}

namespace {

std::string ErrorMessage(const json& j) {
  if (j.is_object() && j.contains("error")) {
    const json& e = j["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string()) {
      return e["message"].get<std::string>();
    }
    return e.dump();
  }
  return "";
}

}  // namespace

Res PostRaw(const std::string& host, int port, const json& body, double timeout_s,
            const Headers& headers) {
  Res out;
  httplib::Client cli(host, port);
  cli.set_connection_timeout(5, 0);
  cli.set_read_timeout(static_cast<time_t>(timeout_s), 0);
  httplib::Headers h;
  for (const auto& [k, v] : headers) h.emplace(k, v);
  auto r = cli.Post("/v1/completions", h, body.dump(), "application/json");
  if (!r) {
    out.error = "transport: " + httplib::to_string(r.error());
    return out;
  }
  out.status = r->status;
  out.raw = r->body;
  json j = json::parse(r->body, nullptr, false);
  out.error = ErrorMessage(j);
  if (r->status == 200 && j.is_object() && j.contains("choices") && !j["choices"].empty() &&
      j["choices"][0].contains("token_ids")) {
    out.ids = j["choices"][0]["token_ids"].get<std::vector<int32_t>>();
  }
  return out;
}

Res Send(const std::string& host, int port, const Req& r, const Headers& headers,
         const json* extra_body, double timeout_s) {
  json body = r.Body();
  if (extra_body != nullptr) {
    for (auto it = extra_body->begin(); it != extra_body->end(); ++it) body[it.key()] = it.value();
  }
  if (r.stream) {
    Res out;
    OpenAiClient c(host, port, timeout_s);
    auto s = c.Stream("/v1/completions", body, headers);
    if (!s.ok()) {
      out.error = "transport: " + s.status().ToString();
      return out;
    }
    out.status = s->http_status;
    out.error = s->error;
    out.ids = s->token_ids;
    out.raw = s->text;
    return out;
  }
  return PostRaw(host, port, body, timeout_s, headers);
}

std::vector<Res> SendAll(const std::string& host, int port, const std::vector<Req>& reqs,
                         int concurrency, const Headers& headers) {
  std::vector<Res> out(reqs.size());
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < reqs.size(); i = next++)
      out[i] = Send(host, port, reqs[i], headers);
  };
  std::vector<std::thread> threads;
  const int n = std::max(1, std::min<int>(concurrency, static_cast<int>(reqs.size())));
  threads.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  return out;
}

double Metric(const std::string& host, int port, const std::string& name) {
  httplib::Client cli(host, port);
  cli.set_connection_timeout(2, 0);
  cli.set_read_timeout(5, 0);
  auto r = cli.Get("/metrics");
  if (!r || r->status != 200) return -1;
  std::istringstream in(r->body);
  std::string line;
  double sum = 0;
  bool found = false;
  while (std::getline(in, line)) {
    if (line.rfind(name, 0) != 0 || line.size() <= name.size()) continue;
    const char c = line[name.size()];
    if (c != '{' && c != ' ') continue;
    const size_t sp = line.rfind(' ');
    sum += std::stod(line.substr(sp + 1));
    found = true;
  }
  return found ? sum : -2;
}

Req RandomPrompt(int n, int max_tokens, uint32_t seed) {
  Req r;
  r.label = std::to_string(n) + "-token prompt #" + std::to_string(seed);
  r.prompt = {1};
  uint32_t x = 2463534242u ^ seed;
  for (int i = 1; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    r.prompt.push_back(static_cast<int32_t>(3 + x % 500));
  }
  r.max_tokens = max_tokens;
  return r;
}

json ErrorOf(const std::string& body) {
  json j = json::parse(body, nullptr, false);
  return j.is_object() && j.contains("error") ? j["error"] : json(nullptr);
}

std::vector<Req> MakePrompts(int vocab, uint32_t seed, int n_short, int n_long, int n_prefix,
                             int n_repeat, int max_tokens) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(3, vocab - 1);
  auto random_ids = [&](int n) {
    std::vector<int32_t> v;
    for (int i = 0; i < n; ++i) v.push_back(tok(rng));
    return v;
  };
  std::vector<Req> out;
  static constexpr std::array<int, 5> kShort = {4, 7, 10, 13, 15};
  static constexpr std::array<int, 4> kLong = {60, 97, 140, 200};
  for (int i = 0; i < n_short; ++i) {
    Req r;
    r.prompt = {1};
    const int len = kShort[static_cast<size_t>(i) % kShort.size()];
    auto ids = random_ids(len - 1);
    r.prompt.insert(r.prompt.end(), ids.begin(), ids.end());
    r.label = "short#" + std::to_string(i) + " (" + std::to_string(len) + " tokens)";
    out.push_back(r);
  }
  std::vector<size_t> longs;
  for (int i = 0; i < n_long; ++i) {
    Req r;
    r.prompt = {1};
    const int len = kLong[static_cast<size_t>(i) % kLong.size()] + i / 4;
    auto ids = random_ids(len - 1);
    r.prompt.insert(r.prompt.end(), ids.begin(), ids.end());
    r.label = "long#" + std::to_string(i) + " (" + std::to_string(len) + " tokens)";
    longs.push_back(out.size());
    out.push_back(r);
  }
  // Prefixes of 2.5, 3 and 4 blocks (block size 16) of a long prompt, then a fresh tail.
  static constexpr std::array<int, 3> kPrefix = {40, 48, 64};
  for (int i = 0; i < n_prefix && !longs.empty(); ++i) {
    const Req& base = out[longs[static_cast<size_t>(i) % longs.size()]];
    const int plen = kPrefix[static_cast<size_t>(i) % kPrefix.size()];
    Req r;
    r.prompt.assign(base.prompt.begin(), base.prompt.begin() + plen);
    auto tail = random_ids(20 + 7 * i);
    r.prompt.insert(r.prompt.end(), tail.begin(), tail.end());
    r.label = "prefix#" + std::to_string(i) + " (first " + std::to_string(plen) + " tokens of " +
              base.label + " + " + std::to_string(tail.size()) + " new)";
    out.push_back(r);
  }
  // Repeats of long and prefix-sharing prompts (full prefix hits on D when run after them).
  const size_t n_before = out.size();
  for (int i = 0; i < n_repeat && n_before > 0; ++i) {
    const size_t src = n_before - 1 - (static_cast<size_t>(i) * 2) % n_before;
    Req r = out[src];
    r.label = "repeat#" + std::to_string(i) + " of " + out[src].label;
    out.push_back(r);
  }
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].max_tokens = max_tokens;
    out[i].seed = 4242 + static_cast<int64_t>(i);
  }
  return out;
}

std::string NewTransferId() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng()));
  return buf;
}

std::string CrashReport(const std::string& path) {
  static const char* const kMarkers[] = {
      "AddressSanitizer", "UndefinedBehaviorSanitizer", "LeakSanitizer", "ThreadSanitizer",
      "runtime error:",   "terminate called",           "Assertion `"};
  std::ifstream in(path);
  std::string line, report;
  int kept = 0;
  while (std::getline(in, line) && kept < 40) {
    if (kept == 0) {
      bool hit = false;
      for (const char* m : kMarkers) hit = hit || line.find(m) != std::string::npos;
      if (!hit) continue;
    }
    report += line + "\n";
    ++kept;
  }
  return report;
}

std::string Tail(const std::string& path, int lines) {
  std::ifstream in(path);
  std::deque<std::string> last;
  std::string line;
  while (std::getline(in, line)) {
    last.push_back(line);
    if (static_cast<int>(last.size()) > lines) last.pop_front();
  }
  std::string out;
  for (const auto& l : last) out += "    " + l + "\n";
  return out;
}

std::pair<int, std::string> Sh(const std::string& cmd) {
  std::string full = cmd + " 2>&1";
  FILE* f = popen(full.c_str(), "r");
  if (f == nullptr) return {-1, "popen failed"};
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof(buf), f) != nullptr) out += buf;
  int st = pclose(f);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

NetnsTopology::~NetnsTopology() {
  Destroy();
}

std::string NetnsTopology::Create(const std::vector<std::string>& names) {
  const int pid = static_cast<int>(getpid());
  const int k = 1 + pid % 250;
  subnet_ = "10.77." + std::to_string(k) + ".";
  bridge_ = "kvb" + std::to_string(pid);
  auto run = [](const std::string& c) -> std::string {
    auto [rc, out] = Sh(c);
    return rc == 0 ? std::string() : ("'" + c + "' failed (" + std::to_string(rc) + "): " + out);
  };
  if (auto e = run("ip link add " + bridge_ + " type bridge"); !e.empty()) return e;
  for (const std::string& c :
       {"ip addr add " + subnet_ + "1/24 dev " + bridge_, "ip link set " + bridge_ + " up"}) {
    if (auto e = run(c); !e.empty()) return e;
  }
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string ns = "kvpd" + std::to_string(pid) + "-" + names[i];
    const std::string host = "kv" + std::to_string(pid) + "h" + std::to_string(i);
    const std::string dev = "kv" + std::to_string(pid) + "n" + std::to_string(i);
    if (auto e = run("ip netns add " + ns); !e.empty()) return e;
    ns_.push_back(ns);
    if (auto e = run("ip link add " + host + " type veth peer name " + dev); !e.empty()) return e;
    hosts_.push_back(host);
    devs_.push_back(dev);
    for (const std::string& c :
         {"ip link set " + dev + " netns " + ns, "ip link set " + host + " master " + bridge_,
          "ip link set " + host + " up", "ip -n " + ns + " addr add " + ip(i) + "/24 dev " + dev,
          "ip -n " + ns + " link set " + dev + " up", "ip -n " + ns + " link set lo up"}) {
      if (auto e = run(c); !e.empty()) return e;
    }
  }
  return "";
}

void NetnsTopology::Destroy() {
  for (const auto& ns : ns_) Sh("ip netns del " + ns);
  for (const auto& h : hosts_) Sh("ip link del " + h + " 2>/dev/null || true");
  if (!bridge_.empty()) Sh("ip link del " + bridge_);
  ns_.clear();
  hosts_.clear();
  devs_.clear();
  bridge_.clear();
}

}  // namespace kvpush::pd_test
