// etcd discovery end to end: a real etcd, `kvpush serve --discovery` P and D instances and
// `kvpush router --discovery` (loopback, ucx:tcp). Instances register while serving, leave on
// SIGTERM, drop out when their lease expires after SIGKILL; the router follows within the
// issue's 2 s (checked with generous WaitUntil deadlines) and keeps its membership while etcd
// is down. Skipped without /usr/bin/etcd.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include "discovery/etcd_client.h"
#include "discovery/instance_record.h"
#include "etcd_test_util.h"
#include "pd_fixture.h"

namespace kvpush::pd_test {
namespace {

using discovery_test::EtcdServer;

class DiscoveryE2eTest : public PdFixture {
 protected:
  /// The router's view: url -> healthy, from its GET /health body (200 or 503).
  std::map<std::string, bool> RouterView(Proc* router) {
    httplib::Client cli(router->host, router->port);
    cli.set_read_timeout(2, 0);
    auto res = cli.Get("/health");
    std::map<std::string, bool> out;
    if (!res) return out;
    const json j = json::parse(res->body, nullptr, false);
    if (!j.is_object() || !j.contains("instances")) return out;
    for (const auto& i : j["instances"])
      out[i["url"].get<std::string>()] = i["healthy"].get<bool>();
    return out;
  }
  bool RouterHas(Proc* router, Proc* inst) {
    auto v = RouterView(router);
    auto it = v.find(inst->url());
    return it != v.end() && it->second;
  }
  bool RouterLacks(Proc* router, Proc* inst) { return !RouterView(router).contains(inst->url()); }
  /// Keys under /kvpush/ whose value names `inst`'s URL (-1: etcd unreachable).
  int KeysOf(const EtcdServer& etcd, Proc* inst) {
    discovery::EtcdClient c(etcd.endpoints(), std::chrono::milliseconds(500));
    auto r = c.RangePrefix("/kvpush/");
    if (!r.ok()) return -1;
    int n = 0;
    for (const auto& kv : r->kvs) {
      if (kv.lease != 0 && kv.value.find("\"" + inst->url() + "\"") != std::string::npos) ++n;
    }
    return n;
  }
  Proc* StartInstance(const std::string& name, const std::string& role, const EtcdServer& etcd) {
    const int port = Port();
    Proc* p = Spawn(name,
                    ServeArgs(model_, role, "127.0.0.1", port, KvCfg("ucx:tcp"),
                              {"--discovery", etcd.url(), "--discovery-lease-ttl-s", "2"}),
                    "127.0.0.1", port);
    WaitHealthyAll({p});
    return p;
  }
  bool RequestOk(Proc* router) {
    Req r;
    r.label = "discovery";
    r.prompt = {1, 40, 41, 42, 43, 44, 45, 46, 47};
    r.max_tokens = 4;
    Res res = Send(router->host, router->port, r, {}, nullptr, 30.0);
    if (res.status != 200) ADD_FAILURE() << "router answered " << res.status << ": " << res.error;
    return res.status == 200;
  }

