// The commit ring server in-process (service_harness.h with rings): records written by hand
// into a ring taken from the descriptor channel, against the AppendBatch RPC on a twin
// session. Promises: the same codes and messages as AppendBatch, garbage and a rejected
// commit change nothing, a scribbled tail closes only that ring, a session ending mid-batch
// leaves nothing half-applied, stopping closes every ring with UNAVAILABLE, and the drain
// thread follows a client's CPU hint only to a CPU of its own mask. A ring whose client
// pipelines is drained beside it and watched after its batch: each watched ring has its own
// deadline, is served in the next round however busy its neighbours keep the thread, leaves
// the hot set at a plain batch or its session's end, never has the thread spin on a CPU a
// client named, and does not hold up another ring's doorbell; its `polling` word misleads no
// one but its client. Watch tests run on a FakeClock that stands still unless the test
// advances it, so none depends on the length of a wall-clock window.
#include <gtest/gtest.h>
#include <sched.h>

#include <random>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_replace.h"
#include "client/lib/descriptor_client.h"
#include "common/commit_ring.h"
#include "common/shared_memory.h"
#include "tests/daemon/service/service_harness.h"

namespace kvarn::testing {
namespace {

using Code = absl::StatusCode;

// A ring as a client process holds it, written by hand.
struct RawRing {
  FdMapping memory;
  UniqueFd doorbell;
  uint32_t capacity = 0;

  ring::Header* h() const { return reinterpret_cast<ring::Header*>(memory.data()); }
  ring::Record* record(uint32_t pos) const {
    return reinterpret_cast<ring::Record*>(memory.data() + ring::RecordsOffset()) +
           (pos & (capacity - 1));
  }
  const ring::Completion* completion(uint32_t pos) const {
    return reinterpret_cast<const ring::Completion*>(memory.data() +
                                                     ring::CompletionsOffset(capacity)) +
           (pos & (capacity - 1));
  }
  void Ring() const {
    const uint64_t one = 1;
    ASSERT_EQ(write(doorbell.get(), &one, sizeof(one)), 8);
  }
  // Publishes `records` after what the daemon completed, rings, and waits (with a deadline)
  // for their completions; an empty result when they did not come.
  std::vector<ring::Completion> Commit(const std::vector<ring::Record>& records) const {
    const uint32_t first = h()->done.load();
    for (size_t i = 0; i < records.size(); ++i)
      *record(first + static_cast<uint32_t>(i)) = records[i];
    const uint32_t target = first + static_cast<uint32_t>(records.size());
    h()->tail.store(target, std::memory_order_release);
    Ring();
    if (!WaitFor([&] { return h()->done.load(std::memory_order_acquire) == target; })) return {};
    std::vector<ring::Completion> out;
    for (uint32_t p = first; p != target; ++p) out.push_back(*completion(p));
    return out;
  }
};

// The ring lent for `ref` on the descriptor channel at `socket`, mapped as the client holds it.
absl::StatusOr<RawRing> TakeRing(const std::string& socket, const v1::SessionRef& ref) {
  auto lent = FetchCommitRing(socket, ref);
  if (!lent.ok()) return lent.status();
  RawRing r;
  for (auto& seg : lent->segments) {
    if (seg.entry.kind() == v1::DescriptorReply::Entry::KIND_COMMIT_RING) {
      r.capacity = seg.entry.ring_records();
      auto m = FdMapping::Map(std::move(seg.fd), seg.entry.bytes(), true);
      if (!m.ok()) return m.status();
      r.memory = std::move(*m);
    } else if (seg.entry.kind() == v1::DescriptorReply::Entry::KIND_DOORBELL) {
      r.doorbell = std::move(seg.fd);
    }
  }
  if (r.capacity == 0 || !r.doorbell.valid()) return absl::InternalError("no ring in the reply");
  return r;
}

ring::Record Rec(uint64_t seq, const std::vector<uint32_t>& ids) {
  ring::Record r{};
  r.sequence = seq;
  r.tokens = static_cast<uint32_t>(ids.size());
  std::copy(ids.begin(), ids.end(), r.ids);
  return r;
}

std::string Message(const ring::Completion& c) { return std::string(c.message, c.message_bytes); }

class CommitRingServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServiceHarness::Options o;
    o.descriptors = true;
    o.rings = true;
    o.core.check_commits = true;
    ASSERT_TRUE(h_.Start(o).ok());
  }
  void TearDown() override {
    if (h_.started()) {
      EXPECT_TRUE(h_.core().CheckInvariants().ok()) << h_.core().CheckInvariants();
    }
  }

  // The session's memory (binding it to this process), then its ring.
  absl::StatusOr<RawRing> OpenRing(const v1::SessionRef& ref) {
    auto mem = FetchSessionMemory(h_.descriptor_socket(), ref);
    if (!mem.ok()) return mem.status();
    return RingOnly(ref);
  }
  absl::StatusOr<RawRing> RingOnly(const v1::SessionRef& ref) {
    return TakeRing(h_.descriptor_socket(), ref);
  }

  // The AppendBatch RPC for the same records.
  grpc::Status Batch(const v1::SessionRef& ref, const std::vector<ring::Record>& records,
                     v1::AppendBatchResponse* resp) {
    v1::AppendBatchRequest req;
    *req.mutable_session() = ref;
    for (const ring::Record& r : records) {
      auto* item = req.add_items();
      item->set_sequence_id(r.sequence);
      for (uint32_t i = 0; i < r.tokens; ++i) item->add_token_ids(r.ids[i]);
    }
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    return h_.stub().AppendBatch(&ctx, req, resp);
  }

  ServiceHarness h_;
};

