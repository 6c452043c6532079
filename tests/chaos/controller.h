// The controller role of kvarn_chaos: starts kvarnd, runs cycles of client processes, injects
// faults at moments chosen from the clients' own lines, and checks the daemon after each cycle.
//
// One cycle:
//   1. start --clients client processes, wait until each opened a session;
//   2. for --cycle-ms, at random intervals arm a fault on a random client, executed at the
//      next matching line: SIGKILL right after `BEGIN op=append seal=1` (mid-seal), after
//      `BEGIN op=append seal=0` (mid-append) or after a `DONE` (idle), each killed client
//      replaced by a new one; or SIGSTOP for a random time (half of them longer than the lease:
//      the controller waits until the daemon no longer lists the session, tells the client
//      EXPIRED, then SIGCONTs it). Each SIGKILLed client's reclaim time is measured: from the
//      kill until the observer's Stats no longer lists its session. Every --daemon-kill-every
//      cycles the daemon is SIGKILLed right after a sealing append began, restarted on the same
//      socket, and every client replays its old handles (RESTARTED) before reconnecting;
//   3. checkpoint: every client parks (PAUSE); the daemon's ListSequences is compared with the
//      expected state; then every client is SIGKILLed and the controller waits (deadline) until
//      only the observer's session remains, and checks leaked blocks, free-count drift,
//      sequences and tail slots left; then Evict(SCOPE_ALL) must leave every block free.
// Everything waits on conditions (pipes read with poll and deadlines; daemon state by polling
// Stats); random sleeps only choose when a fault lands.
//
// Not thread-safe: one thread drives it (the --cpu-hog threads only spin).
#ifndef KVARN_TESTS_CHAOS_CONTROLLER_H_
#define KVARN_TESTS_CHAOS_CONTROLLER_H_

#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/lib/client.h"
#include "tests/chaos/figures.h"
#include "tests/chaos/model.h"
#include "tests/chaos/processes.h"
#include "tests/chaos/protocol.h"

namespace kvarn::chaos {

struct ControllerOptions {
  std::string kvarnd;         // the daemon binary
  std::string self;           // this binary, for the client processes
  int cycles = 5;
  int clients = 4;
  uint64_t seed = 1;
  int grace_ms = 200;
  int lease_ttl_ms = 1000;
  int keepalive_ms = 100;
  std::string capacity = "16MiB";
  double fp16_share = 0.5;    // enough tail slots for 16 clients x 4 sequences and their successors
  int daemon_kill_every = 2;  // 0: never
  int cycle_ms = 3000;        // the fault phase of a cycle
  int think_us = 2000;        // clients pause uniformly in [0, think_us] between operations
  bool cpu_hog = false;
  double duration_budget_s = 0;  // 0: none
  std::string json;
  bool keep_dir = false;
  bool transcript = false;  // every client line and controller action, to <run dir>/transcript.log
};

int RunController(const ControllerOptions& options);

// Below: the controller's parts, split over controller.cc (processes, lines, faults) and
// cycle.cc (the cycle and its checks).
class Controller {
 public:
  explicit Controller(ControllerOptions o);
  ~Controller();
  int Run();

 private:
  enum class Moment { kNone, kSeal, kAppend, kIdle };
  enum class Fault { kNone, kKill, kStop };
  struct Slot {
    int serial = 0;
    std::string tenant;
    std::unique_ptr<ClientProcess> proc;
    uint64_t session = 0;  // the session of the last OPEN (0: none live)
    uint64_t epoch = 0;
    bool opened = false;   // printed OPEN at least once
    double opened_at = 0;  // when the last OPEN line was read
    bool dead = false;     // killed or exited; reaped
    bool killed_by_us = false;
    // An armed fault, executed at the next line matching `moment`.
    Fault fault = Fault::kNone;
    Moment moment = Moment::kNone;
    double armed_at = 0;
    // A stop in progress.
    bool stopped = false;
    bool long_stop = false;
    double stop_at = 0, resume_at = 0;
    double expired_at = 0;   // when Stats first no longer listed the session (0: not yet)
    double last_check = 0;
    bool expiry_late = false;
    bool expiry_pending = false;  // told EXPIRED, EXPIRY_DONE not seen yet
    bool replay_pending = false;  // told RESTARTED, REPLAYED not seen yet
    bool pause_pending = false;   // told PAUSE, PAUSED not seen yet
    bool paused = false;
    std::vector<std::string> recent;  // the last few lines, for diagnostics
  };
  struct Reclaim {
    uint64_t session = 0;
    int serial = 0;
    double killed_at = 0;
    double session_age_ms = 0;   // from the client's OPEN line to the kill
    int polls = 0;
    bool connected_at_first_poll = false;
    double disconnected_ms = -1;  // kill -> first poll showing the stream gone
    double listed_ms = -1;        // kill -> the last poll (its request) that still listed it
  };

