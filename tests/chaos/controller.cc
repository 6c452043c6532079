#include "tests/chaos/controller.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tests/chaos/chaos_client.h"

namespace kvarn::chaos {
namespace {

constexpr double kStartTimeoutMs = 15000;
constexpr double kStatsPollMs = 5;           // reclaim polling period
constexpr double kReclaimDeadlineMs = 10000;  // a session not gone by then is reported
constexpr double kExpirySlackMs = 2000;       // a stopped session must be gone by ttl + this
constexpr double kExpiryGiveUpMs = 10000;     // ... and one still listed then is resumed
constexpr double kArmFallbackMs = 1500;       // an armed fault not matched by then lands at idle
constexpr size_t kRecentLines = 8;

std::string RandomHex(size_t bytes) {
  std::random_device rd;
  std::string s;
  for (size_t i = 0; i < bytes; ++i) absl::StrAppend(&s, absl::Hex(rd() & 0xff, absl::kZeroPad2));
  return s;
}

}  // namespace

Controller::Controller(ControllerOptions o) : o_(std::move(o)), rng_(o_.seed), model_(kTile) {}

Controller::~Controller() {
  slots_.clear();  // SIGKILLs any client still running
  observer_.reset();
  obs_client_.reset();
  daemon_.reset();
  if (client_log_fd_ >= 0) close(client_log_fd_);
}

std::vector<std::string> Controller::DaemonArgs() const {
  const Layout l = it::SmallLayout();
  return {
      "--listen=" + socket_,
      "--metrics=127.0.0.1:0",
      "--instance=" + instance_,
      "--model_id=" + l.model_id,
      absl::StrCat("--num_layers=", l.num_layers),
      absl::StrCat("--num_kv_heads=", l.num_kv_heads),
      absl::StrCat("--head_dim=", l.head_dim),
      "--preset=" + l.preset,
      absl::StrCat("--sink_tokens=", l.sink_tokens),
      "--capacity=" + o_.capacity,
      absl::StrCat("--fp16_share=", o_.fp16_share),
      "--default_tail_slots=4",
      absl::StrCat("--grace_ms=", o_.grace_ms),
      absl::StrCat("--lease_ttl_ms=", o_.lease_ttl_ms),
      absl::StrCat("--keepalive_ms=", o_.keepalive_ms),
      "--drain_ms=2000",  // the final SIGTERM: stopped clients may still hold sessions
      "--admin_token=" + admin_token_,
      "--log_level=info",
  };
}

absl::Status Controller::StartDaemon() {
  auto d = DaemonProcess::Start(o_.kvarnd, DaemonArgs(), log_path_, kStartTimeoutMs);
  if (!d.ok()) return d.status();
  daemon_ = std::move(*d);
  return absl::OkStatus();
}

absl::Status Controller::OpenObserver() {
  observer_.reset();
  obs_client_.reset();
  ClientOptions co;
  co.rpc_timeout = absl::Seconds(5);
  co.map_pool = false;  // it reads figures only
  auto c = Client::Connect("unix:" + socket_, co, absl::Seconds(10));
  if (!c.ok()) return c.status();
  obs_client_ = std::move(*c);
  SessionOptions so;
  so.tenant = "chaos-ops";
  so.layout = it::SmallLayout();
  so.admin_token = admin_token_;
  so.client_name = "kvarn_chaos-observer";
  so.observer = true;
  auto s = obs_client_->OpenSession(so);
  if (!s.ok()) return s.status();
  observer_ = std::move(*s);
  return absl::OkStatus();
}

void Controller::Trace(const std::string& text) {
  if (transcript_.is_open()) transcript_ << absl::StrFormat("%.3f", NowMs()) << " ctl " << text << "\n";
}

void Controller::Trace(const Slot& s, const std::string& text) {
  if (transcript_.is_open()) transcript_ << absl::StrFormat("%.3f", NowMs()) << " c" << s.serial << " " << text << "\n";
}

absl::Status Controller::Setup() {
  dir_ = std::make_unique<TempDir>();
  if (dir_->path().empty()) return absl::InternalError("cannot create a directory under /tmp");
  socket_ = dir_->path() + "/kvarnd.sock";
  log_path_ = dir_->path() + "/kvarnd.log";
  instance_ = absl::StrCat("chaos-", getpid());
  admin_token_ = RandomHex(16);
  const std::string client_log = dir_->path() + "/clients.log";
  client_log_fd_ = open(client_log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (o_.transcript) transcript_.open(dir_->path() + "/transcript.log");
  if (absl::Status s = StartDaemon(); !s.ok()) return s;
  if (absl::Status s = OpenObserver(); !s.ok()) return s;
  return absl::OkStatus();
}

absl::StatusOr<v1::StatsResponse> Controller::Stats() {
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (observer_ == nullptr || !observer_->alive()) {
      if (absl::Status s = OpenObserver(); !s.ok()) return s;
      f_.Note("the observer session ended and was reopened");
    }
    auto st = observer_->Stats();
    if (st.ok() || st.status().code() != absl::StatusCode::kNotFound) return st;
    observer_.reset();
  }
  return absl::UnavailableError("observer session lost twice");
}

absl::StatusOr<v1::ListSequencesResponse> Controller::ListSequences() {
  if (observer_ == nullptr) return absl::UnavailableError("no observer");
  return observer_->ListSequences();
}

bool Controller::DaemonCrashed() {
  if (crashed_) return true;
  int status = 0;
  if (daemon_ == nullptr || !daemon_->ExitedOnItsOwn(&status)) return false;
  crashed_ = true;
  ++f_.daemon_crashes;
  f_.daemon_crash_detail = absl::StrCat("kvarnd (pid ", daemon_->pid(), ") ", DescribeStatus(status),
                                        " without the controller's SIGKILL; log tail:\n", daemon_->LogTail(60));
  std::cerr << "kvarn_chaos: " << f_.daemon_crash_detail << std::flush;
  return true;
}

Controller::Slot* Controller::SpawnClient() {
  Slot s;
  s.serial = next_serial_++;
  s.tenant = Chance(0.5) ? "tenant-a" : "tenant-b";
  const std::vector<std::string> args = {
      "client",
      "--target=unix:" + socket_,
      "--tenant=" + s.tenant,
      absl::StrCat("--seed=", o_.seed),
      absl::StrCat("--serial=", s.serial),
      "--max_sequences=4",
      absl::StrCat("--think_us=", o_.think_us),
  };
  auto p = ClientProcess::Spawn(o_.self, args, client_log_fd_);
  if (!p.ok()) {
    f_.Note(absl::StrCat("cannot spawn a client: ", p.status().message()));
    return nullptr;
  }
  s.proc = std::move(*p);
  Trace(s, absl::StrCat("ctl spawn pid=", s.proc->pid(), " tenant=", s.tenant));
  ++f_.clients_started;
  const int serial = s.serial;
  return &(slots_[serial] = std::move(s));
}

std::vector<Controller::Slot*> Controller::Live() {
  std::vector<Slot*> out;
  for (auto& [serial, s] : slots_) {
    if (!s.dead) out.push_back(&s);
  }
  return out;
}

void Controller::PumpOnce(double max_wait_ms) {
  std::vector<pollfd> fds;
  std::vector<int> serials;
  for (auto& [serial, s] : slots_) {
    if (s.dead || s.proc == nullptr || s.proc->eof()) continue;
    fds.push_back({s.proc->out_fd(), POLLIN, 0});
    serials.push_back(serial);
  }
  const int wait = static_cast<int>(std::clamp(max_wait_ms, 0.0, 5.0));
  const int r = poll(fds.data(), fds.size(), wait);
  if (r > 0) {
    std::vector<std::string> lines;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Slot& s = slots_[serials[i]];
      lines.clear();
      s.proc->ReadAvailable(&lines);
      for (size_t k = 0; k < lines.size() && !s.dead; ++k) {
        OnLine(s, lines[k], /*latest=*/k + 1 == lines.size() && !s.proc->partial());
      }
      if (!s.dead && s.proc->eof()) OnExit(s);
    }
  }
  RunTimers();
  PollReclaims();
  DaemonCrashed();
}

