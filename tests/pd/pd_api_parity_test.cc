// OpenAI / vLLM API parity of the instances across serving modes (issue 13, instance side):
// a table of requests — every sampling parameter kvpush implements (min_tokens, stop_token_ids,
// min_p, presence / frequency / repetition penalties, logit_bias, echo, logprobs), valid and
// invalid values, completions and chat, streamed and not — is sent to a colocated instance and
// as P/D legs straight to a prefill (P) and a decode (D) instance, in push, pull (fast profile)
// and pull (vllm profile). The legs are built as docs/pd_protocol.md §1 says the router builds
// them (P: the client body with max_tokens 1, not streamed; D: the client body), so this checks
// the instances without depending on the router. D's body must equal the colocated body apart
// from `id`, `created` and `usage.prompt_tokens_details` (a prefix-cache count that depends on
// what each instance saw before), event by event when streamed; an invalid request gets the same
// 400 body from both. Values vLLM defines are asserted too (stop_reason of a stop token id,
// min_tokens holding off stops, min_p 0.99 = greedy, echo, n's indexes, cached_tokens). Echo with
// logprobs runs through the router only (it merges P's prompt_echo into D's choices), including
// a prompt D already holds (D tells P it needs no KV; P still answers the prompt's part).
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "pd_fixture.h"

namespace kvpush::pd_test {
namespace {

/// One HTTP answer: status, Content-Type, body.
struct Answer {
  int status = 0;
  std::string content_type;
  std::string body;
};

Answer Post(const Proc& p, const std::string& path, const json& body,
            const httplib::Headers& headers = {}) {
  httplib::Client cli(p.host, p.port);
  cli.set_connection_timeout(5, 0);
  cli.set_read_timeout(60, 0);
  auto r = cli.Post(path, headers, body.dump(), "application/json");
  if (!r) return {0, "", "transport: " + httplib::to_string(r.error())};
  return {r->status, r->get_header_value("Content-Type"), r->body};
}

/// Drops what may differ between instances: ids, timestamps, the prefix-cache count.
void Normalize(json& j) {
  if (!j.is_object()) return;
  j.erase("id");
  j.erase("created");
  j.erase("kv_transfer_params");
  if (j.contains("usage") && j["usage"].is_object()) j["usage"].erase("prompt_tokens_details");
}

/// A body as comparable JSON: one object, or (SSE) the array of its events.
json Comparable(const Answer& a) {
  if (a.content_type.rfind("text/event-stream", 0) != 0) {
    json j = json::parse(a.body, nullptr, false);
    Normalize(j);
    return j;
  }
  json events = json::array();
  size_t pos = 0;
  while (pos < a.body.size()) {
    size_t end = a.body.find("\n\n", pos);
    if (end == std::string::npos) end = a.body.size();
    std::string ev = a.body.substr(pos, end - pos);
    pos = end + 2;
    if (ev.rfind("data: ", 0) != 0) continue;
    ev.erase(0, 6);
    json j = ev == "[DONE]" ? json("[DONE]") : json::parse(ev, nullptr, false);
    Normalize(j);
    events.push_back(std::move(j));
  }
  // Choices of a list of prompts (or n > 1) interleave as their tokens come, colocated or not:
  // compare each choice's events in order (a stable sort by choice index), then the usage chunk
  // and [DONE].
  auto key = [](const json& e) -> int64_t {
    if (e.is_object() && e.contains("choices") && e["choices"].is_array() &&
        !e["choices"].empty()) {
      return e["choices"][0].value("index", int64_t{0});
    }
    return std::numeric_limits<int64_t>::max();
  };
  std::vector<json> sorted(events.begin(), events.end());
  std::stable_sort(sorted.begin(), sorted.end(),
                   [&](const json& x, const json& y) { return key(x) < key(y); });
  return json(sorted);
}

/// Makes `body`'s prompt new to every instance (a preamble of ~40 tokens drawn from `salt`), so
/// that D holds no block of it and the whole prompt's KV, and P's first token, travel over the
/// connector (a prompt D has cached, or one shorter than a block, is computed on D itself).
json Uniquify(json body, uint32_t salt) {
  static const char* kWords[] = {"sun",  "cat",  "tree", "happy", "ball", "red",    "big", "mom",
                                 "park", "fish", "bird", "play",  "jump", "little", "toy", "dog"};
  uint32_t x = 2463534242u ^ (salt * 2654435761u);
  std::string pre;
  std::vector<int32_t> ids;
  for (int i = 0; i < 14; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    pre += std::string(kWords[x % 16]) + " ";
    ids.push_back(static_cast<int32_t>(3 + x % 500));
    ids.push_back(static_cast<int32_t>(3 + (x >> 9) % 500));
  }
  if (body.contains("messages")) {
    auto& m = body["messages"][0]["content"];
    m = pre + m.get<std::string>();
    return body;
  }
  auto one = [&](json& prompt) {
    if (prompt.is_string()) {
      prompt = pre + prompt.get<std::string>();
    } else {  // token ids: BOS, the preamble, the rest
      auto p = prompt.get<std::vector<int32_t>>();
      p.insert(p.begin() + 1, ids.begin(), ids.end());
      prompt = p;
    }
  };
  json& prompt = body["prompt"];
  if (prompt.is_array() && !prompt.empty() && !prompt[0].is_number()) {
    for (json& p : prompt) {  // a list: each prompt new (valid ones only)
      if ((p.is_string() && !p.get<std::string>().empty()) || (p.is_array() && !p.empty())) one(p);
    }
  } else {
    one(prompt);
  }
  return body;
}

/// One row of the table: the client body, its endpoint, and whether it must succeed.
struct Row {
  std::string label;
  std::string path;  ///< /v1/completions or /v1/chat/completions
  json body;
  int status = 200;  ///< what the colocated instance (and D) must answer
  /// A list of prompts: one request only through the router (which splits it into P/D requests);
  /// a single P/D leg takes one prompt.
  bool router_only = false;
};

class PdApiParity : public PdFixture {
 protected:
  void SetUp() override {
    PdFixture::SetUp();
    model_ = ModelOrGenerated();
    ASSERT_FALSE(model_.empty());
    const std::string cfg = KvCfg("ucx:tcp");
    const std::vector<std::string> details = {"--enable-prompt-tokens-details"};
    const int pc = Port(), pp = Port(), pd = Port();
    colo_ = Spawn("colocated", ServeArgs(model_, "both", host_, pc, "", details), host_, pc);
    p_ = Spawn("prefill", ServeArgs(model_, "prefill", host_, pp, cfg, details), host_, pp);
    d_ = Spawn("decode", ServeArgs(model_, "decode", host_, pd, cfg, details), host_, pd);
    ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({colo_, p_, d_}));
    const int pr = Port();
    router_ = Spawn("router",
                    {"router", "--prefill", p_->url(), "--decode", d_->url(), "--host", host_,
                     "--port", std::to_string(pr), "--log-level", "warn"},
                    host_, pr);
    const int prc = Port();
    router_colo_ = Spawn("router-colocated",
                         {"router", "--colocated", colo_->url(), "--host", host_, "--port",
                          std::to_string(prc), "--log-level", "warn"},
                         host_, prc);
    ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({router_, router_colo_}));
  }

