// Process harness of the integration tests: a real kvarnd started from its binary, client
// helper processes (kvarn_test_client) talking to it over its Unix socket, and the OS-level
// checks the tests need (shared-memory segments in /dev/shm, a plain HTTP GET, running
// promtool).
//
// Every resource is RAII: a Daemon or Child that goes out of scope while its process still
// runs kills it with SIGKILL and reaps it, and a Daemon removes the segments a killed daemon
// left behind, so a failing test does not leak processes or shared memory into the next one.
// The tests themselves assert that a daemon stopped with SIGTERM removed every segment.
//
// Not thread-safe; one test thread drives each object.
#ifndef KVARN_TESTS_INTEGRATION_HARNESS_H_
#define KVARN_TESTS_INTEGRATION_HARNESS_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/lib/client.h"
#include "tests/integration/kv_data.h"  // SmallLayout

namespace kvarn::it {

// Paths compiled in by CMake.
std::string KvarndBinary();
std::string TestClientBinary();
std::string AttackerBinary();
std::string PromtoolBinary();

inline constexpr int kTile = 64;

// A fresh directory under /tmp, removed (recursively) on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The whole file, bytes as they are; empty when it cannot be read.
std::string ReadFile(const std::string& path);

// A process unique name, e.g. "it-1234-3": an instance name kvarnd accepts.
std::string UniqueInstance();

// Entries of /dev/shm named like kvarnd's (kvarnd.<instance>.*). kvarnd's memory is anonymous
// (memfd) and handed over by descriptor, so there must never be any.
std::vector<std::string> NamedSegments(const std::string& instance);

// The anonymous memory segments a kvarnd process holds, from /proc/<pid>/fd. kvarnd is not
// dumpable, so only a process with ptrace rights over it (root, CAP_SYS_PTRACE) can look:
// PERMISSION_DENIED otherwise, and tests that need it say so and skip that check.
struct DaemonSegment {
  std::string name;          // e.g. "kvarnd.it-12-3.tail"
  uint64_t size = 0;         // st_size
  uint64_t allocated = 0;    // st_blocks * 512: memory actually in use
};
absl::StatusOr<std::vector<DaemonSegment>> DaemonSegments(pid_t pid);
// DaemonSegments once kvarnd holds at most `count` of them, or as it is at the deadline. The
// core closes an ended session's tail segment after it has released its lock, a moment after
// the stats stop showing the session.
absl::StatusOr<std::vector<DaemonSegment>> AwaitDaemonSegments(
    pid_t pid, size_t count, std::chrono::milliseconds timeout = std::chrono::seconds(5));

// A user to run a process as.
struct RunAs {
  uid_t uid = 0;
  gid_t gid = 0;
};
// When the tests run as root: an unprivileged user (nobody) for daemons and attackers, so
// that what a same-uid process cannot do is tested as such. nullopt when the tests already
// run unprivileged (then everything runs as this user).
std::optional<RunAs> UnprivilegedUser();

struct DaemonOptions {
  std::string instance;                 // default: UniqueInstance()
  std::string socket_path;              // default: <tempdir>/kvarnd.sock
  std::vector<std::string> extra_flags;  // "--key=value", appended after the defaults
  std::optional<RunAs> run_as;          // the daemon's user (its directory is handed to it)
  // When set: --config=config_file with only the socket, metrics port and instance given as
  // flags (no test layout), so the file's own settings are what starts.
  std::string config_file;
  // Runs kvarnd as the first process of a new PID namespace (needs root): this test process
  // and its clients are then outside it, as a worker pod is for a DaemonSet's kvarnd, and
  // SO_PEERCRED gives kvarnd pid 0 for them. pid() is the namespace's parent process; killing
  // it kills kvarnd (PR_SET_PDEATHSIG), so use Kill/the destructor, not Stop, to end it.
  bool own_pid_namespace = false;
};

// A kvarnd process. Start waits until it logged kvarnd_started (its segments exist, gRPC and
// metrics listen) and a client connected.
class Daemon {
 public:
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(DaemonOptions options);
  ~Daemon();  // SIGKILL + reap if still running, then removes leftover segments

  pid_t pid() const { return pid_; }
  const std::string& instance() const { return instance_; }
  const std::string& socket_path() const { return socket_path_; }
  std::string target() const { return "unix:" + socket_path_; }
  int metrics_port() const { return metrics_port_; }
  int tcp_port() const { return tcp_port_; }  // 0 without --tcp
  uint64_t epoch() const { return epoch_; }
  const std::string& log_path() const { return log_path_; }
  // The daemon's own directory (socket, log; owned by its user).
  const std::string& dir() const { return dir_->path(); }
  std::string Log() const;  // the daemon's stderr so far
  bool Running();

