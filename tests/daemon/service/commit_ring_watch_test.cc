// The commit ring server's watch and placement (daemon/service/commit_ring_server.h), in
// process (service_harness.h with rings), rings written by hand (raw_ring.h). A ring whose
// client pipelines is drained beside it and watched after its batch: each watched ring has
// its own deadline, is served in the next round however busy its neighbours keep the thread,
// leaves the hot set at a plain batch, a batch the core refused whole, or its session's end,
// never has the thread spin on a CPU a client named, and does not hold up another ring's
// doorbell; its `polling` word misleads no one but its client. The drain thread follows a
// client's CPU hint only to a CPU of its own mask, and only for a batch. Watch tests run on a
// FakeClock that stands still unless the test advances it, so none depends on the length of
// a wall-clock window.
#include <gtest/gtest.h>
#include <sched.h>

#include <vector>

#include "absl/cleanup/cleanup.h"
#include "common/commit_ring.h"
#include "tests/daemon/service/fake_thread_cpus.h"
#include "tests/daemon/service/raw_ring.h"
#include "tests/daemon/service/service_harness.h"

namespace kvarn::testing {
namespace {

using Code = absl::StatusCode;

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

// A harness with rings whose drain thread watches a ring for 1 ms after a pipelined batch, by
// `clock`, a FakeClock the tests advance themselves: a watch ends only by the ring's next
// batch, the end of its session, Stop, or the test moving the clock, so no test depends on
// the length of a wall-clock window. `neighbour` observes the thread's batches (idle unless a
// test starts it); it is declared first, so it outlives the harness.
class CommitRingWatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServiceHarness::Options o = ServiceHarness::WithRings();
    o.ring_options.watch = absl::Milliseconds(1);
    o.ring_options.clock = &clock;
    o.observer = &neighbour;
    ASSERT_TRUE(h.Start(o).ok());
  }

  TricklingNeighbour neighbour;
  FakeClock clock;
  ServiceHarness h;
};

// A pipelining client's ring is watched after its batch: it publishes the next records
// without the doorbell, and the drain thread takes them.
TEST_F(CommitRingWatchTest, AWatchedRingIsDrainedWithoutItsDoorbell) {
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
TEST_F(CommitRingWatchTest, TheWatchEndsWithPollingCleared) {
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
TEST_F(CommitRingWatchTest, EachWatchedRingHasItsOwnDeadline) {
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
TEST_F(CommitRingWatchTest, APlainBatchEndsTheWatch) {
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
TEST_F(CommitRingWatchTest, RefusedRecordsBuyNoWatch) {
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
TEST_F(CommitRingWatchTest, ARingOfAnEndedSessionLeavesTheHotSet) {
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
TEST_F(CommitRingWatchTest, AnotherRingsDoorbellEndsTheSpin) {
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

// A watched ring's records, published without the doorbell, are drained in the next round
// even while a trickling neighbour keeps the thread from ever running out of work.
TEST_F(CommitRingWatchTest, AWatchedRingIsServedBesideATricklingNeighbour) {
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
TEST_F(CommitRingWatchTest, AScribbledPollingWordDelaysOnlyItsOwnRing) {
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
                           const Clock* clock = SystemClock::Get(),
                           const ThreadCpus* thread_cpus = SystemThreadCpus::Get()) {
  cpu_set_t saved, narrow;
  if (sched_getaffinity(0, sizeof(saved), &saved) != 0) {
    return absl::InternalError("sched_getaffinity");
  }
  CPU_ZERO(&narrow);
  for (int c : cpus) CPU_SET(c, &narrow);
  if (sched_setaffinity(0, sizeof(narrow), &narrow) != 0) {
    return absl::InternalError("sched_setaffinity");
  }
  ServiceHarness::Options o = ServiceHarness::WithRings();
  o.ring_options.follow_client_cpu = follow;
  o.ring_options.clock = clock;
  o.ring_options.cpus = thread_cpus;
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
    auto m = OpenMapped(h, "a");
    ASSERT_TRUE(m.ok()) << m.status();
    const RawRing* r = &m->ring;
    const uint64_t seq = m->seq;
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
  auto m = OpenMapped(h, "a");
  ASSERT_TRUE(m.ok()) << m.status();
  const RawRing* r = &m->ring;
  const uint64_t seq = m->seq;
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

// The same over more CPUs than the machine has (FakeThreadCpus adds c and d to the real a
// and b), so that it runs on two: with two watched rings' clients on a and c and a plain
// client's batch pinning the thread to b, the watch goes on on d, the one CPU nobody named,
// and takes both rings' quiet records there.
TEST_F(CommitRingCpuTest, TheWatchSpinsOnTheOneCpuNoClientNamed) {
  FakeClock clock;
  const int a = cpus_[0], b = cpus_[1];
  FakeThreadCpus fake({a, b}, 2);
  ASSERT_EQ(fake.extra().size(), 2u);
  const int c = fake.extra()[0], d = fake.extra()[1];
  ServiceHarness h;
  ASSERT_TRUE(StartNarrowed(h, {a, b}, true, &clock, &fake).ok());
  auto victim = OpenMapped(h, "v");
  auto other = OpenMapped(h, "w");
  auto plain = OpenMapped(h, "x");
  ASSERT_TRUE(victim.ok() && other.ok() && plain.ok());
  const auto on = [](int cpu) { return static_cast<uint32_t>(cpu) + 1; };
  const auto last_mask_is = [&fake](std::initializer_list<int> cpus) {
    const std::vector<cpu_set_t> set = fake.masks_set();
    cpu_set_t want;
    CPU_ZERO(&want);
    for (int cpu : cpus) CPU_SET(cpu, &want);
    return !set.empty() && CPU_EQUAL(&set.back(), &want);
  };
  ASSERT_EQ(CommitOne(*victim, on(a) | ring::kCpuPipelined, 1), 0);
  EXPECT_NE(h.rings()->last_cpu(), a);
  ASSERT_EQ(CommitOne(*other, on(c) | ring::kCpuPipelined, 1), 0);
  EXPECT_NE(h.rings()->last_cpu(), c);
  ASSERT_TRUE(WaitFor([&] { return h.rings()->watched() == 2; }));
  ASSERT_EQ(CommitOne(*plain, on(b), 1), 0);
  EXPECT_EQ(h.rings()->last_cpu(), b);
  EXPECT_TRUE(WaitFor([&] { return last_mask_is({d}); })) << "the watch never went to d";
  EXPECT_TRUE(CommitQuietly(*victim, 2));
  EXPECT_TRUE(CommitQuietly(*other, 2));
  EXPECT_EQ(h.rings()->watched(), 2u);
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