TEST_F(CommitRingServerTest, RingGivesAppendBatchsCodesMessagesAndTables) {
  const auto a_open = h_.Open("a", 4), b_open = h_.Open("b", 4);
  const v1::SessionRef a = ServiceHarness::RefOf(a_open), b = ServiceHarness::RefOf(b_open);
  auto ring = OpenRing(b);
  ASSERT_TRUE(ring.ok()) << ring.status();
  EXPECT_EQ(ring->capacity, 4u);  // the session's 4 tail slots
  std::vector<uint64_t> sa, sb;
  for (int i = 0; i < 3; ++i) {
    sa.push_back(h_.CreateSequence(a));
    sb.push_back(h_.CreateSequence(b));
  }
  // Batches of (sequence index, ids); index 7 is an unknown id, 8 the other session's.
  using Item = std::pair<int, std::vector<uint32_t>>;
  const std::vector<std::vector<Item>> script = {
      {{0, {1}}, {1, {2, 3}}},
      {{0, {}}},                          // 0 tokens
      {{2, TokenIds(10, 28)}, {2, {5}}},  // the second finds the sequence busy
      {{2, TokenIds(40, 28)}, {1, TokenIds(70, 28)}},
      {{2, TokenIds(100, 20)}},           // past the tail: 8 positions left
      {{2, TokenIds(120, 8)}, {0, {9}}},  // fills the tail: a seal (the sink tile)
      {{7, {1}}, {8, {1}}, {1, {4}}},
  };
  const auto id = [](const std::vector<uint64_t>& own, const std::vector<uint64_t>& other,
                     int i) -> uint64_t {
    return i == 7 ? 99999 : i == 8 ? other[0] : own[static_cast<size_t>(i)];
  };
  const auto normalize = [](std::string m, const std::vector<uint64_t>& own,
                            const std::vector<uint64_t>& other) {
    for (size_t i = 0; i < own.size(); ++i)
      m = absl::StrReplaceAll(m,
                              {{absl::StrCat("sequence ", own[i]), absl::StrCat("sequence S", i)}});
    return absl::StrReplaceAll(
        m, {{absl::StrCat("sequence ", other[0]), "sequence F"}, {"sequence 99999", "sequence U"}});
  };
  for (size_t n = 0; n < script.size(); ++n) {
    std::vector<ring::Record> ra, rb;
    for (const Item& it : script[n]) {
      ra.push_back(Rec(id(sa, sb, it.first), it.second));
      rb.push_back(Rec(id(sb, sa, it.first), it.second));
    }
    v1::AppendBatchResponse want;
    ASSERT_TRUE(Batch(a, ra, &want).ok());
    const std::vector<ring::Completion> got = ring->Commit(rb);
    ASSERT_EQ(got.size(), rb.size()) << "batch " << n << ": no completions";
    ASSERT_EQ(want.items_size(), static_cast<int>(got.size()));
    for (size_t i = 0; i < got.size(); ++i) {
      const auto& w = want.items(static_cast<int>(i));
      SCOPED_TRACE(absl::StrCat("batch ", n, " item ", i, ": ", w.message()));
      EXPECT_EQ(got[i].code, w.code());
      EXPECT_EQ(got[i].call, 0u);
      EXPECT_EQ(normalize(Message(got[i]), sb, sa), normalize(w.message(), sa, sb));
      if (w.code() == 0) {
        EXPECT_EQ(got[i].tokens, w.result().table().tokens());
        EXPECT_EQ(got[i].tail_tokens, w.result().table().tail_tokens());
        EXPECT_EQ(got[i].sealed != 0, w.result().sealed());
        EXPECT_EQ(got[i].has_sink != 0, w.result().table().has_sink());
      }
    }
  }
  // The seal happened on both sides, as the sink tile.
  EXPECT_EQ(h_.core().Table(CoreRef(b), sb[2])->has_sink, true);
  // A record of more tokens than a ring record carries: refused by the ring alone.
  ring::Record big = Rec(sb[0], {1});
  big.tokens = ring::kRecordTokens + 1;
  const auto refused = ring->Commit({big});
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0].code, static_cast<int>(Code::kInvalidArgument));
  // The session's own errors are the call's, as AppendBatch's outer status.
  ASSERT_TRUE(h_.CloseSession(a).ok());
  ASSERT_TRUE(h_.CloseSession(b).ok());
  v1::AppendBatchResponse closed;
  const grpc::Status outer = Batch(a, {Rec(sa[0], {1})}, &closed);
  const auto gone = ring->Commit({Rec(sb[0], {1})});
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0].code, static_cast<int>(outer.error_code()));
  EXPECT_EQ(gone[0].call, 1u);
  EXPECT_EQ(absl::StrReplaceAll(Message(gone[0]),
                                {{absl::StrCat("session ", b.session_id()), "session X"}}),
            absl::StrReplaceAll(outer.error_message(),
                                {{absl::StrCat("session ", a.session_id()), "session X"}}));
}

TEST_F(CommitRingServerTest, GarbageRecordsGetErrorsAndChangeNothing) {
  const v1::SessionRef ref = ServiceHarness::RefOf(h_.Open("a", 8));
  auto ring = OpenRing(ref);
  ASSERT_TRUE(ring.ok()) << ring.status();
  const uint64_t seq = h_.CreateSequence(ref);
  ASSERT_TRUE(h_.Commit(ref, seq, {1, 2, 3}).ok());
  std::mt19937_64 rng(7);
  for (int round = 0; round < 50; ++round) {
    std::vector<ring::Record> junk(ring->capacity);
    for (auto& r : junk) {
      auto* w = reinterpret_cast<uint64_t*>(&r);
      for (size_t i = 0; i < sizeof(r) / 8; ++i) w[i] = rng();
    }
    const auto got = ring->Commit(junk);
    ASSERT_EQ(got.size(), junk.size());
    for (const auto& c : got) EXPECT_NE(c.code, 0);
  }
  EXPECT_EQ(h_.core().Table(CoreRef(ref), seq)->tokens, 3u);
  EXPECT_TRUE(h_.core().CheckInvariants().ok());
  const auto ok = ring->Commit({Rec(seq, {4})});
  ASSERT_EQ(ok.size(), 1u);
  EXPECT_EQ(ok[0].code, 0) << Message(ok[0]);
  EXPECT_EQ(ok[0].tokens, 4u);
}

