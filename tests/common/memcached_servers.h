// Real memcached servers for tests: N `memcached` processes on loopback, each on a free port,
// started and checked ready (connect + "version" answered) within a deadline, then killable
// (SIGKILL), pausable (SIGSTOP / SIGCONT: a hung server) and restartable on the same port.
// The destructor kills and reaps them all. Header-only but for tests/common/spawn.h (link
// kvarn_test_spawn); POSIX and Abseil's status only (no GoogleTest, nothing of kvarnd), so any
// test binary can use it.
//
// The binary: $KVARN_MEMCACHED if set, else `memcached` on $PATH, else /usr/bin/memcached. A
// missing binary is an error with a message saying so (tests fail on it, they do not skip:
// CI installs memcached).
//
// Each server is started with PR_SET_PDEATHSIG, so it dies with the test process even when
// the test crashes. Linux delivers that when the *thread* that started it exits: create and
// Restart from a thread that outlives the servers (a test's main thread).
//
// Thread safety: none; one test thread drives it.
#ifndef KVARN_TESTS_COMMON_MEMCACHED_SERVERS_H_
#define KVARN_TESTS_COMMON_MEMCACHED_SERVERS_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tests/common/spawn.h"

namespace kvarn::testing {

struct MemcachedServerOptions {
  int count = 3;
  uint32_t memory_mb = 64;                        // -m
  std::string item_max;                           // -I (e.g. "2m"); empty: memcached's 1 MiB
  int threads = 2;                                // -t
  std::chrono::milliseconds ready_timeout{5000};  // per server, start to answering "version"
};

class MemcachedServers {
 public:
  static absl::StatusOr<std::unique_ptr<MemcachedServers>> Start(
      const MemcachedServerOptions& options = {}) {
    std::unique_ptr<MemcachedServers> s(new MemcachedServers(options));
    s->binary_ = FindBinary();
    if (s->binary_.empty()) {
      return absl::FailedPreconditionError(
          "memcached is not installed (no $KVARN_MEMCACHED, no memcached on $PATH, no "
          "/usr/bin/memcached): "
          "apt-get install memcached");
    }
    s->servers_.resize(options.count);
    for (int i = 0; i < options.count; ++i) {
      // A free port can be taken between probing it and memcached binding it: a few tries.
      absl::Status st;
      for (int attempt = 0; attempt < 5; ++attempt) {
        absl::StatusOr<int> port = FreePort();
        if (!port.ok()) return port.status();
        s->servers_[i].port = *port;
        st = s->Launch(i);
        if (st.ok()) break;
      }
      if (!st.ok()) return st;
    }
    return s;
  }

  ~MemcachedServers() {
    for (size_t i = 0; i < servers_.size(); ++i) Kill(static_cast<int>(i));
  }
  MemcachedServers(const MemcachedServers&) = delete;
  MemcachedServers& operator=(const MemcachedServers&) = delete;

  int size() const { return static_cast<int>(servers_.size()); }
  int port(int i) const { return servers_[i].port; }
  std::string address(int i) const { return "127.0.0.1:" + std::to_string(servers_[i].port); }
  std::vector<std::string> addresses() const {
    std::vector<std::string> out;
    for (int i = 0; i < size(); ++i) out.push_back(address(i));
    return out;
  }
  bool alive(int i) const { return servers_[i].pid > 0; }

