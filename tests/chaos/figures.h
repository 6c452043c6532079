// What a kvarn_chaos run measured, printed one figure a line (and optionally as JSON), and
// the gates the exit status depends on.
#ifndef KVARN_TESTS_CHAOS_FIGURES_H_
#define KVARN_TESTS_CHAOS_FIGURES_H_

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

namespace kvarn::chaos {

struct Figures {
  // The run.
  int cycles_requested = 0;
  int cycles_run = 0;
  double budget_s = 0;        // 0: none
  bool budget_reached = false;
  int clients_per_cycle = 0;
  uint64_t seed = 0;
  bool cpu_hog = false;
  int hog_threads = 0;
  double wall_s = 0;
  int grace_ms = 0, lease_ttl_ms = 0, keepalive_ms = 0, expiry_scan_ms = 50;

  // Faults injected.
  uint64_t clients_started = 0;
  uint64_t kills_mid_seal = 0, kills_mid_append = 0, kills_idle = 0;
  uint64_t stops = 0, stops_past_lease = 0;
  uint64_t stops_expired = 0;        // sessions the daemon ended while their client was stopped
  uint64_t short_stops_expired = 0;  // ... although the stop was shorter than the lease
  uint64_t expiry_missed = 0;        // stopped past the lease, yet still listed 2 s later
  uint64_t stops_undone = 0;         // stops another process ended (a SIGCONT not ours)
  std::vector<double> expiry_ms;     // SIGSTOP -> session no longer listed, long stops
  uint64_t daemon_kills = 0, daemon_restarts = 0;
  uint64_t daemon_kills_mid_seal = 0;

  // End-of-cycle checks (sums over cycles; each must be 0).
  uint64_t leaked_blocks = 0;      // quant_blocks_active + sink_blocks_active with no client
  uint64_t drift = 0;              // total - (free + cached), quant and sink
  uint64_t sequences_left = 0;
  uint64_t sessions_left = 0;      // besides the observer
  uint64_t tail_slots_left = 0;    // reserved tail slots besides the observer's (none)
  uint64_t not_free_after_evict = 0;  // total - free after Evict(SCOPE_ALL)
  uint64_t quiesce_timeouts = 0;   // cycles whose daemon did not settle before the deadline
  std::vector<double> quiesce_ms;  // from the final SIGKILL of a cycle's clients to a settled pool

  // Work the daemon did, from its Stats counters at the end of each cycle (a killed daemon's
  // counters since its last end-of-cycle check are lost with it: figures are lower bounds).
  uint64_t seals = 0, evictions = 0, prefix_queried_tokens = 0, prefix_hit_tokens = 0;

  // Reclaim after a client's SIGKILL: from the kill until Stats no longer lists its session.
  std::vector<double> reclaim_ms;     // upper bounds: the first Stats answer not listing it
  std::vector<double> reclaim_lo_ms;  // lower bounds: the last Stats request that still did
  std::vector<double> detect_ms;   // kill -> Stats shows the session's stream disconnected
  uint64_t reclaim_timeouts = 0;
  double reclaim_bound_ms = 0;

  // Old handles after a daemon restart, calls after lease expiry.
  uint64_t old_handle_calls = 0, old_handles_accepted = 0, old_handle_wrong_code = 0;
  uint64_t replay_timeouts = 0;
  uint64_t expiry_calls = 0, accepted_after_expiry = 0, expiry_wrong_code = 0;

  // Health.
  uint64_t daemon_crashes = 0;
  std::string daemon_crash_detail;
  bool final_shutdown_clean = true;
  std::string final_shutdown_detail;
  uint64_t client_errors = 0;  // client processes that exited by themselves
  uint64_t model_mismatches = 0;
  uint64_t model_mismatches_extra = 0;  // checkpoint figures that disagree among themselves
  uint64_t checkpoint_timeouts = 0;
  std::vector<std::string> notes;  // details of failures, first few
  std::map<std::string, std::map<int, uint64_t>> op_codes;  // op -> grpc code -> count
  std::map<int, uint64_t> open_fail_codes;

  void Note(const std::string& s);
  // Every gate holds.
  bool Pass() const;
  void Print(std::ostream& out) const;
  bool WriteJson(const std::string& path) const;
};

double Percentile(std::vector<double> v, double p);

}  // namespace kvarn::chaos

#endif  // KVARN_TESTS_CHAOS_FIGURES_H_