TEST_F(CommitRingServerTest, ATailOutOfBoundsClosesOnlyThatRing) {
  const v1::SessionRef x = ServiceHarness::RefOf(h_.Open("x", 2)),
                       y = ServiceHarness::RefOf(h_.Open("y", 2));
  auto rx = OpenRing(x);
  auto ry = OpenRing(y);
  ASSERT_TRUE(rx.ok() && ry.ok());
  const uint64_t qx = h_.CreateSequence(x), qy = h_.CreateSequence(y);
  rx->h()->tail.store(rx->h()->done.load() + rx->capacity + 1);
  rx->Ring();
  ASSERT_TRUE(WaitFor([&] { return rx->h()->broken.load() != 0; }));
  EXPECT_EQ(rx->h()->broken.load(), static_cast<uint32_t>(Code::kFailedPrecondition));
  EXPECT_NE(std::string(rx->h()->broken_message).find("past the daemon's head"), std::string::npos);
  EXPECT_EQ(h_.rings()->broken(), 1u);
  // The neighbour's ring, and the scribbler's own RPCs, still work.
  const auto got = ry->Commit({Rec(qy, {1})});
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].code, 0);
  EXPECT_TRUE(h_.Commit(x, qx, {1}).ok());
  // Doorbells of a closed ring are not even read.
  for (int i = 0; i < 100; ++i) rx->Ring();
  EXPECT_EQ(ry->Commit({Rec(qy, {2})}).size(), 1u);
}

TEST_F(CommitRingServerTest, RingGoesToTheSessionsProcessOnce) {
  const v1::SessionRef ref = ServiceHarness::RefOf(h_.Open("a", 2));
  EXPECT_EQ(RingOnly(ref).status().code(), Code::kFailedPrecondition);  // memory not lent yet
  v1::SessionRef wrong = ref;
  wrong.set_secret(std::string(wrong.secret().size(), 'x'));
  EXPECT_EQ(OpenRing(wrong).status().code(), Code::kNotFound);
  ASSERT_TRUE(OpenRing(ref).ok());
  EXPECT_EQ(RingOnly(ref).status().code(), Code::kAlreadyExists);
  // An observer session has no tail slots, hence nothing to commit.
  const v1::SessionRef obs = [&] {
    v1::OpenSessionRequest req;
    req.set_tenant("a");
    *req.mutable_layout() = LayoutProto(h_.options().core.model);
    req.set_observer(true);
    v1::OpenSessionResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    EXPECT_TRUE(h_.stub().OpenSession(&ctx, req, &resp).ok());
    return ServiceHarness::RefOf(resp);
  }();
  EXPECT_EQ(OpenRing(obs).status().code(), Code::kFailedPrecondition);
}

TEST(CommitRingServerAbsent, DescriptorChannelWithoutRingsSaysUnimplemented) {
  ServiceHarness h;
  ServiceHarness::Options o;
  o.descriptors = true;
  ASSERT_TRUE(h.Start(o).ok());
  const v1::SessionRef ref = ServiceHarness::RefOf(h.Open("a", 2));
  ASSERT_TRUE(FetchSessionMemory(h.descriptor_socket(), ref).ok());
  EXPECT_EQ(FetchCommitRing(h.descriptor_socket(), ref).status().code(), Code::kUnimplemented);
}

TEST_F(CommitRingServerTest, SessionEndingMidBatchLeavesNothingHalfApplied) {
  for (int round = 0; round < 20; ++round) {
    const v1::SessionRef ref = ServiceHarness::RefOf(h_.Open("a", 4));
    auto ring = OpenRing(ref);
    ASSERT_TRUE(ring.ok()) << ring.status();
    std::vector<uint64_t> seqs;
    for (int i = 0; i < 4; ++i) seqs.push_back(h_.CreateSequence(ref));
    ASSERT_TRUE(h_.Commit(ref, seqs[0], TokenIds(0, 60)).ok());
    // A batch that seals one sequence, published while the session closes.
    const std::vector<ring::Record> batch = {Rec(seqs[0], TokenIds(60, 4)), Rec(seqs[1], {1}),
                                             Rec(seqs[2], {2}), Rec(seqs[3], TokenIds(3, 28))};
    for (size_t i = 0; i < batch.size(); ++i) *ring->record(static_cast<uint32_t>(i)) = batch[i];
    std::thread closer([&] { h_.CloseSession(ref).IgnoreError(); });
    ring->h()->tail.store(static_cast<uint32_t>(batch.size()), std::memory_order_release);
    ring->Ring();
    closer.join();
    // Either the batch ran (completions) or the ring closed with the session.
    ASSERT_TRUE(WaitFor(
        [&] { return ring->h()->done.load() == batch.size() || ring->h()->broken.load() != 0; }));
    ASSERT_TRUE(h_.core().CheckInvariants().ok()) << h_.core().CheckInvariants();
  }
  const auto stats = h_.core().Stats(std::nullopt);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->sequences, 0u);
  EXPECT_EQ(stats->quant_active + stats->sink_active, 0u);
  EXPECT_TRUE(WaitFor([&] { return h_.rings()->rings() == 0; }))
      << "the rings of ended sessions are dropped";
}

TEST_F(CommitRingServerTest, StopClosesRingsWithUnavailable) {
  const v1::SessionRef ref = ServiceHarness::RefOf(h_.Open("a", 2));
  auto ring = OpenRing(ref);
  ASSERT_TRUE(ring.ok());
  h_.rings()->Stop();
  EXPECT_EQ(ring->h()->broken.load(), static_cast<uint32_t>(Code::kUnavailable));
  EXPECT_EQ(RingOnly(ref).status().code(), Code::kUnavailable);
}

