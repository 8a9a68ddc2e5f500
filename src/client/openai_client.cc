#include "client/openai_client.h"

#include <httplib.h>

#include <utility>

#include "common/clock.h"

namespace kvpush {

namespace {

void ConfigureTimeouts(httplib::Client& cli, double timeout_s) {
  cli.set_tcp_nodelay(true);  // no Nagle delay on small requests (TTFT is measured through it)
  const auto sec = static_cast<time_t>(timeout_s);
  const auto usec = static_cast<time_t>((timeout_s - static_cast<double>(sec)) * 1e6);
  cli.set_connection_timeout(sec, usec);
  cli.set_read_timeout(sec, usec);
  cli.set_write_timeout(sec, usec);
}

// Applies one SSE `data:` payload to the result; returns false at [DONE].
bool ApplyEvent(const std::string& data, StreamedCompletion& out) {
  if (data == "[DONE]") return false;
  auto j = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    out.error = "malformed SSE event: " + data.substr(0, 200);
    return true;
  }
  if (j.contains("error")) {
    const auto& e = j["error"];
    out.error = e.is_object() && e.contains("message") && e["message"].is_string()
                    ? e["message"].get<std::string>()
                    : e.dump();
    return true;
  }
  if (j.contains("usage") && j["usage"].is_object()) {
    const auto& u = j["usage"];
    if (u.contains("prompt_tokens") && u["prompt_tokens"].is_number_integer()) {
      out.prompt_tokens = u["prompt_tokens"].get<int64_t>();
    }
    if (u.contains("completion_tokens") && u["completion_tokens"].is_number_integer()) {
      out.completion_tokens = u["completion_tokens"].get<int64_t>();
    }
  }
  if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
    const auto& c = j["choices"][0];
    std::string delta;
    if (c.contains("text") && c["text"].is_string()) delta = c["text"].get<std::string>();
    if (c.contains("delta") && c["delta"].is_object() && c["delta"].contains("content") &&
        c["delta"]["content"].is_string()) {
      delta = c["delta"]["content"].get<std::string>();
    }
    bool has_token = !delta.empty() || (c.contains("logprobs") && !c["logprobs"].is_null());
    if (c.contains("token_ids") && c["token_ids"].is_array()) {
      for (const auto& t : c["token_ids"]) {
        if (t.is_number_integer()) out.token_ids.push_back(t.get<int32_t>());
      }
      has_token = has_token || !c["token_ids"].empty();
    }
    if (has_token) out.chunk_ns.push_back(NowNs());
    out.text += delta;
    if (c.contains("finish_reason") && c["finish_reason"].is_string()) {
      out.finish_reason = c["finish_reason"].get<std::string>();
    }
  }
  return true;
}

}  // namespace

double StreamedCompletion::TtftMs() const {
  if (chunk_ns.empty()) return -1.0;
  return NsToMs(chunk_ns.front() - start_ns);
}

double StreamedCompletion::TpotMs() const {
  const int64_t n =
      completion_tokens >= 0 ? completion_tokens : static_cast<int64_t>(chunk_ns.size());
  if (n < 2 || chunk_ns.size() < 2) return -1.0;
  return NsToMs(chunk_ns.back() - chunk_ns.front()) / static_cast<double>(n - 1);
}

OpenAiClient::OpenAiClient(std::string host, int port, double timeout_s)
    : host_(std::move(host)), port_(port), timeout_s_(timeout_s) {}

Result<std::string> OpenAiClient::Get(const std::string& path) const {
  httplib::Client cli(host_, port_);
  if (!api_key_.empty()) cli.set_bearer_token_auth(api_key_);
  ConfigureTimeouts(cli, timeout_s_);
  auto res = cli.Get(path.c_str());
  if (!res) {
    return Unavailable("GET " + path + " to " + host_ + ":" + std::to_string(port_) + ": " +
                       httplib::to_string(res.error()));
  }
  if (res->status != 200) {
    return Internal("GET " + path + ": HTTP " + std::to_string(res->status) + ": " + res->body);
  }
  return res->body;
}

Result<nlohmann::json> OpenAiClient::PostJson(const std::string& path, const nlohmann::json& body,
                                              int* status) const {
  httplib::Client cli(host_, port_);
  if (!api_key_.empty()) cli.set_bearer_token_auth(api_key_);
  ConfigureTimeouts(cli, timeout_s_);
  auto res = cli.Post(path.c_str(), body.dump(), "application/json");
  if (!res) {
    return Unavailable("POST " + path + " to " + host_ + ":" + std::to_string(port_) + ": " +
                       httplib::to_string(res.error()));
  }
  if (status != nullptr) *status = res->status;
  auto j = nlohmann::json::parse(res->body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return DataLoss("POST " + path + ": HTTP " + std::to_string(res->status) +
                    " with a non-JSON body: " + res->body.substr(0, 200));
  }
  return j;
}

Result<StreamedCompletion> OpenAiClient::Stream(
    const std::string& path, nlohmann::json body,
    const std::vector<std::pair<std::string, std::string>>& headers) const {
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  httplib::Client cli(host_, port_);
  if (!api_key_.empty()) cli.set_bearer_token_auth(api_key_);
  ConfigureTimeouts(cli, timeout_s_);

  StreamedCompletion out;
  std::string buffer;
  std::string error_body;
  bool done = false;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  for (const auto& [k, v] : headers) req.set_header(k, v);
  req.response_handler = [&](const httplib::Response& r) {
    out.http_status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    if (out.http_status != 200) {
      error_body.append(data, len);
      return true;
    }
    buffer.append(data, len);
    // Events are separated by a blank line; each line of interest is "data: <payload>".
    size_t pos;
    while (!done && (pos = buffer.find("\n\n")) != std::string::npos) {
      std::string event = buffer.substr(0, pos);
      buffer.erase(0, pos + 2);
      size_t start = 0;
      while (start <= event.size()) {
        size_t eol = event.find('\n', start);
        std::string line =
            event.substr(start, eol == std::string::npos ? std::string::npos : eol - start);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.rfind("data:", 0) == 0) {
          std::string payload = line.substr(5);
          if (!payload.empty() && payload.front() == ' ') payload.erase(0, 1);
          if (!ApplyEvent(payload, out)) done = true;
        }
        if (eol == std::string::npos) break;
        start = eol + 1;
      }
    }
    return true;
  };
  out.start_ns = NowNs();
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool ok = cli.send(req, res, err);
  out.end_ns = NowNs();
  if (!ok) {
    return Unavailable("POST " + path + " to " + host_ + ":" + std::to_string(port_) + ": " +
                       httplib::to_string(err));
  }
  if (out.http_status == 0) out.http_status = res.status;
  if (out.http_status != 200) {
    auto j = nlohmann::json::parse(error_body.empty() ? res.body : error_body, nullptr, false);
    if (!j.is_discarded() && j.contains("error") && j["error"].is_object() &&
        j["error"].contains("message") && j["error"]["message"].is_string()) {
      out.error = j["error"]["message"].get<std::string>();
    } else {
      out.error = (error_body.empty() ? res.body : error_body).substr(0, 500);
    }
  } else if (!done && out.error.empty()) {
    out.error = "stream ended without [DONE]";
  }
  return out;
}

}  // namespace kvpush
