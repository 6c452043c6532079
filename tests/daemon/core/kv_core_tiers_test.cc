// The core with tiers below the pool: evicted and sealed blocks go down, a prompt's prefix
// comes back up (onboarded before CreateSequence answers), Lookup says which tier holds
// what, a record out of place is never served, tenants stay apart, and a new core finds a
// stopped one's pool in the tier (a warm restart). The tier here is an in-memory map that
// validates like the real ones (daemon/tiers/ have their own tests).
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "daemon/core/block_record.h"
#include "tests/daemon/core/core_fixture.h"
#include "tests/daemon/core/map_tier.h"

namespace kvarn::testing {
namespace {

class CoreTiersTest : public CoreTest {
 protected:
  // 4 quantized blocks and 1 sink block: one 4-tile prompt (sink + 3 quantized) fills it.
  void MakeTieredCore(TierWrite write, CoreConfig config = CoreConfig()) {
    MakeCore(4, 1, SmallModel(), config);
    tier_ = std::make_unique<MapTier>(core_->tier_identity(), write);
    core_->SetTiers({tier_.get()});
  }

  // A sequence with `prompt` appended in full, released; returns layer 0's decoded keys of
  // the adoptable tiles.
  std::vector<float> Fill(SessionRef s, const std::vector<uint32_t>& prompt) {
    auto q = core_->CreateSequence(s, prompt);
    EXPECT_TRUE(q.ok()) << q.status();
    if (!q.ok()) return {};
    AppendAll(s, q->sequence, prompt, q->cached_tokens);
    std::vector<float> keys = ReadKeys(s, q->sequence, Adoptable(prompt));
    EXPECT_TRUE(core_->Release(s, std::vector<SequenceId>{q->sequence}).ok());
    return keys;
  }
  // Fill(s, prompt), then another whole-pool prompt, so every block of `prompt` is evicted
  // (to the tier, where its policy writes on eviction); returns Fill's keys.
  std::vector<float> FillThenEvict(SessionRef s, const std::vector<uint32_t>& prompt) {
    std::vector<float> keys = Fill(s, prompt);
    Fill(s, Tokens(50000, 4 * 64 + 1));
    return keys;
  }
  std::vector<float> ReadKeys(SessionRef s, SequenceId q, uint32_t tokens) {
    const size_t n = size_t{tokens} * model_.num_kv_heads * model_.head_dim;
    std::vector<float> k(n), v(n);
    absl::Status st = core_->Read(s, q, 0, 0, tokens, k.data(), v.data());
    EXPECT_TRUE(st.ok()) << st;
    k.insert(k.end(), v.begin(), v.end());
    return k;
  }
  uint32_t Adoptable(const std::vector<uint32_t>& prompt) const {
    return static_cast<uint32_t>((prompt.size() - 1) / g_ * g_);
  }
  uint64_t TierTokens(const LookupResult& r) const {
    uint64_t t = 0;
    for (const auto& [name, n] : r.tier_tokens) t += n;
    return t;
  }

