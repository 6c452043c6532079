// The block pool against a small reference model of LRU-leaf eviction.
#include "daemon/core/block_pool.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

namespace kvarn {
namespace {

BlockHash H(uint32_t i) {
  BlockHash h{};
  h[0] = static_cast<uint8_t>(i);
  h[1] = static_cast<uint8_t>(i >> 8);
  h[31] = 1;
  return h;
}

TEST(BlockPoolTest, FreshPoolIsAllFree) {
  PoolSet p(4, 2);
  EXPECT_EQ(p.pool(BlockClass::kQuant).free_count(), 4u);
  EXPECT_EQ(p.pool(BlockClass::kSink).free_count(), 2u);
  EXPECT_TRUE(p.CheckInvariants().ok());
}

TEST(BlockPoolTest, ReferencedBlocksAreNeverCandidates) {
  PoolSet p(3, 0);
  BlockPool& q = p.pool(BlockClass::kQuant);
  uint64_t tick = 0;
  for (uint32_t i = 0; i < 3; ++i) {
    const uint32_t id = *q.TakeFree();
    p.Publish({BlockClass::kQuant, id}, H(i), std::nullopt, 0);
  }
  EXPECT_FALSE(q.EvictionCandidate(std::nullopt).has_value());
  q.Release(1, ++tick);
  EXPECT_EQ(q.EvictionCandidate(std::nullopt), std::optional<uint32_t>(1));
  q.Acquire(1, ++tick);
  EXPECT_FALSE(q.EvictionCandidate(std::nullopt).has_value());
  EXPECT_TRUE(p.CheckInvariants().ok());
}

TEST(BlockPoolTest, ParentWaitsForItsChildren) {
  PoolSet p(3, 1);
  uint64_t tick = 0;
  BlockPool& sink = p.pool(BlockClass::kSink);
  BlockPool& q = p.pool(BlockClass::kQuant);
  const uint32_t s = *sink.TakeFree();
  p.Publish({BlockClass::kSink, s}, H(100), std::nullopt, 0);
  const uint32_t c = *q.TakeFree();
  p.Publish({BlockClass::kQuant, c}, H(101), BlockRef{BlockClass::kSink, s}, 0);
  // Release the parent first: it is older, but has a cached child, so the child goes first.
  sink.Release(s, ++tick);
  q.Release(c, ++tick);
  EXPECT_FALSE(sink.EvictionCandidate(std::nullopt).has_value());
  EXPECT_EQ(q.EvictionCandidate(std::nullopt), std::optional<uint32_t>(c));
  p.Evict({BlockClass::kQuant, c});
  EXPECT_EQ(sink.EvictionCandidate(std::nullopt), std::optional<uint32_t>(s));
  EXPECT_TRUE(p.CheckInvariants().ok());
}

// Random operations against a reference model that recomputes the victim from scratch:
// the unreferenced indexed block with no indexed children and the smallest last use.
TEST(BlockPoolTest, EvictionOrderMatchesReferenceModel) {
  std::mt19937 rng(7);
  PoolSet p(64, 0);
  BlockPool& q = p.pool(BlockClass::kQuant);
  uint64_t tick = 0;
  uint32_t next_hash = 0;
  std::map<uint32_t, uint32_t> held;  // id -> our refs
  for (int step = 0; step < 5000; ++step) {
    const int op = static_cast<int>(rng() % 4);
    if (op == 0 && q.free_count() > 0) {
      const uint32_t id = *q.TakeFree();
      // Parent: a random indexed block, or none.
      std::optional<BlockRef> parent;
      std::vector<uint32_t> indexed;
      for (uint32_t b = 0; b < q.total(); ++b) {
        const BlockState s = q.info(b).state;
        if (b != id && (s == BlockState::kActive || s == BlockState::kCached)) indexed.push_back(b);
      }
      if (!indexed.empty() && rng() % 3 != 0) {
        const uint32_t par = indexed[rng() % indexed.size()];
        q.Acquire(par, ++tick);  // a child is sealed by a sequence holding its parent
        held[par]++;
        parent = BlockRef{BlockClass::kQuant, par};
      }
      p.Publish({BlockClass::kQuant, id}, H(next_hash++), parent, 0);
      held[id]++;
    } else if (op == 1 && !held.empty()) {
      auto it = held.begin();
      std::advance(it, rng() % held.size());
      q.Release(it->first, ++tick);
      if (--it->second == 0) held.erase(it);
    } else if (op == 2) {
      std::optional<uint32_t> want;
      for (uint32_t b = 0; b < q.total(); ++b) {
        const BlockInfo& i = q.info(b);
        if (i.state == BlockState::kCached && i.children == 0 &&
            (!want || i.last_use < q.info(*want).last_use)) {
          want = b;
        }
      }
      const std::optional<uint32_t> got = q.EvictionCandidate(std::nullopt);
      ASSERT_EQ(got, want) << "step " << step;
      if (got) p.Evict({BlockClass::kQuant, *got});
    } else if (op == 3 && !held.empty()) {
      auto it = held.begin();
      std::advance(it, rng() % held.size());
      q.Acquire(it->first, ++tick);
      it->second++;
    }
    ASSERT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants() << " at step " << step;
  }
}

TEST(BlockPoolTest, InvariantCheckerCatchesCorruption) {
  PoolSet p(2, 0);
  BlockPool& q = p.pool(BlockClass::kQuant);
  const uint32_t id = *q.TakeFree();
  p.Publish({BlockClass::kQuant, id}, H(1), std::nullopt, 0);
  q.Release(id, 1);
  q.Release(id, 2);  // one release too many: refs wrap
  EXPECT_FALSE(p.CheckInvariants().ok());
}

}  // namespace
}  // namespace kvarn
