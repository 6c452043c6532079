// The GoogleTest fixture of the integration tests: starts kvarnd processes, opens sessions,
// spawns helper clients, and at teardown stops every daemon with SIGTERM and asserts that it
// exited cleanly, that nothing of it ever appeared in /dev/shm, and that no helper process
// survives.
#ifndef KVARN_TESTS_INTEGRATION_FIXTURE_H_
#define KVARN_TESTS_INTEGRATION_FIXTURE_H_

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/lib/client.h"
#include "tests/integration/harness.h"
#include "tests/integration/kv_data.h"

namespace kvarn::it {

#define IT_ASSERT_OK(expr)                                 \
  do {                                                     \
    const absl::Status _st = (expr);                       \
    ASSERT_TRUE(_st.ok()) << #expr << ": " << _st;         \
  } while (0)

#define IT_ASSIGN_OR_FAIL(lhs, expr)                              \
  auto lhs##_or = (expr);                                         \
  ASSERT_TRUE(lhs##_or.ok()) << #expr << ": " << lhs##_or.status(); \
  auto lhs = std::move(*lhs##_or)

// Prints a measured figure so it shows in the test log (and in CTest's output on failure).
inline void Report(const std::string& line) {
  std::printf("[ FIGURE   ] %s\n", line.c_str());
  std::fflush(stdout);
}

inline constexpr char kAdminToken[] = "it-admin-secret";

class IntegrationTest : public ::testing::Test {
 protected:
  // Starts a kvarnd with the defaults of Daemon::Start plus `flags` ("--key=value"); the
  // admin token is always set so tests can open an admin observer session.
  Daemon* StartDaemon(std::vector<std::string> flags = {}, const std::string& instance = "",
                      const std::string& socket_path = "") {
    flags.push_back(absl::StrCat("--admin_token=", kAdminToken));
    DaemonOptions o;
    o.instance = instance;
    o.socket_path = socket_path;
    o.extra_flags = std::move(flags);
    auto d = Daemon::Start(o);
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return nullptr;
    daemons_.push_back(std::move(*d));
    return daemons_.back().get();
  }

  std::unique_ptr<Client> Connect(const Daemon& d) {
    auto c = d.Connect();
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  absl::StatusOr<std::unique_ptr<Session>> Open(Client& c, const std::string& tenant, uint32_t max_sequences = 0,
                                                bool admin = false, const std::string& name = "") {
    SessionOptions o;
    o.tenant = tenant;
    o.layout = SmallLayout();
    o.max_sequences = max_sequences;
    o.admin_token = admin ? kAdminToken : "";
    o.client_name = name.empty() ? ::testing::UnitTest::GetInstance()->current_test_info()->name() : name;
    return c.OpenSession(o);
  }

  // A helper client process, killed and reaped at teardown if still running.
  Child* SpawnClient(const std::vector<std::string>& args) {
    auto c = Child::Spawn(TestClientBinary(), args);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return nullptr;
    child_pids_.push_back((*c)->pid());
    children_.push_back(std::move(*c));
    return children_.back().get();
  }

  // Stops the daemon with SIGTERM and asserts a clean exit that removed all its segments.
  void StopCleanly(Daemon* d) {
    if (d == nullptr || !d->Running()) return;
    const std::string instance = d->instance();
    // Generous: how fast kvarnd exits is ShutdownTest's business (see shutdown_test.cc).
    const double t0 = NowMs();
    auto status = d->Stop(std::chrono::seconds(30));
    const double ms = NowMs() - t0;
    if (ms > 1000) Report(absl::StrCat("kvarnd took ", ms, " ms to exit on SIGTERM"));
    ASSERT_TRUE(status.ok()) << "kvarnd did not stop on SIGTERM: " << status.status();
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
        << "kvarnd exit status " << *status << "\n" << d->Log();
    EXPECT_THAT(NamedSegments(instance), ::testing::IsEmpty()) << "kvarnd memory must never have a name";
  }

  void TearDown() override {
    for (auto& c : children_) c->KillAndReap();
    children_.clear();
    for (pid_t pid : child_pids_) {
      EXPECT_TRUE(kill(pid, 0) != 0 && errno == ESRCH) << "helper process " << pid << " survived";
    }
    for (auto& d : daemons_) {
      const pid_t pid = d->pid();
      StopCleanly(d.get());
      if (pid > 0) {
        EXPECT_TRUE(kill(pid, 0) != 0 && errno == ESRCH) << "kvarnd " << pid << " survived";
      }
    }
    for (auto& d : daemons_) {
      const std::string instance = d->instance();
      d.reset();  // kills anything still running
      EXPECT_THAT(NamedSegments(instance), ::testing::IsEmpty());
    }
    daemons_.clear();
  }

  std::vector<std::unique_ptr<Daemon>> daemons_;
  std::vector<std::unique_ptr<Child>> children_;
  std::vector<pid_t> child_pids_;
};

}  // namespace kvarn::it

#endif  // KVARN_TESTS_INTEGRATION_FIXTURE_H_
