// Commit rings against a real kvarnd: a second process scribbling over its own ring and
// spamming its doorbell hurts only its own session (the legitimate client's commits all
// succeed, by Commit and pipelined by Publish and Collect, commit what CommitBatch commits, and
// its latency with and without the neighbour is reported, not asserted); a neighbour that
// trickles its tail does not strand a watched pipelining client's doorbell-less records; a
// client killed mid-commit leaves nothing half-applied and no reference behind.
#include <random>

#include "absl/strings/escaping.h"
#include "client/lib/commit_ring.h"
#include "tests/integration/fixture.h"

namespace kvarn::it {
namespace {

using Code = absl::StatusCode;
using Items = std::vector<std::pair<uint64_t, std::vector<uint32_t>>>;

class CommitRingTest : public IntegrationTest {
 protected:
  Child* Spawn(const std::string& binary, const std::vector<std::string>& args) {
    auto c = Child::Spawn(binary, args);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return nullptr;
    child_pids_.push_back((*c)->pid());
    children_.push_back(std::move(*c));
    return children_.back().get();
  }
  // Ends a `kvarn_attacker ring` neighbour (stdin EOF: it moves its tail out of bounds) and
  // checks its summary: it ran, and kvarnd closed its ring, and only its ring, with
  // FAILED_PRECONDITION. The summary line, empty when it never came.
  std::string EndRingNeighbour(Child* a) {
    a->CloseStdin();
    auto summary = a->WaitFor("RINGSUMMARY", std::chrono::seconds(30));
    EXPECT_TRUE(summary.ok()) << summary.status();
    if (!summary.ok()) return "";
    auto f = ParseFields(*summary);
    EXPECT_GT(FieldU64(f, "rounds"), 0u) << *summary;
    EXPECT_EQ(FieldU64(f, "broken"), static_cast<uint64_t>(Code::kFailedPrecondition)) << *summary;
    return *summary;
  }
};

// Runs `steps` decode steps of every sequence in `seqs` (one token each, K/V from the token
// ids), committing through `commit`; returns each commit's wall time in microseconds.
template <typename Commit>
std::vector<double> Steps(Session& s, const std::vector<uint64_t>& seqs, uint32_t first, int steps, uint64_t salt,
                          Commit&& commit) {
  std::vector<double> us;
  for (int step = 0; step < steps; ++step) {
    const std::vector<uint32_t> ids = {first + static_cast<uint32_t>(step)};
    const KvData kv = MakeKv(ids, SmallLayout(), salt);
    Items items;
    for (uint64_t q : seqs) {
      EXPECT_TRUE(s.Stage(q, 1, kv.keys.data(), kv.values.data(), DType::kF16).ok());
      items.push_back({q, ids});
    }
    const double t0 = NowMs();
    commit(items);
    us.push_back((NowMs() - t0) * 1e3);
  }
  return us;
}

// As Steps, pipelined: each sequence's commit published right after its Stage, then one
// Collect per step; returns each step's Publish calls and Collect, in microseconds. Counts
// every commit that did not succeed in `failures`.
std::vector<double> PipelinedSteps(Session& s, CommitRing& ring, const std::vector<uint64_t>& seqs, uint32_t first,
                                   int steps, uint64_t salt, int* failures) {
  std::vector<double> us;
  for (int step = 0; step < steps; ++step) {
    const std::vector<uint32_t> ids = {first + static_cast<uint32_t>(step)};
    const KvData kv = MakeKv(ids, SmallLayout(), salt);
    double spent = 0;
    for (uint64_t q : seqs) {
      EXPECT_TRUE(s.Stage(q, 1, kv.keys.data(), kv.values.data(), DType::kF16).ok());
      const double t0 = NowMs();
      const absl::Status p = ring.Publish(q, ids);
      spent += NowMs() - t0;
      if (!p.ok()) {
        ++*failures;
        ADD_FAILURE() << p;
      }
    }
    const double t0 = NowMs();
    auto r = ring.Collect();
    us.push_back((spent + NowMs() - t0) * 1e3);
    if (!r.ok()) {
      ++*failures;
      ADD_FAILURE() << r.status();
      continue;
    }
    for (const auto& it : *r) {
      if (!it.ok()) {
        ++*failures;
        ADD_FAILURE() << it.status();
      }
    }
  }
  return us;
}

TEST_F(CommitRingTest, AScribblingNeighbourHurtsOnlyItsOwnSession) {
  Daemon* d = StartDaemon({"--capacity=64MiB"});  // a sink tile for every sequence of the three sessions
  ASSERT_NE(d, nullptr);
  auto client = Connect(*d);
  ASSERT_NE(client, nullptr);
  IT_ASSIGN_OR_FAIL(victim, Open(*client, "victim", 16));
  IT_ASSIGN_OR_FAIL(twin, Open(*client, "twin", 16));  // the same steps by CommitBatch
  IT_ASSIGN_OR_FAIL(ring, victim->OpenCommitRing());
  std::vector<uint64_t> qv, qt;
  for (int i = 0; i < 16; ++i) {
    qv.push_back(victim->CreateSequence({})->id);
    qt.push_back(twin->CreateSequence({})->id);
  }
  int failures = 0;
  const auto by_ring = [&](const Items& items) {
    auto r = ring->Commit(items);
    if (!r.ok()) {
      ++failures;
      ADD_FAILURE() << r.status();
      return;
    }
    for (const auto& it : *r) {
      if (!it.ok()) {
        ++failures;
        ADD_FAILURE() << it.status();
      }
    }
  };
  const auto by_batch = [&](const Items& items) {
    auto r = twin->CommitBatch(items);
    ASSERT_TRUE(r.ok()) << r.status();
    for (const auto& it : *r) ASSERT_TRUE(it.ok()) << it.status();
  };
  constexpr int kSteps = 160;  // crosses the sink tile and into the first quantized one
  const std::vector<double> alone = Steps(*victim, qv, 0, kSteps, 1, by_ring);
  Steps(*twin, qt, 0, kSteps, 1, by_batch);

  const std::string secret = absl::BytesToHexString(victim->Ref().secret());
  Child* a = Spawn(AttackerBinary(), {"ring", "--target=" + d->target(), "--tenant=mallory",
                                      absl::StrCat("--victim-session=", victim->id()),
                                      absl::StrCat("--victim-epoch=", victim->epoch()), "--victim-secret=" + secret});
  ASSERT_NE(a, nullptr);
  IT_ASSIGN_OR_FAIL(steal, a->WaitFor("ATTACK name=victim_commit_ring", std::chrono::seconds(30)));
  EXPECT_NE(steal.find("result=refused"), std::string::npos) << steal;
  EXPECT_NE(steal.find(absl::StrCat("code_", static_cast<int>(Code::kPermissionDenied))), std::string::npos) << steal;
  IT_ASSIGN_OR_FAIL(ready, a->WaitFor("READY", std::chrono::seconds(30)));
  // Half the steps by Commit, half pipelined (Publish after each Stage, then Collect).
  const std::vector<double> attacked = Steps(*victim, qv, kSteps, kSteps / 2, 2, by_ring);
  const std::vector<double> pipelined =
      PipelinedSteps(*victim, *ring, qv, kSteps + kSteps / 2, kSteps / 2, 2, &failures);
  Steps(*twin, qt, kSteps, kSteps, 2, by_batch);
  const std::string summary = EndRingNeighbour(a);
  EXPECT_EQ(failures, 0);
  Report(absl::StrCat("16-sequence ring commit, alone: p50 ", Percentile(alone, 50), " us p99 ", Percentile(alone, 99),
                      " us; beside a scribbling, doorbell-spamming neighbour: p50 ", Percentile(attacked, 50), " us p99 ",
                      Percentile(attacked, 99), " us; pipelined beside it (Publish calls + Collect): p50 ",
                      Percentile(pipelined, 50), " us p99 ", Percentile(pipelined, 99), " us (neighbour: ", summary, ")"));
  // What the victim committed is what CommitBatch committed for the twin, block for block.
  const BlockLayout& l = victim->block_layout();
  for (size_t i = 0; i < qv.size(); ++i) {
    IT_ASSIGN_OR_FAIL(tv, victim->Table(qv[i]));
    IT_ASSIGN_OR_FAIL(tt, twin->Table(qt[i]));
    ASSERT_EQ(tv.tokens, 2u * kSteps);
    ASSERT_EQ(tv.tokens, tt.tokens);
    ASSERT_EQ(tv.quant_blocks.size(), tt.quant_blocks.size());
    ASSERT_TRUE(tv.has_sink && tt.has_sink);
    EXPECT_EQ(std::memcmp(victim->SinkBlock(tv.sink_block), twin->SinkBlock(tt.sink_block), l.fp16_block_bytes()), 0);
    for (size_t k = 0; k < tv.quant_blocks.size(); ++k) {
      EXPECT_EQ(std::memcmp(victim->QuantBlock(tv.quant_blocks[k]), twin->QuantBlock(tt.quant_blocks[k]), l.quant_block_bytes()), 0);
    }
    std::vector<float> kv1, vv1, kv2, vv2;
    ASSERT_TRUE(victim->Read(qv[i], 1, 0, static_cast<uint32_t>(tv.tokens), &kv1, &vv1).ok());
    ASSERT_TRUE(twin->Read(qt[i], 1, 0, static_cast<uint32_t>(tt.tokens), &kv2, &vv2).ok());
    EXPECT_EQ(kv1, kv2);
    EXPECT_EQ(vv1, vv2);
  }
  // And the victim's ring still serves after the neighbour's ring was closed.
  Steps(*victim, qv, 2 * kSteps, 1, 3, by_ring);
  EXPECT_EQ(failures, 0);
}

// A neighbour that keeps its tail one record ahead of `done` (kvarn_attacker ring --trickle)
// gives kvarnd's drain thread work in nearly every round. A pipelining victim, whose ring is
// watched (a 10 ms watch covers its steps), publishes without the doorbell; each of its
// records must still be served in the next round, not when the neighbour happens to lose a
// race (the client's Collect would wait out its rpc_timeout). Its latency is reported.
TEST_F(CommitRingTest, AWatchedRingBesideATricklingNeighbourIsServed) {
  Daemon* d = StartDaemon({"--capacity=64MiB", "--ring_watch_us=10000"});
  ASSERT_NE(d, nullptr);
  auto client = Connect(*d);
  ASSERT_NE(client, nullptr);
  IT_ASSIGN_OR_FAIL(victim, Open(*client, "victim", 16));
  IT_ASSIGN_OR_FAIL(ring, victim->OpenCommitRing());
  std::vector<uint64_t> qv;
  for (int i = 0; i < 16; ++i) qv.push_back(victim->CreateSequence({})->id);
  Child* a = Spawn(AttackerBinary(),
                   {"ring", "--trickle", "--target=" + d->target(), "--tenant=mallory"});
  ASSERT_NE(a, nullptr);
  IT_ASSIGN_OR_FAIL(ready, a->WaitFor("READY", std::chrono::seconds(30)));
  constexpr int kSteps = 96;  // crosses the sink tile
  int failures = 0;
  const std::vector<double> pipelined =
      PipelinedSteps(*victim, *ring, qv, 0, kSteps, 1, &failures);
  const std::string summary = EndRingNeighbour(a);
  EXPECT_EQ(failures, 0);
  for (uint64_t q : qv) {
    IT_ASSIGN_OR_FAIL(t, victim->Table(q));
    EXPECT_EQ(t.tokens, static_cast<uint64_t>(kSteps));
  }
  Report(absl::StrCat("16-sequence pipelined step beside a trickling neighbour (Publish calls + ",
                      "Collect): p50 ", Percentile(pipelined, 50), " us p99 ",
                      Percentile(pipelined, 99), " us (neighbour: ", summary, ")"));
}

TEST_F(CommitRingTest, AClientKilledMidCommitLeavesNothingHalfApplied) {
  Daemon* d = StartDaemon({"--grace_ms=100"});
  ASSERT_NE(d, nullptr);
  auto client = Connect(*d);
  ASSERT_NE(client, nullptr);
  IT_ASSIGN_OR_FAIL(observer, Open(*client, "ops", 1, /*admin=*/true, "observer"));
  IT_ASSIGN_OR_FAIL(base, observer->Stats());
  IT_ASSIGN_OR_FAIL(bystander, Open(*client, "bystander", 2));
  IT_ASSIGN_OR_FAIL(ring, bystander->OpenCommitRing());
  const uint64_t q = bystander->CreateSequence({})->id;
  std::mt19937 rng(11);
  uint32_t token = 0;
  for (int cycle = 0; cycle < 4; ++cycle) {
    SCOPED_TRACE(absl::StrCat("cycle ", cycle));
    Child* c = SpawnClient({"ringloop", "--target=" + d->target(), "--tenant=doomed", "--seqs=8", "--max_sequences=8"});
    ASSERT_NE(c, nullptr);
    IT_ASSIGN_OR_FAIL(open, c->WaitFor("OPEN", std::chrono::seconds(30)));
    const uint64_t doomed = FieldU64(ParseFields(open), "session");
    IT_ASSIGN_OR_FAIL(ready, c->WaitFor("READY", std::chrono::seconds(30)));
    // Its keep-alive stream attached, so its end is detected by the grace period (a client
    // killed before that is reclaimed by the lease TTL instead).
    bool connected = false;
    for (const double t0 = NowMs(); !connected && NowMs() - t0 < 10000;) {
      IT_ASSIGN_OR_FAIL(st, observer->Stats());
      for (const auto& info : st.session_info()) connected |= info.session_id() == doomed && info.connected();
      if (!connected) absl::SleepFor(absl::Milliseconds(2));
    }
    ASSERT_TRUE(connected);
    // Killed at a step boundary's neighbourhood chosen at random: mid-commit, mid-stage or
    // mid-seal (a tile is 64 steps).
    const uint64_t kill_at = 16 * (1 + rng() % 8);
    for (;;) {
      IT_ASSIGN_OR_FAIL(line, c->WaitFor("STEP", std::chrono::seconds(30)));
      if (FieldU64(ParseFields(line), "n") >= kill_at) break;
    }
    c->Signal(SIGKILL);
    IT_ASSERT_OK(c->Wait(std::chrono::seconds(10)).status());
    // The session ends (grace), its sequences go, every reference it held is dropped.
    bool reclaimed = false;
    v1::StatsResponse last;
    for (const double t0 = NowMs(); NowMs() - t0 < 10000;) {
      IT_ASSIGN_OR_FAIL(st, observer->Stats());
      last = st;
      if (st.sessions() == base.sessions() + 1 && st.sequences() == 1) {
        reclaimed = true;
        break;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    ASSERT_TRUE(reclaimed) << last.DebugString() << "\n" << c->transcript() << "\n" << d->Log();
    IT_ASSIGN_OR_FAIL(st, observer->Stats());
    EXPECT_EQ(st.quant_blocks_active(), 0u);
    EXPECT_EQ(st.sink_blocks_active(), 0u);
    EXPECT_EQ(st.quant_blocks_free() + st.quant_blocks_cached(), st.quant_blocks_total());
    EXPECT_EQ(st.sink_blocks_free() + st.sink_blocks_cached(), st.sink_blocks_total());
    // The daemon's ring thread still serves everyone else.
    const std::vector<uint32_t> ids = {token++};
    const KvData kv = MakeKv(ids, SmallLayout());
    IT_ASSERT_OK(bystander->Stage(q, 1, kv.keys.data(), kv.values.data(), DType::kF16));
    auto r = ring->Commit({{q, ids}});
    ASSERT_TRUE(r.ok() && (*r)[0].ok());
  }
}

}  // namespace
}  // namespace kvarn::it