bool Controller::WaitUntil(const std::function<bool()>& done, double timeout_ms) {
  const double until = NowMs() + timeout_ms;
  for (;;) {
    if (done()) return true;
    if (crashed_) return false;
    const double left = until - NowMs();
    if (left <= 0) return false;
    PumpOnce(std::min(left, 5.0));
  }
}

void Controller::OnLine(Slot& s, const std::string& text, bool latest) {
  Trace(s, text);
  s.recent.push_back(text);
  if (s.recent.size() > kRecentLines) s.recent.erase(s.recent.begin());
  const Line l = ParseLine(text);
  const std::string& w = l.word;
  if (w == "BEGIN") {
    const bool append = l.Str("op") == "append";
    const bool seal = l.Int("seal") == 1;
    // Faults land only on the newest line a client wrote: one followed by others in the same
    // read is a moment already past.
    if (latest && daemon_kill_armed_ && daemon_armed_ready_ > 0 && append &&
        (seal || NowMs() - daemon_armed_ready_ > 1000)) {
      KillDaemonNow(seal);
      return;
    }
    if (latest && s.fault != Fault::kNone && append && s.moment == (seal ? Moment::kSeal : Moment::kAppend)) {
      if (s.fault == Fault::kKill) {
        ExecuteKill(s, s.moment);
      } else {
        ExecuteStop(s);
      }
    }
  } else if (w == "DONE") {
    OnDone(s, l, latest);
  } else if (w == "OPEN") {
    s.session = l.U64("session");
    s.epoch = l.U64("epoch");
    s.opened = true;
    s.opened_at = NowMs();
    model_.Open(s.serial, s.session);
    // A session of a daemon that is gone already (the line was still in the pipe).
    if (daemon_ == nullptr || s.epoch != daemon_->epoch() || restart_pending_) {
      model_.EndSession(s.serial);
      s.session = 0;
    }
  } else if (w == "OPEN_FAIL") {
    ++f_.open_fail_codes[static_cast<int>(l.Int("code"))];
  } else if (w == "LOST") {
    model_.EndSession(s.serial);
    s.session = 0;
  } else if (w == "EXPIRY") {
    ++f_.expiry_calls;
    const int code = static_cast<int>(l.Int("code"));
    if (code != kOk && code != kNotFound && code != kFailedPrecondition) {
      ++f_.expiry_wrong_code;
      f_.Note(absl::StrCat("client ", s.serial, ": after expiry ", l.Str("op"), " got ", CodeName(code)));
    }
  } else if (w == "ACCEPTED_AFTER_EXPIRY") {
    ++f_.accepted_after_expiry;
    f_.Note(absl::StrCat("client ", s.serial, ": ", text));
  } else if (w == "EXPIRY_DONE") {
    s.expiry_pending = false;
  } else if (w == "OLD") {
    ++f_.old_handle_calls;
    const int code = static_cast<int>(l.Int("code"));
    if (code != kOk && code != kFailedPrecondition) {
      ++f_.old_handle_wrong_code;
      f_.Note(absl::StrCat("client ", s.serial, ": old handle ", l.Str("op"), " got ", CodeName(code)));
    }
  } else if (w == "OLD_HANDLE_ACCEPTED") {
    ++f_.old_handles_accepted;
    f_.Note(absl::StrCat("client ", s.serial, ": ", text));
  } else if (w == "REPLAYED") {
    // The client drops every session it had (a new-epoch one too) and reconnects: until its
    // next OPEN it holds none.
    s.replay_pending = false;
    model_.EndSession(s.serial);
    s.session = 0;
  } else if (w == "PAUSED") {
    s.paused = true;
    s.pause_pending = false;
  } else if (w == "CONTINUED") {
    // A SIGCONT the controller did not send while it holds the client stopped: the stop was
    // undone from outside (another process signalling this one), so its expiry is not judged.
    if (s.stopped && l.Int("from") != getpid()) {
      ++f_.stops_undone;
      f_.Note(absl::StrCat("client ", s.serial, " was continued by pid ", l.Str("from"), " (si_code ", l.Str("code"),
                           ", controller pid ", getpid(), ") ", NowMs() - s.stop_at,
                           " ms into a stop the controller had not ended; that stop is not judged"));
      s.stopped = false;
      Trace(s, "ctl stop undone from outside");
    }
  } else if (w == "ERROR") {
    f_.Note(absl::StrCat("client ", s.serial, ": ", text));
  }
}