// A harness with rings whose drain thread watches a ring for `watch` after a pipelined batch,
// by `clock`. With a FakeClock the test does not advance, a watch ends only by the ring's next
// batch, the end of its session or Stop: no test depends on the length of a wall-clock window.
absl::Status StartWatching(ServiceHarness& h, const Clock* clock,
                           absl::Duration watch = absl::Milliseconds(1),
                           RpcObserver* observer = nullptr) {
  ServiceHarness::Options o;
  o.descriptors = true;
  o.rings = true;
  o.ring_options.watch = watch;
  o.ring_options.clock = clock;
  o.observer = observer;
  return h.Start(o);
}

// A session (2 tail slots) whose memory and ring this process took, and one sequence of it.
struct Mapped {
  v1::SessionRef ref;
  RawRing ring;
  uint64_t seq = 0;
};

absl::StatusOr<Mapped> OpenMapped(ServiceHarness& h, const std::string& tenant) {
  Mapped m;
  m.ref = ServiceHarness::RefOf(h.Open(tenant, 2));
  auto mem = FetchSessionMemory(h.descriptor_socket(), m.ref);
  if (!mem.ok()) return mem.status();
  auto r = TakeRing(h.descriptor_socket(), m.ref);
  if (!r.ok()) return r.status();
  m.ring = std::move(*r);
  m.seq = h.CreateSequence(m.ref);
  if (m.seq == 0) return absl::InternalError("CreateSequence failed");
  return m;
}

// Commits token `id` to m's sequence with the doorbell, under CPU hint `hint`; the
// completion's code, -1 when none came.
int CommitOne(const Mapped& m, uint32_t hint, uint32_t id) {
  m.ring.h()->cpu.store(hint);
  const auto got = m.ring.Commit({Rec(m.seq, {id})});
  return got.size() == 1 ? got[0].code : -1;
}

// Publishes `r` at the ring's next position without ringing the doorbell; the position.
uint32_t PublishQuietly(const RawRing& ring, const ring::Record& r) {
  const uint32_t pos = ring.h()->tail.load();
  *ring.record(pos) = r;
  ring.h()->tail.store(pos + 1, std::memory_order_release);
  return pos;
}

// Publishes token `id` to m's sequence without the doorbell and waits (with a deadline) for
// it to be committed as the sequence's `id`th token.
::testing::AssertionResult CommitQuietly(const Mapped& m, uint32_t id) {
  const uint32_t pos = PublishQuietly(m.ring, Rec(m.seq, {id}));
  if (!WaitFor([&] { return m.ring.h()->done.load() == pos + 1; })) {
    return ::testing::AssertionFailure()
           << "record " << pos << " (token " << id << ", no doorbell) was never drained";
  }
  const ring::Completion& c = *m.ring.completion(pos);
  if (c.code != 0 || c.tokens != id) {
    return ::testing::AssertionFailure() << "token " << id << ": code " << c.code << " ("
                                         << Message(c) << "), " << c.tokens << " tokens";
  }
  return ::testing::AssertionSuccess();
}

bool Polling(const Mapped& m) { return m.ring.h()->polling.load() != 0; }

// A pipelining client's ring is watched after its batch: it publishes the next records
// without the doorbell, and the drain thread takes them.
TEST(CommitRingWatchTest, AWatchedRingIsDrainedWithoutItsDoorbell) {
  FakeClock clock;
  ServiceHarness h;
  ASSERT_TRUE(StartWatching(h, &clock).ok());
  auto m = OpenMapped(h, "a");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(CommitOne(*m, ring::kCpuPipelined, 1), 0);  // a pipelining client naming no CPU
  ASSERT_TRUE(WaitFor([&] { return Polling(*m); })) << "the thread watches the ring";
  EXPECT_EQ(h.rings()->watched(), 1u);
  for (uint32_t id = 2; id <= 4; ++id) ASSERT_TRUE(CommitQuietly(*m, id));
  EXPECT_EQ(h.rings()->watched(), 1u);  // the clock stood still: still watched
  EXPECT_TRUE(Polling(*m));
}

// The watch lasts until its deadline by the injected clock, renewed by each batch, and ends
// there: `polling` cleared and the ring out of the hot set. The next commit comes by the
// doorbell, as from a client that read `polling` cleared, and starts a new watch. (Records
// published between the clearing and the last look are not forced here: no sync point.)
TEST(CommitRingWatchTest, TheWatchEndsWithPollingCleared) {
  FakeClock clock;
  ServiceHarness h;
  ASSERT_TRUE(StartWatching(h, &clock, absl::Milliseconds(1)).ok());
  auto m = OpenMapped(h, "a");
  ASSERT_TRUE(m.ok()) << m.status();
  uint32_t token = 0;
  for (int round = 0; round < 3; ++round) {
    ASSERT_EQ(CommitOne(*m, ring::kCpuPipelined, ++token), 0);  // rings the doorbell
    ASSERT_TRUE(WaitFor([&] { return Polling(*m) && h.rings()->watched() == 1; }))
        << "the watch never began";
    clock.Advance(absl::Microseconds(999));
    ASSERT_TRUE(CommitQuietly(*m, ++token)) << "watched until its deadline";
    // That batch renewed the watch, until 1 ms after it.
    clock.Advance(absl::Milliseconds(1));
    ASSERT_TRUE(WaitFor([&] { return !Polling(*m) && h.rings()->watched() == 0; }))
        << "the watch never ended";
  }
  EXPECT_EQ(h.core().Table(CoreRef(m->ref), m->seq)->tokens, 6u);
}

