// The etcd client, Registration and MembershipWatcher against a real etcd (/usr/bin/etcd on free
// loopback ports; skipped when absent). Bounds like "within 2 s" are generous WaitUntil deadlines.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <mutex>

#include "discovery/etcd_client.h"
#include "discovery/membership.h"
#include "discovery/registration.h"
#include "etcd_test_util.h"
#include "test_util.h"

namespace kvpush::discovery {
namespace {

using discovery_test::EtcdServer;
using ::kvpush::testing::WaitUntil;
using std::chrono::milliseconds;
using std::chrono::seconds;

class EtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kvpush-etcd-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    etcd_ = std::make_unique<EtcdServer>(dir_);
  }
  void TearDown() override {
    etcd_.reset();
    std::error_code ec;
    if (!HasFailure()) std::filesystem::remove_all(dir_, ec);
  }
  EtcdClient Client() { return EtcdClient(etcd_->endpoints(), milliseconds(1000)); }
  /// The pairs under `prefix` now (empty on error).
  std::vector<KeyValue> Keys(const std::string& prefix = "/kvpush/") {
    auto r = Client().RangePrefix(prefix);
    return r.ok() ? r->kvs : std::vector<KeyValue>{};
  }

  static InstanceRecord Rec(const std::string& role, int port, uint64_t inc) {
    InstanceRecord r;
    r.role = role;
    r.model = "m";
    r.url = "http://127.0.0.1:" + std::to_string(port);
    r.compat_hash = 0x77;
    r.incarnation = inc;
    r.started_at = 1;
    r.pid = 1;
    return r;
  }

  std::string dir_;
  std::unique_ptr<EtcdServer> etcd_;
};

TEST_F(EtcdTest, ClientLeasesPutsRangesAndRevokes) {
  KVP_REQUIRE_ETCD();
  ASSERT_TRUE(etcd_->Start());
  EtcdClient c = Client();
  auto lease = c.LeaseGrant(5);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  ASSERT_TRUE(c.Put("/kvpush/a", "1", *lease).ok());
  ASSERT_TRUE(c.Put("/kvpush/b", "2", 0).ok());
  ASSERT_TRUE(c.Put("/kvpusher", "x", 0).ok());  // shares the bytes but not the prefix
  auto r = c.RangePrefix("/kvpush/");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->kvs.size(), 2u);
  EXPECT_EQ(r->kvs[0].key, "/kvpush/a");
  EXPECT_EQ(r->kvs[0].lease, *lease);
  auto ttl = c.LeaseKeepAlive(*lease);
  ASSERT_TRUE(ttl.ok()) << ttl.status().ToString();
  EXPECT_GT(*ttl, 0);
  ASSERT_TRUE(c.LeaseRevoke(*lease).ok());
  EXPECT_EQ(c.LeaseKeepAlive(*lease).status().code(), StatusCode::kNotFound);
  const Status again = c.LeaseRevoke(*lease);
  EXPECT_TRUE(again.ok()) << "revoking an unknown lease is not an error: " << again.ToString();
  ASSERT_TRUE(c.Delete("/kvpush/b").ok());
  EXPECT_TRUE(Keys().empty());
}