void Controller::OnDone(Slot& s, const Line& l, bool latest) {
  ++f_.op_codes[l.Str("op")][static_cast<int>(l.Int("code"))];
  model_.Done(s.serial, l);
  if (latest && s.fault != Fault::kNone && s.moment == Moment::kIdle) {
    if (s.fault == Fault::kKill) {
      ExecuteKill(s, Moment::kIdle);
    } else {
      ExecuteStop(s);
    }
  }
}

void Controller::OnExit(Slot& s) {
  const int status = s.proc->Reap();
  s.dead = true;
  model_.Forget(s.serial);
  if (!s.killed_by_us) {
    ++f_.client_errors;
    std::string last;
    for (const std::string& r : s.recent) absl::StrAppend(&last, " | ", r);
    f_.Note(absl::StrCat("client ", s.serial, " exited by itself: ", DescribeStatus(status), "; last lines", last));
  }
  if (phase_) ++respawn_;
}

bool Controller::Eligible(const Slot& s) const {
  return !s.dead && s.opened && !s.stopped && s.session != 0 && model_.live(s.serial) && !s.expiry_pending &&
         !s.replay_pending && !s.paused && !s.pause_pending && s.fault == Fault::kNone;
}

void Controller::ClearArms() {
  for (auto& [serial, s] : slots_) {
    s.fault = Fault::kNone;
    s.moment = Moment::kNone;
  }
}

