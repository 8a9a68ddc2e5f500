// CompletionHandler: serves one /v1/completions or /v1/chat/completions request: parse, tokenize,
// submit to the engine, then answer as one JSON body or as an SSE stream.
#pragma once

#include "server/openai_request.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace kvpush::server {

class HttpServer;

/// Stateless apart from the server reference; one call per HTTP request, on an HTTP thread.
class CompletionHandler {
 public:
  explicit CompletionHandler(HttpServer& server) : server_(server) {}

  /// Fills `res` (status, headers, body or chunked SSE provider). Never throws.
  void Handle(ApiKind kind, const httplib::Request& req, httplib::Response& res);

 private:
  HttpServer& server_;
};

}  // namespace kvpush::server