// Each hot ring has its own deadline, its last batch + watch: one ring's watch ends while
// another's, renewed later, goes on.
TEST(CommitRingWatchTest, EachWatchedRingHasItsOwnDeadline) {
  FakeClock clock;
  ServiceHarness h;
  ASSERT_TRUE(StartWatching(h, &clock, absl::Milliseconds(1)).ok());
  auto a = OpenMapped(h, "a");
  auto b = OpenMapped(h, "b");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(CommitOne(*a, ring::kCpuPipelined, 1), 0);
  ASSERT_TRUE(WaitFor([&] { return h.rings()->watched() == 1; }));
  clock.Advance(absl::Microseconds(600));
  ASSERT_EQ(CommitOne(*b, ring::kCpuPipelined, 1), 0);  // its doorbell ends a's spin
  ASSERT_TRUE(WaitFor([&] { return h.rings()->watched() == 2; }));
  clock.Advance(absl::Microseconds(600));  // past a's deadline, not b's
  ASSERT_TRUE(WaitFor([&] { return !Polling(*a) && h.rings()->watched() == 1; }))
      << "a's watch ended at its own deadline";
  EXPECT_TRUE(Polling(*b));
  EXPECT_TRUE(CommitQuietly(*b, 2)) << "b is still watched";
  clock.Advance(absl::Milliseconds(1));
  EXPECT_TRUE(WaitFor([&] { return !Polling(*b) && h.rings()->watched() == 0; }));
}

// Membership of the hot set is the last batch's: a plain batch ends the ring's watch, a
// pipelined one starts it again.
TEST(CommitRingWatchTest, APlainBatchEndsTheWatch) {
  FakeClock clock;
  ServiceHarness h;
  ASSERT_TRUE(StartWatching(h, &clock).ok());
  auto m = OpenMapped(h, "a");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(CommitOne(*m, ring::kCpuPipelined, 1), 0);
  ASSERT_TRUE(WaitFor([&] { return Polling(*m) && h.rings()->watched() == 1; }));
  ASSERT_EQ(CommitOne(*m, 0, 2), 0);
  EXPECT_TRUE(WaitFor([&] { return !Polling(*m) && h.rings()->watched() == 0; }))
      << "a plain batch left the ring watched";
  ASSERT_EQ(CommitOne(*m, ring::kCpuPipelined, 3), 0);
  EXPECT_TRUE(WaitFor([&] { return Polling(*m) && h.rings()->watched() == 1; }));
}

// Records refused before the core (a token count beyond a record) cost their sender nothing,
// so a pipelined batch of only those starts no watch: a client could otherwise keep the
// drain thread spinning a CPU with one junk record per watch period. A later round (another
// ring's plain commit) shows the batch's decision was taken.
TEST(CommitRingWatchTest, RefusedRecordsBuyNoWatch) {
  FakeClock clock;
  ServiceHarness h;
  ASSERT_TRUE(StartWatching(h, &clock).ok());
  auto a = OpenMapped(h, "a");
  auto b = OpenMapped(h, "b");
  ASSERT_TRUE(a.ok() && b.ok());
  ring::Record junk = Rec(a->seq, {1});
  junk.tokens = ring::kRecordTokens + 1;
  a->ring.h()->cpu.store(ring::kCpuPipelined);
  const auto got = a->ring.Commit({junk, junk});
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].code, static_cast<int>(absl::StatusCode::kInvalidArgument));
  ASSERT_EQ(CommitOne(*b, 0, 1), 0);  // a later round
  EXPECT_EQ(h.rings()->watched(), 0u);
  EXPECT_FALSE(Polling(*a));
  // One accepted commit in the batch is enough.
  const auto mixed = a->ring.Commit({junk, Rec(a->seq, {1})});
  ASSERT_EQ(mixed.size(), 2u);
  EXPECT_EQ(mixed[1].code, 0) << Message(mixed[1]);
  EXPECT_TRUE(WaitFor([&] { return Polling(*a) && h.rings()->watched() == 1; }));
}

// The ring of an ended session leaves the hot set (nothing keeps its segment and eventfd
// alive), even while the thread spins for another ring; the other stays watched.
TEST(CommitRingWatchTest, ARingOfAnEndedSessionLeavesTheHotSet) {
  FakeClock clock;
  ServiceHarness h;
  ASSERT_TRUE(StartWatching(h, &clock).ok());
  auto a = OpenMapped(h, "a");
  auto b = OpenMapped(h, "b");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(CommitOne(*a, ring::kCpuPipelined, 1), 0);
  ASSERT_EQ(CommitOne(*b, ring::kCpuPipelined, 1), 0);
  ASSERT_TRUE(WaitFor([&] { return h.rings()->watched() == 2; }));
  ASSERT_TRUE(h.CloseSession(a->ref).ok());
  EXPECT_TRUE(WaitFor([&] { return h.rings()->watched() == 1 && h.rings()->rings() == 1; }))
      << "watched " << h.rings()->watched() << ", rings " << h.rings()->rings();
  EXPECT_EQ(a->ring.h()->broken.load(), static_cast<uint32_t>(Code::kNotFound));
  EXPECT_FALSE(Polling(*a));
  EXPECT_TRUE(Polling(*b));
  EXPECT_TRUE(CommitQuietly(*b, 2));
}

// While the thread spins for a watched ring, another ring's doorbell is answered: the spin
// looks at the doorbells and ends at the first. (The clock stands still: the watch itself
// never ends.)
TEST(CommitRingWatchTest, AnotherRingsDoorbellEndsTheSpin) {
  FakeClock clock;
  ServiceHarness h;
  ASSERT_TRUE(StartWatching(h, &clock).ok());
  auto watched = OpenMapped(h, "w");
  auto plain = OpenMapped(h, "p");
  ASSERT_TRUE(watched.ok() && plain.ok());
  ASSERT_EQ(CommitOne(*watched, ring::kCpuPipelined, 1), 0);
  ASSERT_TRUE(WaitFor([&] { return Polling(*watched); }));
  for (uint32_t id = 1; id <= 3; ++id) {
    EXPECT_EQ(CommitOne(*plain, 0, id), 0) << "commit " << id << " of the rung ring";
  }
  EXPECT_EQ(h.rings()->watched(), 1u);
  EXPECT_TRUE(CommitQuietly(*watched, 2));
}