  // One line of the transcript (with --transcript): steady-clock ms, then the text.
  void Trace(const std::string& text);
  void Trace(const Slot& s, const std::string& text);

  // Setup and the daemon.
  absl::Status Setup();
  std::vector<std::string> DaemonArgs() const;
  absl::Status StartDaemon();
  absl::Status OpenObserver();
  // The observer's Stats (admin: every session); reopens the observer once if its session ended.
  absl::StatusOr<v1::StatsResponse> Stats();
  absl::StatusOr<v1::ListSequencesResponse> ListSequences();
  // Whether the daemon exited on its own; records the crash once.
  bool DaemonCrashed();

  // Client processes.
  Slot* SpawnClient();
  void Reap(Slot& s);  // removes dead slots' processes; not while iterating lines
  std::vector<Slot*> Live();

  // The event loop: waits up to max_wait_ms for lines, handles them, runs the due timers.
  void PumpOnce(double max_wait_ms);
  // Pumps until done() holds (true) or the timeout passes or the daemon crashed (false).
  bool WaitUntil(const std::function<bool()>& done, double timeout_ms);
  // `latest`: no later line of this client has been read yet (faults land only then).
  void OnLine(Slot& s, const std::string& text, bool latest);
  void OnDone(Slot& s, const Line& l, bool latest);
  void OnExit(Slot& s);
  void RunTimers();
  void PollReclaims();
  void CheckStopped(Slot& s);

  // Faults.
  void ArmFault();
  void ExecuteKill(Slot& s, Moment m);
  void ExecuteStop(Slot& s);
  bool Eligible(const Slot& s) const;
  void ClearArms();
  void KillDaemonNow(bool mid_seal);
  absl::Status RestartDaemon();

  // The cycle (cycle.cc).
  bool RunCycle(int cycle);
  void EndCycle(int cycle);
  bool Checkpoint();
  void SettleAndCheck(int cycle);

  double Uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng_); }
  bool Chance(double p) { return std::bernoulli_distribution(p)(rng_); }

  ControllerOptions o_;
  std::mt19937_64 rng_;
  Figures f_;
  Model model_;
  std::unique_ptr<TempDir> dir_;
  std::string socket_, log_path_, admin_token_, instance_;
  int client_log_fd_ = -1;
  std::ofstream transcript_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> obs_client_;
  std::unique_ptr<Session> observer_;
  std::map<int, Slot> slots_;
  int next_serial_ = 0;
  std::vector<Reclaim> reclaims_;
  double last_stats_poll_ = 0;
  bool crashed_ = false;

  // The fault phase.
  bool phase_ = false;
  double next_fault_at_ = 0;
  int respawn_ = 0;             // killed clients to replace
  bool daemon_kill_planned_ = false;
  double daemon_kill_at_ = 0;   // arm time in the phase
  bool daemon_kill_armed_ = false;
  double daemon_armed_ready_ = 0;  // when nothing blocked the kill any more (0: not yet)
  bool restart_pending_ = false;
  double daemon_killed_at_ = 0;
  // Per cycle, for the progress line.
  uint64_t cycle_kills_ = 0, cycle_stops_ = 0;
  bool cycle_daemon_killed_ = false;
  // The daemon's counters at the last end-of-cycle check, and of which instance.
  v1::StatsResponse seen_;
  uint64_t counters_epoch_ = 0;
};

}  // namespace kvarn::chaos

#endif  // KVARN_TESTS_CHAOS_CONTROLLER_H_
