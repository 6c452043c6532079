// The shared memcached tier with real processes: kvarnd nodes (separate pools) over three real
// memcached servers. A prompt prefilled on one node is onboarded by another with the very same
// bytes; a dead or hung server, a corrupt value, another pool's record and another tenant only
// ever cost misses; a node with a disk tier continues one prefix from its disk, then from
// memcached. The disk tier alone: tiers_disk_test.cc.
#include "tests/integration/tier_fixture.h"

namespace kvarn::it {
namespace {

// A prompt prefilled on node 1 is a memcached hit on node 2, onboarded byte-identical;
// the /metrics series of both nodes say so.
TEST_F(TiersTest, PromptPrefilledOnOneNodeIsOnboardedByAnotherWithIdenticalBytes) {
  ASSERT_NO_FATAL_FAILURE(StartMemcached());
  Node n1, n2;
  ASSERT_NO_FATAL_FAILURE(StartTwoNodes(n1, n2, "team-t"));

  constexpr size_t kTiles = 6;  // the sink and 5 quantized blocks
  const std::vector<uint32_t> prompt = Prompt(40000, kTiles);
  IT_ASSIGN_OR_FAIL(t1, Prefill(*n1.session, prompt));
  ASSERT_TRUE(t1.has_sink);
  ASSERT_EQ(t1.quant_blocks.size(), kTiles - 1);
  const std::vector<std::string> bytes1 = BlockBytes(*n1.session, t1);
  IT_ASSERT_OK(AwaitWritten(*n1.session, "memcached", kTiles));
  const v1::StatsResponse::Tier w1 = TierStats(*n1.session, "memcached");
  EXPECT_EQ(w1.written_blocks(), kTiles);
  EXPECT_EQ(w1.spilled_blocks(), kTiles);
  EXPECT_EQ(w1.write(), "seal");
  // Every block is on exactly one of the servers, under its key.
  const std::vector<BlockHash> hashes = Hashes(*n1.session, prompt);
  ASSERT_EQ(hashes.size(), kTiles);
  for (const BlockHash& h : hashes) {
    IT_ASSIGN_OR_FAIL(server, McFind(*memcached_, Key(h)));
    EXPECT_GE(server, 0) << Key(h) << " is on no server";
  }

  // Node 2's pool has none of it; the memcached tier continues the prefix to its end.
  IT_ASSIGN_OR_FAIL(look, n2.session->LookupTiers(prompt));
  EXPECT_EQ(look.pool_tokens(), 0u);
  EXPECT_EQ(TierTokens(look, "memcached"), kTiles * kTile);
  EXPECT_EQ(look.cached_tokens(), kTiles * kTile);

  IT_ASSIGN_OR_FAIL(q2, n2.session->CreateSequence(prompt));
  EXPECT_EQ(q2.cached_tokens, kTiles * kTile);
  ASSERT_TRUE(q2.table.has_sink);
  ASSERT_EQ(q2.table.quant_blocks.size(), kTiles - 1);
  const std::vector<std::string> bytes2 = BlockBytes(*n2.session, q2.table);
  ASSERT_EQ(bytes2.size(), bytes1.size());
  for (size_t i = 0; i < bytes1.size(); ++i) {
    EXPECT_TRUE(bytes2[i] == bytes1[i])
        << "block " << i << " of the prefix differs between the nodes";
  }
  // Dequantized through node 2's mapping, a block reads as on node 1.
  for (size_t i = 0; i < t1.quant_blocks.size(); ++i) {
    IT_ASSIGN_OR_FAIL(d1, DigestQuantBlock(*n1.session, t1.quant_blocks[i]));
    IT_ASSIGN_OR_FAIL(d2, DigestQuantBlock(*n2.session, q2.table.quant_blocks[i]));
    EXPECT_EQ(d1.dequantized, d2.dequantized) << "quantized block " << i;
  }
  const v1::StatsResponse::Tier r2 = TierStats(*n2.session, "memcached");
  EXPECT_EQ(r2.onboarded_blocks(), kTiles);
  EXPECT_EQ(r2.hit_tokens(), kTiles * kTile);
  EXPECT_EQ(r2.hits(), kTiles);
  EXPECT_EQ(r2.onboard_failures(), 0u);
  EXPECT_EQ(r2.errors(), 0u);
  // Onboarded blocks are marked as in memcached: node 2 does not write them back.
  EXPECT_EQ(r2.spilled_blocks(), 0u);
  // Now in node 2's pool: a second lookup is all pool.
  IT_ASSIGN_OR_FAIL(look2, n2.session->LookupTiers(prompt));
  EXPECT_EQ(look2.pool_tokens(), kTiles * kTile);
  EXPECT_EQ(TierTokens(look2, "memcached"), 0u);

  // /metrics of node 2 (onboarded) and node 1 (written), promtool clean.
  const auto scrape = [](Daemon& d, const std::string& name, const std::string& labels,
                         double want) {
    std::string text;
    const double t0 = NowMs();
    for (;;) {  // the exporter caches the core's figures for 100 ms
      auto body = HttpGet(d.metrics_port(), "/metrics");
      EXPECT_TRUE(body.ok()) << body.status();
      if (!body.ok()) return text;
      text = *body;
      if (MetricValue(text, name, labels) == want || NowMs() - t0 > 5000) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(MetricValue(text, name, labels), std::optional<double>(want)) << name << labels;
    return text;
  };
  const std::string m2 =
      scrape(*n2.daemon, "kvarn_tier_onboarded_blocks_total", "{tier=\"memcached\"}", kTiles);
  EXPECT_EQ(MetricValue(m2, "kvarn_tier_hit_tokens_total", "{tier=\"memcached\"}"),
            std::optional<double>(kTiles * kTile));
  EXPECT_EQ(MetricValue(m2, "kvarn_tier_lookups_total", "{tier=\"memcached\",result=\"hit\"}"),
            std::optional<double>(kTiles));
  EXPECT_EQ(MetricValue(m2, "kvarn_tier_rejected_blocks_total",
                        "{tier=\"memcached\",reason=\"corrupt\"}"),
            std::optional<double>(0));
  EXPECT_EQ(MetricValue(m2, "kvarn_tier_onboard_seconds_per_block_count", "{tier=\"memcached\"}"),
            std::optional<double>(kTiles))
      << "one observation per onboarded block";
  IT_ASSIGN_OR_FAIL(check, RunWithInput(PromtoolBinary(), {"check", "metrics"}, m2));
  EXPECT_TRUE(WIFEXITED(check.first) && WEXITSTATUS(check.first) == 0) << check.second;
  EXPECT_EQ(check.second, "") << "promtool lint output";
  const std::string m1 =
      scrape(*n1.daemon, "kvarn_tier_written_blocks_total", "{tier=\"memcached\"}", kTiles);
  EXPECT_EQ(MetricValue(m1, "kvarn_tier_spilled_blocks_total", "{tier=\"memcached\"}"),
            std::optional<double>(kTiles));
  EXPECT_EQ(MetricValue(m1, "kvarn_tier_write_queue_blocks", "{tier=\"memcached\"}"),
            std::optional<double>(0));
  const double written_bytes =
      MetricValue(m1, "kvarn_tier_written_bytes_total", "{tier=\"memcached\"}").value_or(-1);
  const double record_bytes = static_cast<double>(
      kRecordHeaderBytes + n1.session->block_layout().fp16_block_bytes() +
      (kTiles - 1) * (kRecordHeaderBytes + n1.session->block_layout().quant_block_bytes()));
  // Records plus at most a frame per value.
  EXPECT_GE(written_bytes, record_bytes);
  EXPECT_LE(written_bytes, record_bytes + kTiles * MemcachedTier::kFrameBytes);
  Report(absl::StrCat("memcached tier: ", kTiles, " blocks written by node 1 (", written_bytes,
                      " bytes), onboarded by node 2 byte-identical"));
}

// A killed memcached server loses its share only: node 2's prefix ends at the first block
// that server held; every call succeeds; the misses and errors are counted.
TEST_F(TiersTest, KilledServerCostsOnlyTheBlocksItHeld) {
  ASSERT_NO_FATAL_FAILURE(StartMemcached());
  Node n1, n2;
  ASSERT_NO_FATAL_FAILURE(StartTwoNodes(n1, n2, "team-k"));
  constexpr size_t kTiles = 12;
  const std::vector<uint32_t> prompt = Prompt(50000, kTiles);
  IT_ASSIGN_OR_FAIL(t1, Prefill(*n1.session, prompt));
  ASSERT_EQ(t1.quant_blocks.size(), kTiles - 1);
  IT_ASSERT_OK(AwaitWritten(*n1.session, "memcached", kTiles));
  const std::vector<BlockHash> hashes = Hashes(*n1.session, prompt);
  std::vector<int> server(kTiles);
  for (size_t i = 0; i < kTiles; ++i) {
    IT_ASSIGN_OR_FAIL(s, McFind(*memcached_, Key(hashes[i])));
    ASSERT_GE(s, 0) << "block " << i << " is on no server";
    server[i] = s;
  }
  // The victim: the server of the first block not on block 0's server, so the prefix that
  // survives is known exactly and is neither empty nor whole.
  size_t first_lost = 0;
  for (size_t i = 1; i < kTiles && first_lost == 0; ++i) {
    if (server[i] != server[0]) first_lost = i;
  }
  ASSERT_GT(first_lost, 0u) << "all " << kTiles
                            << " blocks on one server: ketama should spread them";
  const int victim = server[first_lost];
  size_t lost = 0;
  for (int s : server) lost += s == victim;
  memcached_->Kill(victim);

  IT_ASSIGN_OR_FAIL(look, n2.session->LookupTiers(prompt));
  EXPECT_EQ(look.pool_tokens(), 0u);
  EXPECT_EQ(TierTokens(look, "memcached"), first_lost * kTile);
  IT_ASSIGN_OR_FAIL(q2, n2.session->CreateSequence(prompt));
  EXPECT_EQ(q2.cached_tokens, first_lost * kTile)
      << "server " << victim << " held block " << first_lost;
  const std::vector<std::string> bytes1 = BlockBytes(*n1.session, t1);
  const std::vector<std::string> bytes2 = BlockBytes(*n2.session, q2.table);
  ASSERT_EQ(bytes2.size(), first_lost);
  for (size_t i = 0; i < first_lost; ++i) EXPECT_TRUE(bytes2[i] == bytes1[i]) << "block " << i;
  // Node 2 computes the rest itself: its appends succeed (writes to the dead server fail
  // inside the tier, not in the call).
  IT_ASSIGN_OR_FAIL(t2, AppendTokens(*n2.session, q2.id, prompt, q2.cached_tokens, prompt.size()));
  EXPECT_EQ(t2.tokens, prompt.size());
  EXPECT_TRUE(BlockBytes(*n2.session, t2) == bytes1) << "recomputed blocks differ from node 1's";
  const v1::StatsResponse::Tier r2 = TierStats(*n2.session, "memcached");
  EXPECT_EQ(r2.onboarded_blocks(), first_lost);
  EXPECT_GE(r2.misses(), 1u);
  EXPECT_GE(r2.errors(), 1u) << "the dead server's failure is counted";
  // Node 1 keeps serving too.
  const std::vector<uint32_t> other = Prompt(51000, 4);
  IT_ASSIGN_OR_FAIL(t1b, Prefill(*n1.session, other));
  EXPECT_EQ(t1b.tokens, other.size());
  Report(absl::StrCat("killed memcached server ", victim, " of 3 held ", lost, " of ", kTiles,
                      " blocks; node 2 adopted ", q2.cached_tokens, " tokens (prefix up to block ",
                      first_lost, "); node 2 misses ", r2.misses(), " errors ", r2.errors()));
}

// A flipped byte, garbage, and another pool's valid record under a block's key are
// refused by header or MAC, counted, deleted, and never adopted.
TEST_F(TiersTest, CorruptGarbageAndForeignValuesAreRejectedCountedAndDeleted) {
  ASSERT_NO_FATAL_FAILURE(StartMemcached());
  Node n1, n2;
  ASSERT_NO_FATAL_FAILURE(StartTwoNodes(n1, n2, "team-c"));
  constexpr size_t kTiles = 4;
  const std::vector<uint32_t> p_flip = Prompt(60000, kTiles);
  const std::vector<uint32_t> p_garbage = Prompt(61000, kTiles);
  const std::vector<uint32_t> p_foreign = Prompt(62000, kTiles);
  IT_ASSIGN_OR_FAIL(t_flip, Prefill(*n1.session, p_flip));
  IT_ASSIGN_OR_FAIL(t_garbage, Prefill(*n1.session, p_garbage));
  IT_ASSIGN_OR_FAIL(t_foreign, Prefill(*n1.session, p_foreign));
  IT_ASSERT_OK(AwaitWritten(*n1.session, "memcached", 3 * kTiles));

  // Block 2 of p_flip: one payload byte flipped. Block 1 of p_garbage: bytes that are not a
  // value at all. Block 3 of p_foreign: a record of another model's pool with a valid MAC.
  struct Damage {
    const std::vector<uint32_t>* prompt;
    const SequenceTable* table;
    size_t block;
    std::string key;
    int server = -1;
  };
  std::vector<Damage> damage = {
      {&p_flip, &t_flip, 2, ""}, {&p_garbage, &t_garbage, 1, ""}, {&p_foreign, &t_foreign, 3, ""}};
  for (Damage& d : damage) {
    const std::vector<BlockHash> hashes = Hashes(*n1.session, *d.prompt);
    d.key = Key(hashes[d.block]);
    IT_ASSIGN_OR_FAIL(server, McFind(*memcached_, d.key));
    ASSERT_GE(server, 0);
    d.server = server;
    IT_ASSIGN_OR_FAIL(value, McGet(memcached_->port(server), d.key));
    ASSERT_TRUE(value.has_value());
    std::string v = *value;
    if (d.prompt == &p_flip) {
      ASSERT_GT(v.size(), MemcachedTier::kFrameBytes + kRecordHeaderBytes + 100);
      v[MemcachedTier::kFrameBytes + kRecordHeaderBytes + 100] ^= 0x20;
    } else if (d.prompt == &p_garbage) {
      v.assign(5000, '\0');
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<char>((i * 131 + 7) & 0xff);
    } else {
      const std::string payload = BlockBytes(*n1.session, *d.table)[d.block];
      const std::vector<std::string> values =
          MemcachedValues(ForeignRecord(*n1.session, hashes, d.block, payload), 512 * 1024);
      ASSERT_EQ(values.size(), 1u);
      v = values[0];
    }
    IT_ASSERT_OK(McSet(memcached_->port(server), d.key, v));
  }

  // Lookup only touches keys: it may count the damaged blocks. CreateSequence reads them.
  IT_ASSIGN_OR_FAIL(q_flip, n2.session->CreateSequence(p_flip));
  EXPECT_EQ(q_flip.cached_tokens, 2u * kTile) << "the prefix ends before the corrupt block";
  IT_ASSIGN_OR_FAIL(q_garbage, n2.session->CreateSequence(p_garbage));
  EXPECT_EQ(q_garbage.cached_tokens, 1u * kTile);
  IT_ASSIGN_OR_FAIL(q_foreign, n2.session->CreateSequence(p_foreign));
  EXPECT_EQ(q_foreign.cached_tokens, 3u * kTile);
  // What was adopted is node 1's bytes.
  std::vector<std::string> want = BlockBytes(*n1.session, t_foreign);
  want.resize(3);
  EXPECT_TRUE(BlockBytes(*n2.session, q_foreign.table) == want);
  const v1::StatsResponse::Tier r2 = TierStats(*n2.session, "memcached");
  EXPECT_EQ(Rejected(r2, "corrupt"), 2u) << r2.DebugString();
  EXPECT_EQ(Rejected(r2, "foreign"), 1u) << r2.DebugString();
  EXPECT_EQ(Rejected(r2, "truncated"), 0u);
  EXPECT_EQ(Rejected(r2, "wrong_key"), 0u);
  EXPECT_EQ(r2.onboarded_blocks(), 2u + 1u + 3u);
  EXPECT_EQ(r2.onboard_failures(), 0u) << "rejections are the tier's, not failed onboards";
  // Each damaged key is gone from every server.
  for (const Damage& d : damage) {
    IT_ASSIGN_OR_FAIL(where, McFind(*memcached_, d.key));
    EXPECT_EQ(where, -1) << d.key << " (block " << d.block << ") was not deleted";
  }
  // The damaged block is a plain miss now: node 2 finds the adopted part in its pool and
  // nothing more below it.
  IT_ASSIGN_OR_FAIL(look, n2.session->LookupTiers(p_flip));
  EXPECT_EQ(look.pool_tokens(), 2u * kTile);
  EXPECT_EQ(TierTokens(look, "memcached"), 0u);
  Report(absl::StrCat("memcached tier: rejected corrupt ", Rejected(r2, "corrupt"), " foreign ",
                      Rejected(r2, "foreign"), "; keys deleted; prefixes ended before them"));
}

// Another tenant never finds tenant A's blocks in the shared tier.
TEST_F(TiersTest, AnotherTenantFindsNothingInTheSharedTier) {
  ASSERT_NO_FATAL_FAILURE(StartMemcached());
  Node n1, n2;
  ASSERT_NO_FATAL_FAILURE(StartNode(n1, "tenant-a"));
  ASSERT_NO_FATAL_FAILURE(StartNode(n2, "tenant-b"));
  constexpr size_t kTiles = 5;
  const std::vector<uint32_t> prompt = Prompt(70000, kTiles);
  ASSERT_TRUE(Prefill(*n1.session, prompt).ok());
  IT_ASSERT_OK(AwaitWritten(*n1.session, "memcached", kTiles));
  EXPECT_NE(n1.session->prefix_namespace(), n2.session->prefix_namespace());

  IT_ASSIGN_OR_FAIL(look, n2.session->LookupTiers(prompt));
  EXPECT_EQ(look.cached_tokens(), 0u);
  EXPECT_EQ(TierTokens(look, "memcached"), 0u);
  IT_ASSIGN_OR_FAIL(qb, n2.session->CreateSequence(prompt));
  EXPECT_EQ(qb.cached_tokens, 0u);
  const v1::StatsResponse::Tier rb = TierStats(*n2.session, "memcached");
  EXPECT_EQ(rb.hits(), 0u);
  EXPECT_EQ(rb.onboarded_blocks(), 0u);
  // Tenant A on the same node 2 does find them (the keys are there, B's are other keys).
  IT_ASSIGN_OR_FAIL(a2, Open(*n2.client, "tenant-a"));
  IT_ASSIGN_OR_FAIL(qa, a2->CreateSequence(prompt));
  EXPECT_EQ(qa.cached_tokens, kTiles * kTile);
}

// A hung memcached server (SIGSTOP: the kernel accepts, nothing answers) is a miss within
// the tier's timeout, never an error and never a call stuck on it.
TEST_F(TiersTest, HungServerIsAMissWithinTheTimeout) {
  ASSERT_NO_FATAL_FAILURE(StartMemcached());
  Node n1, n2;
  ASSERT_NO_FATAL_FAILURE(StartNode(n1, "team-h"));
  ASSERT_NO_FATAL_FAILURE(StartNode(n2, "team-h", {"--memcached_timeout_ms=250"}));
  constexpr size_t kTiles = 12;
  const std::vector<uint32_t> prompt = Prompt(110000, kTiles);
  ASSERT_TRUE(Prefill(*n1.session, prompt).ok());
  IT_ASSERT_OK(AwaitWritten(*n1.session, "memcached", kTiles));
  const std::vector<BlockHash> hashes = Hashes(*n1.session, prompt);
  std::vector<int> server(kTiles);
  for (size_t i = 0; i < kTiles; ++i) {
    IT_ASSIGN_OR_FAIL(s, McFind(*memcached_, Key(hashes[i])));
    ASSERT_GE(s, 0);
    server[i] = s;
  }
  size_t first_lost = 0;
  for (size_t i = 1; i < kTiles && first_lost == 0; ++i) {
    if (server[i] != server[0]) first_lost = i;
  }
  ASSERT_GT(first_lost, 0u);
  memcached_->Pause(server[first_lost]);
  double t0 = NowMs();
  IT_ASSIGN_OR_FAIL(look, n2.session->LookupTiers(prompt));
  const double lookup_ms = NowMs() - t0;
  t0 = NowMs();
  IT_ASSIGN_OR_FAIL(q, n2.session->CreateSequence(prompt));
  const double create_ms = NowMs() - t0;
  memcached_->Resume(server[first_lost]);
  EXPECT_EQ(TierTokens(look, "memcached"), first_lost * kTile);
  EXPECT_EQ(q.cached_tokens, first_lost * kTile);
  // One block on the hung server is asked for per call: a few poll timeouts at most.
  EXPECT_LT(lookup_ms, 2000) << "Lookup waited on the hung server";
  EXPECT_LT(create_ms, 2000) << "CreateSequence waited on the hung server";
  const v1::StatsResponse::Tier r2 = TierStats(*n2.session, "memcached");
  EXPECT_GE(r2.errors(), 1u);
  EXPECT_EQ(r2.onboarded_blocks(), first_lost);
  Report(absl::StrCat("hung memcached server: Lookup ", lookup_ms, " ms, CreateSequence ",
                      create_ms, " ms (timeout 250 ms), adopted ", q.cached_tokens, " tokens"));
}

// With every memcached server dead, both nodes keep serving (writes dropped and counted,
// reads miss) and a node still stops promptly: its tier does not hold the stop for
// tier_stop_ms.
TEST_F(TiersTest, AllServersDeadCostOnlyMissesAndStopStaysPrompt) {
  ASSERT_NO_FATAL_FAILURE(StartMemcached());
  Node n1, n2;
  ASSERT_NO_FATAL_FAILURE(StartTwoNodes(n1, n2, "team-d"));
  for (int i = 0; i < memcached_->size(); ++i) memcached_->Kill(i);
  constexpr size_t kTiles = 6;
  const std::vector<uint32_t> prompt = Prompt(120000, kTiles);
  IT_ASSIGN_OR_FAIL(t1, Prefill(*n1.session, prompt));
  EXPECT_EQ(t1.tokens, prompt.size());
  // The writes fail inside the tier: wait until it has given up on all of them.
  const double deadline = NowMs() + 20000;
  v1::StatsResponse::Tier w1;
  for (;;) {
    w1 = TierStats(*n1.session, "memcached");
    if (w1.queued_blocks() == 0 && w1.dropped_writes() + w1.written_blocks() >= kTiles) break;
    ASSERT_LT(NowMs(), deadline) << w1.DebugString();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(w1.written_blocks(), 0u);
  EXPECT_EQ(w1.dropped_writes(), kTiles);
  EXPECT_GE(w1.errors(), kTiles);
  IT_ASSIGN_OR_FAIL(look, n2.session->LookupTiers(prompt));
  EXPECT_EQ(look.cached_tokens(), 0u);
  IT_ASSIGN_OR_FAIL(q2, n2.session->CreateSequence(prompt));
  EXPECT_EQ(q2.cached_tokens, 0u);
  IT_ASSIGN_OR_FAIL(t2, AppendTokens(*n2.session, q2.id, prompt, 0, prompt.size()));
  EXPECT_EQ(t2.tokens, prompt.size());
  EXPECT_GE(TierStats(*n2.session, "memcached").errors(), 1u);
  // Sessions closed first, so the stop does not wait out drain_ms for them.
  n1.session.reset();
  const double t0 = NowMs();
  ASSERT_NO_FATAL_FAILURE(StopCleanly(n1.daemon));
  const double stop_ms = NowMs() - t0;
  EXPECT_LT(stop_ms, 5000) << "the stop waited on dead memcached servers";
  Report(absl::StrCat("all memcached servers dead: node 1 dropped ", w1.dropped_writes(),
                      " writes (", w1.errors(),
                      " errors), node 2 adopted 0 tokens, every call succeeded; node 1 stopped in ",
                      stop_ms, " ms"));
}

// Both tiers under one node: a restarted node with a disk tier and the shared memcached
// tier continues a prompt from its disk (the first tiles, its own old pool) and then from
// memcached (the rest, prefilled by another node), in lookup order, in one CreateSequence;
// its blocks are those of the node that prefilled the whole prompt, byte for byte.
TEST_F(TiersTest, DiskThenMemcachedContinueOnePrefix) {
  ASSERT_NO_FATAL_FAILURE(StartMemcached());
  TempDir tier_dir;
  const std::string disk_flag = "--disk_tier_dir=" + tier_dir.path() + "/tier";
  constexpr size_t kTiles = 6, kOnDisk = 3;
  const std::vector<uint32_t> prompt = Prompt(140000, kTiles);
  const std::vector<uint32_t> head(prompt.begin(), prompt.begin() + kOnDisk * kTile + 10);
  // Node B, first life: disk tier only; prefills the head, stops (spilling it to disk).
  {
    Daemon* b1 = StartDaemon({disk_flag, absl::StrCat("--tenant_salt_secret=", kSecret)});
    ASSERT_NE(b1, nullptr);
    auto c = Connect(*b1);
    ASSERT_NE(c, nullptr);
    IT_ASSIGN_OR_FAIL(s, Open(*c, "team-s"));
    IT_ASSIGN_OR_FAIL(t, Prefill(*s, head));
    ASSERT_EQ(t.quant_blocks.size(), kOnDisk - 1);
    s.reset();
    c.reset();
    ASSERT_NO_FATAL_FAILURE(StopCleanly(b1));
  }
  // Node A: memcached only; prefills the whole prompt.
  Node a;
  ASSERT_NO_FATAL_FAILURE(StartNode(a, "team-s"));
  IT_ASSIGN_OR_FAIL(ta, Prefill(*a.session, prompt));
  const std::vector<std::string> bytes_a = BlockBytes(*a.session, ta);
  IT_ASSERT_OK(AwaitWritten(*a.session, "memcached", kTiles));
  // Node B, second life: its disk, then memcached.
  Node b;
  ASSERT_NO_FATAL_FAILURE(StartNode(b, "team-s", {disk_flag}));
  IT_ASSIGN_OR_FAIL(look, b.session->LookupTiers(prompt));
  ASSERT_EQ(look.tiers_size(), 2);
  EXPECT_EQ(look.tiers(0).tier(), "disk");
  EXPECT_EQ(look.tiers(1).tier(), "memcached");
  EXPECT_EQ(look.pool_tokens(), 0u);
  EXPECT_EQ(TierTokens(look, "disk"), kOnDisk * kTile);
  EXPECT_EQ(TierTokens(look, "memcached"), (kTiles - kOnDisk) * kTile);
  EXPECT_EQ(look.cached_tokens(), kTiles * kTile);
  IT_ASSIGN_OR_FAIL(q, b.session->CreateSequence(prompt));
  EXPECT_EQ(q.cached_tokens, kTiles * kTile);
  const std::vector<std::string> bytes_b = BlockBytes(*b.session, q.table);
  ASSERT_EQ(bytes_b.size(), kTiles);
  for (size_t i = 0; i < kTiles; ++i) EXPECT_TRUE(bytes_b[i] == bytes_a[i]) << "block " << i;
  EXPECT_EQ(TierStats(*b.session, "disk").onboarded_blocks(), kOnDisk);
  EXPECT_EQ(TierStats(*b.session, "memcached").onboarded_blocks(), kTiles - kOnDisk);
  // The metrics carry both tier labels.
  std::string text;
  const double t0 = NowMs();
  for (;;) {
    IT_ASSIGN_OR_FAIL(body, HttpGet(b.daemon->metrics_port(), "/metrics"));
    text = body;
    if (MetricValue(text, "kvarn_tier_onboarded_blocks_total", "{tier=\"memcached\"}") ==
            kTiles - kOnDisk ||
        NowMs() - t0 > 5000) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(MetricValue(text, "kvarn_tier_onboarded_blocks_total", "{tier=\"disk\"}"),
            std::optional<double>(kOnDisk));
  EXPECT_EQ(MetricValue(text, "kvarn_tier_onboarded_blocks_total", "{tier=\"memcached\"}"),
            std::optional<double>(kTiles - kOnDisk));
  EXPECT_EQ(MetricValue(text, "kvarn_tier_blocks", "{tier=\"disk\"}"),
            std::optional<double>(kOnDisk));
  EXPECT_GT(MetricValue(text, "kvarn_tier_capacity_bytes", "{tier=\"disk\"}").value_or(0), 0);
  EXPECT_EQ(MetricValue(text, "kvarn_tier_capacity_bytes", "{tier=\"memcached\"}"),
            std::optional<double>(0));
}

}  // namespace
}  // namespace kvarn::it