// A neighbour whose client is as fast as the drain thread: it keeps its tail one record
// ahead of `done`. It publishes its next record (garbage, refused by the ring alone) and rings
// from the drain thread itself, as the thread reports each batch (the "CommitRing" call of
// the RpcObserver, made after `done` and before Drain's last look at the tail). So every
// Drain of it sees more records, and the thread never runs out of ready rings.
class TricklingNeighbour final : public RpcObserver {
 public:
  void Start(const RawRing* ring) {
    MutexLock lock(&mu_);
    ring_ = ring;
    PublishOne();
  }
  void Stop() {
    MutexLock lock(&mu_);
    ring_ = nullptr;
  }
  uint64_t published() const {
    MutexLock lock(&mu_);
    return published_;
  }
  void OnRpc(std::string_view method, grpc::StatusCode, absl::Duration) override {
    if (method != "CommitRing") return;
    MutexLock lock(&mu_);
    if (ring_ != nullptr && ring_->h()->done.load() == ring_->h()->tail.load()) PublishOne();
  }

 private:
  void PublishOne() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ring::Record junk{};
    junk.tokens = ring::kRecordTokens + 1;
    PublishQuietly(*ring_, junk);
    const uint64_t one = 1;
    if (write(ring_->doorbell.get(), &one, sizeof(one)) == sizeof(one)) ++published_;
  }

  mutable Mutex mu_;
  const RawRing* ring_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint64_t published_ ABSL_GUARDED_BY(mu_) = 0;
};

// A watched ring's records, published without the doorbell, are drained in the next round
// even while a trickling neighbour keeps the thread from ever running out of work.
TEST(CommitRingWatchTest, AWatchedRingIsServedBesideATricklingNeighbour) {
  TricklingNeighbour neighbour;
  FakeClock clock;
  ServiceHarness h;
  ASSERT_TRUE(StartWatching(h, &clock, absl::Milliseconds(1), &neighbour).ok());
  auto victim = OpenMapped(h, "victim");
  auto trickler = OpenMapped(h, "neighbour");
  ASSERT_TRUE(victim.ok() && trickler.ok());
  absl::Cleanup stop = [&] { neighbour.Stop(); };  // before the neighbour's ring goes
  ASSERT_EQ(CommitOne(*victim, ring::kCpuPipelined, 1), 0);
  ASSERT_TRUE(WaitFor([&] { return Polling(*victim); }));
  neighbour.Start(&trickler->ring);
  ASSERT_TRUE(WaitFor([&] { return neighbour.published() >= 3; }));
  const uint64_t before = neighbour.published();
  for (uint32_t id = 2; id <= 4; ++id) {
    ASSERT_TRUE(CommitQuietly(*victim, id)) << "beside a neighbour that always has one more";
  }
  // Each of those rounds served the neighbour too (it was ready first in each).
  EXPECT_GE(neighbour.published() - before, 3u);
  neighbour.Stop();
  EXPECT_TRUE(
      WaitFor([&] { return trickler->ring.h()->done.load() == trickler->ring.h()->tail.load(); }));
  EXPECT_EQ(trickler->ring.h()->broken.load(), 0u);
  EXPECT_EQ(trickler->ring.completion(trickler->ring.h()->done.load() - 1)->code,
            static_cast<int>(Code::kInvalidArgument));
}

// `polling` is the client's to scribble: a client that sets it while its ring is not watched
// (while the thread watches another) skips its own doorbell and delays only its own record,
// until its doorbell; the watched neighbour's commits go on.
TEST(CommitRingWatchTest, AScribbledPollingWordDelaysOnlyItsOwnRing) {
  FakeClock clock;
  ServiceHarness h;
  ASSERT_TRUE(StartWatching(h, &clock).ok());
  auto x = OpenMapped(h, "x");
  auto y = OpenMapped(h, "y");
  ASSERT_TRUE(x.ok() && y.ok());
  ASSERT_EQ(CommitOne(*y, ring::kCpuPipelined, 1), 0);
  ASSERT_TRUE(WaitFor([&] { return Polling(*y) && h.rings()->watched() == 1; }));
  x->ring.h()->polling.store(1);
  const uint32_t pos = PublishQuietly(x->ring, Rec(x->seq, {1}));  // "kvarnd watches": no doorbell
  for (uint32_t id = 2; id <= 4; ++id) ASSERT_TRUE(CommitQuietly(*y, id));
  ASSERT_EQ(CommitOne(*y, ring::kCpuPipelined, 5), 0);
  // The thread went through rounds that looked at y's tail after x published, and never at
  // x's: x's record waits for its doorbell.
  EXPECT_EQ(x->ring.h()->done.load(), pos);
  EXPECT_EQ(h.rings()->watched(), 1u);
  x->ring.Ring();
  ASSERT_TRUE(WaitFor([&] { return x->ring.h()->done.load() == pos + 1; }));
  EXPECT_EQ(x->ring.completion(pos)->code, 0) << Message(*x->ring.completion(pos));
  EXPECT_EQ(x->ring.h()->broken.load(), 0u);
  EXPECT_EQ(y->ring.h()->broken.load(), 0u);
}

// The CPUs of this thread's mask, in order.
std::vector<int> MaskCpus() {
  cpu_set_t mask;
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(mask), &mask) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &mask)) cpus.push_back(c);
  }
  return cpus;
}

