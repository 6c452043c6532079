// SpawnProcess (tests/common/spawn.h), which every harness uses to start kvarnd, clients,
// memcached and promtool: streams, environment, exec failures and the parent-death signal,
// against the real kernel and real programs (/bin/sh, /usr/bin/env).
#include "tests/common/spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <initializer_list>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace kvarn::testing {
namespace {

constexpr std::chrono::seconds kExitTimeout{10};

int OpenForWriting(const std::string& path) {
  return open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
}

// Spawns `argv`, closes `descriptors` (the caller's copies: the child holds its own) and
// returns the child's wait status once it exits.
absl::StatusOr<int> RunToExit(const std::vector<std::string>& argv, const SpawnOptions& options,
                              std::initializer_list<int> descriptors) {
  const absl::StatusOr<pid_t> pid = SpawnProcess(argv, options);
  for (int fd : descriptors) close(fd);
  if (!pid.ok()) return pid.status();
  const absl::StatusOr<int> status = AwaitExit(*pid, kExitTimeout);
  if (!status.ok()) kill(*pid, SIGKILL);
  return status;
}

bool ExitedWith(const absl::StatusOr<int>& status, int code) {
  return status.ok() && WIFEXITED(*status) && WEXITSTATUS(*status) == code;
}

TEST(SpawnTest, StreamsGoWhereTheyAreAsked) {
  it::TempDir dir;
  const std::string out_path = dir.path() + "/out", err_path = dir.path() + "/err";
  const int out = OpenForWriting(out_path), err = OpenForWriting(err_path);
  ASSERT_GE(out, 0);
  ASSERT_GE(err, 0);
  SpawnOptions options;
  options.stdin_from = Stdio::DevNull();
  options.stdout_to = Stdio::Fd(out);
  options.stderr_to = Stdio::Fd(err);
  const absl::StatusOr<int> status = RunToExit(
      {"/bin/sh", "-c", "read x || echo eof; echo out; echo err >&2"}, options, {out, err});
  EXPECT_TRUE(ExitedWith(status, 0)) << status.status();
  EXPECT_EQ(it::ReadFile(out_path), "eof\nout\n");
  EXPECT_EQ(it::ReadFile(err_path), "err\n");
}

// A source descriptor numbered like a standard stream is the caller's descriptor, not what an
// earlier redirection in the child put at that number: here the caller's fd 0 is the output
// file, and the child's stdin (redirected first) is /dev/null.
TEST(SpawnTest, ASourceNumberedLikeAStandardStreamIsTheCallersDescriptor) {
  it::TempDir dir;
  const std::string out_path = dir.path() + "/out";
  const int out = OpenForWriting(out_path);
  ASSERT_GE(out, 0);
  const int saved_stdin = fcntl(0, F_DUPFD_CLOEXEC, 3);
  ASSERT_GE(saved_stdin, 0);
  ASSERT_EQ(dup2(out, 0), 0);
  SpawnOptions options;
  options.stdin_from = Stdio::DevNull();
  options.stdout_to = Stdio::Fd(0);
  const absl::StatusOr<int> status =
      RunToExit({"/bin/sh", "-c", "echo to-the-file"}, options, {out});
  ASSERT_EQ(dup2(saved_stdin, 0), 0);
  close(saved_stdin);
  EXPECT_TRUE(ExitedWith(status, 0)) << status.status();
  EXPECT_EQ(it::ReadFile(out_path), "to-the-file\n");
}

TEST(SpawnTest, TheEnvironmentGivenReplacesTheCallers) {
  it::TempDir dir;
  const std::string out_path = dir.path() + "/out";
  const int out = OpenForWriting(out_path);
  ASSERT_GE(out, 0);
  SpawnOptions options;
  options.stdout_to = Stdio::Fd(out);
  options.environment = std::vector<std::string>{"KVARN_A=1", "KVARN_B=two"};
  const absl::StatusOr<int> status = RunToExit({"/usr/bin/env"}, options, {out});
  EXPECT_TRUE(ExitedWith(status, 0)) << status.status();
  EXPECT_EQ(it::ReadFile(out_path), "KVARN_A=1\nKVARN_B=two\n");
}

TEST(SpawnTest, AFailedExecExits127AndSaysWhyOnTheChildsStderr) {
  it::TempDir dir;
  const std::string err_path = dir.path() + "/err";
  const int err = OpenForWriting(err_path);
  ASSERT_GE(err, 0);
  SpawnOptions options;
  options.stderr_to = Stdio::Fd(err);
  const std::string missing = dir.path() + "/no-such-program";
  const absl::StatusOr<int> status = RunToExit({missing, "--flag"}, options, {err});
  EXPECT_TRUE(ExitedWith(status, 127)) << status.status();
  EXPECT_EQ(it::ReadFile(err_path), "spawn: cannot exec " + missing + ": errno 2 (ENOENT)\n");
}

TEST(SpawnTest, AnEmptyCommandLineIsRefusedWithoutAFork) {
  const absl::StatusOr<pid_t> pid = SpawnProcess({}, SpawnOptions{});
  EXPECT_EQ(pid.status().code(), absl::StatusCode::kInvalidArgument);
}

// The child dies with the thread that spawned it (PR_SET_PDEATHSIG), so a test that dies
// leaves no process behind. The thread waits for the child's first line, written after exec
// (so after the signal was armed): a thread that ends before that leaves a child that
// survives it, which spawn.h tells callers to avoid.
TEST(SpawnTest, TheChildIsKilledWhenTheSpawningThreadExits) {
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  absl::StatusOr<pid_t> pid = absl::UnknownError("not spawned");
  std::string first_line;
  std::thread spawner([&] {
    SpawnOptions options;
    options.stdout_to = Stdio::Fd(pipe_fds[1]);
    pid = SpawnProcess({"/bin/sh", "-c", "echo armed; exec /bin/sleep 60"}, options);
    close(pipe_fds[1]);
    char c = 0;
    while (pid.ok() && read(pipe_fds[0], &c, 1) == 1 && c != '\n') first_line += c;
  });
  spawner.join();
  close(pipe_fds[0]);
  EXPECT_EQ(first_line, "armed");
  ASSERT_TRUE(pid.ok()) << pid.status();
  const absl::StatusOr<int> status = AwaitExit(*pid, kExitTimeout);
  if (!status.ok()) kill(*pid, SIGKILL);
  ASSERT_TRUE(status.ok()) << "the child outlived its spawning thread: " << status.status();
  EXPECT_TRUE(WIFSIGNALED(*status));
  EXPECT_EQ(WTERMSIG(*status), SIGKILL);
}

}  // namespace
}  // namespace kvarn::testing