  /// Runs `row` as a P/D request in `mode` (push | pull-fast | pull-vllm): D's answer.
  Answer RunPd(const Row& row, const std::string& mode) {
    if (mode == "router-colocated") return Post(*router_colo_, row.path, row.body);
    if (mode.rfind("router-", 0) == 0) {  // the same request through `kvpush router`
      return Post(*router_, row.path, row.body, {{"x-kvpush-mode", mode.substr(7)}});
    }
    const std::string tid = NewTransferId();
    const bool push = mode == "push";
    json p_leg = row.body;
    p_leg["max_tokens"] = 1;
    p_leg["stream"] = false;
    p_leg.erase("stream_options");
    p_leg.erase("max_completion_tokens");
    p_leg["kv_transfer_params"] = {{"do_remote_decode", true},
                                   {"do_remote_prefill", false},
                                   {"transfer_mode", push ? "push" : "pull"},
                                   {"transfer_id", tid}};
    json d_leg = row.body;
    if (push) {
      d_leg["kv_transfer_params"] = {{"do_remote_prefill", true}, {"do_remote_decode", false},
                                     {"transfer_mode", "push"},   {"transfer_id", tid},
                                     {"remote_host", p_->host},   {"remote_port", p_->port}};
      auto p_answer = std::async(std::launch::async, [&] { return Post(*p_, row.path, p_leg); });
      Answer d = Post(*d_, row.path, d_leg);
      Answer p = p_answer.get();
      if (row.status == 200) {
        EXPECT_EQ(p.status, 200) << row.label << " P leg: " << p.body;
      }
      if (d.status != 200) {  // as the router would: P frees what it holds at once
        (void)Post(*p_, "/kv/abort", json{{"transfer_id", tid}});
      }
      return d;
    }
    Answer p = Post(*p_, row.path, p_leg);
    if (p.status != 200) {
      EXPECT_NE(row.status, 200) << row.label << " P leg: " << p.body;
      // D refuses the same input with the same body (no KV needed to parse it); P gave no
      // pull parameters, so D gets a well-formed leg that names P.
      d_leg["kv_transfer_params"] = {{"do_remote_prefill", true}, {"do_remote_decode", false},
                                     {"transfer_mode", "push"},   {"transfer_id", tid},
                                     {"remote_host", p_->host},   {"remote_port", p_->port}};
      return Post(*d_, row.path, d_leg);
    }
    json pj = json::parse(p.body, nullptr, false);
    d_leg["kv_transfer_params"] = pj["kv_transfer_params"];
    d_leg["pull_profile"] = mode == "pull-fast" ? "fast" : "vllm";
    return Post(*d_, row.path, d_leg);
  }

