// One error vocabulary (issue 13): the same bad input gets the same status, Content-Type, Allow
// header and body (`message`, `type`, `param`, `code`) from a colocated instance, from the router
// in P/D mode (push and pull) and from the router in colocated mode. Covers httplib's own errors
// (malformed HTTP, a bad chunked body, 404, 405, 413 over 8 MiB, 414), malformed JSON, a missing
// body, and field errors that reach the instances (a wrong type, an unknown model, a client's
// kv_transfer_params). Requests are written byte for byte on a raw socket, so malformed HTTP
// reaches the servers as sent.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "pd_fixture.h"

namespace kvpush::pd_test {
namespace {

/// One raw HTTP answer.
struct RawAnswer {
  int status = 0;
  std::string content_type;
  std::string allow;
  std::string body;
  std::string raw;  ///< the whole answer, for failure messages
};

/// The value of header `name` (lowercase) in `head_lines` (status line and headers), or "".
std::string HeaderValue(const std::string& head_lines, const std::string& name) {
  const std::string head = head_lines + "\r\n";
  size_t pos = 0;
  while ((pos = head.find("\r\n", pos)) != std::string::npos) {
    pos += 2;
    const size_t colon = head.find(':', pos);
    const size_t eol = head.find("\r\n", pos);
    if (colon == std::string::npos || eol == std::string::npos || colon > eol) continue;
    std::string key = head.substr(pos, colon - pos);
    for (char& c : key) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (key != name) continue;
    std::string v = head.substr(colon + 1, eol - colon - 1);
    while (!v.empty() && v.front() == ' ') v.erase(0, 1);
    return v;
  }
  return "";
}

/// True once `raw` holds a whole answer (Content-Length or chunked), so the reader need not wait
/// for the server to close.
bool Complete(const std::string& raw) {
  const size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos) return false;
  const std::string head = raw.substr(0, head_end);
  const std::string len = HeaderValue(head, "content-length");
  if (!len.empty()) return raw.size() >= head_end + 4 + std::stoul(len);
  if (HeaderValue(head, "transfer-encoding") == "chunked") {
    return raw.size() >= 5 && raw.compare(raw.size() - 5, 5, "0\r\n\r\n") == 0;
  }
  return false;  // close-delimited
}

/// Writes `request` to host:port as is and reads until the server closes (10 s at most).
RawAnswer SendRaw(const std::string& host, int port, const std::string& request) {
  RawAnswer a;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    a.raw = "connect failed";
    return a;
  }
  size_t off = 0;
  while (off < request.size()) {
    const ssize_t w = ::send(fd, request.data() + off, request.size() - off, MSG_NOSIGNAL);
    if (w <= 0) break;  // the server may answer (413) and close before reading everything
    off += static_cast<size_t>(w);
  }
  char buf[65536];
  while (!Complete(a.raw)) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 10000) <= 0) break;
    const ssize_t r = ::recv(fd, buf, sizeof(buf), 0);
    if (r <= 0) break;
    a.raw.append(buf, static_cast<size_t>(r));
  }
  ::close(fd);
  const size_t head_end = a.raw.find("\r\n\r\n");
  if (a.raw.rfind("HTTP/1.1 ", 0) != 0 || head_end == std::string::npos) return a;
  a.status = std::stoi(a.raw.substr(9, 3));
  const std::string head = a.raw.substr(0, head_end);
  a.content_type = HeaderValue(head, "content-type");
  a.allow = HeaderValue(head, "allow");
  a.body = a.raw.substr(head_end + 4);
  if (HeaderValue(head, "transfer-encoding") == "chunked") {  // de-chunk
    std::string out;
    size_t pos = 0;
    for (;;) {
      const size_t eol = a.body.find("\r\n", pos);
      if (eol == std::string::npos) break;
      const size_t len = std::stoul(a.body.substr(pos, eol - pos), nullptr, 16);
      if (len == 0) break;
      out += a.body.substr(eol + 2, len);
      pos = eol + 2 + len + 2;
    }
    a.body = out;
  }
  return a;
}

