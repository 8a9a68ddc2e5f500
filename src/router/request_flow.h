// RequestFlow: one completion request through the router — parse, mint ids, pick P and D, run
// the push or pull flow, relay D's answer, and make the two legs fail together (internal to the
// router library; behaviour in docs/router.md).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "router/instance_pool.h"
#include "router/leg.h"

namespace httplib {
struct Request;
struct Response;
class DataSink;
}  // namespace httplib

namespace kvpush::router {

class Router;

/// Handles POST /v1/completions and /v1/chat/completions on an HTTP worker thread. Short-lived:
/// one per request; what outlives Handle() (a push request's P-leg thread, a streamed answer) shares
/// the request's state through a shared pointer.
class RequestFlow {
 public:
  explicit RequestFlow(Router& router) : router_(router) {}
  void Handle(const httplib::Request& req, httplib::Response& res);

 private:
  struct Transfer;     // one request's legs and who failed first (request_flow.cc)
  struct StreamState;  // a streamed answer being relayed (request_flow.cc)

  /// Request id, mode, body, seed, transfer id. Replies (and returns false) on a bad request.
  bool ParseClient(const httplib::Request& req, httplib::Response& res, Transfer* t,
                   nlohmann::json* body, std::string* pull_profile);
  /// Push: runs P's leg on a thread of its own. False when the router is stopping.
  bool StartPushPrefill(std::shared_ptr<Transfer> t, InstanceLease lease, std::string body);
  static void RunPushPrefill(Router& r, Transfer& t, InstanceLease& lease,
                             const std::string& body);
  /// Pull: runs P's leg on this thread; D's body, or nullopt after replying P's failure.
  std::optional<nlohmann::json> RunPullPrefill(Transfer& t, InstanceLease& lease,
                                               const nlohmann::json& body,
                                               const std::string& pull_profile,
                                               httplib::Response& res);
  void AnswerJson(const std::shared_ptr<Transfer>& t, const nlohmann::json& d_body,
                  InstanceLease d_lease, httplib::Response& res);
  void AnswerStream(const std::shared_ptr<Transfer>& t, const nlohmann::json& d_body,
                    InstanceLease d_lease, httplib::Response& res);
  /// D's leg failed before its answer was committed: the client gets D's error, P aborts.
  void DecodeFailed(Transfer& t, InstanceLease& d_lease, const LegResult& dr,
                    httplib::Response& res);
  /// D's leg failed or the client left: closes P's leg (push) and has P abort the transfer.
  static void AbortPrefill(Router& r, Transfer& t);
  /// The streamed answer's content provider and releaser.
  static bool Pump(Router& r, StreamState& st, httplib::DataSink& sink);
  static void EndStream(Router& r, StreamState& st);

  Router& router_;
};

}  // namespace kvpush::router