  std::unique_ptr<MapTier> tier_;
};

TEST_F(CoreTiersTest, AnEvictedPrefixComesBackFromTheTierWithTheSameBytes) {
  MakeTieredCore(TierWrite::kOnEvict);
  SessionRef s = Open("t");
  const std::vector<uint32_t> a = Tokens(1000, 4 * 64 + 1), b = Tokens(50000, 4 * 64 + 1);
  const std::vector<float> a_keys = Fill(s, a);
  EXPECT_EQ(tier_->size(), 0u) << "nothing is written before the pool lets it go";
  Fill(s, b);  // needs the whole pool: every block of a is evicted
  ASSERT_EQ(tier_->size(), 4u);
  // The records are exactly the pool's blocks: each names its chain position and parent.
  std::set<uint32_t> positions;
  for (const auto& [hash, rec] : tier_->records) {
    RecordFault fault;
    auto meta = CheckRecord(core_->tier_identity(), rec, &hash, &fault);
    ASSERT_TRUE(meta.ok()) << meta.status();
    positions.insert(meta->tile_index);
    EXPECT_EQ(meta->cls, meta->tile_index == 0 ? BlockClass::kSink : BlockClass::kQuant);
  }
  EXPECT_EQ(positions, (std::set<uint32_t>{0, 1, 2, 3}));
  // Each record names the tenant's namespace; one of another namespace is never onboarded.
  for (const auto& [hash, rec] : tier_->records) EXPECT_NE(PeekRecord(rec).ns, BlockHash{});

  auto look = core_->Lookup(s, a);
  ASSERT_TRUE(look.ok());
  EXPECT_EQ(look->pool_tokens, 0u);
  ASSERT_EQ(look->tier_tokens.size(), 1u);
  EXPECT_EQ(look->tier_tokens[0].first, "map");
  EXPECT_EQ(look->tier_tokens[0].second, 4u * 64);

  auto q = core_->CreateSequence(s, a);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->cached_tokens, 4u * 64) << "onboarded before the reply";
  EXPECT_EQ(ReadKeys(s, q->sequence, 4 * 64), a_keys) << "the same K/V as before the eviction";
  auto again = core_->Lookup(s, a);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->pool_tokens, 4u * 64);
  const CoreStats st = core_->Stats(std::nullopt).value();
  ASSERT_EQ(st.tiers.size(), 1u);
  EXPECT_EQ(st.tiers[0].onboarded_blocks, 4u);
  EXPECT_EQ(st.tiers[0].hit_tokens, 4u * 64);
  EXPECT_EQ(st.prefix_hit_tokens, 4u * 64);
  EXPECT_TRUE(core_->CheckInvariants().ok()) << core_->CheckInvariants();
}

TEST_F(CoreTiersTest, ALookupWithPrefetchOnboardsAndHoldsNothing) {
  MakeTieredCore(TierWrite::kOnEvict);
  SessionRef s = Open("t");
  const std::vector<uint32_t> a = Tokens(1000, 4 * 64 + 1);
  FillThenEvict(s, a);
  auto plain = core_->Lookup(s, a);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->pool_tokens, 0u) << "a plain Lookup moves no block";
  auto warm = core_->Lookup(s, a, /*prefetch=*/true);
  ASSERT_TRUE(warm.ok());
  EXPECT_EQ(warm->pool_tokens, 4u * 64);
  EXPECT_EQ(TierTokens(*warm), 0u);
  const CoreStats st = core_->Stats(std::nullopt).value();
  EXPECT_EQ(st.quant_active + st.sink_active, 0u) << "prefetched blocks are cached, held by nobody";
  EXPECT_EQ(st.quant_cached + st.sink_cached, 4u);
  auto q = core_->CreateSequence(s, a);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->cached_tokens, 4u * 64);
  EXPECT_EQ(tier_->gets, 4u) << "the sequence found the prefetched blocks in the pool";
}

TEST_F(CoreTiersTest, ABlockOnboardedFromTheTierIsNotWrittenBackWhenEvictedAgain) {
  MakeTieredCore(TierWrite::kOnEvict);
  SessionRef s = Open("t");
  const std::vector<uint32_t> a = Tokens(1000, 4 * 64 + 1), b = Tokens(50000, 4 * 64 + 1);
  Fill(s, a);
  Fill(s, b);
  auto q = core_->CreateSequence(s, a);  // onboards a, evicting b (written: 4 more)
  ASSERT_TRUE(q.ok());
  ASSERT_TRUE(core_->Release(s, std::vector<SequenceId>{q->sequence}).ok());
  EXPECT_EQ(tier_->puts, 8u);
  Fill(s, b);  // b comes back from the tier; a is evicted again, and the tier has it
  EXPECT_EQ(tier_->puts, 8u);
}

