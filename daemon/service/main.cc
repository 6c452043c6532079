// kvarnd: the KV-cache daemon. See `kvarnd --help`.
#include <algorithm>
#include <malloc.h>
#include <signal.h>
#include <sys/prctl.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "daemon/service/config.h"
#include "daemon/service/log.h"
#include "daemon/service/server.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  bool help = false;
  auto config = kvarn::ParseDaemonConfig(args, &help);
  if (help) {
    std::fputs(kvarn::DaemonHelp().c_str(), stdout);
    return 0;
  }
  if (!config.ok()) {
    std::fprintf(stderr, "kvarnd: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  if (config->check_config) {
    auto plan = kvarn::KvCore::Plan(config->core);
    if (!plan.ok()) {
      std::fprintf(stderr, "kvarnd: %s\n", std::string(plan.status().message()).c_str());
      return 2;
    }
    std::fputs(kvarn::DescribePlan(*config, *plan).c_str(), stdout);
    return 0;
  }
  // Debian's Abseil is built with mutex deadlock detection on, which costs a global graph
  // update on every lock of an absl::Mutex (gRPC's own locks; kvarnd's are common/mutex.h).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // Not dumpable: /proc/<pid>/fd, /proc/<pid>/mem and ptrace of the daemon are closed to
  // other processes of the same uid, so none of them can reach the pool's descriptors (and
  // map a session's tail or the pool writable) except through the descriptor channel.
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) {
    std::fprintf(stderr, "kvarnd: cannot make the process non-dumpable\n");
    return 1;
  }
  // glibc gives every thread that allocates its own arena; with gRPC's thread pool that keeps
  // a burst of large requests resident long after it passed. Four arenas are plenty for the
  // lock-light allocation pattern here (the housekeeping loop trims freed memory too).
  mallopt(M_ARENA_MAX, 4);
  // SIGTERM/SIGINT (stop) and SIGHUP (reload tenants) are taken synchronously by this
  // thread; every other thread blocks them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto server = kvarn::Server::Start(*config);
  if (!server.ok()) {
    kvarn::Log(kvarn::LogLevel::kError, "kvarnd_start_failed", {{"error", server.status().ToString()}});
    return 1;
  }
  int sig = 0;
  for (;;) {
    sigwait(&signals, &sig);
    if (sig != SIGHUP) break;
    kvarn::Log(kvarn::LogLevel::kInfo, "signal", {{"signal", "SIGHUP"}});
    (*server)->ReloadTenants().IgnoreError();  // logged; the old tenants stay on error
  }
  kvarn::Log(kvarn::LogLevel::kInfo, "signal", {{"signal", sig == SIGTERM ? "SIGTERM" : "SIGINT"}});
  // Drain: no new sessions, open ones served until they close or drain_ms passes; a second
  // SIGTERM or SIGINT cuts it short. Calls still in flight then belong to no session
  // (Describe, Stats, health) or to sessions the drain gave up on: they get 500 ms of what
  // is left of the budget, at least 200 ms, before gRPC cancels them and drops the
  // connections (it would otherwise wait for idle clients to hang up).
  (*server)->BeginDrain();
  const absl::Time until = absl::Now() + config->drain;
  const char* ended = "sessions_closed";
  while ((*server)->ClientSessions() > 0) {
    const absl::Duration left = until - absl::Now();
    if (left <= absl::ZeroDuration()) {
      ended = "drain_ms";
      break;
    }
    const timespec wait = absl::ToTimespec(std::min(left, absl::Milliseconds(20)));
    const int got = sigtimedwait(&signals, nullptr, &wait);
    if (got == SIGHUP) (*server)->ReloadTenants().IgnoreError();
    if (got == SIGTERM || got == SIGINT) {
      ended = "second_signal";
      break;
    }
  }
  kvarn::Log(kvarn::LogLevel::kInfo, "drain_ended",
             {{"reason", ended}, {"sessions", static_cast<int64_t>((*server)->ClientSessions())}});
  (*server)->Shutdown(
      std::clamp(until - absl::Now(), absl::Milliseconds(200), absl::Milliseconds(500)));
  // Everything that outlives the process is released by now (segments unlinked, socket
  // removed, calls finished). gRPC's library teardown can wait seconds on an idle internal
  // poller, so leave without running it.
  std::fflush(stderr);
  std::_Exit(0);
}