  std::string model_;
  const std::string host_ = "127.0.0.1";
  Proc* colo_ = nullptr;
  Proc* p_ = nullptr;
  Proc* d_ = nullptr;
  Proc* router_ = nullptr;
  Proc* router_colo_ = nullptr;  ///< `kvpush router --colocated` over colo_
};

/// The table: ids = the colocated greedy tokens of "Once upon a time" (20 tokens), so rows can
/// name tokens that really occur.
std::vector<Row> Table(const std::vector<int32_t>& ids) {
  const std::string C = "/v1/completions", H = "/v1/chat/completions";
  const json base = {{"prompt", "Once upon a time"}, {"max_tokens", 20}, {"temperature", 0}};
  const json seeded = {
      {"prompt", "Once upon a time"}, {"max_tokens", 20}, {"temperature", 0.9}, {"seed", 1234}};
  const json chat = {{"messages", {{{"role", "user"}, {"content", "Tell me a story."}}}},
                     {"max_tokens", 16},
                     {"temperature", 0}};
  auto with = [](json b, const json& extra) {
    for (auto it = extra.begin(); it != extra.end(); ++it) b[it.key()] = it.value();
    return b;
  };
  const std::string t0 = std::to_string(ids[0]), t1 = std::to_string(ids[1]),
                    t2 = std::to_string(ids[2]);
  std::vector<Row> ok = {
      {"greedy", C, base},
      {"min_tokens 5 + stop ','", C, with(base, {{"min_tokens", 5}, {"stop", ","}})},
      {"stop_token_ids", C, with(base, {{"stop_token_ids", {ids[3]}}})},
      {"min_tokens + stop_token_ids", C,
       with(base, {{"min_tokens", 6}, {"stop_token_ids", {ids[0], ids[3]}}})},
      {"min_tokens = max_tokens + stop '.'", C, with(base, {{"min_tokens", 20}, {"stop", "."}})},
      {"min_tokens 1 max_tokens 1", C, with(base, {{"min_tokens", 1}, {"max_tokens", 1}})},
      // EOS (id 2) forced by logit_bias ends at once; min_tokens 5 holds it off for 5 tokens.
      {"forced EOS", C, with(base, {{"logit_bias", {{"2", 100}}}})},
      {"min_tokens holds off a forced EOS", C,
       with(base, {{"logit_bias", {{"2", 100}}}, {"min_tokens", 5}, {"return_token_ids", true}})},
      {"min_p 0.99", C, with(seeded, {{"min_p", 0.99}, {"temperature", 1.0}})},
      {"min_p 0.2", C, with(seeded, {{"min_p", 0.2}, {"temperature", 1.2}})},
      {"presence_penalty", C, with(base, {{"presence_penalty", 1.5}})},
      {"frequency_penalty", C, with(base, {{"frequency_penalty", 1.2}})},
      {"repetition_penalty 1.6", C, with(base, {{"repetition_penalty", 1.6}})},
      {"repetition_penalty 0.7 top_k", C,
       with(seeded, {{"repetition_penalty", 0.7}, {"top_k", 20}})},
      {"all penalties", C,
       with(seeded, {{"presence_penalty", 0.5},
                     {"frequency_penalty", 0.4},
                     {"repetition_penalty", 1.2},
                     {"top_p", 0.9},
                     {"min_p", 0.05}})},
      {"logit_bias -100 on the first token", C, with(base, {{"logit_bias", {{t0, -100}}}})},
      {"logit_bias seeded", C, with(seeded, {{"logit_bias", {{t1, 8}, {t2, -5.5}}}})},
      {"echo", C, with(base, {{"echo", true}})},
      {"echo token prompt", C,
       with(base, {{"echo", true}, {"prompt", {1, ids[0], ids[1], ids[2]}}})},
      {"logprobs + presence", C, with(base, {{"logprobs", 3}, {"presence_penalty", 0.8}})},
      {"min_tokens + stop id + logprobs seeded", C,
       with(seeded, {{"min_tokens", 10}, {"stop_token_ids", {ids[0]}}, {"logprobs", 2}})},
      {"n 1 + return_token_ids", C, with(base, {{"n", 1}, {"return_token_ids", true}})},
      {"long prompt repetition", C,
       with(seeded, {{"prompt",
                      "Once upon a time, there was a little girl named Lily. She loved "
                      "to play outside in the park with her friends every day."},
                     {"repetition_penalty", 1.3}})},
      {"chat min_tokens", H, with(chat, {{"min_tokens", 4}})},
      {"chat penalties logprobs", H,
       with(chat, {{"temperature", 0.8},
                   {"seed", 7},
                   {"frequency_penalty", 0.6},
                   {"repetition_penalty", 1.1},
                   {"logprobs", true},
                   {"top_logprobs", 2}})},
      {"chat logit_bias min_p", H,
       with(chat, {{"temperature", 1.0}, {"seed", 3}, {"min_p", 0.1}, {"logit_bias", {{t0, 3}}}})},
      {"chat stop_token_ids", H, with(chat, {{"stop_token_ids", {ids[1], ids[4]}}})},
      // n > 1: P prefills once, D forks the choices after the KV arrived (seed + j each).
      {"n 3 seeded", C, with(seeded, {{"n", 3}})},
      {"n 2 greedy + logprobs", C, with(base, {{"n", 2}, {"logprobs", 1}})},
      {"n 3 + min_tokens + stop id + penalties", C,
       with(seeded, {{"n", 3},
                     {"min_tokens", 3},
                     {"stop_token_ids", {ids[2]}},
                     {"frequency_penalty", 0.5}})},
      {"n 2 + echo + token ids", C,
       with(seeded, {{"n", 2}, {"echo", true}, {"return_token_ids", true}})},
      {"chat n 3", H, with(chat, {{"n", 3}, {"temperature", 0.8}, {"seed", 11}})},
      {"chat echo after an assistant message", H,
       with(chat, {{"echo", true},
                   {"messages",
                    {{{"role", "user"}, {"content", "Tell me a story."}},
                     {{"role", "assistant"}, {"content", "Once upon a time"}}}}})},
  };
  // Lists of prompts: the router runs one P/D request per prompt and merges the answers.
  const json list = with(
      base, {{"prompt", json::array({"Once upon a time", "The little dog", "Lily saw a bird"})},
             {"max_tokens", 12}});
  const json tok_a = json::array({1, ids[0], ids[1]}), tok_b = json::array({1, ids[2], ids[3]});
  const std::vector<Row> lists = {
      {"list of 3 prompts", C, list, 200, true},
      {"list of token prompts", C, with(base, {{"prompt", json::array({tok_a, tok_b})}}), 200,
       true},
      {"mixed list seeded + logprobs", C,
       with(seeded, {{"prompt", json::array({"Once upon a time", tok_b})}, {"logprobs", 2}}), 200,
       true},
      {"list + echo + stop", C, with(list, {{"echo", true}, {"stop", "."}}), 200, true},
      {"list + min_tokens + penalties + token ids", C,
       with(list, {{"min_tokens", 4}, {"presence_penalty", 0.7}, {"return_token_ids", true}}), 200,
       true},
      {"list of one prompt", C, with(base, {{"prompt", json::array({"Once upon a time"})}}), 200,
       true},
      {"list + n 2 seeded", C, with(list, {{"n", 2}, {"temperature", 0.9}, {"seed", 77}}), 200,
       true},
  };
  // Echo with logprobs: P computes the prompt's logprobs and answers them as prompt_echo, D gets
  // echo false, the router merges (docs/router.md). Through the router only: a D leg given echo
  // with logprobs refuses it (the direct legs here would need the router's merge).
  const std::vector<Row> echo_logprobs = {
      {"echo + logprobs", C, with(base, {{"echo", true}, {"logprobs", 2}}), 200, true},
      {"echo + logprobs 0 token prompt", C,
       with(base, {{"echo", true}, {"logprobs", 0}, {"prompt", {1, ids[0], ids[1], ids[2]}}}), 200,
       true},
      {"n 2 + echo + logprobs seeded", C,
       with(seeded, {{"n", 2}, {"echo", true}, {"logprobs", 3}, {"return_token_ids", true}}), 200,
       true},
      {"list + echo + logprobs", C, with(list, {{"echo", true}, {"logprobs", 1}}), 200, true},
      {"mixed list + n 2 + echo + logprobs", C,
       with(seeded, {{"prompt", json::array({"Once upon a time", tok_b})},
                     {"n", 2},
                     {"echo", true},
                     {"logprobs", 2}}),
       200, true},
  };
  std::vector<Row> ok_all = ok;
  ok_all.insert(ok_all.end(), lists.begin(), lists.end());
  ok_all.insert(ok_all.end(), echo_logprobs.begin(), echo_logprobs.end());
  std::vector<Row> rows;
  for (const Row& r : ok_all) {
    rows.push_back(r);
    Row st = r;
    st.label += " (stream)";
    st.body["stream"] = true;
    st.body["stream_options"] = {{"include_usage", true}};
    rows.push_back(std::move(st));
  }
  const std::vector<Row> bad = {
      {"min_p abc", C, with(base, {{"min_p", "abc"}}), 400},
      {"min_p 5", C, with(base, {{"min_p", 5}}), 400},
      {"presence_penalty 3", C, with(base, {{"presence_penalty", 3}}), 400},
      {"frequency_penalty x", C, with(base, {{"frequency_penalty", "x"}}), 400},
      {"repetition_penalty 0", C, with(base, {{"repetition_penalty", 0}}), 400},
      {"logit_bias key abc", C, with(base, {{"logit_bias", {{"abc", 1}}}}), 400},
      {"logit_bias out of vocabulary", C, with(base, {{"logit_bias", {{"1000000", 1}}}}), 400},
      {"logit_bias 200", C, with(base, {{"logit_bias", {{t0, 200}}}}), 400},
      {"min_tokens > max_tokens", C, with(base, {{"min_tokens", 30}, {"max_tokens", 10}}), 400},
      {"min_tokens -1", C, with(base, {{"min_tokens", -1}}), 400},
      {"use_beam_search", C, with(base, {{"use_beam_search", true}}), 400},
      {"best_of 3", C, with(base, {{"best_of", 3}}), 400},
      {"stop_token_ids out of vocabulary", C, with(base, {{"stop_token_ids", {1000000}}}), 400},
      {"n 0", C, with(base, {{"n", 0}}), 400},
      {"n 129", C, with(base, {{"n", 129}}), 400},
      {"n 2.5 (stream)", C, with(base, {{"n", 2.5}, {"stream", true}}), 400},
      {"chat echo not a boolean", H, with(chat, {{"echo", "yes"}}), 400},
      {"prompt_logprobs", C, with(base, {{"prompt_logprobs", 1}}), 400},
      {"list with an empty prompt", C, with(base, {{"prompt", json::array({"Once", ""})}}), 400,
       true},
      {"list with a token out of vocabulary", C,
       with(base, {{"prompt", json::array({"Once", json::array({1, 1000000})})}}), 400, true},
      {"list with a number", C, with(base, {{"prompt", json::array({"Once", 5})}}), 400, true},
      {"list + bad temperature", C, with(list, {{"temperature", -1}}), 400, true},
      {"list + min_tokens > max_tokens (stream)", C,
       with(list, {{"min_tokens", 13}, {"stream", true}}), 400, true},
  };
  rows.insert(rows.end(), bad.begin(), bad.end());
  return rows;
}

