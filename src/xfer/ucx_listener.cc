// The UCX backend's client-server wire-up (tcp preset; docs/xfer.md "Wire-up"): the ucp_listener
// every agent opens, the endpoints it creates from its peers' connection requests, and the
// sockaddr form of the address blob.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <ucp/api/ucp.h>

#include <cstring>

#include "xfer/ucx_backend_internal.h"

namespace kvpush::xfer::ucx_internal {

Result<sockaddr_storage> ListenAddressFor(const std::string& devices) {
  sockaddr_storage ss{};
  std::string dev = devices.substr(0, devices.find(','));
  dev = dev.substr(0, dev.find(':'));  // "mlx5_0:1" names a port of a device
  if (dev == "all") {
    return InvalidArgument(
        "ucx:tcp: UCX_NET_DEVICES=all names no one address to listen on: name the device that "
        "reaches the peers (e.g. eth0)");
  }
  if (dev.empty() || dev == "lo") {
    auto* in = reinterpret_cast<sockaddr_in*>(&ss);
    in->sin_family = AF_INET;
    in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return ss;
  }
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0)
    return Unavailable("ucx: getifaddrs: " + std::string(strerror(errno)));
  bool found = false;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || dev != a->ifa_name) continue;
    const int family = a->ifa_addr->sa_family;
    if (family == AF_INET) {
      std::memcpy(&ss, a->ifa_addr, sizeof(sockaddr_in));
      found = true;
      break;  // IPv4 first
    }
    if (family == AF_INET6 && !found) {
      auto* in6 = reinterpret_cast<const sockaddr_in6*>(a->ifa_addr);
      if (IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr)) continue;  // would need a scope id
      std::memcpy(&ss, a->ifa_addr, sizeof(sockaddr_in6));
      found = true;
    }
  }
  freeifaddrs(list);
  if (!found) return Unavailable("ucx: device '" + dev + "' (UCX_NET_DEVICES) has no IP address");
  return ss;
}

std::vector<uint8_t> PackSockaddr(const sockaddr_storage& ss) {
  std::vector<uint8_t> out(kSockaddrBytes, 0);
  const uint16_t family = ss.ss_family;
  std::memcpy(out.data(), &family, 2);
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    std::memcpy(out.data() + 2, &in->sin_port, 2);
    std::memcpy(out.data() + 4, &in->sin_addr, 4);
  } else {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    std::memcpy(out.data() + 2, &in6->sin6_port, 2);
    std::memcpy(out.data() + 4, &in6->sin6_addr, 16);
  }
  return out;
}

Result<sockaddr_storage> ParseSockaddr(std::span<const uint8_t> blob, socklen_t* len) {
  if (blob.size() != kSockaddrBytes) return InvalidArgument("ucx: address: bad sockaddr length");
  sockaddr_storage ss{};
  uint16_t family = 0;
  std::memcpy(&family, blob.data(), 2);
  if (family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&ss);
    in->sin_family = AF_INET;
    std::memcpy(&in->sin_port, blob.data() + 2, 2);
    std::memcpy(&in->sin_addr, blob.data() + 4, 4);
    *len = sizeof(sockaddr_in);
  } else if (family == AF_INET6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
    in6->sin6_family = AF_INET6;
    std::memcpy(&in6->sin6_port, blob.data() + 2, 2);
    std::memcpy(&in6->sin6_addr, blob.data() + 4, 16);
    *len = sizeof(sockaddr_in6);
  } else {
    return InvalidArgument("ucx: address: sockaddr family " + std::to_string(family));
  }
  return ss;
}

Status UcxBackend::StartListener(const std::string& devices) {
  KVP_ASSIGN_OR_RETURN(sockaddr_storage ss, ListenAddressFor(devices));
  ucp_listener_params_t lp{};
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&ss);
  lp.sockaddr.addrlen = ss.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  lp.conn_handler.cb = &UcxBackend::OnConnRequest;
  lp.conn_handler.arg = this;
  ucs_status_t s = ucp_listener_create(worker_, &lp, &listener_);
  if (s != UCS_OK) return FromUcs(s, "ucp_listener_create");
  ucp_listener_attr_t la{};
  la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  s = ucp_listener_query(listener_, &la);
  if (s != UCS_OK) return FromUcs(s, "ucp_listener_query");
  listen_addr_ = la.sockaddr;  // the port the kernel chose
  return Status::Ok();
}

void UcxBackend::OnConnRequest(ucp_conn_request_h request, void* arg) {
  auto* self = static_cast<UcxBackend*>(arg);
  self->shell_.mu().AssertHeld();  // UCX calls back from ucp_worker_progress
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.conn_request = request;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &UcxBackend::OnAcceptedEpError;
  ep.err_handler.arg = self;
  ucp_ep_h h = nullptr;
  // On failure (the peer gone already, or out of resources) UCX 1.13 has rejected and freed the
  // request itself (ucp_ep.c: ucp_ep_create_server_accept; wireup_cm.c): it must not be touched
  // again, and the peer's endpoint fails as a connection error.
  if (ucp_ep_create(self->worker_, &ep, &h) == UCS_OK) self->accepted_.insert(h);
}

void UcxBackend::OnAcceptedEpError(void* arg, ucp_ep_h ep, ucs_status_t) {
  auto* self = static_cast<UcxBackend*>(arg);
  self->shell_.mu().AssertHeld();  // UCX calls back from ucp_worker_progress
  // The peer's own endpoint (this one's other end) reports the failure to its agent; here the
  // endpoint is only closed, after the progress call that reported it (ReapAccepted).
  self->accepted_failed_.push_back(ep);
}

void UcxBackend::CloseAccepted(ucp_ep_h ep, bool failed) {
  if (accepted_.erase(ep) == 0) return;
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = failed ? UCP_EP_CLOSE_FLAG_FORCE : 0;  // as CloseEp
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &param);
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) closing_.push_back(r);
}

void UcxBackend::ReapAccepted() {
  std::vector<ucp_ep_h> failed;
  failed.swap(accepted_failed_);
  for (ucp_ep_h ep : failed) CloseAccepted(ep, true);
}

}  // namespace kvpush::xfer::ucx_internal