TEST_F(CoreTiersTest, ARecordTheTierDroppedIsWrittenAgainWhenThePoolEvictsTheBlock) {
  MakeTieredCore(TierWrite::kOnEvict);
  SessionRef s = Open("t");
  const std::vector<uint32_t> a = Tokens(1000, 4 * 64 + 1), b = Tokens(50000, 4 * 64 + 1);
  Fill(s, a);
  Fill(s, b);
  ASSERT_EQ(tier_->size(), 4u);
  BlockHash dropped{};  // a's tile 2: the tier holds only a's records now
  for (const auto& [hash, rec] : tier_->records) {
    if (PeekRecord(rec).tile_index == 2) dropped = hash;
  }
  auto q = core_->CreateSequence(s, a);  // onboarded: the pool knows the tier holds a
  ASSERT_TRUE(q.ok());
  ASSERT_TRUE(core_->Release(s, std::vector<SequenceId>{q->sequence}).ok());
  ASSERT_EQ(tier_->puts, 8u);
  tier_->Drop(dropped);
  Fill(s, b);  // a leaves the pool again: only the dropped record is written back
  EXPECT_EQ(tier_->puts, 9u);
  EXPECT_TRUE(tier_->Contains(dropped));
}

TEST_F(CoreTiersTest, ATierWrittenOnSealGetsEachBlockOnceAtItsSeal) {
  MakeTieredCore(TierWrite::kOnSeal);
  SessionRef s = Open("t");
  const uint64_t after = core_->events().last_seq();
  Fill(s, Tokens(1000, 4 * 64 + 1));
  EXPECT_EQ(tier_->size(), 4u);
  Fill(s, Tokens(50000, 4 * 64 + 1));  // evicts the first prompt's blocks: the tier has them
  EXPECT_EQ(tier_->puts, 8u);
  // The tier's stored events reach Watch streams, tagged with the tier.
  bool lost = false;
  int tier_events = 0;
  for (const BlockEvent& e : core_->events().Read(after, 1000, absl::ZeroDuration(), &lost)) {
    if (e.tier == 1 && e.kind == BlockEvent::Kind::kStored) ++tier_events;
  }
  EXPECT_EQ(tier_events, 8);
}

TEST_F(CoreTiersTest, ARecordOutOfPlaceInTheChainIsNeverServed) {
  MakeTieredCore(TierWrite::kOnEvict);
  SessionRef s = Open("t");
  const std::vector<uint32_t> a = Tokens(1000, 4 * 64 + 1);
  const std::vector<float> a_keys = FillThenEvict(s, a);
  ASSERT_EQ(tier_->size(), 4u);
  // A faulty tier: it serves tile 2's record under tile 1's key, and a short one for tile 3.
  tier_->validate = false;
  std::map<uint32_t, BlockHash> by_position;
  for (const auto& [hash, rec] : tier_->records) by_position[PeekRecord(rec).tile_index] = hash;
  tier_->records[by_position[1]] = tier_->records[by_position[2]];
  tier_->records[by_position[3]].resize(100);
  auto q = core_->CreateSequence(s, a);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->cached_tokens, 64u) << "the sink tile only: the prefix ends at the first record out of place";
  const CoreStats st = core_->Stats(std::nullopt).value();
  EXPECT_EQ(st.tiers[0].onboarded_blocks, 1u);
  EXPECT_EQ(st.tiers[0].onboard_failures, 1u);
  const size_t n = size_t{64} * model_.num_kv_heads * model_.head_dim;
  const std::vector<float> got = ReadKeys(s, q->sequence, 64);
  EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + n), std::vector<float>(a_keys.begin(), a_keys.begin() + n));
}

TEST_F(CoreTiersTest, AValidRecordOfAnotherNamespaceIsNeverServed) {
  MakeTieredCore(TierWrite::kOnEvict);
  SessionRef s = Open("t");
  const std::vector<uint32_t> a = Tokens(1000, 4 * 64 + 1);
  FillThenEvict(s, a);
  ASSERT_EQ(tier_->size(), 4u);
  // Re-sealed (a valid MAC) with every field kept but the namespace.
  for (auto& [hash, rec] : tier_->records) {
    RecordMeta meta = PeekRecord(rec);
    meta.ns[0] ^= 1;
    SealRecord(core_->tier_identity(), meta, rec);
  }
  auto q = core_->CreateSequence(s, a);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->cached_tokens, 0u);
  EXPECT_EQ(core_->Stats(std::nullopt).value().tiers[0].onboard_failures, 1u);
}