/// usage.prompt_tokens_details.cached_tokens of a non-streamed body; -1 when absent.
int64_t CachedTokens(const std::string& body) {
  json j = json::parse(body, nullptr, false);
  if (!j.is_object() || !j.contains("usage")) return -1;
  const json& d = j["usage"].value("prompt_tokens_details", json(nullptr));
  return d.is_object() ? d.value("cached_tokens", int64_t{-1}) : -1;
}

/// Values vLLM defines, checked on the P/D (or router) answer itself: choice k has index k
/// (n, lists: prompt x n + j); min_tokens holds off a forced EOS.
void ExpectVllmValues(const Row& row, const Answer& got, const std::string& who) {
  if (got.status != 200 || row.body.value("stream", false)) return;
  const json j = json::parse(got.body, nullptr, false);
  ASSERT_TRUE(j.is_object()) << who;
  const size_t prompts = row.body.contains("prompt") && row.body["prompt"].is_array() &&
                                 !row.body["prompt"].empty() && !row.body["prompt"][0].is_number()
                             ? row.body["prompt"].size()
                             : 1;
  EXPECT_EQ(j["choices"].size(), prompts * row.body.value("n", 1)) << who;
  for (size_t k = 0; k < j["choices"].size(); ++k) EXPECT_EQ(j["choices"][k]["index"], k) << who;
  if (row.label == "min_tokens holds off a forced EOS") {
    const auto ids = j["choices"][0]["token_ids"].get<std::vector<int32_t>>();
    ASSERT_EQ(ids.size(), 6u) << who;  // 5 held-off tokens, then the forced EOS
    for (size_t i = 0; i < 5; ++i) EXPECT_NE(ids[i], 2) << who;
    EXPECT_EQ(ids[5], 2) << who;
  }
}

