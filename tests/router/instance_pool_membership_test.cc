// InstancePool membership at run time (etcd discovery feeds it): instances added and removed
// while the pool runs; a removed instance gets no new lease and its leases in flight finish.
#include <gtest/gtest.h>

#include "router/instance_pool.h"
#include "router_test_util.h"

namespace kvpush::router::test {
namespace {

TEST(InstancePoolMembership, AddsAndRemovesInstancesAtRunTime) {
  FakeInstance p(true), d(false), d2(false);
  InstancePool pool({*ParseInstanceUrl(p.url())}, {}, HealthOptions{10000, 1000});
  pool.Start();
  EXPECT_FALSE(pool.Acquire(Role::kDecode).has_value());
  // Added: checked at once (not after the 10 s health interval), then selectable.
  ASSERT_TRUE(pool.AddInstance(Role::kDecode, *ParseInstanceUrl(d.url())));
  EXPECT_FALSE(pool.AddInstance(Role::kDecode, *ParseInstanceUrl(d.url()))) << "already a member";
  ASSERT_TRUE(WaitFor([&] { return pool.IsHealthy(d.url()); }, 5000));
  std::optional<InstanceLease> lease = pool.Acquire(Role::kDecode);
  ASSERT_TRUE(lease.has_value());
  EXPECT_EQ(lease->address().url, d.url());
  // Removed: no new lease, gone from the snapshot; the lease in flight stays valid.
  ASSERT_TRUE(pool.RemoveInstance(Role::kDecode, d.url()));
  EXPECT_FALSE(pool.RemoveInstance(Role::kDecode, d.url()));
  EXPECT_FALSE(pool.RemoveInstance(Role::kPrefill, d.url()));
  EXPECT_FALSE(pool.Acquire(Role::kDecode).has_value());
  EXPECT_EQ(pool.Snapshot().size(), 1u);
  EXPECT_TRUE(lease->valid());
  // Another instance while the old one's leg is still out: a new slot.
  ASSERT_TRUE(pool.AddInstance(Role::kDecode, *ParseInstanceUrl(d2.url())));
  ASSERT_TRUE(WaitFor([&] { return pool.IsHealthy(d2.url()); }, 5000));
  auto l2 = pool.Acquire(Role::kDecode);
  ASSERT_TRUE(l2.has_value());
  EXPECT_EQ(l2->address().url, d2.url());
  lease->Release();
  l2->Release();
  // The first one back (same URL): selectable again, counts start from its legs in flight.
  ASSERT_TRUE(pool.AddInstance(Role::kDecode, *ParseInstanceUrl(d.url())));
  ASSERT_TRUE(WaitFor([&] { return pool.IsHealthy(d.url()); }, 5000));
  const auto snap = pool.Snapshot();
  ASSERT_EQ(snap.size(), 3u);
  for (const auto& s : snap) EXPECT_EQ(s.outstanding, 0) << s.url;
  pool.Stop();
}

}  // namespace
}  // namespace kvpush::router::test
