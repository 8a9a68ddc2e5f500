// `kvpush serve --discovery ...`: the flags of etcd registration and the Registration they make
// (src/discovery/registration.h; keys and values: docs/deployment.md).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "discovery/registration.h"

namespace kvpush::apps {

/// The discovery flags of `kvpush serve`.
struct ServeDiscoveryFlags {
  std::string discovery;  ///< etcd://HOST:PORT[,HOST:PORT...]; "" = no registration
  /// http[s]://HOST:PORT routers use; "" = the bound host and port (https with TLS)
  std::string advertise_url;
  std::string prefix = discovery::kDefaultPrefix;
  int64_t lease_ttl_s = 5;
};

/// Adds --discovery, --advertise-url, --discovery-prefix, --discovery-lease-ttl-s to `cmd`.
void AddServeDiscoveryFlags(CLI::App* cmd, ServeDiscoveryFlags* flags);

/// Checks the flags before the model loads; `https`: the instance serves HTTPS only
/// (--ssl-certfile), so an --advertise-url must be https:// (and a plain one http://).
/// Errors: kInvalidArgument naming the flag.
Status ValidateServeDiscoveryFlags(const ServeDiscoveryFlags& flags, const std::string& host,
                                   bool https = false);

/// What the instance publishes, known once it serves.
struct ServeIdentity {
  std::string role;   ///< --role
  std::string model;  ///< served model name
  std::string host;   ///< --host (bound address)
  int port = 0;       ///< the bound port
  uint64_t compat_hash = 0;
  uint64_t incarnation = 0;  ///< 0: a random one is drawn
  bool https = false;        ///< serves HTTPS only: the default URL is https://HOST:PORT
};

/// Creates and starts the registration (first attempt at once, on its thread), or returns null
/// when flags.discovery is empty. `healthy`: whether the instance may be offered now.
/// Errors: kInvalidArgument (flags; the advertised URL would be 0.0.0.0 or ::).
Result<std::unique_ptr<discovery::Registration>> StartServeRegistration(
    const ServeDiscoveryFlags& flags, const ServeIdentity& id, std::function<bool()> healthy);

}  // namespace kvpush::apps