/// A request with a JSON (or any) body.
std::string PostRequest(const std::string& path, const std::string& body,
                        const std::string& method = "POST") {
  return method + " " + path +
         " HTTP/1.1\r\nHost: kvpush\r\nConnection: close\r\nContent-Type: "
         "application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

std::string Bare(const std::string& method, const std::string& path) {
  return method + " " + path + " HTTP/1.1\r\nHost: kvpush\r\nConnection: close\r\n\r\n";
}

/// One bad input and the status every front door must answer it with.
struct Case {
  std::string label;
  std::string request;
  int status;
  std::string code;  ///< the error's `code` ("" = null)
};

std::vector<Case> Cases() {
  const std::string C = "/v1/completions", H = "/v1/chat/completions";
  std::string big = R"({"prompt": ")" + std::string(9400000, 'a') + R"("})";
  const std::string pd_leg =
      R"({"prompt":"Once","kv_transfer_params":{"do_remote_decode":true,"transfer_mode":"push",)"
      R"("transfer_id":"0123456789abcdef0123456789abcdef"}})";
  return {
      {"malformed JSON", PostRequest(C, "{\"prompt\": "), 400, "invalid_json"},
      {"malformed JSON (chat)", PostRequest(H, "{]"), 400, "invalid_json"},
      {"non-object body", PostRequest(C, "[1, 2]"), 400, "invalid_json"},
      {"empty body", PostRequest(C, ""), 400, "invalid_json"},
      // No Content-Length on a POST (what `curl -X POST` without -d sends): an empty body (RFC
      // 9112 §6.3; the front door's loop writes Content-Length: 0), so the empty body's answer.
      {"POST without a body", Bare("POST", C), 400, "invalid_json"},
      {"malformed request line", "GARBAGE\r\n\r\n", 400, ""},
      {"bad chunked body",
       "POST " + C +
           " HTTP/1.1\r\nHost: kvpush\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
           "zz\r\nxx\r\n",
       400, ""},
      {"unknown path", Bare("GET", "/nope"), 404, "not_found"},
      {"unknown POST path", PostRequest("/v1/nope", "{}"), 404, "not_found"},
      {"GET on completions", Bare("GET", C), 405, "method_not_allowed"},
      {"DELETE on chat", Bare("DELETE", H), 405, "method_not_allowed"},
      {"POST on models", PostRequest("/v1/models", "{}"), 405, "method_not_allowed"},
      {"PUT on health", PostRequest("/health", "{}", "PUT"), 405, "method_not_allowed"},
      {"body over 8 MiB", PostRequest(C, big), 413, ""},
      {"URI too long", Bare("GET", "/v1/models?" + std::string(20000, 'q')), 414, ""},
      {"wrong field type", PostRequest(C, R"({"prompt":"Once","temperature":"hot"})"), 400, ""},
      {"missing prompt", PostRequest(C, R"({"max_tokens":4})"), 400, "missing_required_parameter"},
      {"unknown model", PostRequest(C, R"({"prompt":"Once","model":"gpt-4"})"), 404,
       "model_not_found"},
      {"unknown model (chat, stream)",
       PostRequest(H, R"({"messages":[{"role":"user","content":"hi"}],"model":"x","stream":true})"),
       404, "model_not_found"},
      {"min_p out of range (stream)",
       PostRequest(C, R"({"prompt":"Once","min_p":5,"stream":true})"), 400, ""},
      {"a client's kv_transfer_params", PostRequest(C, pd_leg), 400, ""},
  };
}

/// A front door: an instance or router port and the extra request headers (the router's mode).
struct Door {
  std::string name;
  Proc* proc;
  std::string headers;
};

class PdErrorVocabulary : public PdFixture {
 protected:
  /// A colocated instance (the reference), and routers in push, pull and colocated mode.
  void StartDoors() {
    const std::string model = ModelOrGenerated();
    ASSERT_FALSE(model.empty());
    const std::string cfg = KvCfg("ucx:tcp");
    const int pc = Port(), pp = Port(), pd = Port();
    colo_ = Spawn("colocated", ServeArgs(model, "both", host_, pc, ""), host_, pc);
    Proc* p = Spawn("prefill", ServeArgs(model, "prefill", host_, pp, cfg), host_, pp);
    Proc* d = Spawn("decode", ServeArgs(model, "decode", host_, pd, cfg), host_, pd);
    ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({colo_, p, d}));
    const int rp = Port(), rc = Port();
    Proc* router = Spawn("router",
                         {"router", "--prefill", p->url(), "--decode", d->url(), "--host", host_,
                          "--port", std::to_string(rp), "--log-level", "warn"},
                         host_, rp);
    Proc* router_colo = Spawn("router-colocated",
                              {"router", "--colocated", colo_->url(), "--host", host_, "--port",
                               std::to_string(rc), "--log-level", "warn"},
                              host_, rc);
    ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({router, router_colo}));
    doors_ = {{"router push", router, "x-kvpush-mode: push\r\n"},
              {"router pull", router, "x-kvpush-mode: pull\r\n"},
              {"router colocated", router_colo, ""}};
  }

  /// `request` as `door` receives it: its headers after the request line (not into a malformed
  /// one).
  static std::string ForDoor(const Door& door, std::string request) {
    if (!door.headers.empty() && request.rfind("GARBAGE", 0) != 0) {
      request.insert(request.find("\r\n") + 2, door.headers);
    }
    return request;
  }

  const std::string host_ = "127.0.0.1";
  Proc* colo_ = nullptr;
  std::vector<Door> doors_;
};