  // SIGTERM, then waits up to `timeout` for a clean exit. Returns the exit status (as from
  // waitpid) or DEADLINE_EXCEEDED after killing it with SIGKILL.
  absl::StatusOr<int> Stop(std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // Waits up to `timeout` for the process to exit by itself (no signal); its exit status.
  absl::StatusOr<int> AwaitExit(std::chrono::milliseconds timeout);
  // SIGKILL and reap: a crash. Leaves its segments behind, as a real crash does.
  void Kill();

  // A client connected to this daemon.
  absl::StatusOr<std::unique_ptr<Client>> Connect() const;

 private:
  Daemon() = default;
  std::unique_ptr<TempDir> dir_;
  pid_t pid_ = -1;
  std::string instance_, socket_path_, log_path_;
  int metrics_port_ = 0;
  int tcp_port_ = 0;
  uint64_t epoch_ = 0;
};

// A child process with its stdin and stdout on pipes (stderr is inherited), for the
// kvarn_test_client helper: it prints key=value lines the test waits for.
class Child {
 public:
  static absl::StatusOr<std::unique_ptr<Child>> Spawn(const std::string& binary,
                                                      const std::vector<std::string>& args,
                                                      std::optional<RunAs> run_as = std::nullopt);
  ~Child();  // SIGKILL + reap if still running

  pid_t pid() const { return pid_; }
  // The next stdout line (without '\n'); DEADLINE_EXCEEDED after timeout, OUT_OF_RANGE at EOF.
  absl::StatusOr<std::string> ReadLine(std::chrono::milliseconds timeout);
  // Reads lines until one starts with `prefix` and returns it; lines before are kept in
  // transcript().
  absl::StatusOr<std::string> WaitFor(const std::string& prefix, std::chrono::milliseconds timeout);
  bool WriteLine(const std::string& line);
  void CloseStdin();
  bool Signal(int sig);
  // Waits for exit; returns the waitpid status, or DEADLINE_EXCEEDED.
  absl::StatusOr<int> Wait(std::chrono::milliseconds timeout);
  void KillAndReap();
  const std::string& transcript() const { return transcript_; }

 private:
  Child() = default;
  pid_t pid_ = -1;
  int in_ = -1, out_ = -1;
  std::string buffer_, transcript_;
  bool eof_ = false;
};

// "key=value key=value" (after an optional leading word) -> map.
std::map<std::string, std::string> ParseFields(const std::string& line);
uint64_t FieldU64(const std::map<std::string, std::string>& f, const std::string& key);

// HTTP/1.0 GET of http://127.0.0.1:port/path; returns the body when the status is 200.
absl::StatusOr<std::string> HttpGet(int port, const std::string& path);
// The same, any status: (status code, body).
absl::StatusOr<std::pair<int, std::string>> HttpGetReply(int port, const std::string& path);

// Runs `binary args...` with `input` on its stdin; returns (exit status, stdout + stderr).
absl::StatusOr<std::pair<int, std::string>> RunWithInput(const std::string& binary,
                                                         const std::vector<std::string>& args,
                                                         const std::string& input);

// A finished process: its waitpid status and what it wrote on each stream.
struct ProcessOutput {
  int status = 0;
  std::string out, err;
};
// Runs `binary args...` with stdin from /dev/null, stdout and stderr captured apart, and this
// process's environment changed by `env`: "NAME=value" sets NAME, "NAME" alone removes it.
// DEADLINE_EXCEEDED (after SIGKILL) if it runs longer than `timeout`.
absl::StatusOr<ProcessOutput> RunProcess(const std::string& binary, const std::vector<std::string>& args,
                                         const std::vector<std::string>& env = {},
                                         std::chrono::milliseconds timeout = std::chrono::seconds(30));

// Prometheus text format: the value of the sample with exactly this name and label set
// (labels as written, e.g. `{class="total"}`, or "" for none).
std::optional<double> MetricValue(const std::string& text, const std::string& name,
                                  const std::string& labels = "");

// Milliseconds since an arbitrary start (steady clock).
double NowMs();
// Percentile (0..100) of a sample, nearest-rank.
double Percentile(std::vector<double> v, double p);

}  // namespace kvarn::it

#endif  // KVARN_TESTS_INTEGRATION_HARNESS_H_
