#include "tests/chaos/figures.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tests/chaos/protocol.h"

namespace kvarn::chaos {
namespace {

constexpr size_t kMaxNotes = 40;

std::string Ms(double v) { return absl::StrFormat("%.1f", v); }

std::string Gate(bool ok) { return ok ? "[gate: 0, ok]" : "[gate: 0, FAIL]"; }

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

void Figures::Note(const std::string& s) {
  if (notes.size() < kMaxNotes) notes.push_back(s);
}

bool Figures::Pass() const {
  return leaked_blocks == 0 && drift == 0 && sequences_left == 0 && sessions_left == 0 && tail_slots_left == 0 &&
         not_free_after_evict == 0 && quiesce_timeouts == 0 && old_handles_accepted == 0 &&
         accepted_after_expiry == 0 && daemon_crashes == 0 && final_shutdown_clean;
}

void Figures::Print(std::ostream& out) const {
  const double p50 = Percentile(reclaim_ms, 50), p99 = Percentile(reclaim_ms, 99);
  const double max = reclaim_ms.empty() ? 0 : *std::max_element(reclaim_ms.begin(), reclaim_ms.end());
  const uint64_t kills = kills_mid_seal + kills_mid_append + kills_idle;
  out << "kvarn_chaos figures (times on std::chrono::steady_clock)\n";
  out << "run: seed " << seed << ", " << clients_per_cycle << " clients per cycle, grace_ms " << grace_ms
      << ", lease_ttl_ms " << lease_ttl_ms << ", keepalive_ms " << keepalive_ms << ", cpu hog "
      << (cpu_hog ? absl::StrCat("on (", hog_threads, " busy threads)") : "off") << ", wall " << Ms(wall_s) << " s\n";
  out << "cycles: " << cycles_run << " run of " << cycles_requested << " requested"
      << (budget_s > 0 ? absl::StrCat(budget_reached ? " (stopped by the duration budget of " : " (duration budget ",
                                      budget_s, budget_reached ? " s)" : " s not reached)")
                       : "")
      << "\n";
  out << "clients started: " << clients_started << "\n";
  out << "client kills (SIGKILL): " << kills << " (mid-seal " << kills_mid_seal << ", mid-append " << kills_mid_append
      << ", idle " << kills_idle << ")\n";
  out << "client stops (SIGSTOP/SIGCONT): " << stops << " (" << stops_past_lease << " longer than the lease; "
      << stops_expired << " sessions expired while stopped, " << short_stops_expired
      << " of them after a stop shorter than the lease; " << expiry_missed
      << " stopped past the lease but not expired within 2 s; " << stops_undone
      << " undone by a SIGCONT from another process, not judged)\n";
  out << "expiry after SIGSTOP (stop -> session no longer listed, long stops): n=" << expiry_ms.size() << " p50 "
      << Ms(Percentile(expiry_ms, 50)) << " ms, p99 " << Ms(Percentile(expiry_ms, 99)) << " ms, max "
      << Ms(expiry_ms.empty() ? 0 : *std::max_element(expiry_ms.begin(), expiry_ms.end())) << " ms; bound "
      << lease_ttl_ms + expiry_scan_ms << " ms = lease_ttl_ms " << lease_ttl_ms << " + expiry scan " << expiry_scan_ms
      << " (the last renewal is at most the stop) [reported]\n";
  out << "daemon kills (SIGKILL): " << daemon_kills << " (" << daemon_kills_mid_seal << " right after a sealing append began), restarts: "
      << daemon_restarts << "\n";
  out << "daemon work (Stats counters, at least): seals " << seals << ", evictions (every reason, the end-of-cycle Evict(SCOPE_ALL) included) " << evictions
      << ", prefix cache hit tokens " << prefix_hit_tokens << " of " << prefix_queried_tokens << " queried\n";
  out << "leaked blocks (quant_blocks_active + sink_blocks_active, no client alive): " << leaked_blocks << " "
      << Gate(leaked_blocks == 0) << "\n";
  out << "free-count drift (total - (free + cached), quant and sink): " << drift << " " << Gate(drift == 0) << "\n";
  out << "sequences left: " << sequences_left << " " << Gate(sequences_left == 0) << "\n";
  out << "sessions left besides the observer: " << sessions_left << " " << Gate(sessions_left == 0) << "\n";
  out << "tail slots left reserved besides the observer's (0): " << tail_slots_left << " " << Gate(tail_slots_left == 0)
      << "\n";
  out << "blocks not free after Evict(SCOPE_ALL): " << not_free_after_evict << " " << Gate(not_free_after_evict == 0)
      << "\n";
  out << "cycles whose daemon did not settle in time: " << quiesce_timeouts << " " << Gate(quiesce_timeouts == 0) << "\n";
  out << "settle time after a cycle's final SIGKILLs: p50 " << Ms(Percentile(quiesce_ms, 50)) << " ms, max "
      << Ms(quiesce_ms.empty() ? 0 : *std::max_element(quiesce_ms.begin(), quiesce_ms.end())) << " ms\n";
  out << "reclaim after SIGKILL (kill -> first Stats answer no longer listing the session): n=" << reclaim_ms.size()
      << " p50 " << Ms(p50) << " ms, p99 " << Ms(p99) << " ms, max " << Ms(max) << " ms; " << reclaim_timeouts
      << " not reclaimed within 10 s\n";
  out << "reclaim lower bounds (kill -> last Stats request still listing it; polled every " << 5
      << " ms): p50 " << Ms(Percentile(reclaim_lo_ms, 50)) << " ms, p99 " << Ms(Percentile(reclaim_lo_ms, 99))
      << " ms, max " << Ms(reclaim_lo_ms.empty() ? 0 : *std::max_element(reclaim_lo_ms.begin(), reclaim_lo_ms.end()))
      << " ms\n";
  out << "of which detection (kill -> first Stats answer showing the keep-alive stream disconnected): n=" << detect_ms.size() << " p50 "
      << Ms(Percentile(detect_ms, 50)) << " ms, p99 " << Ms(Percentile(detect_ms, 99)) << " ms, max "
      << Ms(detect_ms.empty() ? 0 : *std::max_element(detect_ms.begin(), detect_ms.end())) << " ms\n";
  out << "reclaim bound: " << Ms(reclaim_bound_ms) << " ms = grace_ms " << grace_ms << " + expiry scan "
      << expiry_scan_ms << " (kvarnd checks leases every 50 ms) + keep-alive detection " << keepalive_ms
      << " (one keepalive_ms: the daemon learns of the death when the client's keep-alive stream closes, "
         "milliseconds on a Unix socket); p99 "
      << (p99 <= reclaim_bound_ms ? "within" : "OVER") << " the bound [reported, not a gate]\n";
  out << "old handles accepted after restart: " << old_handles_accepted << " of " << old_handle_calls
      << " replayed calls (" << old_handle_wrong_code << " refused with a code other than FAILED_PRECONDITION; "
      << replay_timeouts << " clients did not finish the replay) " << Gate(old_handles_accepted == 0) << "\n";
  out << "calls accepted after expiry: " << accepted_after_expiry << " of " << expiry_calls << " calls on expired sessions ("
      << expiry_wrong_code << " refused with a code other than NOT_FOUND / FAILED_PRECONDITION) "
      << Gate(accepted_after_expiry == 0) << "\n";
  out << "daemon crashes (exits not caused by the controller): " << daemon_crashes << " " << Gate(daemon_crashes == 0)
      << "\n";
  out << "final SIGTERM shutdown: " << (final_shutdown_clean ? "clean" : "NOT CLEAN") << " " << final_shutdown_detail
      << "\n";
  out << "expected-state mismatches (model vs DONE lines and checkpoints): " << model_mismatches + model_mismatches_extra << " ("
      << checkpoint_timeouts << " clients missed a checkpoint) [reported]\n";
  out << "client processes that exited by themselves: " << client_errors << " [reported]\n";
  for (const auto& [op, codes] : op_codes) {
    uint64_t total = 0;
    std::string parts;
    for (const auto& [code, n] : codes) {
      total += n;
      absl::StrAppend(&parts, parts.empty() ? "" : ", ", CodeName(code), " ", n);
    }
    out << "calls " << op << ": " << total << " (" << parts << ")\n";
  }
  if (!open_fail_codes.empty()) {
    std::string parts;
    for (const auto& [code, n] : open_fail_codes) absl::StrAppend(&parts, parts.empty() ? "" : ", ", CodeName(code), " ", n);
    out << "OpenSession failures (retried): " << parts << "\n";
  }
  for (const std::string& n : notes) out << "note: " << n << "\n";
  if (!daemon_crash_detail.empty()) out << "daemon crash:\n" << daemon_crash_detail;
  out << "result: " << (Pass() ? "PASS" : "FAIL") << "\n";
}

bool Figures::WriteJson(const std::string& path) const {
  std::ofstream f(path);
  if (!f) return false;
  const double max = reclaim_ms.empty() ? 0 : *std::max_element(reclaim_ms.begin(), reclaim_ms.end());
  f.precision(15);
  const auto num = [&](const char* k, double v, bool comma = true) { f << "  " << JsonString(k) << ": " << v << (comma ? ",\n" : "\n"); };
  f << "{\n";
  f << "  \"clock\": \"steady_clock\",\n";
  num("seed", static_cast<double>(seed));
  num("cycles_requested", cycles_requested);
  num("cycles_run", cycles_run);
  num("duration_budget_s", budget_s);
  f << "  \"budget_reached\": " << (budget_reached ? "true" : "false") << ",\n";
  num("clients_per_cycle", clients_per_cycle);
  f << "  \"cpu_hog\": " << (cpu_hog ? "true" : "false") << ",\n";
  num("wall_s", wall_s);
  num("grace_ms", grace_ms);
  num("lease_ttl_ms", lease_ttl_ms);
  num("keepalive_ms", keepalive_ms);
  num("clients_started", static_cast<double>(clients_started));
  num("kills_mid_seal", static_cast<double>(kills_mid_seal));
  num("kills_mid_append", static_cast<double>(kills_mid_append));
  num("kills_idle", static_cast<double>(kills_idle));
  num("stops", static_cast<double>(stops));
  num("stops_past_lease", static_cast<double>(stops_past_lease));
  num("stops_expired", static_cast<double>(stops_expired));
  num("short_stops_expired", static_cast<double>(short_stops_expired));
  num("expiry_missed", static_cast<double>(expiry_missed));
  num("stops_undone", static_cast<double>(stops_undone));
  num("expiry_samples", static_cast<double>(expiry_ms.size()));
  num("expiry_p50_ms", Percentile(expiry_ms, 50));
  num("expiry_p99_ms", Percentile(expiry_ms, 99));
  num("expiry_max_ms", expiry_ms.empty() ? 0 : *std::max_element(expiry_ms.begin(), expiry_ms.end()));
  num("daemon_kills", static_cast<double>(daemon_kills));
  num("daemon_restarts", static_cast<double>(daemon_restarts));
  num("seals", static_cast<double>(seals));
  num("evictions", static_cast<double>(evictions));
  num("prefix_hit_tokens", static_cast<double>(prefix_hit_tokens));
  num("prefix_queried_tokens", static_cast<double>(prefix_queried_tokens));
  num("leaked_blocks", static_cast<double>(leaked_blocks));
  num("free_count_drift", static_cast<double>(drift));
  num("sequences_left", static_cast<double>(sequences_left));
  num("sessions_left", static_cast<double>(sessions_left));
  num("tail_slots_left", static_cast<double>(tail_slots_left));
  num("not_free_after_evict_all", static_cast<double>(not_free_after_evict));
  num("quiesce_timeouts", static_cast<double>(quiesce_timeouts));
  num("reclaim_samples", static_cast<double>(reclaim_ms.size()));
  num("reclaim_p50_ms", Percentile(reclaim_ms, 50));
  num("reclaim_p99_ms", Percentile(reclaim_ms, 99));
  num("reclaim_max_ms", max);
  num("reclaim_lo_p50_ms", Percentile(reclaim_lo_ms, 50));
  num("reclaim_lo_p99_ms", Percentile(reclaim_lo_ms, 99));
  num("reclaim_bound_ms", reclaim_bound_ms);
  num("detect_p50_ms", Percentile(detect_ms, 50));
  num("detect_p99_ms", Percentile(detect_ms, 99));
  num("reclaim_timeouts", static_cast<double>(reclaim_timeouts));
  num("old_handle_calls", static_cast<double>(old_handle_calls));
  num("old_handles_accepted", static_cast<double>(old_handles_accepted));
  num("old_handle_wrong_code", static_cast<double>(old_handle_wrong_code));
  num("expiry_calls", static_cast<double>(expiry_calls));
  num("accepted_after_expiry", static_cast<double>(accepted_after_expiry));
  num("expiry_wrong_code", static_cast<double>(expiry_wrong_code));
  num("daemon_crashes", static_cast<double>(daemon_crashes));
  f << "  \"final_shutdown_clean\": " << (final_shutdown_clean ? "true" : "false") << ",\n";
  num("model_mismatches", static_cast<double>(model_mismatches + model_mismatches_extra));
  num("client_errors", static_cast<double>(client_errors));
  f << "  \"notes\": [";
  for (size_t i = 0; i < notes.size(); ++i) f << (i ? ", " : "") << JsonString(notes[i]);
  f << "],\n";
  f << "  \"pass\": " << (Pass() ? "true" : "false") << "\n";
  f << "}\n";
  return static_cast<bool>(f);
}

}  // namespace kvarn::chaos
