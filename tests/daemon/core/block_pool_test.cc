// The block pools against a small reference model of LRU-leaf eviction, the eviction policy's
// pressure rules, and broken invariants caught as such.
#include "daemon/core/block_pool.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

#include "daemon/core/eviction_policy.h"
#include "daemon/core/tenants.h"

namespace kvarn {
namespace {

BlockHash H(uint32_t i) {
  BlockHash h{};
  h[0] = static_cast<uint8_t>(i);
  h[1] = static_cast<uint8_t>(i >> 8);
  h[31] = 1;
  return h;
}

constexpr uint64_t kQ = 100, kS = 1000;  // block bytes of each class, for the charges

class PoolTest : public ::testing::Test {
 protected:
  void Make(uint32_t quant, uint32_t sink) { pools_ = std::make_unique<PoolSet>(quant, sink, kQ, kS, &usage_); }
  BlockRef Seal(BlockClass c, uint32_t hash, std::optional<BlockRef> parent = std::nullopt, uint32_t tenant = 0) {
    const std::optional<uint32_t> id = pools_->TakeFree(c, tenant);
    EXPECT_TRUE(id.has_value());
    pools_->Publish({c, *id}, H(hash), parent);
    return {c, *id};
  }
  const LeafLru& Leaves(BlockClass c) const { return pools_->pool(c).leaves(); }
  void TearDown() override {
    if (pools_) {
      EXPECT_TRUE(pools_->CheckInvariants().ok()) << pools_->CheckInvariants();
    }
  }

  UsageLedger usage_;
  std::unique_ptr<PoolSet> pools_;
  uint64_t tick_ = 0;
};

TEST_F(PoolTest, FreshPoolIsAllFree) {
  Make(4, 2);
  EXPECT_EQ(pools_->pool(BlockClass::kQuant).free_count(), 4u);
  EXPECT_EQ(pools_->pool(BlockClass::kSink).free_count(), 2u);
}

TEST_F(PoolTest, ReferencedBlocksAreNeverCandidates) {
  Make(3, 0);
  for (uint32_t i = 0; i < 3; ++i) Seal(BlockClass::kQuant, i);
  EXPECT_FALSE(Leaves(BlockClass::kQuant).Oldest().has_value());
  pools_->Release({BlockClass::kQuant, 1}, ++tick_);
  EXPECT_EQ(Leaves(BlockClass::kQuant).Oldest(), std::optional<uint32_t>(1));
  pools_->Acquire({BlockClass::kQuant, 1}, ++tick_);
  EXPECT_FALSE(Leaves(BlockClass::kQuant).Oldest().has_value());
}

TEST_F(PoolTest, ParentWaitsForItsChildren) {
  Make(3, 1);
  const BlockRef s = Seal(BlockClass::kSink, 100);
  const BlockRef c = Seal(BlockClass::kQuant, 101, s);
  // Release the parent first: it is older, but has a cached child, so the child goes first.
  pools_->Release(s, ++tick_);
  pools_->Release(c, ++tick_);
  EXPECT_FALSE(Leaves(BlockClass::kSink).Oldest().has_value());
  EXPECT_EQ(Leaves(BlockClass::kQuant).Oldest(), std::optional<uint32_t>(c.id));
  pools_->Evict(c);
  EXPECT_EQ(Leaves(BlockClass::kSink).Oldest(), std::optional<uint32_t>(s.id));
}

TEST_F(PoolTest, SealedBlocksAreChargedToTheirTenantUntilEvicted) {
  Make(4, 2);
  const BlockRef a = Seal(BlockClass::kQuant, 1, std::nullopt, /*tenant=*/3);
  const BlockRef b = Seal(BlockClass::kSink, 2, std::nullopt, 3);
  EXPECT_EQ(usage_.of(3).cache_bytes, kQ + kS);
  const std::optional<uint32_t> aborted = pools_->TakeFree(BlockClass::kQuant, 5);
  EXPECT_EQ(usage_.of(5).cache_bytes, kQ);  // a sealing block counts
  pools_->Abort({BlockClass::kQuant, *aborted});
  EXPECT_EQ(usage_.of(5).cache_bytes, 0u);
  pools_->Release(a, ++tick_);
  EXPECT_EQ(usage_.of(3).cache_bytes, kQ + kS) << "a cached block stays charged";
  pools_->Evict(a);
  EXPECT_EQ(usage_.of(3).cache_bytes, kS);
  pools_->Release(b, ++tick_);
  pools_->Evict(b);
  EXPECT_EQ(usage_.of(3).cache_bytes, 0u);
}

// Random operations against a reference model that recomputes the victim from scratch:
// the unreferenced indexed block with no indexed children and the smallest last use.
TEST_F(PoolTest, EvictionOrderMatchesReferenceModel) {
  std::mt19937 rng(7);
  Make(64, 0);
  const BlockPool& q = pools_->pool(BlockClass::kQuant);
  uint32_t next_hash = 0;
  std::map<uint32_t, uint32_t> held;  // id -> our refs
  for (int step = 0; step < 5000; ++step) {
    const int op = static_cast<int>(rng() % 4);
    if (op == 0 && q.free_count() > 0) {
      // Parent: a random indexed block, or none.
      std::optional<BlockRef> parent;
      std::vector<uint32_t> indexed;
      for (uint32_t b = 0; b < q.total(); ++b) {
        const BlockState s = q.info(b).state;
        if (s == BlockState::kActive || s == BlockState::kCached) indexed.push_back(b);
      }
      if (!indexed.empty() && rng() % 3 != 0) {
        const uint32_t par = indexed[rng() % indexed.size()];
        pools_->Acquire({BlockClass::kQuant, par}, ++tick_);  // a child is sealed by a sequence holding its parent
        held[par]++;
        parent = BlockRef{BlockClass::kQuant, par};
      }
      const BlockRef b = Seal(BlockClass::kQuant, next_hash++, parent, static_cast<uint32_t>(rng() % 3));
      held[b.id]++;
    } else if (op == 1 && !held.empty()) {
      auto it = held.begin();
      std::advance(it, rng() % held.size());
      pools_->Release({BlockClass::kQuant, it->first}, ++tick_);
      if (--it->second == 0) held.erase(it);
    } else if (op == 2) {
      std::optional<uint32_t> want;
      for (uint32_t b = 0; b < q.total(); ++b) {
        const BlockInfo& i = q.info(b);
        if (i.state == BlockState::kCached && i.children == 0 && (!want || i.last_use < q.info(*want).last_use)) want = b;
      }
      const std::optional<BlockRef> got = NextRequestedEviction(*pools_, std::nullopt);
      ASSERT_EQ(got.has_value(), want.has_value()) << "step " << step;
      if (got) {
        ASSERT_EQ(got->id, *want) << "step " << step;
        pools_->Evict(*got);
      }
    } else if (op == 3 && !held.empty()) {
      auto it = held.begin();
      std::advance(it, rng() % held.size());
      pools_->Acquire({BlockClass::kQuant, it->first}, ++tick_);
      it->second++;
    }
    ASSERT_TRUE(pools_->CheckInvariants().ok()) << pools_->CheckInvariants() << " at step " << step;
  }
}

TEST_F(PoolTest, PressurePrefersTenantsAboveTheirShare) {
  Make(8, 0);
  // Tenant 0 seals 6 blocks, tenant 1 seals 2; tenant 1's are older. Unconfigured labels
  // share the pool equally (800 bytes / 2 holders = 400): tenant 0 holds 600, above it.
  std::vector<BlockRef> t1 = {Seal(BlockClass::kQuant, 1, std::nullopt, 1), Seal(BlockClass::kQuant, 2, std::nullopt, 1)};
  std::vector<BlockRef> t0;
  for (uint32_t i = 0; i < 6; ++i) t0.push_back(Seal(BlockClass::kQuant, 10 + i, std::nullopt, 0));
  for (const BlockRef& b : t1) pools_->Release(b, ++tick_);
  for (const BlockRef& b : t0) pools_->Release(b, ++tick_);
  HashNamespaceInput ns;
  TenantRegistry tenants(ns, "", false, QuotaDefaults{});
  const std::vector<uint32_t> over = TenantsOverShare(usage_, tenants, 8 * kQ);
  ASSERT_EQ(over, std::vector<uint32_t>{0});
  const std::vector<BlockRef> plan = PlanPressureEviction(*pools_, BlockClass::kQuant, over);
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0], t0[0]) << "the over-share tenant's oldest leaf, not the globally oldest";
  // Without preference, plain LRU.
  EXPECT_EQ(PlanPressureEviction(*pools_, BlockClass::kQuant, {})[0], t1[0]);
}

