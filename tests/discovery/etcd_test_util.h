// A throwaway etcd for discovery tests: /usr/bin/etcd (Debian's etcd-server) on free loopback
// ports with a temp data dir; restartable on the same ports and data (etcd restart tests).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "apps/child_process.h"
#include "discovery/etcd_client.h"
#include "test_util.h"

namespace kvpush::discovery_test {

inline constexpr const char* kEtcdBin = "/usr/bin/etcd";

/// Skips the test when etcd is not installed.
#define KVP_REQUIRE_ETCD()                                                                   \
  if (access(::kvpush::discovery_test::kEtcdBin, X_OK) != 0) {                               \
    GTEST_SKIP() << ::kvpush::discovery_test::kEtcdBin                                       \
                 << " not found: install Debian's etcd-server (scripts/setup-debian.sh) to " \
                    "run the etcd discovery tests; skipping";                                \
  }

class EtcdServer {
 public:
  /// `dir`: where the data dir and log go.
  explicit EtcdServer(std::string dir) : dir_(std::move(dir)) {
    client_port_ = *apps::PickFreePort();
    peer_port_ = *apps::PickFreePort();
  }
  ~EtcdServer() { Stop(); }

  /// Starts etcd and waits until it answers a range. Returns false (with the log tail in a
  /// test failure) when it does not within 20 s.
  bool Start() {
    const std::string c = "http://127.0.0.1:" + std::to_string(client_port_);
    const std::string p = "http://127.0.0.1:" + std::to_string(peer_port_);
    Status s = child_.Start(
        {"--name", "t", "--data-dir", dir_ + "/etcd-data", "--listen-client-urls", c,
         "--advertise-client-urls", c, "--listen-peer-urls", p, "--initial-advertise-peer-urls", p,
         "--initial-cluster", "t=" + p, "--log-level", "warn"},
        dir_ + "/etcd.log", kEtcdBin);
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (!s.ok()) return false;
    discovery::EtcdClient cli(endpoints(), std::chrono::milliseconds(500));
    const bool up = testing::WaitUntil([&] { return cli.RangePrefix("/").ok(); },
                                       std::chrono::seconds(20), std::chrono::milliseconds(50));
    EXPECT_TRUE(up) << "etcd did not answer; log " << dir_ << "/etcd.log";
    return up;
  }
  void Stop() { child_.Stop(5000); }

  std::string url() const { return "etcd://127.0.0.1:" + std::to_string(client_port_); }
  std::vector<discovery::EtcdEndpoint> endpoints() const {
    return {discovery::EtcdEndpoint{"127.0.0.1", client_port_}};
  }

 private:
  std::string dir_;
  int client_port_ = 0;
  int peer_port_ = 0;
  apps::ChildProcess child_;
};

}  // namespace kvpush::discovery_test
