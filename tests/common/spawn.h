// Starting a child process from a test, the chaos controller or a bench: fork, prepare the
// child (standard streams, user, parent-death signal, process group), then exec. The one
// place this sequence is written; the harnesses choose its options.
//
// Between fork and exec the child makes only async-signal-safe calls (and, for
// new_pid_namespace, one more fork, in the then single-threaded child), on memory prepared
// before the fork (argv, environment, descriptors): the parent may have other threads, whose
// locks (malloc's among them) the child inherits held.
//
// The parent-death signal is sent when the *thread* that called SpawnProcess exits, not only
// the process: call it from a thread that outlives the child (a test's or bench's main thread).
//
// A failure in the child before the program runs shows as its exit status, and (but for a
// parent that died) as a line "spawn: ..." on the child's stderr, as redirected:
//   127  exec failed (no such file, not executable, ...)
//   126  becoming `user` failed
//   125  arming the parent-death signal failed, or the parent died before it was armed (then
//        nobody waits for this status)
//   124  unshare(CLONE_NEWPID) failed (new_pid_namespace)
//   123  the fork into the new PID namespace failed (new_pid_namespace)
//   122  waiting for the process in the new PID namespace failed (new_pid_namespace)
//   121  redirecting a standard stream or making the process group failed
//
// Thread-safe. As with any fork, a descriptor another thread opens without O_CLOEXEC can leak
// into the child.
#ifndef KVARN_TESTS_COMMON_SPAWN_H_
#define KVARN_TESTS_COMMON_SPAWN_H_

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvarn::testing {

// Where one of the child's standard streams (0, 1 or 2) comes from or goes to.
struct Stdio {
  enum class Kind { kInherit, kDevNull, kFd };
  Kind kind = Kind::kInherit;
  int fd = -1;  // kFd only

  // The parent's stream, as it is.
  static Stdio Inherit() { return Stdio{}; }
  // /dev/null, opened (read-write, close-on-exec) by SpawnProcess in the parent.
  static Stdio DevNull() { return Stdio{Kind::kDevNull, -1}; }
  // A descriptor of the caller's, duplicated onto the stream (a negative one: inherited), as
  // it is when SpawnProcess is called: Fd(1) for stderr is the caller's stdout, even where
  // stdout is redirected too. The caller still owns it, and closes it after SpawnProcess
  // returns where the child is to hold it alone (a pipe's end).
  static Stdio Fd(int descriptor) { return Stdio{Kind::kFd, descriptor}; }
};

// A user for the child to become (needs root).
struct SpawnUser {
  uid_t uid = 0;
  gid_t gid = 0;
};

struct SpawnOptions {
  Stdio stdin_from;
  Stdio stdout_to;
  Stdio stderr_to;
  // Sent to the child when the thread that spawned it exits, so that a test or bench that dies
  // (an assertion, a sanitizer report, a runner's timeout, ^C) leaves no process behind.
  // 0: none, the child outlives the parent.
  int parent_death_signal = SIGKILL;
  // setgroups (none), setgid, setuid before exec. The parent-death signal is armed after the
  // change, which would clear it.
  std::optional<SpawnUser> user;
  // setpgid(0, 0): the child leads a process group of its own.
  bool own_process_group = false;
  // SIGPIPE back to SIG_DFL: exec keeps an ignored signal ignored, so a parent that ignores
  // SIGPIPE would hand that on.
  bool default_sigpipe = false;
  // The child's whole environment, "NAME=value" each; nullopt: this process's.
  std::optional<std::vector<std::string>> environment;
  // The child enters a new PID namespace (needs root) and forks once more: the program runs as
  // the namespace's pid 1, and the returned pid is the process outside that waits for it and
  // exits with its status (128 + signal for a killed one). A signal sent to the returned pid
  // does not reach the program; the death of that process kills it with parent_death_signal.
  bool new_pid_namespace = false;
};

// `binary` followed by `args`: the argv SpawnProcess takes.
std::vector<std::string> CommandLine(const std::string& binary,
                                     const std::vector<std::string>& args);

// Starts the program at path argv[0] (no $PATH search) with `argv` and returns its pid; the
// caller reaps it. INVALID_ARGUMENT for an empty argv; the errno's status
// (absl::ErrnoToStatus) when /dev/null cannot be opened, a descriptor cannot be copied, or
// fork fails. A failure in the child shows only in its exit status and on its stderr (above).
absl::StatusOr<pid_t> SpawnProcess(const std::vector<std::string>& argv,
                                   const SpawnOptions& options);

// Waits up to `timeout` for `pid`, a child of this process, to exit, and reaps it: its wait
// status, or DEADLINE_EXCEEDED with the child left running (and unreaped). Waits in poll(2)
// on a pidfd (Linux 5.3 or later), so it returns as soon as the child exits; the errno's
// status where the pidfd cannot be opened (ESRCH: no such child, or already reaped).
absl::StatusOr<int> AwaitExit(pid_t pid, std::chrono::milliseconds timeout);

}  // namespace kvarn::testing

#endif  // KVARN_TESTS_COMMON_SPAWN_H_
