// The client library and a daemon core share a process: kvarn::Session (the client's) and the
// core's session record (once also named kvarn::Session, now SessionState) are different
// types; when they shared a name, the linker gave both the client's destructor and the
// daemon's first OpenSession aborted.
#include <gtest/gtest.h>

#include "client/lib/client.h"
#include "tests/client/lib/in_process_daemon.h"

namespace kvarn::testing {
namespace {

TEST(ClientOdrTest, TheRealClientLibraryAndAnInProcessDaemonShareAProcess) {
  InProcessDaemon daemon;
  ASSERT_TRUE(daemon.Start({}).ok());
  auto client = Client::Connect(daemon.target(), {}, absl::Seconds(10));
  ASSERT_TRUE(client.ok()) << client.status();
  auto d = (*client)->Describe();
  ASSERT_TRUE(d.ok()) << d.status();
  SessionOptions o;
  o.tenant = "tenant-a";
  o.layout = Client::LayoutOf(*d);
  auto session = (*client)->OpenSession(o);
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_TRUE((*session)->mapped());
  EXPECT_EQ(daemon.sessions(), 1u);
  session->reset();
  EXPECT_EQ(daemon.sessions(), 0u);
  EXPECT_TRUE(daemon.CheckInvariants().ok());
}

}  // namespace
}  // namespace kvarn::testing