TEST_F(PdErrorVocabulary, RouterAndInstancesAnswerBadInputAlike) {
  ASSERT_NO_FATAL_FAILURE(StartDoors());
  const std::string& host = host_;
  Proc* colo = colo_;
  const std::vector<Door>& doors = doors_;
  int compared = 0;
  for (const Case& c : Cases()) {
    const RawAnswer ref = SendRaw(host, colo->port, c.request);
    ASSERT_EQ(ref.status, c.status) << c.label << ": " << ref.raw.substr(0, 400);
    EXPECT_EQ(ref.content_type, "application/json") << c.label;
    const json err = json::parse(ref.body, nullptr, false);
    ASSERT_TRUE(err.is_object() && err.contains("error")) << c.label << ": " << ref.body;
    EXPECT_EQ(err["error"]["code"], c.code.empty() ? json(nullptr) : json(c.code)) << c.label;
    EXPECT_EQ(err["error"]["type"], "invalid_request_error") << c.label;
    for (const Door& door : doors) {
      const RawAnswer got = SendRaw(host, door.proc->port, ForDoor(door, c.request));
      const std::string who = "[" + door.name + "] " + c.label;
      EXPECT_EQ(got.status, ref.status) << who << ": " << got.raw.substr(0, 400);
      EXPECT_EQ(got.content_type, ref.content_type) << who;
      EXPECT_EQ(got.allow, ref.allow) << who;
      EXPECT_EQ(got.body, ref.body) << who;
      ++compared;
    }
  }
  EXPECT_EQ(compared, static_cast<int>(Cases().size() * doors.size()));
}

// POST /tokenize and /detokenize through the router are one instance's answer, byte for byte
// (the router forwards them to a decode or colocated instance), good input and bad.
TEST_F(PdErrorVocabulary, TokenizeThroughTheRouterIsTheInstancesAnswer) {
  ASSERT_NO_FATAL_FAILURE(StartDoors());
  const std::vector<std::pair<std::string, int>> cases = {
      {PostRequest("/tokenize", R"({"prompt":"Once upon a time"})"), 200},
      {PostRequest("/tokenize", R"({"prompt":"Once","add_special_tokens":false,)"
                                R"("return_token_strs":true})"),
       200},
      {PostRequest("/tokenize", R"({"messages":[{"role":"system","content":"Be brief."},)"
                                R"({"role":"user","content":"Hi"}]})"),
       200},
      {PostRequest("/detokenize", R"({"tokens":[1, 403, 407, 261]})"), 200},
      {PostRequest("/tokenize", R"({"prompt":7})"), 400},
      {PostRequest("/tokenize", R"({"messages":[]})"), 400},
      {PostRequest("/detokenize", R"({"tokens":[-1]})"), 400},
      {PostRequest("/tokenize", R"({"prompt":"a","model":"gpt-4"})"), 404},
      {Bare("GET", "/tokenize"), 405},
  };
  for (const auto& [request, status] : cases) {
    const RawAnswer ref = SendRaw(host_, colo_->port, request);
    ASSERT_EQ(ref.status, status) << request << " -> " << ref.raw.substr(0, 400);
    for (const Door& door : doors_) {
      const RawAnswer got = SendRaw(host_, door.proc->port, ForDoor(door, request));
      EXPECT_EQ(got.status, ref.status) << door.name << ": " << request;
      EXPECT_EQ(got.content_type, ref.content_type) << door.name << ": " << request;
      EXPECT_EQ(got.allow, ref.allow) << door.name << ": " << request;
      EXPECT_EQ(got.body, ref.body) << door.name << ": " << request;
    }
  }
}

}  // namespace
}  // namespace kvpush::pd_test
