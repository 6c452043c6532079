// kvarnd: the KV-cache daemon. See `kvarnd --help`.
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
  (*server)->Shutdown(config->drain);
  // Everything that outlives the process is released by now (segments unlinked, socket
  // removed, calls finished). gRPC's library teardown can wait seconds on an idle internal
  // poller, so leave without running it.
  std::fflush(stderr);
  std::_Exit(0);
}
