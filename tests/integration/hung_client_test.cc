// Scenario 8: a hung client. A helper process is stopped with SIGSTOP past its lease TTL,
// its session expires (the keep-alive stream stays open but silent), its blocks are reused
// by another session, then it is resumed with SIGCONT: every later call on its expired
// sequences and session is refused, and its writes to its tail slot land only in its own
// segment, which the daemon has let go of, never in memory another session uses.
#include <signal.h>

#include "tests/integration/fixture.h"

namespace kvarn::it {
namespace {

constexpr int kLeaseTtlMs = 600;
constexpr int kKeepaliveMs = 100;

class HungClientTest : public IntegrationTest {};

TEST_F(HungClientTest, StoppedClientPastItsLeaseIsRejectedAfterResumingAndCannotTouchReusedMemory) {
  Daemon* d = StartDaemon({absl::StrCat("--lease_ttl_ms=", kLeaseTtlMs), absl::StrCat("--keepalive_ms=", kKeepaliveMs),
                           "--grace_ms=200"});
  ASSERT_NE(d, nullptr);
  auto client = Connect(*d);
  ASSERT_NE(client, nullptr);
  IT_ASSIGN_OR_FAIL(admin, Open(*client, "ops", 1, /*admin=*/true, "observer"));

  Child* hung = SpawnClient({"hung", "--target=" + d->target(), "--tenant=team-h", "--first=40000", "--max_sequences=2"});
  ASSERT_NE(hung, nullptr);
  IT_ASSIGN_OR_FAIL(ready, hung->WaitFor("READY", std::chrono::seconds(20)));
  auto f = ParseFields(ready);
  const uint64_t hung_session = FieldU64(f, "session");
  const uint32_t hung_sink = static_cast<uint32_t>(FieldU64(f, "sink"));
  const uint32_t hung_quant = static_cast<uint32_t>(FieldU64(f, "quant"));
  ASSERT_EQ(FieldU64(f, "tokens"), 2u * kTile + 10);
  // The daemon holds quant, sink, the observer's tail and the hung client's tail.
  const auto segments_before = DaemonSegments(d->pid());
  if (segments_before.ok()) {
    EXPECT_EQ(segments_before->size(), 4u);
  } else {
    Report(absl::StrCat("the daemon's segments are not checked: ", segments_before.status().message()));
  }

  // Stop it past the lease: its stream stays open but carries no keep-alive.
  ASSERT_TRUE(hung->Signal(SIGSTOP));
  const double t0 = NowMs();
  bool expired = false;
  while (NowMs() - t0 < 5000) {
    IT_ASSIGN_OR_FAIL(st, admin->Stats());
    if (st.sessions() == 1 && st.sequences() == 0) {
      expired = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const double expiry_ms = NowMs() - t0;  // reported, not asserted: a loaded machine stretches it
  ASSERT_TRUE(expired) << "the stopped client's session outlived its lease";
  if (segments_before.ok()) {
    auto after = AwaitDaemonSegments(d->pid(), 3);
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_EQ(after->size(), 3u) << "the daemon still holds the expired session's tail";
  }

  // Another session reuses the memory: evict everything cached (the hung client's blocks
  // are unreferenced now), then seal new tiles, which take the freed block ids.
  IT_ASSIGN_OR_FAIL(evicted, admin->Evict(v1::EvictRequest::SCOPE_ALL));
  EXPECT_EQ(evicted.blocks(), 2u);  // the hung client's sink and quantized block
  IT_ASSIGN_OR_FAIL(fresh, Open(*client, "team-h"));
  const std::vector<uint32_t> prompt = Tokens(80000, 2 * kTile + 20);
  IT_ASSIGN_OR_FAIL(q, fresh->CreateSequence(prompt));
  EXPECT_EQ(q.cached_tokens, 0u);
  IT_ASSIGN_OR_FAIL(table, AppendTokens(*fresh, q.id, prompt, 0, prompt.size()));
  const bool reused = table.sink_block == hung_sink || (!table.quant_blocks.empty() && table.quant_blocks[0] == hung_quant);
  const BlockLayout& bl = fresh->block_layout();
  const uint64_t sink_digest = DigestSinkBlock(*fresh, table.sink_block);
  const uint64_t quant_digest = Fnv64(fresh->QuantBlock(table.quant_blocks[0]), bl.quant_block_bytes());
  IT_ASSIGN_OR_FAIL(slot, fresh->TailSlot(q.id));
  const uint64_t tail_digest = Fnv64(slot.first, bl.fp16_block_bytes());
  std::vector<float> k0, v0;
  IT_ASSERT_OK(fresh->Read(q.id, 1, 0, static_cast<uint32_t>(prompt.size()), &k0, &v0));

  // Resume the hung client and let it try everything.
  ASSERT_TRUE(hung->Signal(SIGCONT));
  ASSERT_TRUE(hung->WriteLine("GO"));
  int results = 0, accepted = 0;
  for (;;) {
    IT_ASSIGN_OR_FAIL(line, hung->ReadLine(std::chrono::seconds(20)));
    if (line.rfind("DONE", 0) == 0) {
      EXPECT_EQ(ParseFields(line)["alive"], "0") << "the resumed client still believes in its lease";
      break;
    }
    if (line.rfind("RESULT", 0) != 0) continue;
    auto r = ParseFields(line);
    const uint64_t code = FieldU64(r, "code");
    ++results;
    accepted += code == 0;
    EXPECT_TRUE(code == static_cast<uint64_t>(absl::StatusCode::kNotFound) ||
                code == static_cast<uint64_t>(absl::StatusCode::kFailedPrecondition))
        << line;
  }
  EXPECT_EQ(results, 10);  // every daemon call of the resumed client
  EXPECT_EQ(accepted, 0);
  EXPECT_NE(hung->transcript().find("SCRIBBLED"), std::string::npos) << hung->transcript();

  // The new session's data is untouched: blocks read in place, its tail, and Read.
  EXPECT_EQ(DigestSinkBlock(*fresh, table.sink_block), sink_digest);
  EXPECT_EQ(Fnv64(fresh->QuantBlock(table.quant_blocks[0]), bl.quant_block_bytes()), quant_digest);
  EXPECT_EQ(Fnv64(slot.first, bl.fp16_block_bytes()), tail_digest);
  std::vector<float> k1, v1_;
  IT_ASSERT_OK(fresh->Read(q.id, 1, 0, static_cast<uint32_t>(prompt.size()), &k1, &v1_));
  EXPECT_EQ(k1, k0);
  EXPECT_EQ(v1_, v0);
  IT_ASSIGN_OR_FAIL(st, admin->Stats());
  EXPECT_EQ(st.sessions(), 2u);
  EXPECT_EQ(st.sequences(), 1u);
  Report(absl::StrCat("hung client: session ", hung_session, " expired ", expiry_ms, " ms after SIGSTOP (ttl ",
                      kLeaseTtlMs, " ms); block ids reused by another session: ", reused ? "yes" : "no", "; ", results,
                      " calls after SIGCONT, ", accepted, " accepted"));

  hung->CloseStdin();
  IT_ASSIGN_OR_FAIL(status, hung->Wait(std::chrono::seconds(10)));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << hung->transcript();
}

}  // namespace
}  // namespace kvarn::it
