// The controller's cycle: clients, the fault phase, the checkpoint and the end-of-cycle checks
// (controller.h describes them); and the run around the cycles.
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tests/chaos/controller.h"

namespace kvarn::chaos {
namespace {

// The pool's figures at the end of a cycle, with no client alive.
struct Settled {
  uint64_t leaked = 0, drift = 0, sequences = 0, sessions = 0, tail = 0;
  bool Clean() const { return leaked == 0 && drift == 0 && sequences == 0 && sessions == 0 && tail == 0; }
};

uint64_t Diff(uint64_t a, uint64_t b) { return a > b ? a - b : b - a; }

Settled Evaluate(const v1::StatsResponse& st, uint64_t observer, uint64_t fp16_block_bytes) {
  Settled r;
  r.leaked = uint64_t{st.quant_blocks_active()} + st.sink_blocks_active();
  r.drift = Diff(st.quant_blocks_total(), uint64_t{st.quant_blocks_free()} + st.quant_blocks_cached()) +
            Diff(st.sink_blocks_total(), uint64_t{st.sink_blocks_free()} + st.sink_blocks_cached());
  r.sequences = st.sequences();
  uint64_t listed_tail = 0;
  for (const auto& si : st.session_info()) {
    if (si.session_id() == observer) continue;
    ++r.sessions;
    listed_tail += si.tail_slots();
  }
  r.sessions = std::max<uint64_t>(r.sessions, st.sessions() > 0 ? st.sessions() - 1 : 0);
  // fp16_bytes counts sink blocks in use and reserved tail slots; the observer reserves none.
  const uint64_t fp16_blocks = fp16_block_bytes == 0 ? 0 : st.fp16_bytes() / fp16_block_bytes;
  const uint64_t sinks_in_use = st.sink_blocks_total() - std::min(st.sink_blocks_total(), st.sink_blocks_free());
  r.tail = std::max(listed_tail, fp16_blocks > sinks_in_use ? fp16_blocks - sinks_in_use : 0);
  return r;
}

}  // namespace

bool Controller::RunCycle(int cycle) {
  const double start = NowMs();
  cycle_kills_ = cycle_stops_ = 0;
  cycle_daemon_killed_ = false;
  const uint64_t started_before = f_.clients_started;
  const Figures before = f_;
  Trace(absl::StrCat("cycle ", cycle + 1, " starts"));
  for (int i = 0; i < o_.clients; ++i) SpawnClient();
  const bool opened = WaitUntil(
      [&] {
        for (Slot* s : Live()) {
          if (!s->opened) return false;
        }
        return true;
      },
      30000);
  if (!opened && !crashed_) f_.Note(absl::StrCat("cycle ", cycle, ": not every client opened a session within 30 s"));

  // The fault phase.
  phase_ = true;
  const double phase_end = NowMs() + o_.cycle_ms;
  const double scale = std::max(1.0, 8.0 / std::max(1, o_.clients));
  next_fault_at_ = NowMs() + Uniform(50, 300) * scale;
  if (o_.daemon_kill_every > 0 && (cycle + 1) % o_.daemon_kill_every == 0) {
    daemon_kill_planned_ = true;
    daemon_kill_at_ = NowMs() + Uniform(0.3, 0.6) * o_.cycle_ms;
  }
  while (!crashed_) {
    const double now = NowMs();
    const bool daemon_kill_due = daemon_kill_planned_ || daemon_kill_armed_ || restart_pending_;
    if (now >= phase_end && !daemon_kill_due) break;
    if (daemon_kill_armed_ && now >= phase_end + 5000) KillDaemonNow(/*mid_seal=*/false);  // no sealing append came
    PumpOnce(5);
    if (restart_pending_) {
      if (absl::Status s = RestartDaemon(); !s.ok()) {
        f_.Note(absl::StrCat("cycle ", cycle, ": cannot restart kvarnd: ", s.message()));
        ++f_.daemon_crashes;
        crashed_ = true;
        break;
      }
    }
    for (auto it = slots_.begin(); it != slots_.end();) {
      it = it->second.dead ? slots_.erase(it) : std::next(it);
    }
    for (; respawn_ > 0; --respawn_) SpawnClient();
  }
  phase_ = false;
  respawn_ = 0;
  daemon_kill_planned_ = daemon_kill_armed_ = false;
  ClearArms();
  if (crashed_) return false;
  EndCycle(cycle);
  std::cerr << absl::StrFormat("kvarn_chaos: cycle %d/%d: %d clients (+%d replacements), %d kills, %d stops%s",
                               cycle + 1, o_.cycles, o_.clients,
                               static_cast<int>(f_.clients_started - started_before) - o_.clients,
                               static_cast<int>(cycle_kills_), static_cast<int>(cycle_stops_),
                               cycle_daemon_killed_ ? ", daemon killed and restarted" : "")
            << absl::StrFormat("; reclaim max %.0f ms",
                               f_.reclaim_ms.size() > before.reclaim_ms.size()
                                   ? *std::max_element(f_.reclaim_ms.begin() + static_cast<std::ptrdiff_t>(before.reclaim_ms.size()),
                                                       f_.reclaim_ms.end())
                                   : 0.0)
            << absl::StrFormat("; leaked %d, drift %d, left: %d sequences %d sessions %d tail slots; %.1f s",
                               static_cast<int>(f_.leaked_blocks - before.leaked_blocks),
                               static_cast<int>(f_.drift - before.drift),
                               static_cast<int>(f_.sequences_left - before.sequences_left),
                               static_cast<int>(f_.sessions_left - before.sessions_left),
                               static_cast<int>(f_.tail_slots_left - before.tail_slots_left), (NowMs() - start) / 1000.0)
            << (crashed_ ? " (daemon crashed)" : "") << std::endl;
  return !crashed_;
}

void Controller::EndCycle(int cycle) {
  // Let every stop resume (past-lease ones after their expiry), every reclaim be measured and
  // every replay finish.
  const bool quiet = WaitUntil(
      [&] {
        if (!reclaims_.empty()) return false;
        for (Slot* s : Live()) {
          if (s->stopped || s->expiry_pending || s->replay_pending) return false;
        }
        return true;
      },
      20000);
  if (!quiet && !crashed_) f_.Note(absl::StrCat("cycle ", cycle, ": stops, reclaims or replays still pending after 20 s"));
  if (crashed_) return;
  Checkpoint();
  if (crashed_) return;
  SettleAndCheck(cycle);
}

bool Controller::Checkpoint() {
  for (Slot* s : Live()) {
    s->paused = false;
    s->pause_pending = s->proc->Write("PAUSE");
  }
  WaitUntil(
      [&] {
        for (Slot* s : Live()) {
          if (s->pause_pending) return false;
        }
        return true;
      },
      10000);
  std::set<int> parked;
  std::set<uint64_t> ignore = {observer_ != nullptr ? observer_->id() : 0};
  for (Slot* s : Live()) {
    if (s->paused) {
      parked.insert(s->serial);
    } else {
      ++f_.checkpoint_timeouts;
      ignore.insert(s->session);
    }
  }
  auto list = ListSequences();
  auto st = Stats();
  if (!list.ok() || !st.ok()) {
    f_.Note(absl::StrCat("checkpoint: cannot list the daemon's state: ", (!list.ok() ? list.status() : st.status()).message()));
    return false;
  }
  const uint64_t found = model_.Compare(*list, *st, parked, ignore);
  Trace(absl::StrCat("checkpoint parked=", parked.size(), " mismatches=", found, " stats=", st->ShortDebugString()));
  if (found > 0 && dir_ != nullptr) dir_->Keep();
  // The tail-slot figure used after the kills (from fp16_bytes) must agree with the session
  // rows while the clients hold their slots.
  const uint64_t fp16_block = observer_->block_layout().fp16_block_bytes();
  const Settled now = Evaluate(*st, observer_->id(), fp16_block);
  uint64_t listed = 0;
  for (const auto& si : st->session_info()) listed += si.tail_slots();
  const uint64_t sinks_in_use = st->sink_blocks_total() - std::min(st->sink_blocks_total(), st->sink_blocks_free());
  if (st->fp16_bytes() != (sinks_in_use + listed) * fp16_block) {
    ++f_.model_mismatches_extra;
    f_.Note(absl::StrCat("checkpoint: fp16_bytes ", st->fp16_bytes(), " != (sink blocks in use ", sinks_in_use,
                         " + tail slots listed ", listed, ") x ", fp16_block, " (derived tail ", now.tail, ")"));
  }
  return true;
}

void Controller::SettleAndCheck(int cycle) {
  for (Slot* s : Live()) {
    s->killed_by_us = true;
    s->proc->KillAndReap();
    s->dead = true;
    model_.Forget(s->serial);
  }
  slots_.clear();
  const double t0 = NowMs();
  const uint64_t observer = observer_ != nullptr ? observer_->id() : 0;
  const uint64_t fp16_block = observer_ != nullptr ? observer_->block_layout().fp16_block_bytes() : 0;
  Settled last;
  v1::StatsResponse last_st;
  bool have = false;
  const bool settled = WaitUntil(
      [&] {
        auto st = Stats();
        if (!st.ok()) return false;
        last_st = *st;
        last = Evaluate(*st, observer, fp16_block);
        have = true;
        return last.Clean();
      },
      f_.reclaim_bound_ms + 10000);
  if (!have) {
    f_.Note(absl::StrCat("cycle ", cycle, ": no Stats from the daemon at the end of the cycle"));
    ++f_.quiesce_timeouts;
    return;
  }
  if (settled) {
    f_.quiesce_ms.push_back(NowMs() - t0);
  } else {
    ++f_.quiesce_timeouts;
    f_.Note(absl::StrCat("cycle ", cycle, ": not settled ", NowMs() - t0, " ms after the last SIGKILL: leaked ",
                         last.leaked, ", drift ", last.drift, ", sequences ", last.sequences, ", sessions ",
                         last.sessions, ", tail slots ", last.tail));
  }
  // The daemon's cumulative counters, per instance: what this cycle (since the last restart)
  // made it do.
  if (last_st.epoch() != counters_epoch_) {
    counters_epoch_ = last_st.epoch();
    seen_ = {};
  }
  f_.seals += last_st.seals() - std::min(last_st.seals(), seen_.seals());
  f_.evictions += last_st.evictions() - std::min(last_st.evictions(), seen_.evictions());
  f_.prefix_queried_tokens += last_st.prefix_queried_tokens() - std::min(last_st.prefix_queried_tokens(), seen_.prefix_queried_tokens());
  f_.prefix_hit_tokens += last_st.prefix_hit_tokens() - std::min(last_st.prefix_hit_tokens(), seen_.prefix_hit_tokens());
  seen_ = last_st;
  f_.leaked_blocks += last.leaked;
  f_.drift += last.drift;
  f_.sequences_left += last.sequences;
  f_.sessions_left += last.sessions;
  f_.tail_slots_left += last.tail;

  // Every unreferenced block can go: after Evict(SCOPE_ALL) all are free.
  if (observer_ == nullptr) return;
  auto ev = observer_->Evict(v1::EvictRequest::SCOPE_ALL);
  if (!ev.ok()) {
    f_.Note(absl::StrCat("cycle ", cycle, ": Evict(SCOPE_ALL) failed: ", ev.status().message()));
    ++f_.not_free_after_evict;
    return;
  }
  auto st = Stats();
  if (!st.ok()) return;
  const uint64_t not_free = (st->quant_blocks_total() - std::min(st->quant_blocks_total(), st->quant_blocks_free())) +
                            (st->sink_blocks_total() - std::min(st->sink_blocks_total(), st->sink_blocks_free()));
  if (not_free > 0) {
    f_.Note(absl::StrCat("cycle ", cycle, ": ", not_free, " blocks not free after Evict(SCOPE_ALL) evicted ",
                         ev->blocks(), ": ", st->ShortDebugString()));
  }
  f_.not_free_after_evict += not_free;
}

int Controller::Run() {
  const double t_start = NowMs();
  f_.cycles_requested = o_.cycles;
  f_.clients_per_cycle = o_.clients;
  f_.seed = o_.seed;
  f_.budget_s = o_.duration_budget_s;
  f_.cpu_hog = o_.cpu_hog;
  f_.grace_ms = o_.grace_ms;
  f_.lease_ttl_ms = o_.lease_ttl_ms;
  f_.keepalive_ms = o_.keepalive_ms;
  // The stated bound (docs/daemon.md): grace_ms + the 50 ms expiry scan + the time the daemon
  // takes to see the keep-alive stream close, allowed one keep-alive interval.
  f_.reclaim_bound_ms = o_.grace_ms + f_.expiry_scan_ms + o_.keepalive_ms;

  std::atomic<bool> stop_hog{false};
  std::vector<std::thread> hogs;
  if (o_.cpu_hog) {
    const unsigned n = std::max(1u, std::thread::hardware_concurrency());
    for (unsigned i = 0; i < n; ++i) {
      hogs.emplace_back([&stop_hog] {
        uint64_t x = 0;
        while (!stop_hog.load(std::memory_order_relaxed)) x = x * 6364136223846793005ull + 1;
        (void)x;
      });
    }
    f_.hog_threads = static_cast<int>(n);
  }

  int rc = 0;
  if (absl::Status s = Setup(); !s.ok()) {
    std::cerr << "kvarn_chaos: setup failed: " << s << std::endl;
    rc = 2;
  } else {
    std::cerr << "kvarn_chaos: kvarnd pid " << daemon_->pid() << " epoch " << daemon_->epoch() << " at " << socket_
              << "; " << o_.cycles << " cycles of " << o_.clients << " clients, seed " << o_.seed << std::endl;
    for (int c = 0; c < o_.cycles; ++c) {
      if (o_.duration_budget_s > 0 && (NowMs() - t_start) / 1000.0 >= o_.duration_budget_s) {
        f_.budget_reached = true;
        std::cerr << "kvarn_chaos: duration budget of " << o_.duration_budget_s << " s reached after " << c
                  << " cycles" << std::endl;
        break;
      }
      const bool ok = RunCycle(c);
      ++f_.cycles_run;
      if (!ok) break;
    }
    slots_.clear();
    observer_.reset();
    obs_client_.reset();
    if (daemon_ != nullptr && !crashed_) {
      DaemonCrashed();
      auto status = daemon_->Terminate(10000);
      if (!status.ok()) {
        f_.final_shutdown_clean = false;
        f_.final_shutdown_detail = std::string(status.status().message());
      } else {
        f_.final_shutdown_clean = WIFEXITED(*status) && WEXITSTATUS(*status) == 0;
        f_.final_shutdown_detail = absl::StrCat("(kvarnd ", DescribeStatus(*status), " after SIGTERM)");
        if (!f_.final_shutdown_clean) f_.Note(absl::StrCat("kvarnd log tail:\n", daemon_->LogTail(40)));
      }
    }
  }
  stop_hog.store(true);
  for (std::thread& t : hogs) t.join();
  f_.wall_s = (NowMs() - t_start) / 1000.0;
  f_.model_mismatches = model_.mismatches();
  for (const std::string& n : model_.notes()) f_.Note(n);
  f_.Print(std::cout);
  std::cout.flush();
  if (!o_.json.empty() && !f_.WriteJson(o_.json)) std::cerr << "kvarn_chaos: cannot write " << o_.json << std::endl;
  const bool pass = rc == 0 && f_.Pass();
  if (!pass && dir_ != nullptr) {
    dir_->Keep();
    std::cerr << "kvarn_chaos: kept " << dir_->path() << " (kvarnd.log, clients.log)" << std::endl;
  } else if (o_.keep_dir && dir_ != nullptr) {
    dir_->Keep();
    std::cerr << "kvarn_chaos: kept " << dir_->path() << std::endl;
  }
  return rc != 0 ? rc : pass ? 0 : 1;
}

}  // namespace kvarn::chaos
