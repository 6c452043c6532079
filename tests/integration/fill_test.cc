// Scenario 4: fill the pool to twice its capacity. New sequences keep sealing tiles (most are
// released, some stay referenced); after every append the pool's used bytes and the memory
// the kernel allocated behind its segments stay within the capacity, referenced blocks are never evicted
// (Watch sees no removal of them and their bytes, read in place, never change), and once
// only referenced blocks remain the next sealing append gets RESOURCE_EXHAUSTED and changes
// nothing.
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <set>
#include <thread>

#include "kernels/preset.h"
#include "tests/integration/fixture.h"

namespace kvarn::it {
namespace {

constexpr uint32_t kQuantBlocks = 48;
constexpr uint32_t kFp16Blocks = 16;
constexpr uint32_t kTailSlots = 4;  // the test session's; the rest of the fp16 share holds sinks

// --fp16_share and --sink_share giving exactly `fp16` fp16 blocks, `sinks` of them sink blocks.
std::vector<std::string> Fp16Flags(uint64_t capacity, uint64_t fbytes, uint32_t fp16, uint32_t sinks) {
  char share[64], sink_share[64];
  std::snprintf(share, sizeof(share), "%.12f", (static_cast<double>(fp16 * fbytes) + 0.5) / static_cast<double>(capacity));
  std::snprintf(sink_share, sizeof(sink_share), "%.12f", (sinks + 0.5) / fp16);
  return {absl::StrCat("--capacity=", capacity), absl::StrCat("--fp16_share=", share), absl::StrCat("--sink_share=", sink_share)};
}

// How many times the capacity the churn writes: 2 by default, KVARN_IT_FILL_FACTOR for a
// longer stress run.
uint64_t FillFactor() {
  const char* env = std::getenv("KVARN_IT_FILL_FACTOR");
  const long n = env != nullptr ? std::atol(env) : 2;
  return n >= 2 ? static_cast<uint64_t>(n) : 2;
}

// Collects block events from a Watch stream on the raw stub, cancellable from the test.
class Watcher {
 public:
  Watcher(Client& client, const v1::SessionRef& ref) {
    thread_ = std::thread([this, &client, ref] {
      v1::WatchRequest req;
      *req.mutable_session() = ref;
      auto reader = client.stub().Watch(&ctx_, req);
      v1::BlockEvent e;
      while (reader->Read(&e)) {
        std::lock_guard<std::mutex> lock(mu_);
        events_.push_back(e);
      }
      status_ = reader->Finish();
    });
  }
  ~Watcher() { Stop(); }
  void Stop() {
    if (!thread_.joinable()) return;
    ctx_.TryCancel();
    thread_.join();
  }
  std::vector<v1::BlockEvent> events() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }

 private:
  grpc::ClientContext ctx_;
  std::thread thread_;
  std::mutex mu_;
  std::vector<v1::BlockEvent> events_;
  grpc::Status status_;
};

struct Held {
  uint64_t seq = 0;
  SequenceTable table;
  std::map<uint32_t, uint64_t> quant_digest;  // block -> raw bytes digest when sealed
  uint64_t sink_digest = 0;
};

class FillTest : public IntegrationTest {
 protected:
  void SetUp() override {
    Preset p;
    ASSERT_TRUE(ParsePreset(SmallLayout().preset, &p).ok());
    const Layout l = SmallLayout();
    qbytes_ = uint64_t{l.num_layers} * l.num_kv_heads * p.RecordBytes(static_cast<int>(l.head_dim));
    fbytes_ = uint64_t{l.num_layers} * l.num_kv_heads * 2 * kTile * l.head_dim * 2;
    capacity_ = kQuantBlocks * qbytes_ + kFp16Blocks * fbytes_;
  }