void Controller::ArmFault() {
  std::vector<Slot*> candidates;
  int stopped = 0, running = 0;
  for (auto& [serial, s] : slots_) {
    if (s.dead) continue;
    stopped += s.stopped;
    running += !s.stopped;
    if (Eligible(s)) candidates.push_back(&s);
  }
  if (candidates.empty()) return;
  Slot& s = *candidates[std::uniform_int_distribution<size_t>(0, candidates.size() - 1)(rng_)];
  // Keep most clients running: at most half of them stopped at once.
  const bool may_stop = stopped + 1 <= std::max(1, (stopped + running) / 2);
  s.fault = !may_stop || Chance(0.55) ? Fault::kKill : Fault::kStop;
  static constexpr Moment kMoments[] = {Moment::kSeal, Moment::kAppend, Moment::kIdle};
  s.moment = kMoments[std::uniform_int_distribution<int>(0, 2)(rng_)];
  s.armed_at = NowMs();
}

void Controller::ExecuteKill(Slot& s, Moment m) {
  s.fault = Fault::kNone;
  s.moment = Moment::kNone;
  // A random instant within the operation that just began (a fault-injection choice, not a
  // synchronization).
  if (m != Moment::kIdle) std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(Uniform(0, 1500))));
  const double t0 = NowMs();
  s.killed_by_us = true;
  s.proc->KillAndReap();
  Trace(s, absl::StrCat("ctl SIGKILL session=", s.session, " moment=", static_cast<int>(m)));
  if (s.session != 0 && model_.live(s.serial)) {
    reclaims_.push_back({.session = s.session, .serial = s.serial, .killed_at = t0, .session_age_ms = t0 - s.opened_at});
  }
  s.dead = true;
  model_.Forget(s.serial);
  switch (m) {
    case Moment::kSeal: ++f_.kills_mid_seal; break;
    case Moment::kAppend: ++f_.kills_mid_append; break;
    default: ++f_.kills_idle; break;
  }
  ++cycle_kills_;
  if (phase_) ++respawn_;
}

void Controller::ExecuteStop(Slot& s) {
  s.fault = Fault::kNone;
  s.moment = Moment::kNone;
  if (!s.proc->Signal(SIGSTOP)) f_.Note(absl::StrCat("client ", s.serial, ": SIGSTOP failed: ", std::strerror(errno)));
  Trace(s, absl::StrCat("ctl SIGSTOP session=", s.session));
  s.stopped = true;
  s.stop_at = NowMs();
  s.expired_at = 0;
  s.last_check = 0;
  s.expiry_late = false;
  s.long_stop = Chance(0.5);
  const double ttl = o_.lease_ttl_ms;
  s.resume_at = s.stop_at + (s.long_stop ? Uniform(1.3, 2.5) * ttl : Uniform(0.1, 0.6) * ttl);
  ++f_.stops;
  if (s.long_stop) ++f_.stops_past_lease;
  ++cycle_stops_;
}

