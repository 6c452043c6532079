// Scenario 6: kvarnd SIGKILLed while a client holds sequences, then restarted with the same
// instance name and socket. The new daemon removes the dead one's segments at start, and
// every handle of the old epoch is rejected: calls get FAILED_PRECONDITION and the old
// Session notices (alive() == false) through its keep-alive stream.
#include <signal.h>

#include <set>

#include "tests/integration/fixture.h"

namespace kvarn::it {
namespace {

class RestartTest : public IntegrationTest {};

TEST_F(RestartTest, RestartedDaemonRemovesLeftoverSegmentsAndRejectsOldHandles) {
  TempDir dir;
  const std::string instance = UniqueInstance();
  const std::string socket = dir.path() + "/kvarnd.sock";
  Daemon* first = StartDaemon({}, instance, socket);
  ASSERT_NE(first, nullptr);
  auto client = Connect(*first);
  ASSERT_NE(client, nullptr);
  IT_ASSIGN_OR_FAIL(old, Open(*client, "team-r"));
  const std::vector<uint32_t> prompt = Tokens(3000, 3 * kTile + 5);
  IT_ASSIGN_OR_FAIL(seq, old->CreateSequence(prompt));
  IT_ASSIGN_OR_FAIL(table, AppendTokens(*old, seq.id, prompt, 0, prompt.size()));
  ASSERT_EQ(table.quant_blocks.size(), 2u);
  IT_ASSIGN_OR_FAIL(fork, old->Fork(seq.id));
  const uint64_t old_epoch = old->epoch();
  const uint64_t old_session = old->id();
  EXPECT_EQ(old_epoch, first->epoch());

  // Segments of the first daemon: quantized pool, sink pool, the session's tail.
  const std::vector<std::string> leftover = ShmSegments(instance);
  ASSERT_EQ(leftover.size(), 3u);
  for (const std::string& name : leftover) {
    EXPECT_NE(name.find(absl::StrCat(".", first->pid(), ".")), std::string::npos) << name;
  }

  first->Kill();  // SIGKILL + reap: the crash leaves its segments behind
  for (const std::string& name : leftover) EXPECT_TRUE(ShmExists(name)) << name << " vanished before the restart";

  Daemon* second = StartDaemon({}, instance, socket);
  ASSERT_NE(second, nullptr);
  ASSERT_NE(second->epoch(), old_epoch);
  // Every leftover segment is gone and logged as removed; only the new daemon's remain.
  const std::string log = second->Log();
  for (const std::string& name : leftover) {
    EXPECT_FALSE(ShmExists(name)) << name << " survived the restart";
    EXPECT_NE(log.find("event=stale_segment_removed name=" + name), std::string::npos) << log;
  }
  for (const std::string& name : ShmSegments(instance)) {
    EXPECT_NE(name.find(absl::StrCat(".", second->pid(), ".")), std::string::npos) << name;
  }

  // The old Session finds out by itself, before any call of ours: its keep-alive stream
  // reconnects to the new daemon, which refuses the old epoch.
  const double t0 = NowMs();
  while (old->alive() && NowMs() - t0 < 10000) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(old->alive());
  const double noticed_ms = NowMs() - t0;

  // A new client and session of the new daemon: likely the same session id as the old one,
  // which is exactly why the epoch is checked.
  auto client2 = Connect(*second);
  ASSERT_NE(client2, nullptr);
  IT_ASSIGN_OR_FAIL(fresh, Open(*client2, "team-r"));
  EXPECT_NE(fresh->epoch(), old_epoch);
  Report(absl::StrCat("restart: old session ", old_session, " epoch ", old_epoch, "; new session ", fresh->id(),
                      " epoch ", fresh->epoch(), "; leftover segments removed ", leftover.size(),
                      "; old Session saw alive()==false ", noticed_ms, " ms after the new daemon started"));

  // Old handles, replayed on the old (reconnected) channel: all refused with
  // FAILED_PRECONDITION (stale epoch), none accepted.
  const std::vector<uint32_t> more = Tokens(9000, 3);
  const KvData kv = MakeKv(more, SmallLayout());
  int accepted = 0;
  const auto expect_stale = [&](const std::string& op, const absl::Status& s) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << op << ": " << s;
    accepted += s.ok();
  };
  expect_stale("AppendInline", old->AppendInline(seq.id, more, kv.keys.data(), kv.values.data(), DType::kF16).status());
  expect_stale("Append", old->Append(fork.id, more, kv.keys.data(), kv.values.data(), DType::kF16).status());
  std::vector<float> k, v;
  expect_stale("Read", old->Read(seq.id, 0, 0, 1, &k, &v));
  expect_stale("Fork", old->Fork(seq.id).status());
  const uint64_t ids[] = {seq.id, fork.id};
  expect_stale("Release", old->Release(ids));
  expect_stale("CreateSequence", old->CreateSequence(prompt).status());
  expect_stale("Lookup", old->Lookup(prompt).status());
  expect_stale("Stats", old->Stats().status());
  expect_stale("ListSequences", old->ListSequences().status());
  EXPECT_EQ(accepted, 0);
  // The old session id under the new epoch is simply unknown unless it was reissued.
  {
    v1::StatsRequest req;
    req.mutable_session()->set_session_id(fresh->id() + 100);
    req.mutable_session()->set_epoch(second->epoch());
    v1::StatsResponse resp;
    grpc::ClientContext ctx;
    EXPECT_EQ(client2->stub().Stats(&ctx, req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  }

  // Nothing of the old daemon's state exists in the new one.
  IT_ASSIGN_OR_FAIL(st, fresh->Stats());
  EXPECT_EQ(st.sessions(), 1u);
  EXPECT_EQ(st.sequences(), 0u);
  EXPECT_EQ(st.quant_blocks_active() + st.quant_blocks_cached(), 0u);
  IT_ASSIGN_OR_FAIL(lookup, fresh->Lookup(prompt));
  EXPECT_EQ(lookup, 0u);
  // The new daemon serves normally.
  IT_ASSIGN_OR_FAIL(q, fresh->CreateSequence(prompt));
  IT_ASSIGN_OR_FAIL(t2, AppendTokens(*fresh, q.id, prompt, 0, prompt.size()));
  EXPECT_EQ(t2.tokens, prompt.size());
  old.reset();  // its best-effort CloseSession is refused (stale epoch); nothing changes
  IT_ASSIGN_OR_FAIL(st2, fresh->Stats());
  EXPECT_EQ(st2.sessions(), 1u);
  EXPECT_EQ(st2.sequences(), 1u);
}

}  // namespace
}  // namespace kvarn::it
