// Scenario 6: kvarnd SIGKILLed while a client holds sequences, then restarted with the same
// instance name and socket. Nothing of the dead daemon can be picked up: its memory was
// anonymous (nothing in /dev/shm to find), the new daemon's segments are new memory (the old
// client's mapping does not see the new daemon's writes), and every handle of the old epoch is
// rejected: calls get FAILED_PRECONDITION and the old Session notices (alive() == false)
// through its keep-alive stream.
#include <signal.h>

#include <set>

#include "tests/integration/fixture.h"

namespace kvarn::it {
namespace {

class RestartTest : public IntegrationTest {};

TEST_F(RestartTest, RestartedDaemonSharesNoMemoryWithTheDeadOneAndRejectsOldHandles) {
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

  // The first daemon's memory has no name anyone could open later.
  EXPECT_THAT(NamedSegments(instance), ::testing::IsEmpty());
  const uint32_t old_block = table.quant_blocks[0];
  const uint64_t old_digest = Fnv64(old->QuantBlock(old_block), old->block_layout().quant_block_bytes());

  first->Kill();  // SIGKILL + reap: the old client's mappings are all that is left of its memory

  Daemon* second = StartDaemon({}, instance, socket);
  ASSERT_NE(second, nullptr);
  ASSERT_NE(second->epoch(), old_epoch);
  EXPECT_THAT(NamedSegments(instance), ::testing::IsEmpty());
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
                      " epoch ", fresh->epoch(), "; old Session saw alive()==false ", noticed_ms,
                      " ms after the new daemon started"));

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
    req.mutable_session()->set_secret(fresh->Ref().secret());
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
  // The new daemon serves normally (other tokens, so its blocks differ from the old ones).
  const std::vector<uint32_t> prompt2 = Tokens(70000, 3 * kTile + 5);
  IT_ASSIGN_OR_FAIL(q, fresh->CreateSequence(prompt2));
  IT_ASSIGN_OR_FAIL(t2, AppendTokens(*fresh, q.id, prompt2, 0, prompt2.size()));
  EXPECT_EQ(t2.tokens, prompt2.size());
  // The new daemon wrote its blocks (the same ids as before, most likely) into new memory:
  // the old client's mapping of the dead daemon's pool did not change.
  EXPECT_EQ(Fnv64(old->QuantBlock(old_block), old->block_layout().quant_block_bytes()), old_digest);
  EXPECT_NE(Fnv64(fresh->QuantBlock(t2.quant_blocks[0]), fresh->block_layout().quant_block_bytes()),
            Fnv64(old->QuantBlock(t2.quant_blocks[0]), old->block_layout().quant_block_bytes()))
      << "the old mapping shows the new daemon's block";
  old.reset();  // its best-effort CloseSession is refused (stale epoch); nothing changes
  IT_ASSIGN_OR_FAIL(st2, fresh->Stats());
  EXPECT_EQ(st2.sessions(), 1u);
  EXPECT_EQ(st2.sequences(), 1u);
}

}  // namespace
}  // namespace kvarn::it