// A harness with rings whose drain thread starts with this thread's mask narrowed to `cpus`
// (threads inherit their creator's mask); the mask is restored before returning. Watches go
// by `clock`.
absl::Status StartNarrowed(ServiceHarness& h, const std::vector<int>& cpus, bool follow,
                           const Clock* clock = SystemClock::Get()) {
  cpu_set_t saved, narrow;
  if (sched_getaffinity(0, sizeof(saved), &saved) != 0) {
    return absl::InternalError("sched_getaffinity");
  }
  CPU_ZERO(&narrow);
  for (int c : cpus) CPU_SET(c, &narrow);
  if (sched_setaffinity(0, sizeof(narrow), &narrow) != 0) {
    return absl::InternalError("sched_setaffinity");
  }
  ServiceHarness::Options o;
  o.descriptors = true;
  o.rings = true;
  o.ring_options.follow_client_cpu = follow;
  o.ring_options.clock = clock;
  const absl::Status started = h.Start(o);
  sched_setaffinity(0, sizeof(saved), &saved);
  return started;
}

class CommitRingCpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cpus_ = MaskCpus();
    if (cpus_.size() < 2) GTEST_SKIP() << "needs two CPUs in the mask";
  }
  // Opens a session with a ring and a sequence; commits one token with each hint in turn and
  // checks every commit completes with OK.
  void CommitWithHints(ServiceHarness& h, const std::vector<uint32_t>& hints) {
    const v1::SessionRef ref = ServiceHarness::RefOf(h.Open("a", 2));
    ASSERT_TRUE(FetchSessionMemory(h.descriptor_socket(), ref).ok());
    auto r = TakeRing(h.descriptor_socket(), ref);
    ASSERT_TRUE(r.ok()) << r.status();
    const uint64_t seq = h.CreateSequence(ref);
    uint32_t id = 1;
    for (uint32_t hint : hints) {
      r->h()->cpu.store(hint);
      const auto got = r->Commit({Rec(seq, {id})});
      ASSERT_EQ(got.size(), 1u) << "hint " << hint;
      EXPECT_EQ(got[0].code, 0) << "hint " << hint << ": " << Message(got[0]);
      EXPECT_EQ(got[0].tokens, id);
      ++id;
    }
  }
  std::vector<int> cpus_;
};

TEST_F(CommitRingCpuTest, TheDrainMovesOnlyToACpuOfItsOwnMask) {
  ServiceHarness h;
  const int a = cpus_[0], b = cpus_[1];
  ASSERT_TRUE(StartNarrowed(h, {a}, true).ok());
  // Outside the mask, no CPU at all, beyond any CPU number, pipelined or not: ignored, and
  // the commits go on, on the mask's CPU.
  const uint32_t outside = static_cast<uint32_t>(b) + 1;
  CommitWithHints(h, {outside, 0, CPU_SETSIZE + 1, 0xffffffffu, outside | ring::kCpuPipelined});
  EXPECT_EQ(h.rings()->cpu_moves(), 0u);
  EXPECT_EQ(h.rings()->last_cpu(), a);
  // The mask's own CPU, plain or pipelined (no other CPU to go to): the thread is there
  // already, and stays.
  const uint32_t own = static_cast<uint32_t>(a) + 1;
  CommitWithHints(h, {own, own | ring::kCpuPipelined, own});
  EXPECT_EQ(h.rings()->cpu_moves(), 0u);
  EXPECT_EQ(h.rings()->last_cpu(), a);
}

// A doorbell with no records places the thread nowhere, whatever CPU the ring's header names:
// only a batch's hint does (a client cannot send kvarnd's thread to a CPU by spamming its
// doorbell). Two later batches of another ring without a hint: the second's round comes
// after the whole round that took the doorbells.
TEST_F(CommitRingCpuTest, AnEmptyDoorbellPlacesNothing) {
  ServiceHarness h;
  ASSERT_TRUE(StartNarrowed(h, cpus_, true).ok());
  auto a = OpenMapped(h, "a");
  auto b = OpenMapped(h, "b");
  ASSERT_TRUE(a.ok() && b.ok());
  a->ring.h()->cpu.store(static_cast<uint32_t>(cpus_[0]) + 1);
  for (int i = 0; i < 3; ++i) a->ring.Ring();
  ASSERT_EQ(CommitOne(*b, 0, 1), 0);
  ASSERT_EQ(CommitOne(*b, 0, 2), 0);
  EXPECT_EQ(h.rings()->cpu_moves(), 0u);
  EXPECT_EQ(a->ring.h()->done.load(), 0u);
}

TEST_F(CommitRingCpuTest, TheDrainFollowsTheHintAcrossItsMask) {
  ServiceHarness h;
  const uint32_t a = static_cast<uint32_t>(cpus_[0]) + 1, b = static_cast<uint32_t>(cpus_[1]) + 1;
  ASSERT_TRUE(StartNarrowed(h, cpus_, true).ok());
  CommitWithHints(h, {a, a, b, b, a});
  EXPECT_EQ(h.rings()->cpu_moves(), 3u);
}

// A batch without a hint lets the thread run on any CPU of its mask again: the next hint of
// the same CPU is a move again.
TEST_F(CommitRingCpuTest, NoHintReleasesTheThreadToItsMask) {
  ServiceHarness h;
  const uint32_t a = static_cast<uint32_t>(cpus_[0]) + 1;
  ASSERT_TRUE(StartNarrowed(h, cpus_, true).ok());
  CommitWithHints(h, {a, a, 0, a});
  EXPECT_EQ(h.rings()->cpu_moves(), 2u);
}