  // Records the digests of a held sequence's blocks as they are now.
  void Snapshot(const Session& s, Held& h) {
    if (h.table.has_sink) h.sink_digest = DigestSinkBlock(s, h.table.sink_block);
    for (uint32_t b : h.table.quant_blocks) {
      if (!h.quant_digest.count(b)) h.quant_digest[b] = Fnv64(s.QuantBlock(b), qbytes_);
    }
  }

  // Every invariant of the fill, after one step.
  void CheckStep(Session& s, const std::vector<Held>& held, const std::string& step) {
    SCOPED_TRACE(step);
    auto st = s.Stats();
    ASSERT_TRUE(st.ok()) << st.status();
    const uint64_t used = uint64_t{st->quant_blocks_total() - st->quant_blocks_free()} * qbytes_ + st->fp16_bytes();
    EXPECT_LE(used, st->capacity_bytes()) << st->DebugString();
    EXPECT_EQ(st->capacity_bytes() - st->free_bytes(), used);
    max_used_ = std::max(max_used_, used);
    // Pages the kernel allocated behind the segments (this test's one session holds every
    // tail): within the capacity, up to one block of slack for page rounding (RELIABILITY.md:
    // max resident bytes over capacity <= one block).
    auto mem = s.Resident();
    ASSERT_TRUE(mem.ok()) << mem.status();
    const uint64_t resident = mem->quant + mem->sink + mem->tail;
    max_resident_ = std::max(max_resident_, resident);
    EXPECT_LE(resident, st->capacity_bytes() + qbytes_) << "resident segment bytes exceed the capacity";
    uint32_t held_quant = 0;
    std::set<uint32_t> distinct;
    for (const Held& h : held) {
      for (uint32_t b : h.table.quant_blocks) distinct.insert(b);
      EXPECT_EQ(DigestSinkBlock(s, h.table.sink_block), h.sink_digest) << "held sink block changed";
      for (uint32_t b : h.table.quant_blocks) {
        EXPECT_EQ(Fnv64(s.QuantBlock(b), qbytes_), h.quant_digest.at(b)) << "held block " << b << " changed";
      }
    }
    held_quant = static_cast<uint32_t>(distinct.size());
    EXPECT_GE(st->quant_blocks_active(), held_quant);
    EXPECT_GE(st->sink_blocks_active(), held.size());
  }

