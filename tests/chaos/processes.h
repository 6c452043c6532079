// The processes kvarn_chaos's controller runs: kvarnd, and client processes (this binary in
// its client role) talking to the controller over pipes.
//
// Both are RAII: an object that goes out of scope while its process runs SIGKILLs and reaps
// it, and every child gets SIGKILL if the controller dies (PR_SET_PDEATHSIG), so a controller
// killed by a test runner's timeout leaves nothing behind. Every descriptor is close-on-exec,
// so no child inherits another's pipes (a client's stdout reaches EOF exactly when that client
// dies). Not thread-safe unless said otherwise.
#ifndef KVARN_TESTS_CHAOS_PROCESSES_H_
#define KVARN_TESTS_CHAOS_PROCESSES_H_

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace kvarn::chaos {

// A kvarnd process. Its stderr (the log) goes to a pipe that a thread drains into `log_path`
// and a tail kept in memory; the same thread reaps the process when the pipe closes, so an
// exit the controller did not cause is seen at once. Start waits (on a condition, with a
// deadline) for the log's kvarnd_started line.
class DaemonProcess {
 public:
  static absl::StatusOr<std::unique_ptr<DaemonProcess>> Start(const std::string& binary,
                                                              const std::vector<std::string>& args,
                                                              const std::string& log_path, double timeout_ms);
  ~DaemonProcess();  // SIGKILL + reap if still running
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  pid_t pid() const { return pid_; }
  uint64_t epoch() const { return epoch_; }
  // SIGKILL by the controller, then waits for the reaper.
  void Kill();
  // SIGTERM, waits up to timeout_ms for the exit; returns the waitpid status (SIGKILLs and
  // returns DEADLINE_EXCEEDED at the deadline).
  absl::StatusOr<int> Terminate(double timeout_ms);
  // True once the process exited without Kill() or Terminate() (a crash, or an exit of its
  // own); *status is its waitpid status. Thread-safe.
  bool ExitedOnItsOwn(int* status) const;
  // The last `lines` lines of the log. Thread-safe.
  std::string LogTail(size_t lines) const;

 private:
  DaemonProcess() = default;
  void Drain();
  // Waits until the reaper saw the exit; false at the deadline.
  bool WaitExited(double timeout_ms);

  pid_t pid_ = -1;
  int log_fd_ = -1;  // read end of the stderr pipe
  uint64_t epoch_ = 0;
  std::ofstream log_file_;
  std::thread drain_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false;      // guarded by mu_
  bool exited_ = false;       // guarded by mu_
  bool by_us_ = false;        // guarded by mu_: Kill or Terminate sent the signal
  int status_ = 0;            // guarded by mu_
  std::string started_line_;  // guarded by mu_
  std::deque<std::string> tail_;  // guarded by mu_
};

// A client process with its stdin and stdout on pipes; stderr goes to `stderr_fd`.
class ClientProcess {
 public:
  static absl::StatusOr<std::unique_ptr<ClientProcess>> Spawn(const std::string& binary,
                                                              const std::vector<std::string>& args, int stderr_fd);
  ~ClientProcess();  // SIGKILL + reap if still running
  ClientProcess(const ClientProcess&) = delete;
  ClientProcess& operator=(const ClientProcess&) = delete;

  pid_t pid() const { return pid_; }
  int out_fd() const { return out_; }
  bool eof() const { return eof_; }
  // Part of a line was read (the client is writing past its last complete line).
  bool partial() const { return !buffer_.empty(); }
  // Reads what the pipe holds now (never blocks) and appends the complete lines to *lines.
  // Sets eof() when the client closed its stdout (it died).
  void ReadAvailable(std::vector<std::string>* lines);
  // One command line on the client's stdin; false if it cannot be written (the client died).
  bool Write(const std::string& line);
  bool Signal(int sig);
  // SIGKILL (and SIGCONT, for a stopped one), then waits for it; returns the waitpid status.
  int KillAndReap();
  // Waits for a client that exited by itself; returns the waitpid status.
  int Reap();
  bool reaped() const { return pid_ <= 0; }

 private:
  ClientProcess() = default;
  pid_t pid_ = -1;
  int in_ = -1, out_ = -1;
  std::string buffer_;
  bool eof_ = false;
};

// A fresh directory under /tmp, removed (recursively) on destruction unless kept.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  void Keep() { keep_ = true; }

 private:
  std::string path_;
  bool keep_ = false;
};

// The waitpid status in words ("exited 1", "killed by SIGSEGV").
std::string DescribeStatus(int status);

}  // namespace kvarn::chaos

#endif  // KVARN_TESTS_CHAOS_PROCESSES_H_
