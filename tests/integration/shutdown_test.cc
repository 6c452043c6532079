// kvarnd stops promptly on SIGTERM whatever its clients are doing: the process exits (and
// its memory goes) within its own shutdown deadline, not only the kvarnd_stopped log line.
#include <signal.h>

#include "tests/integration/fixture.h"

namespace kvarn::it {
namespace {

// Server::Shutdown gives in-flight calls 5 s, then cancels them; 1 s more for the rest of
// the teardown (unmapping, unlinking segments).
constexpr double kExitBoundMs = 5000 + 1000;

class ShutdownTest : public IntegrationTest {
 protected:
  // SIGTERM, then the time until the process exited, asserting a clean exit without
  // segments left behind.
  double TimedStop(Daemon* d) {
    const double t0 = NowMs();
    auto status = d->Stop(std::chrono::seconds(30));
    const double ms = NowMs() - t0;
    EXPECT_TRUE(status.ok()) << status.status();
    if (status.ok()) {
      EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << d->Log();
    }
    EXPECT_THAT(NamedSegments(d->instance()), ::testing::IsEmpty());
    const size_t stopped = d->Log().find("event=kvarnd_stopped");
    EXPECT_NE(stopped, std::string::npos) << d->Log();
    return ms;
  }
};

TEST_F(ShutdownTest, ExitsPromptlyOnSigtermAfterAClientLeft) {
  std::vector<double> ms;
  for (int i = 0; i < 3; ++i) {
    Daemon* d = StartDaemon();
    ASSERT_NE(d, nullptr);
    {
      auto client = Connect(*d);
      ASSERT_NE(client, nullptr);
      IT_ASSIGN_OR_FAIL(s, Open(*client, "team-s", 2));
      const std::vector<uint32_t> p = Tokens(1, 3 * kTile + 40);
      IT_ASSIGN_OR_FAIL(q, s->CreateSequence(p));
      ASSERT_TRUE(AppendTokens(*s, q.id, p, 0, p.size()).ok());
    }
    ms.push_back(TimedStop(d));
  }
  Report(absl::StrCat("SIGTERM to exit after a client left: ", ms[0], ", ", ms[1], ", ", ms[2], " ms (bound ",
                      kExitBoundMs, ")"));
  for (double m : ms) EXPECT_LE(m, kExitBoundMs);
}

// The same after the client read 232 tokens of one layer with the Read RPC (a 237 KB
// response). Two runs: the slow exit this guards against showed in most runs.
TEST_F(ShutdownTest, ExitsPromptlyOnSigtermAfterALargeReadResponse) {
  std::vector<double> ms;
  for (int i = 0; i < 2; ++i) {
    Daemon* d = StartDaemon();
    ASSERT_NE(d, nullptr);
    {
      auto client = Connect(*d);
      ASSERT_NE(client, nullptr);
      IT_ASSIGN_OR_FAIL(s, Open(*client, "team-s", 2));
      const std::vector<uint32_t> p = Tokens(1, 3 * kTile + 40);
      IT_ASSIGN_OR_FAIL(q, s->CreateSequence(p));
      ASSERT_TRUE(AppendTokens(*s, q.id, p, 0, p.size()).ok());
      std::vector<float> k, v;
      IT_ASSERT_OK(s->Read(q.id, 0, 0, static_cast<uint32_t>(p.size()), &k, &v));
    }
    ms.push_back(TimedStop(d));
  }
  Report(absl::StrCat("SIGTERM to exit after a client read 237 KB and left: ", ms[0], ", ", ms[1], " ms (bound ",
                      kExitBoundMs, ")"));
  for (double m : ms) {
    EXPECT_LE(m, kExitBoundMs) << "kvarnd logged kvarnd_stopped at once but the process (and its segments) lived on";
  }
}

// An idle client connection is no call in flight, so nothing needs the shutdown deadline.
TEST_F(ShutdownTest, ExitsPromptlyOnSigtermWithAnIdleClientConnected) {
  std::vector<double> ms;
  for (int i = 0; i < 1; ++i) {
    Daemon* d = StartDaemon();
    ASSERT_NE(d, nullptr);
    auto client = Connect(*d);
    ASSERT_NE(client, nullptr);
    ms.push_back(TimedStop(d));
  }
  Report(absl::StrCat("SIGTERM to exit with an idle client connected: ", ms[0], " ms (bound ", kExitBoundMs, ")"));
  for (double m : ms) EXPECT_LE(m, kExitBoundMs);
}

// The session's keep-alive stream is a call in flight: the drain ends it.
TEST_F(ShutdownTest, ExitsPromptlyOnSigtermWithALiveSession) {
  std::vector<double> ms;
  for (int i = 0; i < 1; ++i) {
    Daemon* d = StartDaemon();
    ASSERT_NE(d, nullptr);
    auto client = Connect(*d);
    ASSERT_NE(client, nullptr);
    IT_ASSIGN_OR_FAIL(s, Open(*client, "team-s", 2));
    ms.push_back(TimedStop(d));
  }
  Report(absl::StrCat("SIGTERM to exit with a live session: ", ms[0], " ms (bound ", kExitBoundMs, ")"));
  for (double m : ms) EXPECT_LE(m, kExitBoundMs);
}

}  // namespace
}  // namespace kvarn::it
