// The disk tier with real kvarnd processes: it carries a pool across a SIGTERM restart (new
// epoch) and across eviction; whatever was damaged in its directory is deleted at start,
// counted and never served; a block its own LRU dropped goes back to it when the pool evicts
// the block; two daemons never share its directory.
#include <filesystem>

#include "tests/integration/tier_fixture.h"

namespace kvarn::it {
namespace {

// Warm restart on the disk tier: the pool spilled on SIGTERM is found by the next kvarnd
//    (new epoch) and adopted byte-identical; damaged and foreign files are deleted at start,
// counted and never served.
TEST_F(TiersTest, WarmRestartServesTheDiskTierAndRejectsDamagedFiles) {
  TempDir tier_dir, sock_dir;
  const std::string dir = tier_dir.path() + "/tier";
  const std::string instance = UniqueInstance();
  const std::string socket = sock_dir.path() + "/kvarnd.sock";
  const std::vector<std::string> flags = {"--disk_tier_dir=" + dir,
                                          absl::StrCat("--tenant_salt_secret=", kSecret)};
  Daemon* first = StartDaemon(flags, instance, socket);
  ASSERT_NE(first, nullptr);
  auto client = Connect(*first);
  ASSERT_NE(client, nullptr);
  IT_ASSIGN_OR_FAIL(old, Open(*client, "team-w"));
  constexpr size_t kTiles = 7;
  const std::vector<uint32_t> prompt = Prompt(80000, kTiles);
  IT_ASSIGN_OR_FAIL(t, Prefill(*old, prompt));
  ASSERT_EQ(t.quant_blocks.size(), kTiles - 1);
  const std::vector<std::string> before = BlockBytes(*old, t);
  const std::vector<BlockHash> hashes = Hashes(*old, prompt);
  const uint64_t old_epoch = old->epoch();
  // Evict-on-write: nothing on disk while the pool holds the blocks.
  EXPECT_EQ(TierStats(*old, "disk").written_blocks(), 0u);
  EXPECT_EQ(TierStats(*old, "disk").write(), "evict");
  StopCleanly(first);
  for (size_t i = 0; i < kTiles; ++i) {
    ASSERT_TRUE(std::filesystem::exists(DiskPath(dir, hashes[i])))
        << "block " << i << " was not spilled on stop";
    const std::string rec = ReadFile(DiskPath(dir, hashes[i]));
    EXPECT_EQ(rec.size(), kRecordHeaderBytes + before[i].size());
    EXPECT_TRUE(rec.substr(kRecordHeaderBytes) == before[i])
        << "file of block " << i << " holds other bytes";
  }

  // Block 4: one payload byte flipped; block 5: cut short; block 6: a valid record of
  // another pool. Plus a foreign record under a name of its own, and a stray file.
  {
    std::string rec = ReadFile(DiskPath(dir, hashes[4]));
    rec[kRecordHeaderBytes + 17] ^= 1;
    ASSERT_NO_FATAL_FAILURE(WriteFile(DiskPath(dir, hashes[4]), rec));
    std::filesystem::resize_file(DiskPath(dir, hashes[5]), kRecordHeaderBytes + 1000);
    ASSERT_NO_FATAL_FAILURE(
        WriteFile(DiskPath(dir, hashes[6]), ForeignRecord(*old, hashes, 6, before[6])));
    const std::vector<uint32_t> elsewhere = Prompt(81000, 2);
    const std::vector<BlockHash> eh = Hashes(*old, elsewhere);
    for (const BlockHash& h : eh)
      std::filesystem::create_directories(std::filesystem::path(DiskPath(dir, h)).parent_path());
    ASSERT_NO_FATAL_FAILURE(WriteFile(DiskPath(dir, eh[1]), ForeignRecord(*old, eh, 1, before[1])));
    ASSERT_NO_FATAL_FAILURE(
        WriteFile(DiskPath(dir, eh[0]), ReadFile(DiskPath(dir, hashes[0]))));  // wrong name
  }

  Daemon* second = StartDaemon(flags, instance, socket);
  ASSERT_NE(second, nullptr);
  ASSERT_NE(second->epoch(), old_epoch);
  auto client2 = Connect(*second);
  ASSERT_NE(client2, nullptr);
  IT_ASSIGN_OR_FAIL(fresh, Open(*client2, "team-w"));
  EXPECT_NE(fresh->epoch(), old_epoch);
  EXPECT_EQ(fresh->prefix_namespace(), old->prefix_namespace());
  const v1::StatsResponse::Tier d0 = TierStats(*fresh, "disk");
  EXPECT_EQ(Rejected(d0, "corrupt"), 1u) << d0.DebugString();
  EXPECT_EQ(Rejected(d0, "truncated"), 1u) << d0.DebugString();
  EXPECT_EQ(Rejected(d0, "foreign"), 2u) << d0.DebugString();
  EXPECT_EQ(Rejected(d0, "wrong_key"), 1u) << d0.DebugString();
  EXPECT_EQ(d0.blocks(), 4u) << "blocks 0-3 survive the scan";
  for (size_t i = 4; i < kTiles; ++i) {
    EXPECT_FALSE(std::filesystem::exists(DiskPath(dir, hashes[i])))
        << "damaged file of block " << i << " kept";
  }

  IT_ASSIGN_OR_FAIL(look, fresh->LookupTiers(prompt));
  EXPECT_EQ(look.pool_tokens(), 0u);
  EXPECT_EQ(TierTokens(look, "disk"), 4u * kTile);
  IT_ASSIGN_OR_FAIL(q, fresh->CreateSequence(prompt));
  EXPECT_EQ(q.cached_tokens, 4u * kTile) << "the prefix ends before the corrupt block";
  const std::vector<std::string> after = BlockBytes(*fresh, q.table);
  ASSERT_EQ(after.size(), 4u);
  for (size_t i = 0; i < after.size(); ++i)
    EXPECT_TRUE(after[i] == before[i]) << "block " << i << " changed across the restart";
  EXPECT_EQ(TierStats(*fresh, "disk").onboarded_blocks(), 4u);
  // The rest is computed again and yields the same bytes.
  IT_ASSIGN_OR_FAIL(t2, AppendTokens(*fresh, q.id, prompt, q.cached_tokens, prompt.size()));
  EXPECT_TRUE(BlockBytes(*fresh, t2) == before);

  // The old daemon's session is refused by the new one.
  const double t0 = NowMs();
  while (old->alive() && NowMs() - t0 < 10000)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(old->alive());
  EXPECT_EQ(old->Lookup(prompt).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(old->CreateSequence(prompt).status().code(), absl::StatusCode::kFailedPrecondition);
  Report(absl::StrCat(
      "disk tier warm restart: epoch ", old_epoch, " -> ", fresh->epoch(), "; ", d0.blocks(),
      " records kept, rejected corrupt 1 truncated 1 foreign 2 wrong_key 1; adopted ",
      q.cached_tokens, " tokens byte-identical"));
}

// Under eviction a small pool hands its blocks to the disk tier, from which a prompt that
// left the pool is adopted again with the same bytes.
TEST_F(TiersTest, EvictedPromptComesBackFromTheDiskTier) {
  TempDir tier_dir;
  std::vector<std::string> flags = SmallPoolFlags();
  flags.push_back("--disk_tier_dir=" + tier_dir.path() + "/tier");
  Daemon* d = StartDaemon(flags);
  ASSERT_NE(d, nullptr);
  auto client = Connect(*d);
  ASSERT_NE(client, nullptr);
  IT_ASSIGN_OR_FAIL(s, Open(*client, "team-e", /*max_sequences=*/2));
  IT_ASSIGN_OR_FAIL(st0, s->Stats());
  ASSERT_EQ(st0.quant_blocks_total(), kQuant) << st0.DebugString();

  constexpr size_t kTiles = 4;  // the sink and 3 quantized blocks
  const std::vector<uint32_t> a = Prompt(90000, kTiles);
  std::vector<std::string> bytes_a;
  IT_ASSERT_OK(PrefillAndRelease(*s, a, &bytes_a));
  // Other prompts until A has left the pool entirely (each prompt: 1 sink + 3 quantized).
  // At every step, what the pool let go of A is on disk: the pool and the disk together
  // always hold all of A's prefix.
  int others = 0;
  bool partly = false;  // seen A split between the pool and the disk
  for (; others < 12; ++others) {
    IT_ASSIGN_OR_FAIL(look, s->LookupTiers(a));
    EXPECT_EQ(look.pool_tokens() + TierTokens(look, "disk"), kTiles * kTile)
        << "after " << others << " other prompts";
    partly |= look.pool_tokens() > 0 && look.pool_tokens() < kTiles * kTile;
    if (look.pool_tokens() == 0) break;
    IT_ASSERT_OK(PrefillAndRelease(*s, Prompt(91000 + 1000 * others, kTiles)));
  }
  IT_ASSIGN_OR_FAIL(look, s->LookupTiers(a));
  EXPECT_EQ(look.pool_tokens(), 0u)
      << "A is still in the pool after " << others << " other prompts";
  EXPECT_EQ(TierTokens(look, "disk"), kTiles * kTile);
  EXPECT_TRUE(partly) << "quantized blocks were expected to go before A's sink";
  const v1::StatsResponse::Tier before = TierStats(*s, "disk");
  EXPECT_GE(before.spilled_blocks(), kTiles) << before.DebugString();
  EXPECT_EQ(before.spill_dropped(), 0u);

  IT_ASSIGN_OR_FAIL(q, s->CreateSequence(a));
  EXPECT_EQ(q.cached_tokens, kTiles * kTile);
  EXPECT_TRUE(BlockBytes(*s, q.table) == bytes_a)
      << "A's blocks came back from disk with other bytes";
  const v1::StatsResponse::Tier after = TierStats(*s, "disk");
  EXPECT_EQ(after.onboarded_blocks(), kTiles);
  EXPECT_EQ(after.hits(), kTiles);
  EXPECT_EQ(after.onboard_failures(), 0u);
  IT_ASSIGN_OR_FAIL(st, s->Stats());
  EXPECT_LE(st.quant_blocks_active() + st.quant_blocks_cached(), kQuant);
  Report(absl::StrCat("disk tier under eviction: A left a pool of ", kQuant, " quantized and ",
                      kSinks, " sink blocks after ", others, " other prompts; ",
                      after.spilled_blocks(), " blocks spilled; A adopted again from disk, ",
                      q.cached_tokens, " tokens byte-identical"));
}

// A block onboarded from the disk tier and later dropped by the disk tier's own LRU (while
// the pool holds it) goes back to disk when the pool evicts it: the pool and the disk
// together keep holding the prefix. (Before KvCore::OnTierEvent cleared the block's
// in_tiers bit on the tier's removal, SpillBeforeEvict skipped the disk for it, and so
// did SpillAll on stop: the most recently used prefix was lost from every tier.)
TEST_F(TiersTest, BlockDroppedByTheDiskLruGoesBackToDiskWhenThePoolEvictsIt) {
  TempDir tier_dir;
  const std::string dir = tier_dir.path() + "/tier";
  std::vector<std::string> flags = SmallPoolFlags();
  flags.push_back("--disk_tier_dir=" + dir);
  flags.push_back("--disk_tier_bytes=1MiB");  // about 10 prompts of the small layout
  Daemon* d = StartDaemon(flags);
  ASSERT_NE(d, nullptr);
  auto client = Connect(*d);
  ASSERT_NE(client, nullptr);
  IT_ASSIGN_OR_FAIL(s, Open(*client, "team-l", /*max_sequences=*/2));
  constexpr size_t kTiles = 4;
  const std::vector<uint32_t> x = Prompt(200000, kTiles);
  const std::vector<BlockHash> hx = Hashes(*s, x);
  uint32_t first = 300000;
  IT_ASSERT_OK(PrefillAndRelease(*s, x));
  // X leaves the pool for the disk...
  for (int i = 0; i < 12; ++i) {
    IT_ASSIGN_OR_FAIL(look, s->LookupTiers(x));
    if (look.pool_tokens() == 0) break;
    IT_ASSERT_OK(Churn(*s, &first, 1));
  }
  IT_ASSIGN_OR_FAIL(look0, s->LookupTiers(x));
  ASSERT_EQ(TierTokens(look0, "disk"), kTiles * kTile);
  // ... comes back (onboarded, held) ...
  IT_ASSIGN_OR_FAIL(q, s->CreateSequence(x));
  ASSERT_EQ(q.cached_tokens, kTiles * kTile);
  // ... and while the pool holds it the disk tier's LRU drops its files (others pass through).
  int churned = 0;
  const auto files_left = [&] {
    int n = 0;
    for (const BlockHash& h : hx) n += std::filesystem::exists(DiskPath(dir, h));
    return n;
  };
  for (; churned < 60 && files_left() > 0; ++churned) IT_ASSERT_OK(Churn(*s, &first, 1));
  ASSERT_EQ(files_left(), 0) << "the disk tier kept X's files after " << churned << " prompts";
  EXPECT_GT(TierStats(*s, "disk").evicted_blocks(), 0u);
  // Now the pool lets X go: it must land on disk again.
  {
    const uint64_t ids[] = {q.id};
    IT_ASSERT_OK(s->Release(ids));
  }
  for (int i = 0; i < 12; ++i) {
    IT_ASSIGN_OR_FAIL(look, s->LookupTiers(x));
    EXPECT_EQ(look.pool_tokens() + TierTokens(look, "disk"), kTiles * kTile)
        << "X's blocks evicted from the pool did not go back to the disk tier (pool "
        << look.pool_tokens() << ", disk " << TierTokens(look, "disk") << " tokens)";
    if (look.pool_tokens() == 0) break;
    IT_ASSERT_OK(Churn(*s, &first, 1));
  }
}

// Two kvarnd never share a disk tier's directory: the second one refuses to start, naming
// it, and the first keeps serving.
TEST_F(TiersTest, SecondDaemonOnTheSameDiskDirectoryRefusesToStart) {
  TempDir tier_dir;
  const std::string flag = "--disk_tier_dir=" + tier_dir.path() + "/tier";
  Daemon* first = StartDaemon({flag, absl::StrCat("--tenant_salt_secret=", kSecret)});
  ASSERT_NE(first, nullptr);
  DaemonOptions o;
  o.extra_flags = {flag, absl::StrCat("--tenant_salt_secret=", kSecret)};
  auto second = Daemon::Start(o);
  ASSERT_FALSE(second.ok()) << "a second kvarnd opened the same disk tier";
  EXPECT_THAT(std::string(second.status().message()), ::testing::HasSubstr("disk tier"));
  EXPECT_THAT(std::string(second.status().message()), ::testing::HasSubstr(tier_dir.path()));
  auto client = Connect(*first);
  ASSERT_NE(client, nullptr);
  IT_ASSIGN_OR_FAIL(s, Open(*client, "team-x"));
  IT_ASSIGN_OR_FAIL(t, Prefill(*s, Prompt(130000, 2)));
  EXPECT_EQ(t.quant_blocks.size(), 1u);
}

// A record damaged on disk while the daemon runs is refused at onboard (the prefix ends
// before it), counted, and its file deleted; the blocks before it are adopted with their bytes.
TEST_F(TiersTest, RecordDamagedWhileRunningIsRefusedAndDeleted) {
  TempDir tier_dir;
  const std::string dir = tier_dir.path() + "/tier";
  std::vector<std::string> flags = SmallPoolFlags();
  flags.push_back("--disk_tier_dir=" + dir);
  Daemon* d = StartDaemon(flags);
  ASSERT_NE(d, nullptr);
  auto client = Connect(*d);
  ASSERT_NE(client, nullptr);
  IT_ASSIGN_OR_FAIL(s, Open(*client, "team-r", /*max_sequences=*/2));
  constexpr size_t kTiles = 4;
  const std::vector<uint32_t> a = Prompt(150000, kTiles);
  const std::vector<BlockHash> ha = Hashes(*s, a);
  std::vector<std::string> bytes_a;
  IT_ASSERT_OK(PrefillAndRelease(*s, a, &bytes_a));
  uint32_t first = 160000;
  for (int i = 0; i < 12; ++i) {
    IT_ASSIGN_OR_FAIL(look, s->LookupTiers(a));
    if (look.pool_tokens() == 0) break;
    IT_ASSERT_OK(Churn(*s, &first, 1));
  }
  // Every evicted block is written out (Get would serve a queued one from memory).
  const double deadline = NowMs() + 20000;
  const auto all_files = [&] {
    for (const BlockHash& h : ha) {
      if (!std::filesystem::exists(DiskPath(dir, h))) return false;
    }
    return TierStats(*s, "disk").queued_blocks() == 0;
  };
  while (!all_files()) {
    ASSERT_LT(NowMs(), deadline) << "A's records were not written";
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::string rec = ReadFile(DiskPath(dir, ha[2]));
  ASSERT_EQ(rec.size(), kRecordHeaderBytes + bytes_a[2].size());
  rec[kRecordHeaderBytes + 5] ^= 0x40;
  ASSERT_NO_FATAL_FAILURE(WriteFile(DiskPath(dir, ha[2]), rec));

  IT_ASSIGN_OR_FAIL(q, s->CreateSequence(a));
  EXPECT_EQ(q.cached_tokens, 2u * kTile) << "the prefix ends before the damaged block";
  std::vector<std::string> want = bytes_a;
  want.resize(2);
  EXPECT_TRUE(BlockBytes(*s, q.table) == want);
  const v1::StatsResponse::Tier t = TierStats(*s, "disk");
  EXPECT_EQ(Rejected(t, "corrupt"), 1u) << t.DebugString();
  EXPECT_EQ(t.onboard_failures(), 0u);
  // The writer thread deletes the file.
  while (std::filesystem::exists(DiskPath(dir, ha[2]))) {
    ASSERT_LT(NowMs(), deadline + 20000) << "the damaged file was not deleted";
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  IT_ASSIGN_OR_FAIL(look, s->LookupTiers(a));
  EXPECT_EQ(look.pool_tokens(), 2u * kTile);
  EXPECT_EQ(TierTokens(look, "disk"), 0u) << "the damaged block is still indexed";
}

}  // namespace
}  // namespace kvarn::it