  uint64_t qbytes_ = 0, fbytes_ = 0, capacity_ = 0;
  uint64_t max_used_ = 0, max_resident_ = 0;
};

TEST_F(FillTest, FillingTwiceTheCapacityNeverExceedsItNorEvictsReferencedBlocks) {
  Daemon* d = StartDaemon(Fp16Flags(capacity_, fbytes_, kFp16Blocks, kFp16Blocks - kTailSlots));
  ASSERT_NE(d, nullptr);
  auto client = Connect(*d);
  ASSERT_NE(client, nullptr);
  IT_ASSIGN_OR_FAIL(s, Open(*client, "fill", kTailSlots));
  IT_ASSIGN_OR_FAIL(st0, s->Stats());
  ASSERT_EQ(st0.quant_blocks_total(), kQuantBlocks);
  ASSERT_EQ(st0.capacity_bytes(), capacity_);
  ASSERT_EQ(st0.fp16_capacity_bytes(), kFp16Blocks * fbytes_);

  Watcher watcher(*client, s->Ref());
  // The Watch stream only reports events after it started on the server: seal and evict a
  // probe tile until one of its events arrives.
  {
    bool live = false;
    const std::vector<uint32_t> probe = Tokens(7000000, kTile);
    for (int i = 0; i < 30 && !live; ++i) {
      IT_ASSIGN_OR_FAIL(q, s->CreateSequence(probe));
      ASSERT_TRUE(AppendTokens(*s, q.id, probe, 0, kTile).ok());
      const uint64_t ids[] = {q.id};
      IT_ASSERT_OK(s->Release(ids));
      IT_ASSERT_OK(s->Evict(v1::EvictRequest::SCOPE_TENANT).status());
      // Live once a probe's removal arrived: everything before it is counted out below.
      for (const double t0 = NowMs(); !live && NowMs() - t0 < 300;) {
        for (const v1::BlockEvent& e : watcher.events()) live |= e.kind() == v1::BlockEvent::KIND_REMOVED;
        if (!live) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    ASSERT_TRUE(live) << "the Watch stream never delivered an event";
  }
  const size_t events_before = watcher.events().size();

  // Two sequences of a sink and 6 quantized tiles, plus 10 tail tokens, stay referenced.
  std::vector<Held> held;
  for (int i = 0; i < 2; ++i) {
    const std::vector<uint32_t> p = Tokens(100000 + i * 10000, 7 * kTile + 10);
    IT_ASSIGN_OR_FAIL(q, s->CreateSequence(p));
    IT_ASSIGN_OR_FAIL(t, AppendTokens(*s, q.id, p, 0, p.size()));
    held.push_back(Held{q.id, t, {}, 0});
    Snapshot(*s, held.back());
  }
  std::set<uint32_t> first_held_quant, first_held_sink;
  for (const Held& h : held) {
    first_held_sink.insert(h.table.sink_block);
    first_held_quant.insert(h.table.quant_blocks.begin(), h.table.quant_blocks.end());
  }
  CheckStep(*s, held, "held sequences built");

  // Churn: sequences of a sink and 4 quantized tiles, sealed one tile per append; all are
  // released except the fourth, which stays referenced. Until twice the capacity is written.
  uint64_t written = 0;
  int sequences = 0;
  const uint64_t target = FillFactor() * capacity_;
  for (int i = 0; written < target; ++i) {
    ASSERT_LT(static_cast<uint64_t>(i), 100 * FillFactor());
    const std::vector<uint32_t> p = Tokens(1000000 + i * 1000, 5 * kTile);
    IT_ASSIGN_OR_FAIL(q, s->CreateSequence(p));
    EXPECT_EQ(q.cached_tokens, 0u);
    for (int tile = 0; tile < 5; ++tile) {
      auto t = AppendTokens(*s, q.id, p, tile * kTile, (tile + 1) * kTile);
      if (!t.ok()) {
        auto st = s->Stats();
        FAIL() << "append of tile " << tile << " of churn sequence " << i << " failed: " << t.status()
               << "\nwhile evictable blocks existed: " << (st.ok() ? st->DebugString() : "?");
      }
      written += tile == 0 ? fbytes_ : qbytes_;
      CheckStep(*s, held, absl::StrCat("churn sequence ", i, " tile ", tile));
      if (HasFatalFailure()) return;
    }
    ++sequences;
    if (i == 3) {
      IT_ASSIGN_OR_FAIL(t, s->Table(q.id));
      held.push_back(Held{q.id, t, {}, 0});
      Snapshot(*s, held.back());
    } else {
      const uint64_t ids[] = {q.id};
      IT_ASSERT_OK(s->Release(ids));
    }
  }
  IT_ASSIGN_OR_FAIL(churned, s->Stats());
  EXPECT_GT(churned.evictions(), 0u);

  // Fill the rest of the pool with referenced blocks: extend the first held sequence until a
  // sealing append finds nothing to evict.
  Held& grow = held[0];
  uint32_t next_token = 200000;
  bool exhausted = false;
  for (int i = 0; i < static_cast<int>(kQuantBlocks) + 4 && !exhausted; ++i) {
    // Fill the tail up to one token short of sealing, then seal with one more token.
    const uint32_t room = kTile - grow.table.tail_tokens;
    if (room > 1) {
      const std::vector<uint32_t> ids = Tokens(next_token, room - 1);
      next_token += room - 1;
      const KvData kv = MakeKv(ids, SmallLayout());
      IT_ASSIGN_OR_FAIL(r, s->AppendInline(grow.seq, ids, kv.keys.data(), kv.values.data(), DType::kF16));
      grow.table = r.table;
    }
    ASSERT_EQ(grow.table.tail_tokens, static_cast<uint32_t>(kTile - 1));
    IT_ASSIGN_OR_FAIL(before, s->Stats());
    IT_ASSIGN_OR_FAIL(list_before, s->ListSequences());
    const std::vector<uint32_t> one = Tokens(next_token, 1);
    const KvData kv = MakeKv(one, SmallLayout());
    auto r = s->AppendInline(grow.seq, one, kv.keys.data(), kv.values.data(), DType::kF16);
    if (r.ok()) {
      ++next_token;
      grow.table = r->table;
      Snapshot(*s, grow);
      CheckStep(*s, held, absl::StrCat("filling with referenced blocks, seal ", i));
      continue;
    }
    exhausted = true;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
    // Only referenced blocks were left ...
    EXPECT_EQ(before.quant_blocks_free(), 0u) << before.DebugString();
    EXPECT_EQ(before.quant_blocks_cached(), 0u) << before.DebugString();
    EXPECT_EQ(before.quant_blocks_active(), kQuantBlocks);
    // ... and the rejected append changed nothing.
    IT_ASSIGN_OR_FAIL(after, s->Stats());
    IT_ASSIGN_OR_FAIL(list_after, s->ListSequences());
    EXPECT_EQ(after.SerializeAsString(), before.SerializeAsString()) << before.DebugString() << "\nvs\n" << after.DebugString();
    EXPECT_EQ(list_after.SerializeAsString(), list_before.SerializeAsString());
    // The in-place path (Stage into the tail, then Commit) is refused the same way.
    IT_ASSERT_OK(s->Stage(grow.seq, 1, kv.keys.data(), kv.values.data(), DType::kF16));
    EXPECT_EQ(s->Commit(grow.seq, one).status().code(), absl::StatusCode::kResourceExhausted);
    IT_ASSIGN_OR_FAIL(after2, s->Stats());
    EXPECT_EQ(after2.SerializeAsString(), before.SerializeAsString());
    IT_ASSIGN_OR_FAIL(table_now, s->Table(grow.seq));
    EXPECT_EQ(table_now.tokens, grow.table.tokens);
    EXPECT_EQ(table_now.tail_tokens, static_cast<uint32_t>(kTile - 1));
  }
  EXPECT_TRUE(exhausted) << "the pool never ran out of evictable blocks";
  CheckStep(*s, held, "after RESOURCE_EXHAUSTED");

  // Watch: blocks were removed (evicted) along the way, never one that was held throughout.
  // A marker tile (one sink block: quantized blocks are all referenced now), sealed and
  // evicted last, tells when the stream has caught up.
  {
    const size_t seen = watcher.events().size();
    const std::vector<uint32_t> marker = Tokens(9000000, kTile);
    IT_ASSIGN_OR_FAIL(mq, s->CreateSequence(marker));
    IT_ASSIGN_OR_FAIL(mt, AppendTokens(*s, mq.id, marker, 0, kTile));
    ASSERT_TRUE(mt.has_sink);
    const uint64_t mids[] = {mq.id};
    IT_ASSERT_OK(s->Release(mids));
    IT_ASSERT_OK(s->Evict(v1::EvictRequest::SCOPE_TENANT).status());
    bool caught_up = false;
    for (const double t0 = NowMs(); !caught_up && NowMs() - t0 < 10000;) {
      const std::vector<v1::BlockEvent> ev = watcher.events();
      for (size_t i = seen; i < ev.size(); ++i) {
        caught_up |= ev[i].kind() == v1::BlockEvent::KIND_REMOVED && ev[i].fp16() && ev[i].block() == mt.sink_block;
      }
      if (!caught_up) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_TRUE(caught_up) << "the Watch stream did not deliver the marker's removal";
  }
  watcher.Stop();
  const std::vector<v1::BlockEvent> events = watcher.events();
  size_t removed = 0, stored = 0;
  for (size_t i = events_before; i < events.size(); ++i) {
    const v1::BlockEvent& e = events[i];
    if (e.kind() == v1::BlockEvent::KIND_STORED) ++stored;
    if (e.kind() != v1::BlockEvent::KIND_REMOVED) continue;
    ++removed;
    const auto& held_set = e.fp16() ? first_held_sink : first_held_quant;
    EXPECT_FALSE(held_set.count(e.block())) << "referenced " << (e.fp16() ? "sink" : "quantized") << " block " << e.block()
                                            << " was evicted";
  }
  EXPECT_GT(removed, 0u);
  IT_ASSIGN_OR_FAIL(final_stats, s->Stats());
  Report(absl::StrCat("fill to ", FillFactor(), "x: wrote ", written, " bytes into a ", capacity_, "-byte pool (", sequences,
                      " churn sequences); max used ", max_used_, " bytes, max resident ", max_resident_,
                      " bytes (over capacity by ", max_resident_ > capacity_ ? max_resident_ - capacity_ : 0,
                      "); evictions ", final_stats.evictions(), "; watch saw ", stored, " stored / ", removed,
                      " removed; referenced blocks evicted 0"));
}

// When the sink blocks are the scarce ones, every cached sink block is the parent of a cached
// quantized block, so no sink is a leaf. A new sink tile must still get room: the least
// recently used cached chain is evicted leaf first (the quantized child, then its sink).
// RESOURCE_EXHAUSTED is only for a pool of referenced blocks. Tail slots are a budget of
// their own: they never take sink blocks.
TEST_F(FillTest, SinkPressureEvictsCachedChainsInsteadOfFailing) {
  constexpr uint32_t kQuant = 64, kFp16 = 8, kSlots = 2;  // 6 sink blocks, 2 tail slots
  const uint64_t capacity = kQuant * qbytes_ + kFp16 * fbytes_;
  Daemon* d = StartDaemon(Fp16Flags(capacity, fbytes_, kFp16, kFp16 - kSlots));
  ASSERT_NE(d, nullptr);
  auto client = Connect(*d);
  ASSERT_NE(client, nullptr);
  IT_ASSIGN_OR_FAIL(s, Open(*client, "sinks", kSlots));
  IT_ASSIGN_OR_FAIL(st0, s->Stats());
  ASSERT_EQ(st0.sink_blocks_total(), kFp16 - kSlots);
  // 10 sequences of a sink and one quantized tile, each released: from the seventh on, a new
  // sink needs an evicted one.
  for (int i = 0; i < 10; ++i) {
    SCOPED_TRACE(absl::StrCat("sequence ", i));
    const std::vector<uint32_t> p = Tokens(3000000 + i * 1000, 2 * kTile);
    IT_ASSIGN_OR_FAIL(q, s->CreateSequence(p));
    auto t = AppendTokens(*s, q.id, p, 0, p.size());
    IT_ASSIGN_OR_FAIL(st, s->Stats());
    EXPECT_TRUE(t.ok()) << t.status() << "\nwith " << st.sink_blocks_cached() << " cached sink and "
                        << st.quant_blocks_cached() << " cached quantized blocks evictable:\n" << st.DebugString();
    const uint64_t ids[] = {q.id};
    IT_ASSERT_OK(s->Release(ids));
    if (!t.ok()) break;
  }
  // The watermark (95 %) keeps one of the six sinks free.
  IT_ASSIGN_OR_FAIL(st, s->Stats());
  EXPECT_GE(st.sink_blocks_cached(), kFp16 - kSlots - 1);
  // The tail budget is spent by the first session: a second one is refused, and no cached
  // sink is taken for it.
  auto other = Open(*client, "sinks", kSlots);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kResourceExhausted) << other.status();
  IT_ASSIGN_OR_FAIL(st2, s->Stats());
  EXPECT_EQ(st2.sink_blocks_cached(), st.sink_blocks_cached());
}

}  // namespace
}  // namespace kvarn::it
