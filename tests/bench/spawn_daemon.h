// The benches' own kvarnd: a child the kernel kills when the bench dies, so a bench stopped
// by ^C, SIGPIPE (`| head`) or a crash leaves no kvarnd behind holding its pool (and its huge
// pages).
#ifndef KVARN_TESTS_BENCH_SPAWN_DAEMON_H_
#define KVARN_TESTS_BENCH_SPAWN_DAEMON_H_

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace kvarn {

// Starts args[0] with `args`; the pid, or -1 when fork fails. A child that cannot run it exits
// with 127. The kernel sends the SIGKILL when the thread that forked exits, not only the
// process: call this from the thread that outlives the daemon (the benches' main thread).
inline pid_t SpawnTiedDaemon(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    // Async-signal-safe calls only until exec.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(125);  // the bench died before the prctl
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
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