TEST_F(CoreTiersTest, AnotherTenantNeverFindsTheBlocks) {
  CoreConfig config;
  config.tenant_salt_secret = "salt";
  MakeTieredCore(TierWrite::kOnSeal, config);
  SessionRef a = Open("alice"), b = Open("bob");
  const std::vector<uint32_t> prompt = Tokens(1000, 4 * 64 + 1);
  Fill(a, prompt);
  ASSERT_EQ(tier_->size(), 4u);
  auto look = core_->Lookup(b, prompt);
  ASSERT_TRUE(look.ok());
  EXPECT_EQ(look->total_tokens(), 0u);
  auto q = core_->CreateSequence(b, prompt);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->cached_tokens, 0u);
  EXPECT_EQ(tier_->gets, 0u);
}

TEST_F(CoreTiersTest, AFullPoolEndsTheOnboardedPrefixWithoutFailingTheCall) {
  MakeTieredCore(TierWrite::kOnEvict);
  SessionRef s = Open("t", 3);
  const std::vector<uint32_t> a = Tokens(1000, 4 * 64 + 1), b = Tokens(50000, 3 * 64 + 1);
  Fill(s, a);
  // b's sequence holds the sink and 2 quantized blocks; a's other blocks go to the tier.
  auto hold = core_->CreateSequence(s, b);
  ASSERT_TRUE(hold.ok());
  AppendAll(s, hold->sequence, b, 0);
  ASSERT_EQ(tier_->size(), 4u) << "a was evicted whole (its sink is b's now)";
  auto q = core_->CreateSequence(s, a);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->cached_tokens, 0u) << "no free sink block: a's prefix cannot start";
  EXPECT_TRUE(core_->CheckInvariants().ok()) << core_->CheckInvariants();
}

TEST_F(CoreTiersTest, ANewCoreFindsAStoppedCoresPoolInTheTier) {
  MakeTieredCore(TierWrite::kOnEvict);
  SessionRef s = Open("t");
  const std::vector<uint32_t> a = Tokens(1000, 4 * 64 + 1);
  const std::vector<float> a_keys = Fill(s, a);
  EXPECT_EQ(tier_->size(), 0u);
  EXPECT_EQ(core_->SpillAll(absl::InfiniteFuture()), 4u);
  EXPECT_EQ(tier_->size(), 4u);
  EXPECT_EQ(core_->SpillAll(absl::InfiniteFuture()), 0u) << "blocks the tier took are not written twice";
  // A restart: a new core (a new epoch) over the same tier.
  const uint64_t old_epoch = core_->epoch();
  tier_->SetListener(nullptr);
  core_.reset();
  CoreConfig config;
  config.model = SmallModel();
  Preset p;
  ASSERT_TRUE(ParsePreset(config.model.preset, &p).ok());
  config.capacity_bytes = 4 * qbytes_ + 17 * fbytes_;
  config.fp16_share = (17.0 * fbytes_ + 0.5) / config.capacity_bytes;
  config.sink_share = 1.5 / 17;
  auto core = KvCore::Create(config, &backend_, &clock_, nullptr, nullptr, /*epoch=*/old_epoch + 1);
  ASSERT_TRUE(core.ok()) << core.status();
  core_ = std::move(*core);
  core_->SetTiers({tier_.get()});
  auto stale = core_->Lookup(s, a);
  EXPECT_FALSE(stale.ok()) << "a handle of the old epoch is refused";
  SessionRef s2 = Open("t");
  auto q = core_->CreateSequence(s2, a);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->cached_tokens, 4u * 64);
  EXPECT_EQ(ReadKeys(s2, q->sequence, 4 * 64), a_keys);
}

TEST_F(CoreTiersTest, ATierThatRefusesWritesLosesTheBlocksButNothingElse) {
  MakeTieredCore(TierWrite::kOnEvict);
  tier_->refuse_puts = true;
  SessionRef s = Open("t");
  const std::vector<uint32_t> a = Tokens(1000, 4 * 64 + 1);
  FillThenEvict(s, a);
  EXPECT_EQ(tier_->size(), 0u);
  const CoreStats st = core_->Stats(std::nullopt).value();
  EXPECT_EQ(st.tiers[0].spill_dropped, 4u);
  auto q = core_->CreateSequence(s, a);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->cached_tokens, 0u);
}

}  // namespace
}  // namespace kvarn::testing