TEST_F(PoolTest, SinkPressureTakesTheWholeCachedChainLeavesFirst) {
  Make(8, 2);
  const BlockRef s = Seal(BlockClass::kSink, 1);
  const BlockRef a = Seal(BlockClass::kQuant, 2, s);
  const BlockRef b = Seal(BlockClass::kQuant, 3, a);
  const BlockRef c = Seal(BlockClass::kQuant, 4, a);  // a fork: a has two children
  for (const BlockRef& r : {c, b, a, s}) pools_->Release(r, ++tick_);
  const std::vector<BlockRef> plan = PlanPressureEviction(*pools_, BlockClass::kSink, {});
  ASSERT_EQ(plan.size(), 4u);
  EXPECT_EQ(plan.back(), s);
  EXPECT_EQ(plan[2], a) << "a goes after both of its children";
  for (const BlockRef& r : plan) pools_->Evict(r);  // each is a leaf when its turn comes
  EXPECT_EQ(pools_->indexed(), 0u);
}

TEST(PoolDeathTest, ReferenceCountUnderflowIsABrokenInvariant) {
  UsageLedger usage;
  PoolSet p(2, 0, kQ, kS, &usage);
  const std::optional<uint32_t> id = p.TakeFree(BlockClass::kQuant, 0);
  p.Publish({BlockClass::kQuant, *id}, H(1), std::nullopt);
  p.Release({BlockClass::kQuant, *id}, 1);
  EXPECT_DEATH(p.Release({BlockClass::kQuant, *id}, 2), "reference count underflow");
}

TEST(PoolDeathTest, EvictingAHeldBlockIsABrokenInvariant) {
  UsageLedger usage;
  PoolSet p(2, 0, kQ, kS, &usage);
  const std::optional<uint32_t> id = p.TakeFree(BlockClass::kQuant, 0);
  p.Publish({BlockClass::kQuant, *id}, H(1), std::nullopt);
  EXPECT_DEATH(p.Evict({BlockClass::kQuant, *id}), "only a cached leaf is evicted");
}

}  // namespace
}  // namespace kvarn