void Controller::CheckStopped(Slot& s) {
  const double now = NowMs();
  const double since = now - s.stop_at;
  const double ttl = o_.lease_ttl_ms;
  // A long stop is watched from the lease's end on, so the expiry time is measured; a short
  // one is checked once, when it is due.
  const bool due = now >= s.resume_at;
  const bool watching = s.long_stop && s.expired_at == 0 && since >= ttl;
  if (!due && !watching) return;
  if (watching && now - s.last_check < kStatsPollMs) return;
  s.last_check = now;
  const double asked = NowMs();
  auto st = Stats();
  const double answered = NowMs();
  if (!st.ok()) {
    if (now >= s.resume_at) {
      s.stopped = false;
      s.proc->Signal(SIGCONT);
      Trace(s, "ctl SIGCONT (no Stats)");
    }
    return;
  }
  const v1::StatsResponse::SessionInfo* row = nullptr;
  for (const auto& si : st->session_info()) {
    if (si.session_id() == s.session) row = &si;
  }
  // Listed: it was live at some instant after `asked`; not listed: it had ended by `answered`.
  const double after = answered - s.stop_at;
  if (row == nullptr && s.expired_at == 0) {
    s.expired_at = answered;
    if (s.long_stop && s.session != 0) f_.expiry_ms.push_back(after);
  }
  if (row != nullptr && s.long_stop) {
    if (asked - s.stop_at > ttl + kExpirySlackMs && !s.expiry_late) {
      s.expiry_late = true;
      ++f_.expiry_missed;
      dir_->Keep();
      f_.Note(absl::StrCat("client ", s.serial, " (pid ", s.proc->pid(), ") session ", s.session,
                           " still listed by a Stats call sent ", asked - s.stop_at, " ms after SIGSTOP (lease ", ttl,
                           " ms; the call took ", answered - asked, " ms): connected ", row->connected(),
                           ", sequences ", row->sequences(), "; run dir kept: ", dir_->path()));
    }
    if (after < ttl + kExpiryGiveUpMs) return;  // keep it stopped: does it expire at all?
    f_.Note(absl::StrCat("client ", s.serial, " session ", s.session, " never expired in ", after,
                         " ms of SIGSTOP; resumed"));
  }
  if (s.expiry_late && row == nullptr) {
    f_.Note(absl::StrCat("client ", s.serial, " session ", s.session, ": expired ", after, " ms after SIGSTOP"));
  }
  if (row == nullptr && s.session != 0) {
    s.proc->Write(absl::StrCat("EXPIRED session=", s.session, " epoch=", s.epoch));
    Trace(s, absl::StrCat("ctl EXPIRED session=", s.session));
    s.expiry_pending = true;
    model_.EndSession(s.serial);
    s.session = 0;
    ++f_.stops_expired;
    if (!s.long_stop) {
      ++f_.short_stops_expired;
      f_.Note(absl::StrCat("client ", s.serial, ": session expired during a ", after, " ms stop (lease ", ttl, " ms)"));
    }
  }
  if (NowMs() < s.resume_at) return;  // expired early: still resumed at the time drawn
  s.stopped = false;
  s.proc->Signal(SIGCONT);
  Trace(s, "ctl SIGCONT");
}

void Controller::RunTimers() {
  const double now = NowMs();
  for (auto& [serial, s] : slots_) {
    if (!s.dead && s.stopped) CheckStopped(s);
  }
  if (!phase_) return;
  for (auto& [serial, s] : slots_) {
    if (s.fault != Fault::kNone && s.moment != Moment::kIdle && now - s.armed_at > kArmFallbackMs) s.moment = Moment::kIdle;
  }
  if (daemon_kill_planned_ && now >= daemon_kill_at_) {
    daemon_kill_planned_ = false;
    daemon_kill_armed_ = true;
    daemon_armed_ready_ = 0;
    ClearArms();
  }
  if (daemon_kill_armed_) {
    if (daemon_armed_ready_ == 0) {
      // The kill waits for every stop to be resumed and every reclaim to be measured on
      // this daemon.
      bool busy = !reclaims_.empty();
      for (auto& [serial, s] : slots_) busy |= !s.dead && (s.stopped || s.expiry_pending || s.replay_pending);
      if (!busy) daemon_armed_ready_ = now;
    }
    return;
  }
  if (!restart_pending_ && now >= next_fault_at_) {
    ArmFault();
    const double scale = std::max(1.0, 8.0 / std::max(1, o_.clients));
    next_fault_at_ = now + Uniform(100, 400) * scale;
  }
}

