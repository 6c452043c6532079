#include "tests/chaos/processes.h"

#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tests/chaos/protocol.h"
#include "tests/common/spawn.h"

namespace kvarn::chaos {
namespace {

using ::kvarn::testing::CommandLine;
using ::kvarn::testing::SpawnOptions;
using ::kvarn::testing::SpawnProcess;
using ::kvarn::testing::Stdio;

constexpr size_t kTailLines = 400;

// What every child of the controller gets: SIGKILL when the controller dies (a controller
// killed by a test runner must not leave kvarnd or clients behind), and SIGPIPE back at
// SIG_DFL (the controller ignores it, and exec would pass that on).
// Each child also gets a process group of its own, whose parent (the controller) is outside
// it: such a group is never orphaned while the controller lives, so the kernel never sends it
// the SIGHUP + SIGCONT it sends an orphaned group with a stopped member (which would undo a
// SIGSTOP the moment the shell that started the controller exits).
SpawnOptions TiedToController() {
  SpawnOptions options;
  options.parent_death_signal = SIGKILL;
  options.own_process_group = true;
  options.default_sigpipe = true;
  return options;
}

// Blocks until `pid` exits (it was sent SIGKILL, or its pipe reported its death).
int WaitBlocking(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return status;
}

}  // namespace

std::string DescribeStatus(int status) {
  if (status < 0) return "unknown (waitpid failed)";
  if (WIFEXITED(status)) return absl::StrCat("exited ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
  return absl::StrCat("status ", status);
}

absl::StatusOr<std::unique_ptr<DaemonProcess>> DaemonProcess::Start(const std::string& binary,
                                                                    const std::vector<std::string>& args,
                                                                    const std::string& log_path, double timeout_ms) {
  std::unique_ptr<DaemonProcess> d(new DaemonProcess());
  d->log_file_.open(log_path, std::ios::app);
  int err[2];
  if (pipe2(err, O_CLOEXEC) != 0) return absl::InternalError("pipe2 failed");
  SpawnOptions spawn = TiedToController();
  spawn.stdin_from = Stdio::DevNull();
  spawn.stdout_to = Stdio::DevNull();
  spawn.stderr_to = Stdio::Fd(err[1]);
  const absl::StatusOr<pid_t> pid = SpawnProcess(CommandLine(binary, args), spawn);
  close(err[1]);
  if (!pid.ok()) {
    close(err[0]);
    return pid.status();
  }
  d->pid_ = *pid;
  d->log_fd_ = err[0];
  d->drain_ = std::thread([p = d.get()] { p->Drain(); });
  std::unique_lock<std::mutex> lock(d->mu_);
  const bool ready = d->cv_.wait_for(lock, std::chrono::duration<double, std::milli>(timeout_ms),
                                     [&] { return d->started_ || d->exited_; });
  if (!d->started_) {
    std::string why = ready ? absl::StrCat("kvarnd exited at start: ", DescribeStatus(d->status_))
                            : absl::StrCat("kvarnd did not log kvarnd_started within ", timeout_ms, " ms");
    for (const std::string& l : d->tail_) absl::StrAppend(&why, "\n  ", l);
    return absl::InternalError(why);
  }
  const Line l = ParseLine(d->started_line_);
  d->epoch_ = l.U64("epoch");
  return d;
}

DaemonProcess::~DaemonProcess() {
  Kill();
  if (drain_.joinable()) drain_.join();
  if (log_fd_ >= 0) close(log_fd_);
}

void DaemonProcess::Drain() {
  std::string buf;
  char chunk[8192];
  for (;;) {
    const ssize_t n = read(log_fd_, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    buf.append(chunk, static_cast<size_t>(n));
    log_file_.write(chunk, n);
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t nl; (nl = buf.find('\n')) != std::string::npos;) {
      std::string line = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      if (!started_ && line.find("event=kvarnd_started") != std::string::npos) {
        started_ = true;
        started_line_ = line;
        cv_.notify_all();
      }
      tail_.push_back(std::move(line));
      if (tail_.size() > kTailLines) tail_.pop_front();
    }
  }
  log_file_.flush();
  // The pipe closed: the daemon is gone (nothing else holds its write end).
  const int status = WaitBlocking(pid_);
  std::lock_guard<std::mutex> lock(mu_);
  if (!buf.empty()) tail_.push_back(buf);
  exited_ = true;
  status_ = status;
  cv_.notify_all();
}

bool DaemonProcess::WaitExited(double timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::duration<double, std::milli>(timeout_ms), [&] { return exited_; });
}

void DaemonProcess::Kill() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pid_ <= 0 || exited_) return;
    by_us_ = true;
  }
  kill(pid_, SIGKILL);
  WaitExited(30000);
}

