// The benches' own kvarnd: a child the kernel kills when the bench dies, so a bench stopped
// by ^C, SIGPIPE (`| head`) or a crash leaves no kvarnd behind holding its pool (and its huge
// pages).
#ifndef KVARN_TESTS_BENCH_SPAWN_DAEMON_H_
#define KVARN_TESTS_BENCH_SPAWN_DAEMON_H_

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/common/spawn.h"

namespace kvarn {

// Starts args[0] with `args` (stdio and environment inherited); the pid, or -1 when fork fails
// (or args is empty). A child that cannot run it exits with 127. The kernel sends the SIGKILL
// when the thread that forked exits, not only the process: call this from the thread that
// outlives the daemon (the benches' main thread).
inline pid_t SpawnTiedDaemon(const std::vector<std::string>& args) {
  ::kvarn::testing::SpawnOptions options;
  options.parent_death_signal = SIGKILL;
  const absl::StatusOr<pid_t> pid = ::kvarn::testing::SpawnProcess(args, options);
  return pid.ok() ? *pid : -1;
}

// Why the daemon is not answering, if it already exited: "" while it runs.
inline std::string DaemonExited(pid_t pid) {
  int status = 0;
  if (pid <= 0 || waitpid(pid, &status, WNOHANG) != pid) return "";
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127) return "kvarnd could not be run (exit 127: no such file?)";
  if (WIFEXITED(status)) return "kvarnd exited with status " + std::to_string(WEXITSTATUS(status)) + " (its stderr says why)";
  return "kvarnd was killed by signal " + std::to_string(WTERMSIG(status));
}

}  // namespace kvarn

#endif  // KVARN_TESTS_BENCH_SPAWN_DAEMON_H_