void Controller::PollReclaims() {
  if (reclaims_.empty() || restart_pending_) return;
  if (NowMs() - last_stats_poll_ < kStatsPollMs) return;
  const double asked = NowMs();
  last_stats_poll_ = asked;
  auto st = Stats();
  const double answered = NowMs();
  if (!st.ok()) return;
  // The daemon answered at some instant in [asked, answered]: a session it still lists was
  // live after `asked`; one it does not list was gone by `answered`.
  std::vector<Reclaim> still;
  for (Reclaim& r : reclaims_) {
    const v1::StatsResponse::SessionInfo* row = nullptr;
    for (const auto& si : st->session_info()) {
      if (si.session_id() == r.session) row = &si;
    }
    if (row != nullptr) {
      r.listed_ms = asked - r.killed_at;
      if (r.polls++ == 0) r.connected_at_first_poll = row->connected();
      if (!row->connected() && r.disconnected_ms < 0) {
        r.disconnected_ms = answered - r.killed_at;
        f_.detect_ms.push_back(r.disconnected_ms);
      }
    }
    if (row == nullptr) {
      const double took = answered - r.killed_at;
      f_.reclaim_ms.push_back(took);
      f_.reclaim_lo_ms.push_back(std::max(0.0, r.listed_ms));
      if (took > f_.reclaim_bound_ms) {
        f_.Note(absl::StrCat("reclaim over the bound: client ", r.serial, " session ", r.session, " gone between ",
                             std::max(0.0, r.listed_ms), " and ", took, " ms after SIGKILL (", r.polls,
                             " polls); stream seen closed by ", r.disconnected_ms, " ms (-1: never seen), ",
                             r.connected_at_first_poll ? "connected" : "NOT connected", " at the first poll; session ",
                             r.session_age_ms, " ms old at the kill"));
      }
    } else if (answered - r.killed_at > kReclaimDeadlineMs) {
      ++f_.reclaim_timeouts;
      f_.Note(absl::StrCat("client ", r.serial, " session ", r.session, " still listed ", r.listed_ms,
                           " ms after SIGKILL"));
    } else {
      still.push_back(r);
    }
  }
  reclaims_ = std::move(still);
}

void Controller::KillDaemonNow(bool mid_seal) {
  daemon_kill_armed_ = false;
  daemon_armed_ready_ = 0;
  daemon_->Kill();
  Trace(absl::StrCat("daemon SIGKILL epoch=", daemon_->epoch()));
  daemon_killed_at_ = NowMs();
  ++f_.daemon_kills;
  if (mid_seal) ++f_.daemon_kills_mid_seal;
  cycle_daemon_killed_ = true;
  model_.NewEpoch();
  for (auto& [serial, s] : slots_) s.session = 0;
  reclaims_.clear();
  restart_pending_ = true;
}

absl::Status Controller::RestartDaemon() {
  restart_pending_ = false;
  observer_.reset();
  obs_client_.reset();
  if (absl::Status s = StartDaemon(); !s.ok()) return s;
  if (absl::Status s = OpenObserver(); !s.ok()) return s;
  ++f_.daemon_restarts;
  Trace(absl::StrCat("daemon restarted epoch=", daemon_->epoch(), " observer=", observer_->id()));
  for (Slot* s : Live()) {
    s->replay_pending = s->proc->Write(absl::StrCat("RESTARTED epoch=", daemon_->epoch()));
  }
  const bool all = WaitUntil(
      [&] {
        for (Slot* s : Live()) {
          if (s->replay_pending) return false;
        }
        return true;
      },
      30000);
  if (!all) {
    for (Slot* s : Live()) {
      if (!s->replay_pending) continue;
      ++f_.replay_timeouts;
      s->replay_pending = false;
      f_.Note(absl::StrCat("client ", s->serial, " did not finish its old-handle replay within 30 s"));
    }
  }
  return absl::OkStatus();
}

int RunController(const ControllerOptions& options) {
  signal(SIGPIPE, SIG_IGN);  // a client that died while we write its stdin
  return Controller(options).Run();
}

}  // namespace kvarn::chaos
