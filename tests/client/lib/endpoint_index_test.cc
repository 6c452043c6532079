// The router's local index (client/lib/endpoint_index.h): hashing a prompt as kvarnd does and
// matching its longest cached prefix by tier, without a daemon.
#include "client/lib/endpoint_index.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace kvarn {
namespace {

constexpr uint32_t kTile = 4;

BlockHash Ns(uint8_t seed) {
  HashNamespaceInput in;
  in.model_id = "m";
  in.num_layers = 2;
  in.num_kv_heads = 2;
  in.head_dim = 64;
  in.tile_tokens = kTile;
  in.preset = "kvarn_k4v2_g128";
  in.sink_tokens = kTile;
  in.tenant_salt = TenantSalt(std::string(1, static_cast<char>('a' + seed)), "");
  return NamespaceDigest(in);
}

std::vector<uint32_t> Prompt(size_t n, uint32_t first = 100) {
  std::vector<uint32_t> p(n);
  std::iota(p.begin(), p.end(), first);
  return p;
}

TEST(PromptBlockHashesTest, HashesOnlyTheTilesAPromptCanAdopt) {
  const BlockHash ns = Ns(0);
  EXPECT_TRUE(PromptBlockHashes(ns, kTile, {}).empty());
  EXPECT_TRUE(PromptBlockHashes(ns, kTile, Prompt(kTile)).empty())
      << "the last token is always computed";
  EXPECT_EQ(PromptBlockHashes(ns, kTile, Prompt(kTile + 1)).size(), 1u);
  EXPECT_EQ(PromptBlockHashes(ns, kTile, Prompt(3 * kTile)).size(), 2u);
  EXPECT_EQ(PromptBlockHashes(ns, kTile, Prompt(3 * kTile + 1)).size(), 3u);
}

TEST(PromptBlockHashesTest, ChainsFromTheRootAsTheDaemonDoes) {
  const BlockHash ns = Ns(0);
  const std::vector<uint32_t> p = Prompt(2 * kTile + 1);
  const std::vector<BlockHash> h = PromptBlockHashes(ns, kTile, p);
  ASSERT_EQ(h.size(), 2u);
  const BlockHash h0 = ChainHash(kRootHash, ns, std::span<const uint32_t>(p).subspan(0, kTile));
  EXPECT_EQ(h[0], h0);
  EXPECT_EQ(h[1], ChainHash(h0, ns, std::span<const uint32_t>(p).subspan(kTile, kTile)));
}

TEST(PromptBlockHashesTest, AnotherNamespaceGivesOtherHashes) {
  const std::vector<uint32_t> p = Prompt(2 * kTile + 1);
  EXPECT_NE(PromptBlockHashes(Ns(0), kTile, p)[0], PromptBlockHashes(Ns(1), kTile, p)[0]);
}

TEST(TierBitOfTest, NamesThePlaces) {
  EXPECT_EQ(TierBitOf("pool"), kInPool);
  EXPECT_EQ(TierBitOf(""), kInPool);
  EXPECT_EQ(TierBitOf("disk"), kInDisk);
  EXPECT_EQ(TierBitOf("memcached"), kInRemote);
  EXPECT_EQ(TierBitOf("some-future-tier"), kInRemote);
}

TEST(MatchPlacesTest, PoolRunThenTiersContinueInLocalFirstOrder) {
  const std::vector<uint8_t> places = {
      kInPool, kInPool | kInDisk, kInDisk | kInRemote, kInRemote, 0, kInPool};
  const TierTokens t = MatchPlaces(places, kTile);
  EXPECT_EQ(t.pool, 2 * kTile);
  EXPECT_EQ(t.disk, 1 * kTile) << "a block on disk and remote counts once, as disk";
  EXPECT_EQ(t.remote, 1 * kTile);
  EXPECT_EQ(t.total(), 4 * kTile) << "the match stops at the first block held nowhere";
}

TEST(MatchPlacesTest, PoolOnlyBlockAfterTheRunEndsTheMatch) {
  const std::vector<uint8_t> places = {kInDisk, kInPool, kInDisk};
  const TierTokens t = MatchPlaces(places, kTile);
  EXPECT_EQ(t.pool, 0u);
  EXPECT_EQ(t.disk, kTile);
  EXPECT_EQ(t.total(), kTile);
}

TEST(MatchPlacesTest, NothingCachedIsZero) {
  EXPECT_EQ(MatchPlaces({}, kTile).total(), 0u);
  const std::vector<uint8_t> none = {0, kInPool};
  EXPECT_EQ(MatchPlaces(none, kTile).total(), 0u);
}

TEST(EndpointIndexTest, StoredAndRemovedTrackEachTier) {
  EndpointIndex index;
  const std::vector<BlockHash> h = PromptBlockHashes(Ns(0), kTile, Prompt(3 * kTile + 1));
  for (const BlockHash& b : h) index.Stored(b, kInPool);
  EXPECT_EQ(index.size(), 3u);
  EXPECT_EQ(index.Match(h, kTile).pool, 3 * kTile);

  // The pool evicts block 1 after spilling it to disk: the prefix continues from disk.
  index.Stored(h[1], kInDisk);
  index.Removed(h[1], kInPool);
  TierTokens t = index.Match(h, kTile);
  EXPECT_EQ(t.pool, kTile);
  EXPECT_EQ(t.disk, kTile);
  EXPECT_EQ(t.total(), 2 * kTile)
      << "block 2 is only in the pool, after the gap: Lookup stops there too";
  EXPECT_EQ(index.PlacesOf(h[1]), kInDisk);

  // The disk lets block 1 go too: the hash is forgotten, the match is block 0 only.
  index.Removed(h[1], kInDisk);
  EXPECT_EQ(index.PlacesOf(h[1]), 0);
  EXPECT_EQ(index.size(), 2u);
  EXPECT_EQ(index.Match(h, kTile).total(), kTile);

  // A removal of something never stored changes nothing.
  index.Removed(h[1], kInRemote);
  EXPECT_EQ(index.size(), 2u);
  index.Clear();
  EXPECT_EQ(index.size(), 0u);
  EXPECT_EQ(index.Match(h, kTile).total(), 0u);
}

TEST(EndpointIndexTest, SharedPrefixMatchesHalf) {
  EndpointIndex index;
  const std::vector<uint32_t> p1 = Prompt(8 * kTile + 1);
  for (const BlockHash& b : PromptBlockHashes(Ns(0), kTile, p1)) index.Stored(b, kInPool);
  // The first half of p1, then other tokens.
  std::vector<uint32_t> half(p1.begin(), p1.begin() + 4 * kTile);
  for (uint32_t t : Prompt(4 * kTile + 1, 90000)) half.push_back(t);
  const TierTokens t = index.Match(PromptBlockHashes(Ns(0), kTile, half), kTile);
  EXPECT_EQ(t.pool, 4 * kTile);
  EXPECT_EQ(t.total(), 4 * kTile);
  // Another tenant's namespace finds nothing of it.
  EXPECT_EQ(index.Match(PromptBlockHashes(Ns(1), kTile, p1), kTile).total(), 0u);
}

}  // namespace
}  // namespace kvarn