  std::string model_;
};

TEST_F(DiscoveryE2eTest, InstancesRegisterLeaveAndExpireAndTheRouterFollows) {
  KVP_REQUIRE_ETCD();
  model_ = ModelOrGenerated();
  ASSERT_FALSE(model_.empty());
  EtcdServer etcd(dir_);
  ASSERT_TRUE(etcd.Start());
  const int rport = Port();
  Proc* router = Spawn("router",
                       {"router", "--discovery", etcd.url(), "--port", std::to_string(rport),
                        "--health-interval-ms", "200", "--log-level", "info"},
                       "127.0.0.1", rport);
  Proc* p = StartInstance("prefill", "prefill", etcd);
  Proc* d = StartInstance("decode", "decode", etcd);
  ASSERT_TRUE(WaitFor([&] { return KeysOf(etcd, p) == 1 && KeysOf(etcd, d) == 1; }, 5000))
      << "P and D did not register under a lease";
  ASSERT_TRUE(WaitFor([&] { return RouterHas(router, p) && RouterHas(router, d); }, 5000));
  ASSERT_TRUE(RequestOk(router));

  // A new D joins: the router routes to it within 2 s of its registration.
  Proc* d2 = StartInstance("decode2", "decode", etcd);
  ASSERT_TRUE(WaitFor([&] { return KeysOf(etcd, d2) == 1; }, 5000));
  EXPECT_TRUE(WaitFor([&] { return RouterHas(router, d2); }, 4000))
      << "the router did not add the new decode instance";

  // SIGTERM: the instance leaves discovery first (key deleted, lease revoked); the router drops it.
  EXPECT_EQ(d2->child.Stop(10000) & 0x7f, 0);
  EXPECT_EQ(KeysOf(etcd, d2), 0) << "the key outlived a graceful stop";
  EXPECT_TRUE(WaitFor([&] { return RouterLacks(router, d2); }, 4000));

  // SIGKILL: the key goes when its 2 s lease expires; the router drops it; requests keep working.
  Proc* d3 = StartInstance("decode3", "decode", etcd);
  ASSERT_TRUE(WaitFor([&] { return RouterHas(router, d3); }, 4000));
  ASSERT_EQ(::kill(d3->child.pid(), SIGKILL), 0);
  EXPECT_TRUE(WaitFor([&] { return KeysOf(etcd, d3) == 0; }, 6000))
      << "the key of a killed instance outlived its lease";
  EXPECT_TRUE(WaitFor([&] { return RouterLacks(router, d3); }, 4000));
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(RequestOk(router));

  // etcd down: the router keeps its membership and serves; etcd back: instances re-register and
  // the router sees newcomers again.
  etcd.Stop();
  EXPECT_FALSE(WaitFor([&] { return !RouterHas(router, p) || !RouterHas(router, d); }, 3000))
      << "the router lost members while etcd was down";
  EXPECT_TRUE(RequestOk(router));
  ASSERT_TRUE(etcd.Start());
  EXPECT_TRUE(WaitFor([&] { return KeysOf(etcd, p) == 1 && KeysOf(etcd, d) == 1; }, 10000))
      << "P and D did not re-register after the etcd restart";
  Proc* d4 = StartInstance("decode4", "decode", etcd);
  EXPECT_TRUE(WaitFor([&] { return RouterHas(router, d4); }, 6000))
      << "the router did not resume watching after the etcd restart";
  EXPECT_TRUE(RequestOk(router));
}

TEST_F(DiscoveryE2eTest, ServeRefusesAWildcardAddressWithoutAdvertiseUrl) {
  auto [rc, out] = Sh(KvpushBin() +
                      " serve --model x --host 0.0.0.0 --discovery etcd://127.0.0.1:1"
                      " 2>&1");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--advertise-url"), std::string::npos) << out;
  auto [rc2, out2] = Sh(KvpushBin() + " router --discovery http://x:1 2>&1");
  EXPECT_EQ(rc2, 2) << out2;
  // An instance serving HTTPS registers an https URL, a plain one an http URL: an
  // --advertise-url of the other scheme is refused at start, naming the one to give. (Any
  // existing file passes the TLS flags' parser; they are loaded only later.)
  const std::string tls = " --ssl-certfile " + KvpushBin() + " --ssl-keyfile " + KvpushBin();
  auto [rc3, out3] = Sh(KvpushBin() +
                        " serve --model x --discovery etcd://127.0.0.1:1"
                        " --advertise-url http://127.0.0.1:8100" +
                        tls + " 2>&1");
  EXPECT_EQ(rc3, 2) << out3;
  EXPECT_NE(out3.find("give https://HOST:PORT"), std::string::npos) << out3;
  auto [rc4, out4] = Sh(KvpushBin() +
                        " serve --model x --discovery etcd://127.0.0.1:1"
                        " --advertise-url https://127.0.0.1:8100 2>&1");
  EXPECT_EQ(rc4, 2) << out4;
  EXPECT_NE(out4.find("give http://HOST:PORT"), std::string::npos) << out4;
}

}  // namespace
}  // namespace kvpush::pd_test
