// Scenario 3: a client process SIGKILLed while holding 1,000 quantized block references.
// Every reference must be dropped within the lease's stated detection bound, and no block
// may leak. Repeated KVARN_IT_KILL_CYCLES times (default 5); the reclaim time of each cycle
// and their p50/p99 are printed.
#include <signal.h>

#include <cstdlib>

#include "tests/integration/fixture.h"

namespace kvarn::it {
namespace {

constexpr int kGraceMs = 100;
constexpr int kExpiryScanMs = 50;  // DaemonConfig::expiry_scan
constexpr int kSlackMs = 250;      // scheduling, the keep-alive stream's teardown, polling
constexpr double kReclaimBoundMs = kGraceMs + kExpiryScanMs + kSlackMs;

int Cycles() {
  const char* env = std::getenv("KVARN_IT_KILL_CYCLES");
  const int n = env != nullptr ? std::atoi(env) : 5;
  return n > 0 ? n : 5;
}

class ClientKillTest : public IntegrationTest {};

TEST_F(ClientKillTest, KilledClientsThousandReferencesAreReclaimedWithinTheLeaseBound) {
  Daemon* d = StartDaemon({absl::StrCat("--grace_ms=", kGraceMs), "--capacity=64MiB"});
  ASSERT_NE(d, nullptr);
  auto client = Connect(*d);
  ASSERT_NE(client, nullptr);
  // The observer is admin so it sees every tenant's sessions.
  IT_ASSIGN_OR_FAIL(observer, Open(*client, "ops", /*max_sequences=*/1, /*admin=*/true, "observer"));
  IT_ASSIGN_OR_FAIL(base, observer->Stats());
  const uint32_t quant_total = base.quant_blocks_total(), sink_total = base.sink_blocks_total();
  const uint64_t fp16_block = observer->block_layout().fp16_block_bytes();

  std::vector<double> reclaim_ms, session_ms;
  const int cycles = Cycles();
  for (int cycle = 0; cycle < cycles; ++cycle) {
    SCOPED_TRACE(absl::StrCat("cycle ", cycle));
    // 2 sequences of a sink and 50 quantized tiles each, each forked into 10: 20 sequences
    // holding 20 x 50 = 1,000 quantized block references (100 distinct blocks) and 20 sink
    // references. Token ids differ per cycle, so every cycle seals new blocks.
    Child* holder = SpawnClient({"hold", "--target=" + d->target(), "--tenant=team-k",
                                 absl::StrCat("--first=", 1 + cycle * 10000000), "--bases=2", "--tiles=50", "--forks=10",
                                 "--max_sequences=32"});
    ASSERT_NE(holder, nullptr);
    IT_ASSIGN_OR_FAIL(ready, holder->WaitFor("READY", std::chrono::seconds(60)));
    auto f = ParseFields(ready);
    ASSERT_GE(FieldU64(f, "refs"), 1000u);
    ASSERT_EQ(FieldU64(f, "seqs"), 20u);
    const uint64_t holder_session = FieldU64(f, "session");

    IT_ASSIGN_OR_FAIL(held, observer->Stats());
    EXPECT_EQ(held.quant_blocks_active(), 100u);
    EXPECT_EQ(held.sink_blocks_active(), 2u);
    EXPECT_EQ(held.sessions(), 2u);
    EXPECT_EQ(held.sequences(), 20u);
    bool connected = false;
    for (const auto& si : held.session_info()) {
      if (si.session_id() == holder_session) connected = si.connected();
    }
    ASSERT_TRUE(connected) << "the holder's keep-alive stream is not attached: its death would not be seen";

    ASSERT_TRUE(holder->Signal(SIGKILL));
    const double t0 = NowMs();
    double sessions_gone = -1, refs_gone = -1;
    v1::StatsResponse st;
    while (NowMs() - t0 < 5000) {
      IT_ASSIGN_OR_FAIL(now, observer->Stats());
      st = now;
      const double t = NowMs() - t0;
      if (sessions_gone < 0 && st.sessions() == 1) sessions_gone = t;
      if (st.quant_blocks_active() == 0 && st.sink_blocks_active() == 0 && st.sequences() == 0) {
        refs_gone = t;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_GE(refs_gone, 0) << "references still held 5 s after the kill: " << st.DebugString();
    reclaim_ms.push_back(refs_gone);
    session_ms.push_back(sessions_gone < 0 ? refs_gone : sessions_gone);
    IT_ASSIGN_OR_FAIL(status, holder->Wait(std::chrono::seconds(5)));
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

    // Nothing leaked: every block is free or cached (kept for prefix hits), only the
    // observer's session (and its one tail slot) remains, and the daemon let go of the
    // holder's tail segment.
    IT_ASSIGN_OR_FAIL(after, observer->Stats());
    EXPECT_EQ(after.sessions(), 1u);
    ASSERT_EQ(after.session_info_size(), 1);
    EXPECT_EQ(after.session_info(0).session_id(), observer->id());
    EXPECT_EQ(after.quant_blocks_free() + after.quant_blocks_cached(), quant_total) << after.DebugString();
    EXPECT_EQ(after.sink_blocks_free() + after.sink_blocks_cached(), sink_total) << after.DebugString();
    EXPECT_EQ(after.quant_blocks_cached(), 100u * (cycle + 1));
    EXPECT_EQ(after.fp16_bytes(), (uint64_t{sink_total - after.sink_blocks_free()} + 1) * fp16_block);
    if (auto segs = AwaitDaemonSegments(d->pid(), 3); segs.ok()) {
      EXPECT_EQ(segs->size(), 3u) << "quant, sink and the observer's tail segment only";
    } else if (cycle == 0) {
      Report(absl::StrCat("the daemon's segments are not checked: ", segs.status().message()));
    }
    Report(absl::StrCat("cycle ", cycle, ": 1000 refs reclaimed ", refs_gone, " ms after SIGKILL (session gone at ",
                        session_ms.back(), " ms)"));
  }
  const double p50 = Percentile(reclaim_ms, 50), p99 = Percentile(reclaim_ms, 99);
  Report(absl::StrCat("reclaim after SIGKILL over ", cycles, " cycles: p50 ", p50, " ms, p99 ", p99, " ms, bound ",
                      kReclaimBoundMs, " ms (grace ", kGraceMs, " + expiry scan ", kExpiryScanMs, " + slack ", kSlackMs,
                      "); blocks leaked 0"));
  // The figures are reported, not asserted: a loaded machine stretches them (the bound that
  // holds under load is measured by kvarn_chaos, docs/daemon.md). That the grace period is
  // honoured is a unit test on a fake clock (LeaseTest.BrokenStreamReleasesSequencesAfterGrace).
  (void)p99;
}

}  // namespace
}  // namespace kvarn::it
