#include "tests/common/spawn.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvarn::testing {
namespace {

// What the child does, in memory the parent prepared before fork.
struct ChildPlan {
  char* const* argv = nullptr;
  char* const* envp = nullptr;  // nullptr: this process's environment
  int stdio[3] = {-1, -1, -1};  // the descriptor for stream 0, 1, 2; negative: inherited
  const SpawnUser* user = nullptr;
  int parent_death_signal = 0;
  pid_t parent = -1;
  bool own_process_group = false;
  bool default_sigpipe = false;
  bool new_pid_namespace = false;
};

// A line for the child's stderr, built on the stack (nothing allocated after fork) and cut
// short at its capacity.
class ChildMessage {
 public:
  void Append(const char* s) {
    while (*s != '\0' && size_ < kCapacity) buf_[size_++] = *s++;
  }
  void AppendNumber(unsigned v) {
    char digits[12] = {};
    int n = 0;
    do {
      digits[n++] = static_cast<char>('0' + v % 10);
      v /= 10;
    } while (v != 0);
    while (n > 0 && size_ < kCapacity) buf_[size_++] = digits[--n];
  }
  // The line and a newline on fd 2, with write(2) only.
  void Write() {
    buf_[size_++] = '\n';  // kCapacity leaves room for it
    size_t done = 0;
    while (done < size_) {
      const ssize_t n = write(2, buf_ + done, size_ - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      done += static_cast<size_t>(n);
    }
  }

 private:
  static constexpr size_t kCapacity = 511;
  char buf_[kCapacity + 1] = {};
  size_t size_ = 0;
};

// The names of the errors a spawn typically meets; strerror is not async-signal-safe.
const char* ErrnoName(int error) {
  switch (error) {
    case ENOENT:
      return "ENOENT";
    case EACCES:
      return "EACCES";
    case ENOEXEC:
      return "ENOEXEC";
    case ENOTDIR:
      return "ENOTDIR";
    case EPERM:
      return "EPERM";
    case EINVAL:
      return "EINVAL";
    case EBADF:
      return "EBADF";
    case ENOMEM:
      return "ENOMEM";
    case EAGAIN:
      return "EAGAIN";
    case E2BIG:
      return "E2BIG";
    default:
      return nullptr;
  }
}

// Ends the child after a failed step: "spawn: <what>[ <path>]: errno N (NAME)" on its stderr,
// then _exit(code). Async-signal-safe.
[[noreturn]] void ChildFail(const char* what, const char* path, int code) {
  const int error = errno;
  ChildMessage m;
  m.Append("spawn: ");
  m.Append(what);
  if (path != nullptr) {
    m.Append(" ");
    m.Append(path);
  }
  m.Append(": errno ");
  m.AppendNumber(static_cast<unsigned>(error));
  if (const char* name = ErrnoName(error); name != nullptr) {
    m.Append(" (");
    m.Append(name);
    m.Append(")");
  }
  m.Write();
  _exit(code);
}

// PR_SET_PDEATHSIG; prctl reads its argument as an unsigned long.
bool ArmParentDeathSignal(int signal_number) {
  using ULong = unsigned long;  // NOLINT(runtime/int)
  return prctl(PR_SET_PDEATHSIG, static_cast<ULong>(signal_number)) == 0;
}

[[noreturn]] void Exec(const ChildPlan& plan) {
  if (plan.envp != nullptr) {
    execve(plan.argv[0], plan.argv, plan.envp);
  } else {
    execv(plan.argv[0], plan.argv);
  }
  ChildFail("cannot exec", plan.argv[0], 127);
}

// The forked child, up to exec. Async-signal-safe calls only, on `plan` alone.
[[noreturn]] void RunChild(const ChildPlan& plan) {
  for (int stream = 0; stream < 3; ++stream) {
    const int fd = plan.stdio[stream];
    if (fd < 0) continue;
    // dup2 onto itself would leave close-on-exec set; clear it instead.
    const int r = fd == stream ? fcntl(fd, F_SETFD, 0) : dup2(fd, stream);
    if (r < 0) ChildFail("cannot redirect a standard stream", nullptr, 121);
  }
  if (plan.user != nullptr &&
      (setgroups(0, nullptr) != 0 || setgid(plan.user->gid) != 0 || setuid(plan.user->uid) != 0)) {
    ChildFail("cannot become the requested user", nullptr, 126);
  }
  // After the user change, which clears the parent-death signal.
  if (plan.parent_death_signal != 0) {
    if (!ArmParentDeathSignal(plan.parent_death_signal)) {
      ChildFail("prctl(PR_SET_PDEATHSIG)", nullptr, 125);
    }
    // The parent died before the prctl: the signal will never come, and nobody reads a message.
    if (getppid() != plan.parent) _exit(125);
  }
  if (plan.own_process_group && setpgid(0, 0) != 0) ChildFail("setpgid", nullptr, 121);
  if (plan.default_sigpipe) signal(SIGPIPE, SIG_DFL);
  if (plan.new_pid_namespace) {
    if (unshare(CLONE_NEWPID) != 0) ChildFail("unshare(CLONE_NEWPID)", nullptr, 124);
    const pid_t inner = fork();
    if (inner < 0) ChildFail("fork into the new PID namespace", nullptr, 123);
    if (inner == 0) {
      // Its parent is outside the namespace (getppid() is 0 here), so a parent that died
      // before this line goes unnoticed; that parent waits for this process, so only a SIGKILL
      // ends it that early.
      if (plan.parent_death_signal != 0 && !ArmParentDeathSignal(plan.parent_death_signal)) {
        ChildFail("prctl(PR_SET_PDEATHSIG)", nullptr, 125);
      }
      Exec(plan);
    }
    int status = 0;
    pid_t r;
    while ((r = waitpid(inner, &status, 0)) < 0 && errno == EINTR) {
    }
    if (r != inner) ChildFail("waitpid", nullptr, 122);
    _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  Exec(plan);
}

// The NULL-terminated pointer array exec takes, over `strings` (which must outlive it).
std::vector<char*> ExecArray(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  pointers.reserve(strings.size() + 1);
  for (std::string& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

// A descriptor of 3 or more for `fd` where it is a standard stream's number (0-2), which the
// child's dup2 onto an earlier stream could replace before it is read: *extra holds the copy
// the caller closes after fork. -1 when the copy fails.
int AboveStandardStreams(int fd, int* extra) {
  if (fd < 0 || fd > 2) return fd;
  *extra = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  return *extra;
}

}  // namespace

std::vector<std::string> CommandLine(const std::string& binary,
                                     const std::vector<std::string>& args) {
  std::vector<std::string> argv = {binary};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

absl::StatusOr<pid_t> SpawnProcess(const std::vector<std::string>& argv,
                                   const SpawnOptions& options) {
  if (argv.empty()) return absl::InvalidArgumentError("SpawnProcess: empty argv");
  // Everything the child reads is built now: after fork it may not allocate.
  std::vector<std::string> arg_strings = argv;
  const std::vector<char*> arg_pointers = ExecArray(arg_strings);
  std::vector<std::string> env_strings;
  std::vector<char*> env_pointers;
  if (options.environment.has_value()) {
    env_strings = *options.environment;
    env_pointers = ExecArray(env_strings);
  }
  ChildPlan plan;
  plan.argv = arg_pointers.data();
  plan.envp = options.environment.has_value() ? env_pointers.data() : nullptr;
  // Descriptors this call opens or copies, closed once the child has its own.
  int devnull = -1;
  int copies[3] = {-1, -1, -1};
  const auto close_ours = [&] {
    if (devnull >= 0) close(devnull);
    for (int fd : copies) {
      if (fd >= 0) close(fd);
    }
  };
  const Stdio* streams[3] = {&options.stdin_from, &options.stdout_to, &options.stderr_to};
  for (int i = 0; i < 3; ++i) {
    switch (streams[i]->kind) {
      case Stdio::Kind::kInherit:
        break;
      case Stdio::Kind::kFd:
        if (streams[i]->fd >= 0) {
          plan.stdio[i] = AboveStandardStreams(streams[i]->fd, &copies[i]);
          if (plan.stdio[i] < 0) {
            const absl::Status error = absl::ErrnoToStatus(errno, "fcntl(F_DUPFD_CLOEXEC)");
            close_ours();
            return error;
          }
        }
        break;
      case Stdio::Kind::kDevNull:
        // At 3 or above too: a /dev/null that got number 0 would be replaced by the stdin step.
        if (devnull < 0) {
          int low = -1;
          devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
          if (devnull >= 0 && devnull <= 2) {
            low = devnull;
            devnull = fcntl(low, F_DUPFD_CLOEXEC, 3);
            const int saved = errno;
            close(low);
            errno = saved;
          }
        }
        if (devnull < 0) {
          const absl::Status error = absl::ErrnoToStatus(errno, "open /dev/null");
          close_ours();
          return error;
        }
        plan.stdio[i] = devnull;
        break;
    }
  }
  plan.user = options.user.has_value() ? &*options.user : nullptr;
  plan.parent_death_signal = options.parent_death_signal;
  plan.parent = getpid();
  plan.own_process_group = options.own_process_group;
  plan.default_sigpipe = options.default_sigpipe;
  plan.new_pid_namespace = options.new_pid_namespace;

  const pid_t pid = fork();
  if (pid == 0) RunChild(plan);
  const int fork_errno = errno;
  close_ours();
  if (pid < 0) return absl::ErrnoToStatus(fork_errno, "fork");
  return pid;
}

absl::StatusOr<int> AwaitExit(pid_t pid, std::chrono::milliseconds timeout) {
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("pidfd_open(", pid, ")"));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  absl::StatusOr<int> result;
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      result = status;
      break;
    }
    if (r < 0 && errno != EINTR) {
      result = absl::ErrnoToStatus(errno, "waitpid");
      break;
    }
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      result = absl::DeadlineExceededError(
          absl::StrCat("process ", pid, " still running after ", timeout.count(), " ms"));
      break;
    }
    pollfd readable = {pidfd, POLLIN, 0};  // readable once the process has exited
    if (poll(&readable, 1, static_cast<int>(left.count())) < 0 && errno != EINTR) {
      result = absl::ErrnoToStatus(errno, "poll on a pidfd");
      break;
    }
  }
  close(pidfd);
  return result;
}

}  // namespace kvarn::testing
