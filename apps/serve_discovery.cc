#include "apps/serve_discovery.h"

#include <unistd.h>

#include <chrono>
#include <random>

#include "router/instance_pool.h"

namespace kvpush::apps {
namespace {

bool Wildcard(const std::string& host) {
  return host == "0.0.0.0" || host == "::" || host == "[::]" || host.empty();
}

}  // namespace

void AddServeDiscoveryFlags(CLI::App* cmd, ServeDiscoveryFlags* f) {
  cmd->add_option("--discovery", f->discovery,
                  "etcd://HOST:PORT[,HOST:PORT...]: register this instance in etcd discovery "
                  "while it is healthy (docs/deployment.md)");
  cmd->add_option("--advertise-url", f->advertise_url,
                  "With --discovery: the http[s]://HOST:PORT routers reach this instance at "
                  "(default: the bound --host and port, https with --ssl-certfile; required "
                  "when binding 0.0.0.0)");
  cmd->add_option("--discovery-prefix", f->prefix, "etcd key prefix to register under")
      ->capture_default_str();
  cmd->add_option("--discovery-lease-ttl-s", f->lease_ttl_s,
                  "TTL of the etcd lease (renewed every ttl/3 while healthy); a killed instance "
                  "leaves discovery within this")
      ->capture_default_str();
}

Status ValidateServeDiscoveryFlags(const ServeDiscoveryFlags& f, const std::string& host,
                                   bool https) {
  if (f.discovery.empty()) {
    if (!f.advertise_url.empty()) return InvalidArgument("--advertise-url needs --discovery");
    return Status::Ok();
  }
  KVP_RETURN_IF_ERROR(discovery::ParseDiscoveryUrl(f.discovery).status());
  KVP_RETURN_IF_ERROR(discovery::ValidatePrefix(f.prefix));
  if (f.lease_ttl_s < 2 || f.lease_ttl_s > 3600) {
    return InvalidArgument("--discovery-lease-ttl-s must be in [2, 3600]");
  }
  if (!f.advertise_url.empty()) {
    auto a = router::ParseInstanceUrl(f.advertise_url);
    if (!a.ok()) return InvalidArgument("--advertise-url: " + a.status().message());
    if (Wildcard(a->host)) return InvalidArgument("--advertise-url must name a reachable host");
    if (a->https != https) {
      return InvalidArgument(
          std::string("--advertise-url ") + f.advertise_url + ": this instance " +
          (https ? "serves HTTPS only (--ssl-certfile): give https://HOST:PORT"
                 : "serves plain HTTP (no --ssl-certfile): give http://HOST:PORT"));
    }
  } else if (Wildcard(host)) {
    return InvalidArgument("--discovery with --host " + host + " needs --advertise-url " +
                           (https ? "https" : "http") + "://HOST:PORT (an address routers reach)");
  }
  return Status::Ok();
}

Result<std::unique_ptr<discovery::Registration>> StartServeRegistration(
    const ServeDiscoveryFlags& f, const ServeIdentity& id, std::function<bool()> healthy) {
  if (f.discovery.empty()) return std::unique_ptr<discovery::Registration>();
  KVP_RETURN_IF_ERROR(ValidateServeDiscoveryFlags(f, id.host, id.https));
  discovery::RegistrationOptions ro;
  ro.endpoints = *discovery::ParseDiscoveryUrl(f.discovery);
  ro.prefix = f.prefix;
  ro.ttl_s = f.lease_ttl_s;
  ro.healthy = std::move(healthy);
  discovery::InstanceRecord& r = ro.record;
  r.role = id.role;
  r.model = id.model;
  r.url = !f.advertise_url.empty() ? router::ParseInstanceUrl(f.advertise_url)->url
                                   : std::string(id.https ? "https://" : "http://") + id.host +
                                         ":" + std::to_string(id.port);
  r.compat_hash = id.compat_hash;
  r.incarnation = id.incarnation;
  std::random_device rd;
  while (r.incarnation == 0) r.incarnation = (uint64_t{rd()} << 32) | rd();
  r.started_at = std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
  r.pid = ::getpid();
  KVP_ASSIGN_OR_RETURN(std::unique_ptr<discovery::Registration> reg,
                       discovery::Registration::Create(std::move(ro)));
  reg->Start();
  return reg;
}

}  // namespace kvpush::apps