TEST_F(EtcdTest, ClientReportsAnUnreachableEtcd) {
  EtcdClient c({EtcdEndpoint{"127.0.0.1", *apps::PickFreePort()}}, milliseconds(300));
  EXPECT_EQ(c.LeaseGrant(5).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(c.RangePrefix("/").status().code(), StatusCode::kUnavailable);
}

TEST_F(EtcdTest, RegistrationFollowsHealthAndLeaves) {
  KVP_REQUIRE_ETCD();
  ASSERT_TRUE(etcd_->Start());
  std::atomic<bool> healthy{true};
  RegistrationOptions ro;
  ro.endpoints = etcd_->endpoints();
  ro.ttl_s = 3;
  ro.record = Rec("decode", 9001, 0xab);
  ro.healthy = [&] { return healthy.load(); };
  auto reg = Registration::Create(ro);
  ASSERT_TRUE(reg.ok());
  (*reg)->Start();
  ASSERT_TRUE(WaitUntil([&] { return Keys().size() == 1; }, seconds(5)));
  const std::vector<KeyValue> kvs = Keys();
  EXPECT_EQ(kvs[0].key, "/kvpush/m/decode/00000000000000ab");
  EXPECT_NE(kvs[0].lease, 0) << "the key must hang on a lease";
  auto parsed = InstanceRecord::Parse("/kvpush/", kvs[0].key, kvs[0].value);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(*parsed, ro.record);
  // Kept alive beyond its TTL.
  const int64_t lease = kvs[0].lease;
  EXPECT_FALSE(WaitUntil(
      [&] {
        const auto k = Keys();
        return k.size() != 1 || k[0].lease != lease;
      },
      seconds(4)))
      << "the key vanished or changed lease within 4 s (ttl 3 s, renewed every 1 s)";
  // Unhealthy: deregistered; healthy again: registered under a new lease.
  healthy.store(false);
  ASSERT_TRUE(WaitUntil([&] { return Keys().empty(); }, seconds(5)));
  healthy.store(true);
  ASSERT_TRUE(WaitUntil([&] { return Keys().size() == 1; }, seconds(5)));
  EXPECT_NE(Keys()[0].lease, lease);
  // The key is visible in etcd as soon as it is written; the registration counts itself after
  // its Put returns, so the count may trail the key by a moment.
  EXPECT_TRUE(WaitUntil([&] { return (*reg)->state().registrations == 2; }, seconds(2)))
      << "registrations " << (*reg)->state().registrations;
  // Leave: key deleted and lease revoked at once.
  const int64_t lease2 = Keys()[0].lease;
  (*reg)->Leave();
  EXPECT_TRUE(Keys().empty());
  EXPECT_EQ(Client().LeaseKeepAlive(lease2).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE((*reg)->state().left);
}

TEST_F(EtcdTest, RegistrationComesBackAfterAnEtcdRestart) {
  KVP_REQUIRE_ETCD();
  ASSERT_TRUE(etcd_->Start());
  RegistrationOptions ro;
  ro.endpoints = etcd_->endpoints();
  ro.ttl_s = 2;
  ro.record = Rec("prefill", 9002, 0xcd);
  auto reg = Registration::Create(ro);
  ASSERT_TRUE(reg.ok());
  (*reg)->Start();
  ASSERT_TRUE(WaitUntil([&] { return Keys().size() == 1; }, seconds(5)));
  // Wipe the key behind the registration's back and restart etcd: the lease is renewed or a new
  // one granted, and the key is there again.
  etcd_->Stop();
  ASSERT_TRUE(etcd_->Start());
  ASSERT_TRUE(Client().Delete(ro.record.Key("/kvpush/")).ok());
  EXPECT_TRUE(WaitUntil([&] { return Keys().size() == 1; }, seconds(10)))
      << "registration did not come back within lease ttl + renewal";
  (*reg)->Leave();
  EXPECT_TRUE(Keys().empty());
}

/// Records the watcher's changes (thread-safe).
struct Recorder {
  std::mutex mu;
  std::vector<MembershipChange> changes;
  void Add(const MembershipChange& c) {
    std::lock_guard<std::mutex> l(mu);
    changes.push_back(c);
  }
  size_t Count(MembershipChange::Type t) {
    std::lock_guard<std::mutex> l(mu);
    size_t n = 0;
    for (const auto& c : changes) n += c.type == t ? 1 : 0;
    return n;
  }
};

TEST_F(EtcdTest, WatcherFollowsKeysAndKeepsMembershipWhileEtcdIsDown) {
  KVP_REQUIRE_ETCD();
  ASSERT_TRUE(etcd_->Start());
  EtcdClient c = Client();
  const InstanceRecord p = Rec("prefill", 9003, 1);
  ASSERT_TRUE(c.Put(p.Key("/kvpush/"), p.ToJson().dump(), 0).ok());
  Recorder rec;
  MembershipOptions mo;
  mo.endpoints = etcd_->endpoints();
  mo.retry = milliseconds(100);
  auto w = MembershipWatcher::Create(mo, [&](const MembershipChange& ch) { rec.Add(ch); });
  ASSERT_TRUE(w.ok());
  (*w)->Start();
  EXPECT_EQ((*w)->admitted_count(), 1u) << "Start lists synchronously";
  // A new key under a short lease: added, then removed when the lease expires.
  auto lease = c.LeaseGrant(2);
  ASSERT_TRUE(lease.ok());
  const InstanceRecord d = Rec("decode", 9004, 2);
  ASSERT_TRUE(c.Put(d.Key("/kvpush/"), d.ToJson().dump(), *lease).ok());
  ASSERT_TRUE(WaitUntil([&] { return (*w)->admitted_count() == 2; }, seconds(2)));
  ASSERT_TRUE(WaitUntil([&] { return (*w)->admitted_count() == 1; }, seconds(6)))
      << "the lease expired but the instance was not removed";
  EXPECT_EQ(rec.Count(MembershipChange::Type::kRemove), 1u);
  // etcd down: the last membership stays.
  etcd_->Stop();
  ASSERT_FALSE(WaitUntil([&] { return (*w)->admitted_count() != 1; }, seconds(2)));
  EXPECT_EQ(rec.Count(MembershipChange::Type::kRemove), 1u);
  // etcd back: re-listed, then watched again (a new key arrives).
  const int64_t lists = (*w)->lists();
  ASSERT_TRUE(etcd_->Start());
  ASSERT_TRUE(WaitUntil([&] { return (*w)->lists() > lists; }, seconds(10)));
  const InstanceRecord d2 = Rec("decode", 9005, 3);
  ASSERT_TRUE(Client().Put(d2.Key("/kvpush/"), d2.ToJson().dump(), 0).ok());
  ASSERT_TRUE(WaitUntil([&] { return (*w)->admitted_count() == 2; }, seconds(2)));
  (*w)->Stop();
}

}  // namespace
}  // namespace kvpush::discovery
