// RequestFlow: one completion request through the router — parse, mint ids, pick P and D, run
// the push or pull flow, relay D's answer (internal to the router library).
#pragma once

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace kvpush::router {

class Router;

/// Handles POST /v1/completions and /v1/chat/completions on an HTTP worker thread. Short-lived:
/// one per request; what outlives Handle() (a streamed answer) is owned by the response.
class RequestFlow {
 public:
  explicit RequestFlow(Router& router) : router_(router) {}
  void Handle(const httplib::Request& req, httplib::Response& res);

 private:
  Router& router_;
};

}  // namespace kvpush::router