TEST_F(PdApiParity, TableGivesTheColocatedBodyInPushAndPull) {
  Answer g = Post(*colo_, "/v1/completions",
                  {{"prompt", "Once upon a time"},
                   {"max_tokens", 20},
                   {"temperature", 0},
                   {"ignore_eos", true},
                   {"return_token_ids", true}});
  ASSERT_EQ(g.status, 200) << g.body;
  const auto ids = json::parse(g.body)["choices"][0]["token_ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(ids.size(), 20u);
  const std::vector<Row> rows = Table(ids);
  ASSERT_GE(rows.size(), 60u);

  // The legs sent directly (as pd_protocol.md §1 says the router builds them), then the same
  // table through the router.
  const std::vector<std::string> modes = {"push",
                                          "pull-fast",
                                          "pull-vllm",
                                          "router-push",
                                          "router-pull-fast",
                                          "router-pull-vllm",
                                          "router-colocated"};
  size_t compared = 0;
  for (size_t m = 0; m < modes.size(); ++m) {
    for (size_t i = 0; i < rows.size(); ++i) {
      Row row = rows[i];
      if (row.router_only && modes[m].rfind("router-", 0) != 0) continue;
      ++compared;
      row.body = Uniquify(row.body, static_cast<uint32_t>(m * 1000 + i));
      const std::string who = "[" + modes[m] + "] " + row.label;
      const Answer ref = Post(*colo_, row.path, row.body);
      ASSERT_EQ(ref.status, row.status) << who << ": " << ref.body;
      if (row.body.value("stream", false) && ref.status == 200) {
        EXPECT_EQ(ref.content_type, "text/event-stream; charset=utf-8") << who;
      }
      const Answer got = RunPd(row, modes[m]);
      EXPECT_EQ(got.status, ref.status) << who << ": " << got.body;
      EXPECT_EQ(got.content_type, ref.content_type) << who;
      EXPECT_EQ(Comparable(got), Comparable(ref))
          << who << "\n  colocated: " << ref.body << "\n  P/D:       " << got.body;
      ExpectVllmValues(row, got, who);
    }
  }
  std::printf("API parity table: %zu rows, %zu P/D or router requests compared with colocated\n",
              rows.size(), compared);
  EXPECT_GE(compared, 6 * 60u);

  // Echo with logprobs of a prompt D already holds (the second run: a full prefix hit on D,
  // which tells P it needs no KV): P still computes the prompt and its logprobs, and the answer
  // is still the colocated one.
  const json cached = {{"prompt",
                        "A tiny red bird sat on the old fence and sang a happy song for the kids "
                        "who walked by on their way to school."},
                       {"max_tokens", 6},
                       {"temperature", 0},
                       {"echo", true},
                       {"logprobs", 2}};
  const double not_needed0 = Metric(d_->host, d_->port, "kvpush_kv_transfer_not_needed_total");
  for (const std::string mode : {"router-push", "router-pull-fast", "router-pull-vllm"}) {
    for (bool stream : {false, true}) {
      Row row{"echo + logprobs, prompt cached on D", "/v1/completions", cached};
      if (stream) row.body["stream"] = true;
      const Answer ref = Post(*colo_, row.path, row.body);
      ASSERT_EQ(ref.status, 200) << ref.body;
      for (int run = 0; run < 2; ++run) {
        const Answer got = RunPd(row, mode);
        EXPECT_EQ(got.status, 200) << mode << " run " << run << ": " << got.body;
        EXPECT_EQ(Comparable(got), Comparable(ref))
            << mode << " stream " << stream << " run " << run << "\n  colocated: " << ref.body
            << "\n  P/D:       " << got.body;
      }
    }
  }
  // Every mode's second runs were full prefix hits on D (D told P it needs no KV): still equal.
  EXPECT_GE(Metric(d_->host, d_->port, "kvpush_kv_transfer_not_needed_total") - not_needed0, 6.0);

  // Push, the order that races above made certain: D (a full prefix hit) told P it needs no KV
  // before P's leg arrived. P still computes the prompt for its own answer: 200 with the
  // prompt_echo the router merges, equal to the colocated prompt part.
  {
    const std::string tid = NewTransferId();
    json d_leg = cached;
    d_leg["echo"] = false;
    d_leg["kv_transfer_params"] = {{"do_remote_prefill", true}, {"do_remote_decode", false},
                                   {"transfer_mode", "push"},   {"transfer_id", tid},
                                   {"remote_host", p_->host},   {"remote_port", p_->port}};
    const Answer d = Post(*d_, "/v1/completions", d_leg);
    ASSERT_EQ(d.status, 200) << d.body;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // NOT_NEEDED reaches P
    json p_leg = cached;
    p_leg["max_tokens"] = 1;
    p_leg["kv_transfer_params"] = {{"do_remote_decode", true},
                                   {"do_remote_prefill", false},
                                   {"transfer_mode", "push"},
                                   {"transfer_id", tid}};
    const Answer p = Post(*p_, "/v1/completions", p_leg);
    ASSERT_EQ(p.status, 200) << p.body;
    const json pj = json::parse(p.body);
    ASSERT_TRUE(pj.contains("prompt_echo")) << p.body;
    const json ref = json::parse(Post(*colo_, "/v1/completions", cached).body);
    const json& ref_lp = ref["choices"][0]["logprobs"];
    const json& echo_lp = pj["prompt_echo"]["logprobs"];
    const size_t n = ref["usage"]["prompt_tokens"].get<size_t>();
    ASSERT_EQ(echo_lp["tokens"].size(), n);
    for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
      EXPECT_EQ(echo_lp[k], json(std::vector<json>(ref_lp[k].begin(), ref_lp[k].begin() + n))) << k;
    }
    EXPECT_EQ(pj["prompt_echo"]["text"], cached["prompt"]);
  }
  // The prompts reached D over the connector (not recomputed there): KV-ready messages in push,
  // READs in pull.
  EXPECT_GE(Metric(d_->host, d_->port, kReady), 50.0);
  EXPECT_GE(Metric(d_->host, d_->port, kReads), 100.0);
}