absl::StatusOr<int> DaemonProcess::Terminate(double timeout_ms) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (exited_) return status_;
    by_us_ = true;
  }
  kill(pid_, SIGTERM);
  if (!WaitExited(timeout_ms)) {
    kill(pid_, SIGKILL);
    WaitExited(30000);
    return absl::DeadlineExceededError(absl::StrCat("kvarnd did not exit within ", timeout_ms, " ms of SIGTERM"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

bool DaemonProcess::ExitedOnItsOwn(int* status) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!exited_) return false;
  *status = status_;
  if (!by_us_) return true;
  // The controller sent SIGKILL (Kill) or SIGTERM (Terminate, which checks the exit status
  // itself); a death by any other signal is a crash that happened first.
  if (WIFSIGNALED(status_) && WTERMSIG(status_) == SIGKILL) return false;
  return !WIFEXITED(status_);
}

std::string DaemonProcess::LogTail(size_t lines) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  const size_t from = tail_.size() > lines ? tail_.size() - lines : 0;
  for (size_t i = from; i < tail_.size(); ++i) absl::StrAppend(&out, tail_[i], "\n");
  return out;
}

absl::StatusOr<std::unique_ptr<ClientProcess>> ClientProcess::Spawn(const std::string& binary,
                                                                    const std::vector<std::string>& args, int stderr_fd) {
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0) return absl::InternalError("pipe2 failed");
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(in[0]);
    close(in[1]);
    return absl::InternalError("pipe2 failed");
  }
  SpawnOptions spawn = TiedToController();
  spawn.stdin_from = Stdio::Fd(in[0]);
  spawn.stdout_to = Stdio::Fd(out[1]);
  if (stderr_fd >= 0) spawn.stderr_to = Stdio::Fd(stderr_fd);  // else inherited
  const absl::StatusOr<pid_t> pid = SpawnProcess(CommandLine(binary, args), spawn);
  close(in[0]);
  close(out[1]);
  if (!pid.ok()) {
    close(in[1]);
    close(out[0]);
    return pid.status();
  }
  fcntl(out[0], F_SETFL, fcntl(out[0], F_GETFL) | O_NONBLOCK);
  std::unique_ptr<ClientProcess> c(new ClientProcess());
  c->pid_ = *pid;
  c->in_ = in[1];
  c->out_ = out[0];
  return c;
}

ClientProcess::~ClientProcess() {
  if (pid_ > 0) KillAndReap();
  if (in_ >= 0) close(in_);
  if (out_ >= 0) close(out_);
}

void ClientProcess::ReadAvailable(std::vector<std::string>* lines) {
  char buf[16384];
  for (;;) {
    const ssize_t n = read(out_, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;  // EAGAIN: nothing more now
    if (n == 0) {
      eof_ = true;
      break;
    }
    buffer_.append(buf, static_cast<size_t>(n));
  }
  size_t start = 0;
  for (size_t nl; (nl = buffer_.find('\n', start)) != std::string::npos; start = nl + 1) {
    lines->push_back(buffer_.substr(start, nl - start));
  }
  buffer_.erase(0, start);
}

bool ClientProcess::Write(const std::string& line) {
  if (in_ < 0) return false;
  const std::string s = line + "\n";
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = write(in_, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;  // EPIPE: SIGPIPE is ignored by the controller
    done += static_cast<size_t>(n);
  }
  return true;
}

bool ClientProcess::Signal(int sig) { return pid_ > 0 && kill(pid_, sig) == 0; }

int ClientProcess::KillAndReap() {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGKILL);
  kill(pid_, SIGCONT);
  const int status = WaitBlocking(pid_);
  pid_ = -1;
  return status;
}

int ClientProcess::Reap() {
  if (pid_ <= 0) return -1;
  const int status = WaitBlocking(pid_);
  pid_ = -1;
  return status;
}

TempDir::TempDir() {
  char tmpl[] = "/tmp/kvchaos.XXXXXX";
  const char* p = mkdtemp(tmpl);
  path_ = p != nullptr ? p : "";
}

TempDir::~TempDir() {
  std::error_code ec;
  if (!keep_ && !path_.empty()) std::filesystem::remove_all(path_, ec);
}

}  // namespace kvarn::chaos