  // SIGKILL and reap: its port refuses connections from then on. No-op when not running.
  void Kill(int i) {
    Server& s = servers_[i];
    if (s.pid <= 0) return;
    ::kill(s.pid, SIGKILL);
    while (::waitpid(s.pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    s.pid = -1;
  }
  // SIGSTOP: connections are accepted by the kernel, nothing answers (a hung server).
  void Pause(int i) {
    if (servers_[i].pid > 0) ::kill(servers_[i].pid, SIGSTOP);
  }
  void Resume(int i) {
    if (servers_[i].pid > 0) ::kill(servers_[i].pid, SIGCONT);
  }
  // A fresh, empty server on the same port (killing the old one if it still runs).
  absl::Status Restart(int i) {
    Kill(i);
    return Launch(i);
  }

 private:
  struct Server {
    int port = 0;
    pid_t pid = -1;
  };

  explicit MemcachedServers(const MemcachedServerOptions& options) : options_(options) {}

  static std::string FindBinary() {
    if (const char* env = std::getenv("KVARN_MEMCACHED"); env != nullptr && *env != '\0') {
      return ::access(env, X_OK) == 0 ? std::string(env) : std::string();
    }
    if (const char* path = std::getenv("PATH"); path != nullptr) {
      std::string dirs(path);
      size_t start = 0;
      while (start <= dirs.size()) {
        size_t end = dirs.find(':', start);
        if (end == std::string::npos) end = dirs.size();
        const std::string candidate = dirs.substr(start, end - start) + "/memcached";
        if (end > start && ::access(candidate.c_str(), X_OK) == 0) return candidate;
        start = end + 1;
      }
    }
    return ::access("/usr/bin/memcached", X_OK) == 0 ? "/usr/bin/memcached" : "";
  }

  // A port nobody listens on now (bound to 0 and released).
  static absl::StatusOr<int> FreePort() {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return absl::InternalError(std::string("socket: ") + std::strerror(errno));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    int port = -1;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port = ntohs(addr.sin_port);
    }
    ::close(fd);
    if (port <= 0)
      return absl::InternalError(std::string("no free loopback port: ") + std::strerror(errno));
    return port;
  }

  std::vector<std::string> Args(int i) const {
    std::vector<std::string> args = {binary_,
                                     "-l",
                                     "127.0.0.1",
                                     "-p",
                                     std::to_string(servers_[i].port),
                                     "-U",
                                     "0",
                                     "-m",
                                     std::to_string(options_.memory_mb),
                                     "-t",
                                     std::to_string(options_.threads)};
    if (!options_.item_max.empty()) args.insert(args.end(), {"-I", options_.item_max});
    if (::geteuid() == 0)
      args.insert(args.end(), {"-u", "root"});  // memcached refuses root without -u
    return args;
  }
  std::string CommandLine(int i) const {
    std::string line;
    for (const std::string& a : Args(i)) line += (line.empty() ? "" : " ") + a;
    return line;
  }

  absl::Status Launch(int i) {
    Server& s = servers_[i];
    SpawnOptions spawn;
    spawn.parent_death_signal = SIGKILL;  // dies with the test, even when the test crashes
    // memcached's chatter (e.g. "getpeername" when a paused server accepts a connection its
    // client gave up on) stays out of the test log.
    spawn.stdin_from = Stdio::DevNull();
    spawn.stdout_to = Stdio::DevNull();
    spawn.stderr_to = Stdio::DevNull();
    const absl::StatusOr<pid_t> pid = SpawnProcess(Args(i), spawn);
    if (!pid.ok()) return pid.status();
    s.pid = *pid;
    return WaitReady(i);
  }

  // Connects and asks "version" until the server answers, it exits, or the deadline passes.
  absl::Status WaitReady(int i) {
    Server& s = servers_[i];
    const auto deadline = std::chrono::steady_clock::now() + options_.ready_timeout;
    auto backoff = std::chrono::milliseconds(1);
    for (;;) {
      int status = 0;
      if (::waitpid(s.pid, &status, WNOHANG) == s.pid) {
        s.pid = -1;
        return absl::UnavailableError("memcached on port " + std::to_string(s.port) +
                                      " exited at start (status " + std::to_string(status) +
                                      ": port taken, or a bad option; run " + CommandLine(i) +
                                      " by hand to see its message)");
      }
      if (AnswersVersion(s.port, deadline)) return absl::OkStatus();
      if (std::chrono::steady_clock::now() >= deadline) {
        Kill(i);
        return absl::DeadlineExceededError("memcached on port " + std::to_string(s.port) +
                                           " did not answer");
      }
      // Not listening yet: retry with a growing backoff bounded by the deadline.
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(50));
    }
  }

  static bool AnswersVersion(int port, std::chrono::steady_clock::time_point deadline) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    bool ok = false;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      static constexpr char kVersion[] = "version\r\n";
      if (::send(fd, kVersion, sizeof(kVersion) - 1, MSG_NOSIGNAL) ==
          static_cast<ssize_t>(sizeof(kVersion) - 1)) {
        std::string reply;
        char buf[128];
        while (reply.find("\r\n") == std::string::npos) {
          const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
              deadline - std::chrono::steady_clock::now());
          pollfd p{fd, POLLIN, 0};
          if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
          const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
          if (n <= 0) break;
          reply.append(buf, static_cast<size_t>(n));
        }
        ok = reply.rfind("VERSION ", 0) == 0;
      }
    }
    ::close(fd);
    return ok;
  }

  MemcachedServerOptions options_;
  std::string binary_;
  std::vector<Server> servers_;
};

}  // namespace kvarn::testing

#endif  // KVARN_TESTS_COMMON_MEMCACHED_SERVERS_H_