TEST_F(PdApiParity, ColocatedValuesFollowVllm) {
  auto body_of = [&](const json& req) {
    Answer a = Post(*colo_, "/v1/completions", req);
    EXPECT_EQ(a.status, 200) << req.dump() << ": " << a.body;
    return json::parse(a.body, nullptr, false);
  };
  const json base = {{"prompt", "Once upon a time"},
                     {"max_tokens", 20},
                     {"temperature", 0},
                     {"return_token_ids", true}};
  json greedy = body_of(base);
  const auto ids = greedy["choices"][0]["token_ids"].get<std::vector<int32_t>>();
  ASSERT_FALSE(ids.empty());
  EXPECT_TRUE(greedy["system_fingerprint"].is_string());
  EXPECT_EQ(greedy["system_fingerprint"].get<std::string>().rfind("fp_", 0), 0u);

  // stop_token_ids: stop_reason is the id (an integer), finish_reason "stop".
  json stop_id = base;
  stop_id["stop_token_ids"] = {ids.back()};
  json s = body_of(stop_id)["choices"][0];
  EXPECT_EQ(s["finish_reason"], "stop");
  EXPECT_EQ(s["stop_reason"], ids.back());
  // min_tokens holds the stop id off: the first min_tokens tokens never contain it.
  json held = stop_id;
  held["stop_token_ids"] = {ids[0]};
  held["min_tokens"] = 5;
  const auto held_ids = body_of(held)["choices"][0]["token_ids"].get<std::vector<int32_t>>();
  ASSERT_GE(held_ids.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_NE(held_ids[i], ids[0]) << i;
  // The example: min_tokens 5 with stop "," gives at least 5 tokens.
  json comma = base;
  comma["min_tokens"] = 5;
  comma["stop"] = ",";
  EXPECT_GE(body_of(comma)["usage"]["completion_tokens"].get<int>(), 5);
  // min_p 0.99 at temperature 1 gives the greedy text.
  json minp = base;
  minp["temperature"] = 1.0;
  minp["seed"] = 99;
  minp["min_p"] = 0.99;
  EXPECT_EQ(body_of(minp)["choices"][0]["text"], greedy["choices"][0]["text"]);
  // echo: the prompt leads the text.
  json echo = base;
  echo["echo"] = true;
  EXPECT_EQ(body_of(echo)["choices"][0]["text"].get<std::string>(),
            "Once upon a time" + greedy["choices"][0]["text"].get<std::string>());
  // n = 3: indexes 0..2; choice j is the n = 1 request with seed + j (vLLM); prompt counted once.
  json n3 = base;
  n3["temperature"] = 0.9;
  n3["seed"] = 40;
  n3["n"] = 3;
  json many = body_of(n3);
  ASSERT_EQ(many["choices"].size(), 3u);
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(many["choices"][j]["index"], j);
    json one = n3;
    one.erase("n");
    one["seed"] = 40 + j;
    json single = body_of(one);
    EXPECT_EQ(many["choices"][j]["token_ids"], single["choices"][0]["token_ids"]) << j;
    if (j == 0) {
      EXPECT_EQ(many["usage"]["prompt_tokens"], single["usage"]["prompt_tokens"]);
    }
  }
  // A batch of 2 prompts with n = 2: 4 choices, prompt-major.
  json batch = n3;
  batch["prompt"] = {"Once upon a time", "The dog"};
  batch["n"] = 2;
  json b = body_of(batch);
  ASSERT_EQ(b["choices"].size(), 4u);
  for (int k = 0; k < 4; ++k) EXPECT_EQ(b["choices"][k]["index"], k);
  // n > 1 on a P leg: P prefills once and answers one choice (choice 0's first token); D forks
  // the rest (the table checks D's choices against colocated).
  json leg = n3;
  leg["max_tokens"] = 1;
  leg["kv_transfer_params"] = {
      {"do_remote_decode", true}, {"transfer_mode", "pull"}, {"transfer_id", NewTransferId()}};
  Answer p_answer = Post(*p_, "/v1/completions", leg);
  ASSERT_EQ(p_answer.status, 200) << p_answer.body;
  EXPECT_EQ(json::parse(p_answer.body)["choices"].size(), 1u);
}