// A plain batch is drained on the CPU its client names, a pipelined one on another CPU of
// the mask, beside the client.
TEST_F(CommitRingCpuTest, APipelinedBatchIsDrainedBesideItsClient) {
  ServiceHarness h;
  ASSERT_TRUE(StartNarrowed(h, cpus_, true).ok());
  const v1::SessionRef ref = ServiceHarness::RefOf(h.Open("a", 2));
  ASSERT_TRUE(FetchSessionMemory(h.descriptor_socket(), ref).ok());
  auto r = TakeRing(h.descriptor_socket(), ref);
  ASSERT_TRUE(r.ok()) << r.status();
  const uint64_t seq = h.CreateSequence(ref);
  uint32_t id = 1;
  for (int round = 0; round < 2; ++round) {
    for (int cpu : {cpus_[0], cpus_[1]}) {
      for (bool pipelined : {true, false}) {
        r->h()->cpu.store((static_cast<uint32_t>(cpu) + 1) | (pipelined ? ring::kCpuPipelined : 0));
        const auto got = r->Commit({Rec(seq, {id++})});
        ASSERT_EQ(got.size(), 1u);
        EXPECT_EQ(got[0].code, 0) << Message(got[0]);
        if (pipelined) {
          EXPECT_NE(h.rings()->last_cpu(), cpu) << "a pipelined batch from CPU " << cpu;
        } else {
          EXPECT_EQ(h.rings()->last_cpu(), cpu) << "a plain batch from CPU " << cpu;
        }
      }
    }
  }
}

// A client cannot park the watching thread on a CPU it names: a plain hint takes its ring
// out of the hot set (so nothing spins where its batch was drained), and the thread spins only
// on CPUs no hot ring's client and no plain client it was pinned for named; with none left,
// it ends the watches instead.
TEST_F(CommitRingCpuTest, TheWatchNeverSpinsOnACpuAClientNamed) {
  FakeClock clock;  // stands still: only the thread's decisions end a watch
  ServiceHarness h;
  const int a = cpus_[0], b = cpus_[1];
  ASSERT_TRUE(StartNarrowed(h, {a, b}, true, &clock).ok());
  auto hostile = OpenMapped(h, "h");
  auto victim = OpenMapped(h, "v");
  auto plain = OpenMapped(h, "x");
  ASSERT_TRUE(hostile.ok() && victim.ok() && plain.ok());
  const uint32_t on_a = static_cast<uint32_t>(a) + 1, on_b = static_cast<uint32_t>(b) + 1;
  // Pipelined from a: drained on b, and watched.
  ASSERT_EQ(CommitOne(*hostile, on_a | ring::kCpuPipelined, 1), 0);
  EXPECT_EQ(h.rings()->last_cpu(), b);
  ASSERT_TRUE(WaitFor([&] { return h.rings()->watched() == 1; }));
  // Then a plain hint naming b (another tenant's worker's CPU): drained there, and no longer
  // watched, so the thread does not go on spinning there.
  ASSERT_EQ(CommitOne(*hostile, on_b, 2), 0);
  EXPECT_EQ(h.rings()->last_cpu(), b);
  EXPECT_TRUE(WaitFor([&] { return h.rings()->watched() == 0 && !Polling(*hostile); }));
  // A pipelining client on a, watched; then a plain client's batch pins the thread to b. No
  // CPU is left to spin on (a is the watched ring's client's, b the plain client's): the
  // watch ends rather than spin on b.
  ASSERT_EQ(CommitOne(*victim, on_a | ring::kCpuPipelined, 1), 0);
  ASSERT_TRUE(WaitFor([&] { return h.rings()->watched() == 1; }));
  ASSERT_EQ(CommitOne(*plain, on_b, 1), 0);
  EXPECT_EQ(h.rings()->last_cpu(), b);
  EXPECT_TRUE(WaitFor([&] {
    return h.rings()->watched() == 0 && !Polling(*victim) && h.rings()->watches_unplaced() >= 1;
  })) << "watched "
      << h.rings()->watched() << ", unplaced " << h.rings()->watches_unplaced();
  // Its client, seeing `polling` cleared, rings: served as before.
  EXPECT_EQ(CommitOne(*victim, on_a | ring::kCpuPipelined, 2), 0);
}

// With a third CPU, the watch goes on there: the thread leaves the plain client's CPU and
// the watched ring's client's, and takes the watched ring's quiet records.
TEST_F(CommitRingCpuTest, TheWatchSpinsOnACpuNoClientNamed) {
  if (cpus_.size() < 3) GTEST_SKIP() << "needs three CPUs in the mask";
  FakeClock clock;
  ServiceHarness h;
  const int a = cpus_[0], b = cpus_[1];
  ASSERT_TRUE(StartNarrowed(h, {a, b, cpus_[2]}, true, &clock).ok());
  auto victim = OpenMapped(h, "v");
  auto plain = OpenMapped(h, "x");
  ASSERT_TRUE(victim.ok() && plain.ok());
  const uint32_t on_a = static_cast<uint32_t>(a) + 1, on_b = static_cast<uint32_t>(b) + 1;
  ASSERT_EQ(CommitOne(*victim, on_a | ring::kCpuPipelined, 1), 0);
  ASSERT_TRUE(WaitFor([&] { return h.rings()->watched() == 1; }));
  ASSERT_EQ(CommitOne(*plain, on_b, 1), 0);
  EXPECT_EQ(h.rings()->last_cpu(), b);
  EXPECT_TRUE(CommitQuietly(*victim, 2));
  EXPECT_EQ(h.rings()->watched(), 1u);
  EXPECT_EQ(h.rings()->watches_unplaced(), 0u);
}

TEST_F(CommitRingCpuTest, FollowingCanBeTurnedOff) {
  ServiceHarness h;
  ASSERT_TRUE(StartNarrowed(h, cpus_, false).ok());
  CommitWithHints(h, {static_cast<uint32_t>(cpus_[0]) + 1, static_cast<uint32_t>(cpus_[1]) + 1});
  EXPECT_EQ(h.rings()->cpu_moves(), 0u);
}

}  // namespace
}  // namespace kvarn::testing
