#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "daemon/core/kv_core.h"
#include "tests/daemon/core/core_fixture.h"

namespace kvarn::testing {
namespace {

using ::testing::HasSubstr;

TEST_F(CoreTest, RejectsConfigsThatCannotHoldABlock) {
  CoreConfig c;
  c.model = SmallModel();
  c.capacity_bytes = 1000;
  auto core = KvCore::Create(c, &backend_, &clock_);
  EXPECT_EQ(core.status().code(), absl::StatusCode::kInvalidArgument);
  c.capacity_bytes = 1 << 26;
  c.model.sink_tokens = 32;
  EXPECT_EQ(KvCore::Create(c, &backend_, &clock_).status().code(), absl::StatusCode::kInvalidArgument);
  c.model.sink_tokens = 0;
  c.model.head_dim = 96;
  EXPECT_EQ(KvCore::Create(c, &backend_, &clock_).status().code(), absl::StatusCode::kInvalidArgument);
  c.model.head_dim = 64;
  c.high_watermark = 0.5;
  c.low_watermark = 0.9;
  EXPECT_EQ(KvCore::Create(c, &backend_, &clock_).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CoreTest, OpenSessionChecksLayoutAndTenant) {
  MakeCore(8, 8);
  OpenParams p;
  p.tenant = "a";
  p.layout = model_;
  p.layout.num_layers = 3;
  auto r = core_->OpenSession(p);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("layout mismatch"));
  p.layout = model_;
  p.tenant = "";
  EXPECT_EQ(core_->OpenSession(p).status().code(), absl::StatusCode::kInvalidArgument);
  p.tenant = "a";
  p.max_sequences = 100000;
  EXPECT_EQ(core_->OpenSession(p).status().code(), absl::StatusCode::kInvalidArgument);
  auto stats = core_->Stats(std::nullopt);
  EXPECT_EQ(stats->sessions, 0u);
  EXPECT_EQ(stats->tail_slots_reserved, 0u);
}

TEST_F(CoreTest, StaleEpochAndUnknownIdsAreRejected) {
  MakeCore(8, 8);
  SessionRef s = Open("a");
  EXPECT_EQ(core_->CreateSequence({s.session, s.epoch + 1, s.secret}, Tokens(0, 5)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(core_->CreateSequence({s.session + 9, s.epoch, s.secret}, Tokens(0, 5)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->Append(s, 12345, Tokens(0, 1)).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CoreTest, FirstTileBecomesTheSinkAndLaterTilesAreQuantized) {
  MakeCore(8, 8);
  SessionRef s = Open("a");
  auto c = core_->CreateSequence(s, Tokens(0, 200));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->cached_tokens, 0u);
  const BlockTableView t = AppendAll(s, c->sequence, Tokens(0, 200), 0);
  EXPECT_EQ(t.tokens, 200u);
  EXPECT_TRUE(t.has_sink);
  EXPECT_EQ(t.quant_blocks.size(), 2u);  // 64 sink + 2 x 64 quantized + 8 in the tail
  EXPECT_EQ(t.tail_tokens, 8u);
  auto st = core_->Stats(std::nullopt);
  EXPECT_EQ(st->seals, 2u);
  EXPECT_EQ(st->sink_seals, 1u);
  EXPECT_EQ(st->quant_active, 2u);
  EXPECT_EQ(st->sink_active, 1u);
}

TEST_F(CoreTest, WithoutSinkEveryFullTileIsQuantized) {
  MakeCore(8, 8, SmallModel("kvarn_k4v2_g64", 0));
  SessionRef s = Open("a");
  auto c = core_->CreateSequence(s, std::vector<uint32_t>{});
  const BlockTableView t = AppendAll(s, c->sequence, Tokens(0, 130), 0);
  EXPECT_FALSE(t.has_sink);
  EXPECT_EQ(t.quant_blocks.size(), 2u);
  EXPECT_EQ(t.tail_tokens, 2u);
}

TEST_F(CoreTest, SecondSequenceAdoptsTheCachedPrefix) {
  MakeCore(8, 8);
  SessionRef s = Open("a");
  const std::vector<uint32_t> prompt = Tokens(1000, 3 * 64 + 10);
  auto a = core_->CreateSequence(s, prompt);
  AppendAll(s, a->sequence, prompt, 0);
  auto b = core_->CreateSequence(s, prompt);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->cached_tokens, 3u * 64);
  auto ta = core_->Table(s, a->sequence);
  EXPECT_EQ(b->table.sink_block, ta->sink_block);
  EXPECT_EQ(b->table.quant_blocks, std::vector<uint32_t>(ta->quant_blocks.begin(), ta->quant_blocks.begin() + 2));
  EXPECT_EQ(core_->Lookup(s, prompt).value().total_tokens(), 3u * 64);
  // A prompt of exactly three tiles adopts two: the worker must compute the last token.
  auto c = core_->CreateSequence(s, Tokens(1000, 3 * 64));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);  // two slots in use
  ASSERT_TRUE(core_->Release(s, std::vector<SequenceId>{a->sequence}).ok());
  c = core_->CreateSequence(s, Tokens(1000, 3 * 64));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->cached_tokens, 2u * 64);
  // A different token in the second tile stops the match after the sink.
  std::vector<uint32_t> other = prompt;
  other[70] = 7;
  EXPECT_EQ(core_->Lookup(s, other).value().total_tokens(), 64u);
  auto st = core_->Stats(std::nullopt);
  EXPECT_EQ(st->prefix_hit_tokens, 3u * 64 + 2u * 64);
}

TEST_F(CoreTest, TenantsDoNotShareOrSeeEachOthersBlocks) {
  MakeCore(8, 8);
  SessionRef a = Open("alice");
  SessionRef b = Open("bob");
  const std::vector<uint32_t> prompt = Tokens(5, 2 * 64 + 1);
  auto qa = core_->CreateSequence(a, prompt);
  AppendAll(a, qa->sequence, prompt, 0);
  EXPECT_EQ(core_->Lookup(a, prompt).value().total_tokens(), 128u);
  EXPECT_EQ(core_->Lookup(b, prompt).value().total_tokens(), 0u);
  // Bob cannot address Alice's sequence in any way.
  EXPECT_EQ(core_->Release(b, std::vector<SequenceId>{qa->sequence}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->Fork(b, qa->sequence).status().code(), absl::StatusCode::kNotFound);
  std::vector<float> k(64 * 2 * 64), v(k.size());
  EXPECT_EQ(core_->Read(b, qa->sequence, 0, 0, 1, k.data(), v.data()).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->Evict(b, EvictScope::kTenant, 0, "alice").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(core_->Evict(b, EvictScope::kAll, 0, "").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(core_->Table(a, qa->sequence)->tokens, prompt.size());
  auto seqs = core_->ListSequences(b);
  EXPECT_TRUE(seqs->empty());
}

TEST_F(CoreTest, SharedAcrossTenantsWhenConfigured) {
  CoreConfig c;
  c.share_across_tenants = true;
  MakeCore(8, 8, SmallModel(), c);
  SessionRef a = Open("alice");
  SessionRef b = Open("bob");
  const std::vector<uint32_t> prompt = Tokens(5, 2 * 64 + 1);
  auto qa = core_->CreateSequence(a, prompt);
  AppendAll(a, qa->sequence, prompt, 0);
  EXPECT_EQ(core_->Lookup(b, prompt).value().total_tokens(), 128u);
}

TEST_F(CoreTest, RejectedAppendsChangeNothing) {
  MakeCore(8, 8);
  SessionRef s = Open("a");
  auto c = core_->CreateSequence(s, std::vector<uint32_t>{});
  AppendAll(s, c->sequence, Tokens(0, 60), 0);
  const BlockTableView before = core_->Table(s, c->sequence).value();
  // Past the tail: 4 positions are free.
  EXPECT_EQ(core_->Append(s, c->sequence, Tokens(60, 5)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(core_->Append(s, c->sequence, std::vector<uint32_t>{}).status().code(), absl::StatusCode::kInvalidArgument);
  // NaN and Inf in inline K/V, including one that would seal.
  for (float bad : {NAN, INFINITY, -INFINITY, 1e6f}) {
    std::vector<float> k = Kv(4, 1), v = Kv(4, 2);
    v[300] = bad;
    auto r = core_->AppendInline(s, c->sequence, Tokens(60, 4), k.data(), v.data(), DType::kF32);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  }
  const BlockTableView after = core_->Table(s, c->sequence).value();
  EXPECT_EQ(after.tokens, before.tokens);
  EXPECT_EQ(after.tail_tokens, before.tail_tokens);
  EXPECT_FALSE(after.has_sink);
  auto st = core_->Stats(std::nullopt);
  EXPECT_EQ(st->sink_seals, 0u);
  EXPECT_EQ(st->sink_free, st->sink_total);
}

TEST_F(CoreTest, NanStagedInSharedMemoryFailsTheSealWithoutStateChange) {
  MakeCore(8, 8);
  SessionRef s = Open("a");
  auto c = core_->CreateSequence(s, std::vector<uint32_t>{});
  AppendAll(s, c->sequence, Tokens(0, 64 + 63), 0);  // sink sealed, 63 in the tail
  const BlockTableView before = core_->Table(s, c->sequence).value();
  // The client overwrites committed tail token 5 of layer 1, kv-head 1 with NaN, then
  // stages the 64th token and commits it: the seal must refuse.
  BlockLayout l;
  l.num_layers = 2;
  l.num_kv_heads = 2;
  l.head_dim = 64;
  l.tile_tokens = 64;
  uint8_t* slot = backend_.tails.at(0) + before.tail_slot * l.fp16_block_bytes();
  auto* keys = reinterpret_cast<uint16_t*>(slot + l.Fp16KeysOffset(1, 1));
  keys[5 * l.fp16_token_elems() + 3] = 0x7E00;  // NaN
  auto r = core_->Append(s, c->sequence, std::vector<uint32_t>{127});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("NaN"));
  const BlockTableView after = core_->Table(s, c->sequence).value();
  EXPECT_EQ(after.tokens, before.tokens);
  EXPECT_EQ(after.quant_blocks.size(), 0u);
  auto st = core_->Stats(std::nullopt);
  EXPECT_EQ(st->quant_free, st->quant_total);
  // Repaired, the same append succeeds.
  keys[5 * l.fp16_token_elems() + 3] = 0;
  r = core_->Append(s, c->sequence, std::vector<uint32_t>{127});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->sealed);
}

TEST_F(CoreTest, ExhaustedPoolReportsResourceExhaustedAndKeepsReferencedBlocks) {
  MakeCore(2, 8);
  SessionRef s = Open("a", 4);
  auto a = core_->CreateSequence(s, std::vector<uint32_t>{});
  AppendAll(s, a->sequence, Tokens(0, 3 * 64), 0);  // sink + 2 quantized: pool full
  auto b = core_->CreateSequence(s, std::vector<uint32_t>{});
  AppendAll(s, b->sequence, Tokens(9000, 64 + 63), 0);
  std::vector<float> k = Kv(1, 1), v = Kv(1, 2);
  auto r = core_->AppendInline(s, b->sequence, std::vector<uint32_t>{9999}, k.data(), v.data(), DType::kF32);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(core_->Table(s, b->sequence)->tail_tokens, 63u);
  EXPECT_EQ(core_->Table(s, a->sequence)->quant_blocks.size(), 2u);
  auto st = core_->Stats(std::nullopt);
  EXPECT_EQ(st->quant_active, 2u);
  EXPECT_EQ(st->evictions[static_cast<int>(EvictReason::kAllocation)], 0u);
  // Once a is released its blocks are cached, and the seal evicts one of them.
  ASSERT_TRUE(core_->Release(s, std::vector<SequenceId>{a->sequence}).ok());
  r = core_->AppendInline(s, b->sequence, std::vector<uint32_t>{9999}, k.data(), v.data(), DType::kF32);
  ASSERT_TRUE(r.ok()) << r.status();
  st = core_->Stats(std::nullopt);
  EXPECT_EQ(st->evictions[static_cast<int>(EvictReason::kAllocation)], 1u);
}

TEST_F(CoreTest, EvictsLeastRecentlyUsedLeafFirst) {
  MakeCore(6, 8);
  SessionRef s = Open("a", 4);
  // Two chains of sink + 2 quantized blocks, released in order: chain A then chain B.
  const std::vector<uint32_t> pa = Tokens(0, 3 * 64 + 1), pb = Tokens(50000, 3 * 64 + 1);
  auto a = core_->CreateSequence(s, pa);
  const BlockTableView ta = AppendAll(s, a->sequence, pa, 0);
  auto b = core_->CreateSequence(s, pb);
  const BlockTableView tb = AppendAll(s, b->sequence, pb, 0);
  ASSERT_TRUE(core_->Release(s, std::vector<SequenceId>{a->sequence}).ok());
  ASSERT_TRUE(core_->Release(s, std::vector<SequenceId>{b->sequence}).ok());
  uint64_t after = core_->events().last_seq();
  auto c = core_->CreateSequence(s, std::vector<uint32_t>{});
  // sink + 3 quantized: 2 free blocks, 1 evicted to allocate, 1 more by the 95% watermark.
  AppendAll(s, c->sequence, Tokens(90000, 64 + 3 * 64), 0);
  bool lost = false;
  std::vector<BlockEvent> ev = core_->events().Read(after, 100, absl::ZeroDuration(), &lost);
  std::vector<uint32_t> removed;
  for (const BlockEvent& e : ev) {
    if (e.kind == BlockEvent::Kind::kRemoved && !e.fp16) removed.push_back(e.block);
  }
  ASSERT_EQ(removed.size(), 2u);
  EXPECT_EQ(removed[0], ta.quant_blocks[1]);
  EXPECT_EQ(removed[1], ta.quant_blocks[0]);
  // Chain B is intact.
  EXPECT_EQ(core_->Lookup(s, pb).value().total_tokens(), 3u * 64);
  EXPECT_EQ(core_->Lookup(s, pa).value().total_tokens(), 64u);
  (void)tb;
}

TEST_F(CoreTest, ForkSharesSealedBlocksAndCopiesTheTail) {
  MakeCore(8, 8);
  SessionRef s = Open("a", 3);
  auto a = core_->CreateSequence(s, std::vector<uint32_t>{});
  AppendAll(s, a->sequence, Tokens(0, 64 + 64 + 10), 0);
  auto f = core_->Fork(s, a->sequence);
  ASSERT_TRUE(f.ok()) << f.status();
  const BlockTableView ta = core_->Table(s, a->sequence).value();
  EXPECT_EQ(f->table.quant_blocks, ta.quant_blocks);
  EXPECT_EQ(f->table.sink_block, ta.sink_block);
  EXPECT_EQ(f->table.tail_tokens, 10u);
  EXPECT_NE(f->table.tail_slot, ta.tail_slot);
  // The fork's tail holds the same tokens: reading them back matches the parent.
  std::vector<float> k1(10 * 2 * 64), v1(k1.size()), k2(k1.size()), v2(k1.size());
  ASSERT_TRUE(core_->Read(s, a->sequence, 1, 128, 10, k1.data(), v1.data()).ok());
  ASSERT_TRUE(core_->Read(s, f->sequence, 1, 128, 10, k2.data(), v2.data()).ok());
  EXPECT_EQ(k1, k2);
  EXPECT_EQ(v1, v2);
  // Diverging appends stay apart.
  AppendAll(s, f->sequence, Tokens(7777, 54), 0);
  EXPECT_EQ(core_->Table(s, a->sequence)->tokens, 138u);
  EXPECT_EQ(core_->Table(s, f->sequence)->tokens, 192u);
}

TEST_F(CoreTest, ReadReturnsWhatWasAppendedWithinCodecError) {
  MakeCore(8, 8);
  SessionRef s = Open("a");
  auto a = core_->CreateSequence(s, std::vector<uint32_t>{});
  const int n = 64 + 64 + 20;
  const std::vector<uint32_t> ids = Tokens(0, n);
  AppendAll(s, a->sequence, ids, 0);
  // Reassemble the inputs AppendAll derived from the token ids (tail-sized chunks).
  const size_t per_token = 2 * 2 * 64;
  std::vector<float> want_k, want_v;
  for (int off = 0; off < n; off += 64) {
    const int m = std::min(64, n - off);
    std::vector<float> k = Kv(m, ids[off]), v = Kv(m, ids[off] + 1000003);
    want_k.insert(want_k.end(), k.begin(), k.end());
    want_v.insert(want_v.end(), v.begin(), v.end());
  }
  std::vector<float> k(n * 2 * 64), v(k.size());
  for (uint32_t layer = 0; layer < 2; ++layer) {
    ASSERT_TRUE(core_->Read(s, a->sequence, layer, 0, n, k.data(), v.data()).ok());
    double num_sink = 0, num_q = 0, num_tail = 0, den = 0;
    for (int t = 0; t < n; ++t) {
      for (int i = 0; i < 2 * 64; ++i) {
        const float x = want_k[t * per_token + layer * 128 + i];
        const double e = k[t * 128 + i] - x;
        (t < 64 ? num_sink : t < 128 ? num_q : num_tail) += e * e;
        den += x * x;
      }
    }
    EXPECT_LT(std::sqrt(num_sink / den), 1e-3);  // fp16
    EXPECT_LT(std::sqrt(num_tail / den), 1e-3);
    EXPECT_GT(std::sqrt(num_q / den), 1e-3);     // really quantized
    EXPECT_LT(std::sqrt(num_q / den), 0.1);      // 4-bit keys
  }
  EXPECT_EQ(core_->Read(s, a->sequence, 2, 0, 1, k.data(), v.data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(core_->Read(s, a->sequence, 0, n - 1, 2, k.data(), v.data()).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CoreTest, IdenticalTilesSealedTwiceShareOneBlock) {
  MakeCore(8, 8);
  SessionRef s = Open("a");
  const std::vector<uint32_t> prompt = Tokens(42, 2 * 64);
  auto a = core_->CreateSequence(s, std::vector<uint32_t>{});
  auto b = core_->CreateSequence(s, std::vector<uint32_t>{});
  const BlockTableView ta = AppendAll(s, a->sequence, prompt, 0);
  const BlockTableView tb = AppendAll(s, b->sequence, prompt, 0);
  EXPECT_EQ(ta.quant_blocks, tb.quant_blocks);
  EXPECT_EQ(ta.sink_block, tb.sink_block);
  auto st = core_->Stats(std::nullopt);
  EXPECT_EQ(st->dedup_seals, 2u);
  EXPECT_EQ(st->quant_active, 1u);
}

TEST_F(CoreTest, WatermarkEvictsCachedBlocksAfterASeal) {
  CoreConfig c;
  c.high_watermark = 0.5;
  c.low_watermark = 0.25;
  MakeCore(8, 8, SmallModel(), c);
  SessionRef s = Open("a", 2);
  auto a = core_->CreateSequence(s, std::vector<uint32_t>{});
  AppendAll(s, a->sequence, Tokens(0, 64 + 3 * 64), 0);  // 3 quantized
  ASSERT_TRUE(core_->Release(s, std::vector<SequenceId>{a->sequence}).ok());
  auto b = core_->CreateSequence(s, std::vector<uint32_t>{});
  AppendAll(s, b->sequence, Tokens(900, 64 + 2 * 64), 0);  // 2 more: 5 of 8 in use > 50%
  auto st = core_->Stats(std::nullopt);
  EXPECT_GT(st->evictions[static_cast<int>(EvictReason::kWatermark)], 0u);
  EXPECT_LE(st->quant_total - st->quant_free, 2u + 1u);
  EXPECT_EQ(st->quant_active, 2u);
}

TEST_F(CoreTest, EvictByRequestHonoursScopes) {
  CoreConfig c;
  c.admin_token = "secret";
  MakeCore(8, 8, SmallModel(), c);
  SessionRef a = Open("alice");
  OpenParams p;
  p.tenant = "ops";
  p.layout = model_;
  p.admin_token = "secret";
  SessionRef admin = Ref(core_->OpenSession(p));
  auto q = core_->CreateSequence(a, std::vector<uint32_t>{});
  AppendAll(a, q->sequence, Tokens(0, 3 * 64), 0);
  ASSERT_TRUE(core_->Release(a, std::vector<SequenceId>{q->sequence}).ok());
  auto r = core_->Evict(a, EvictScope::kTenant, 0, "");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->blocks, 3u);
  EXPECT_EQ(r->bytes, 2 * qbytes_ + fbytes_);
  q = core_->CreateSequence(a, std::vector<uint32_t>{});
  AppendAll(a, q->sequence, Tokens(0, 3 * 64), 0);
  ASSERT_TRUE(core_->Release(a, std::vector<SequenceId>{q->sequence}).ok());
  r = core_->Evict(admin, EvictScope::kBytes, 1, "");
  EXPECT_EQ(r->blocks, 1u);
  r = core_->Evict(admin, EvictScope::kAll, 0, "");
  EXPECT_EQ(r->blocks, 2u);
  auto st = core_->Stats(std::nullopt);
  EXPECT_EQ(st->quant_cached + st->sink_cached, 0u);
}

TEST_F(CoreTest, TailSlotsHaveABudgetOfTheirOwn) {
  MakeCore(8, 4, SmallModel(), CoreConfig(), /*tail_slots=*/4);
  SessionRef s = Open("a", 2);  // 2 of 4 tail slots reserved
  auto a = core_->CreateSequence(s, std::vector<uint32_t>{});
  AppendAll(s, a->sequence, Tokens(0, 65), 0);  // a sink block
  ASSERT_TRUE(core_->Release(s, std::vector<SequenceId>{a->sequence}).ok());
  OpenParams p;
  p.tenant = "b";
  p.layout = model_;
  p.max_sequences = 2;
  EXPECT_EQ(core_->OpenSession(p).status().code(), absl::StatusCode::kOk);
  p.max_sequences = 1;
  auto refused = core_->OpenSession(p);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("tail slots"));
  auto st = core_->Stats(std::nullopt);
  EXPECT_EQ(st->tail_slots_reserved, 4u);
  EXPECT_EQ(st->sink_cached, 1u) << "reserving tail slots never takes sink blocks";
  EXPECT_LE(st->UsedBytes(), st->capacity_bytes);
}

// Draining refuses new sessions only: an open session keeps creating, appending, forking and
// releasing until it closes, and the stats say the daemon drains.
TEST_F(CoreTest, DrainingRefusesNewSessionsAndServesOpenOnes) {
  MakeCore(8, 8);
  SessionRef s = Open("a");
  auto a = core_->CreateSequence(s, std::vector<uint32_t>{});
  ASSERT_TRUE(a.ok());
  core_->BeginDrain();
  OpenParams p;
  p.tenant = "b";
  p.layout = model_;
  auto refused = core_->OpenSession(p);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.status().message(), HasSubstr("draining"));
  auto b = core_->CreateSequence(s, std::vector<uint32_t>{});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(core_->Append(s, a->sequence, std::vector<uint32_t>{1}).ok());
  EXPECT_TRUE(core_->Release(s, std::vector<SequenceId>{b->sequence}).ok());
  auto forked = core_->Fork(s, a->sequence);  // the session has 2 tail slots
  ASSERT_TRUE(forked.ok()) << forked.status();
  auto st = core_->Stats(std::nullopt);
  EXPECT_TRUE(st->draining);
  EXPECT_EQ(st->client_sessions, 1u);
  EXPECT_TRUE(core_->Release(s, std::vector<SequenceId>{a->sequence, forked->sequence}).ok());
  EXPECT_TRUE(core_->CloseSession(s).ok());
  EXPECT_EQ(core_->Stats(std::nullopt)->client_sessions, 0u);
}

}  // namespace
}  // namespace kvarn::testing

namespace kvarn::testing {
namespace {

TEST_F(CoreTest, ObserverSessionsReserveNoTailSlots) {
  MakeCore(8, 4);
  OpenParams p;
  p.tenant = "ops";
  p.layout = model_;
  p.observer = true;
  auto r = core_->OpenSession(p);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->pool.tail_slots, 0u);
  const SessionRef s = Ref(r);
  EXPECT_EQ(core_->CreateSequence(s, Tokens(0, 10)).status().code(), absl::StatusCode::kResourceExhausted);
  auto st = core_->Stats(s);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->tail_slots_reserved, 0u);
  EXPECT_EQ(st->sessions, 1u);
}

}  // namespace
}  // namespace kvarn::testing

namespace kvarn::testing {
namespace {

// A cached sink heads a chain of cached quantized blocks, so it is never a leaf; allocating
// a sink must evict the least recently used chain, leaves first.
TEST_F(CoreTest, SinkPressureEvictsCachedChainsLeavesFirst) {
  CoreConfig c;
  c.high_watermark = 1.0;  // only allocations evict here
  MakeCore(64, 6, SmallModel(), c);
  SessionRef s = Open("a", 2);
  std::vector<BlockTableView> tables;
  for (uint32_t i = 0; i < 12; ++i) {
    auto q = core_->CreateSequence(s, std::vector<uint32_t>{});
    ASSERT_TRUE(q.ok());
    tables.push_back(AppendAll(s, q->sequence, Tokens(10000 * i, 2 * 64), 0));  // sink + 1 quantized
    ASSERT_EQ(tables.back().quant_blocks.size(), 1u) << "sequence " << i;
    ASSERT_TRUE(core_->Release(s, std::vector<SequenceId>{q->sequence}).ok());
    ASSERT_TRUE(core_->CheckInvariants().ok()) << core_->CheckInvariants();
  }
  // The six oldest chains went (quantized block first, then its sink), the six newest stayed.
  for (uint32_t i = 0; i < 12; ++i) {
    EXPECT_EQ(core_->Lookup(s, Tokens(10000 * i, 2 * 64 + 1)).value().total_tokens(), i < 6 ? 0u : 128u) << i;
  }
  auto st = core_->Stats(std::nullopt);
  EXPECT_EQ(st->evictions[static_cast<int>(EvictReason::kAllocation)], 12u);
  EXPECT_EQ(st->quant_cached, 6u);
  EXPECT_EQ(st->sink_cached, 6u);
}

}  // namespace
}  // namespace kvarn::testing

namespace kvarn::testing {
namespace {

TEST_F(CoreTest, AppendsThatSealNothingOmitBlockIds) {
  MakeCore(8, 8);
  SessionRef s = Open("a");
  auto q = core_->CreateSequence(s, std::vector<uint32_t>{});
  AppendAll(s, q->sequence, Tokens(0, 64 + 64 + 3), 0);
  std::vector<float> k = Kv(1, 9), v = Kv(1, 10);
  auto r = core_->AppendInline(s, q->sequence, std::vector<uint32_t>{7}, k.data(), v.data(), DType::kF32);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->sealed);
  EXPECT_TRUE(r->table.blocks_omitted);
  EXPECT_TRUE(r->table.quant_blocks.empty());
  EXPECT_EQ(r->table.tokens, 64u + 64 + 4);
  EXPECT_FALSE(core_->Table(s, q->sequence)->blocks_omitted);
  EXPECT_EQ(core_->Table(s, q->sequence)->quant_blocks.size(), 1u);
}

TEST_F(CoreTest, BatchAppendsAreIndependent) {
  MakeCore(8, 8);
  SessionRef s = Open("a", 3);
  auto a = core_->CreateSequence(s, std::vector<uint32_t>{});
  auto b = core_->CreateSequence(s, std::vector<uint32_t>{});
  const std::vector<uint32_t> one = {1}, too_many = Tokens(0, 65);
  std::vector<std::pair<SequenceId, std::span<const uint32_t>>> items = {
      {a->sequence, one}, {999, one}, {b->sequence, too_many}, {b->sequence, one}};
  auto batch = core_->AppendBatch(s, items);
  ASSERT_TRUE(batch.ok()) << batch.status();
  const auto& r = *batch;
  ASSERT_EQ(r.size(), 4u);
  EXPECT_TRUE(r[0].ok());
  EXPECT_EQ(r[1].status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(r[2].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(r[3].ok());
  EXPECT_EQ(core_->Table(s, a->sequence)->tokens, 1u);
  EXPECT_EQ(core_->Table(s, b->sequence)->tokens, 1u);
}

}  // namespace
}  // namespace kvarn::testing

namespace kvarn::testing {
namespace {

// AppendBatch through the sealer: the last token of three full tails in one call seals three
// tiles; one tail holds a NaN the client wrote after committing, so its seal fails alone.
TEST_F(CoreTest, BatchAppendsSealTilesAndAFailedSealChangesOnlyItsItem) {
  MakeCore(8, 8);
  SessionRef s = Open("a", 3);
  std::vector<SequenceId> seqs;
  for (int i = 0; i < 3; ++i) {
    auto q = core_->CreateSequence(s, std::vector<uint32_t>{});
    ASSERT_TRUE(q.ok());
    seqs.push_back(q->sequence);
    AppendAll(s, q->sequence, Tokens(1000 * i, 64 + 63), 0);  // a sink and 63 tail tokens
  }
  // The 64th token of each is staged as zeros (the tail memory starts zeroed); sequence 2's
  // committed token 10 is overwritten with NaN in the shared tail.
  BlockLayout l;
  l.num_layers = 2;
  l.num_kv_heads = 2;
  l.head_dim = 64;
  l.tile_tokens = 64;
  const BlockTableView bad = core_->Table(s, seqs[2]).value();
  auto* keys = reinterpret_cast<uint16_t*>(backend_.tails.at(0) + bad.tail_slot * l.fp16_block_bytes() + l.Fp16KeysOffset(0, 1));
  keys[10 * l.fp16_token_elems() + 5] = 0x7E00;
  const std::vector<uint32_t> last[3] = {{2063}, {3063}, {4063}};
  std::vector<std::pair<SequenceId, std::span<const uint32_t>>> items;
  for (int i = 0; i < 3; ++i) items.emplace_back(seqs[i], last[i]);
  auto before = core_->Stats(std::nullopt);
  auto batch = core_->AppendBatch(s, items);
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_EQ(batch->size(), 3u);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE((*batch)[i].ok()) << (*batch)[i].status();
    EXPECT_TRUE((*batch)[i]->sealed);
    EXPECT_EQ((*batch)[i]->table.quant_blocks.size(), 1u);
    EXPECT_EQ((*batch)[i]->table.tail_tokens, 0u);
  }
  EXPECT_EQ((*batch)[2].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT((*batch)[2].status().message(), HasSubstr("NaN"));
  const BlockTableView after_bad = core_->Table(s, seqs[2]).value();
  EXPECT_EQ(after_bad.tokens, bad.tokens);
  EXPECT_EQ(after_bad.tail_tokens, 63u);
  EXPECT_TRUE(after_bad.quant_blocks.empty());
  auto after = core_->Stats(std::nullopt);
  EXPECT_EQ(after->seals, before->seals + 2);
  EXPECT_EQ(after->quant_active, before->quant_active + 2);
  // The sealed tiles read back within the codec's error.
  std::vector<float> k(64 * 2 * 64), v(k.size());
  EXPECT_TRUE(core_->Read(s, seqs[0], 0, 64, 64, k.data(), v.data()).ok());
}

}  // namespace
}  // namespace kvarn::testing