TEST_F(PdApiParity, CachedTokensCountOnlyTheInstancesOwnPrefixCache) {
  // A prompt of 3 full blocks and a bit, new to every instance.
  const json req = {{"prompt",
                     "A tiny red bird sat on the old fence and sang a happy song for the kids who "
                     "walked by on their way to school in the morning sun."},
                    {"max_tokens", 4},
                    {"temperature", 0}};
  Answer c1 = Post(*colo_, "/v1/completions", req);
  Answer c2 = Post(*colo_, "/v1/completions", req);
  ASSERT_EQ(c1.status, 200);
  EXPECT_EQ(CachedTokens(c1.body), 0);
  const int64_t hit = CachedTokens(c2.body);
  EXPECT_GT(hit, 0);
  EXPECT_EQ(hit % 16, 0);
  // Push: every prompt token D holds arrived over the connector: 0 cached.
  Row row{"cached", "/v1/completions", req};
  Answer d1 = RunPd(row, "push");
  ASSERT_EQ(d1.status, 200) << d1.body;
  EXPECT_EQ(CachedTokens(d1.body), 0);
  // The same prompt again: now D's own prefix cache serves it, like the colocated second run.
  Answer d2 = RunPd(row, "push");
  EXPECT_EQ(CachedTokens(d2.body), hit);
  // Without --enable-prompt-tokens-details there is no prompt_tokens_details (checked on the
  // colocated body's shape: the flag is what adds it).
  EXPECT_TRUE(json::parse(c1.body)["usage"].contains("prompt_tokens_details"));
}

}  // namespace
}  // namespace kvpush::pd_test
