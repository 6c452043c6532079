// kvarnd in a PID namespace of its own, its clients outside it: the DaemonSet deployment,
// where worker pods are processes kvarnd cannot see (SO_PEERCRED gives pid 0). The host
// backend lends memory to such a peer; the client's in-place appends (shared-memory tail)
// and in-place reads of sealed blocks work, and produce the very blocks a kvarnd in the
// client's own namespace produces.
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/integration/fixture.h"

namespace kvarn::it {
namespace {

// Whether this process may create PID namespaces (CAP_SYS_ADMIN; CI runs as root).
bool CanUnsharePid() {
  const pid_t child = fork();
  if (child == 0) _exit(unshare(CLONE_NEWPID) == 0 ? 0 : 1);
  int st = 0;
  return child > 0 && waitpid(child, &st, 0) == child && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

class PidNamespaceTest : public IntegrationTest {};

TEST_F(PidNamespaceTest, AClientKvarndCannotSeeGetsItsMemoryAndTheSameBlocks) {
  if (!CanUnsharePid()) GTEST_SKIP() << "unshare(CLONE_NEWPID) is not permitted here (needs root)";
  DaemonOptions o;
  o.own_pid_namespace = true;
  o.extra_flags = {absl::StrCat("--admin_token=", kAdminToken), "--log_level=debug"};
  auto isolated = Daemon::Start(o);
  ASSERT_TRUE(isolated.ok()) << isolated.status();
  Daemon* plain = StartDaemon();
  ASSERT_NE(plain, nullptr);

  const std::vector<uint32_t> prompt = Tokens(31000, 3 * kTile + 7);
  std::vector<std::vector<uint64_t>> digests;  // per daemon: every quantized block's digest
  for (Daemon* d : {isolated->get(), plain}) {
    auto client = Connect(*d);
    ASSERT_NE(client, nullptr);
    IT_ASSIGN_OR_FAIL(s, Open(*client, "team-ns", 2));
    IT_ASSIGN_OR_FAIL(q, s->CreateSequence(prompt));
    // mixed: in-place Stage+Commit through the lent tail, alternating with inline appends.
    IT_ASSIGN_OR_FAIL(table, AppendTokens(*s, q.id, prompt, 0, prompt.size(), /*mixed=*/true));
    ASSERT_EQ(table.quant_blocks.size(), 2u);
    ASSERT_TRUE(table.has_sink);
    std::vector<uint64_t> mine;
    for (uint32_t b : table.quant_blocks) {
      IT_ASSIGN_OR_FAIL(dg, DigestQuantBlock(*s, b));  // read in place, through the lent segment
      mine.push_back(dg.raw);
      mine.push_back(dg.dequantized);
    }
    mine.push_back(DigestSinkBlock(*s, table.sink_block));
    digests.push_back(mine);
  }
  EXPECT_EQ(digests[0], digests[1]) << "the isolated kvarnd stored other blocks";
  const std::string log = (*isolated)->Log();
  EXPECT_THAT(log, ::testing::HasSubstr("event=descriptors_lent session=1 pid=0"))
      << "the client was visible to kvarnd: the test did not separate them\n" << log;
  EXPECT_THAT(log, ::testing::HasSubstr("pid=1 "));
}

}  // namespace
}  // namespace kvarn::it
