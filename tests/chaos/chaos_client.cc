#include "tests/chaos/chaos_client.h"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/chaos/protocol.h"
#include "tests/integration/kv_data.h"

namespace kvarn::chaos {

namespace {

constexpr int kPrompts = 6;                   // the shared prompt set
constexpr uint32_t kMaxPromptLen = 5 * kTile + 16;
constexpr uint64_t kMaxTokens = 8 * kTile;    // a sequence this long is released, not grown
constexpr int kGraveyard = 4;                 // ended sessions kept for a restart's replay

// Who continued this process last (SIGCONT), for the controller to tell its own resumes from
// anyone else's: a continue it did not send means the stop it counts on was undone.
std::atomic<uint64_t> g_continues{0};
std::atomic<int> g_cont_pid{0};
std::atomic<int> g_cont_code{0};

void OnContinue(int, siginfo_t* info, void*) {
  g_cont_pid.store(info->si_pid);
  g_cont_code.store(info->si_code);
  g_continues.fetch_add(1);
}

uint32_t PromptToken(int prompt, uint64_t pos) { return 1000000u * static_cast<uint32_t>(prompt + 1) + static_cast<uint32_t>(pos); }

int Code(const absl::Status& s) { return static_cast<int>(s.code()); }

class ChaosClient {
 public:
  explicit ChaosClient(ClientArgs a) : args_(std::move(a)), rng_(args_.seed * 0x9E3779B97F4A7C15ull + args_.serial) {}
  int Run();

 private:
  // A sequence this process holds, and what its content is: the prompt's tokens up to `len`,
  // then uniq + position.
  struct Held {
    uint64_t id = 0;
    uint64_t tokens = 0;
    uint32_t tail = 0;  // committed tokens in the tail slot
    int prompt = 0;
    uint32_t len = 0;
    uint32_t uniq = 0;
    bool force_inline = false;  // a shared-memory commit failed: its staged count is unknown
  };
  struct Ended {
    std::unique_ptr<Session> session;
    std::vector<Held> held;
  };
  struct Tally {
    int calls = 0, accepted = 0, wrong = 0;
  };

  uint32_t TokenAt(const Held& h, uint64_t pos) const { return pos < h.len ? PromptToken(h.prompt, pos) : h.uniq + static_cast<uint32_t>(pos); }
  std::vector<uint32_t> Content(const Held& h, uint64_t from, size_t n) const {
    std::vector<uint32_t> ids(n);
    for (size_t i = 0; i < n; ++i) ids[i] = TokenAt(h, from + i);
    return ids;
  }
  uint64_t Uniform(uint64_t lo, uint64_t hi) { return std::uniform_int_distribution<uint64_t>(lo, hi)(rng_); }
  bool Chance(double p) { return std::bernoulli_distribution(p)(rng_); }

  // Reads the commands waiting on stdin and acts on them; false at EOF (the controller is gone).
  bool HandleControl();
  bool HandleCommand(const std::string& line);
  bool Connect();
  void TryOpen();
  void Bury();  // the current session ended under us: keep it for a restart's replay
  void DoOp();
  void Create();
  void AppendOne();
  void ForkOne();
  void ReleaseOne();
  void ReadOne();
  // Every call on `s` (a session the daemon ended or a daemon that restarted): all must be
  // refused, with FAILED_PRECONDITION after a restart, NOT_FOUND or FAILED_PRECONDITION after
  // expiry.
  void Replay(Session& s, const std::vector<Held>& held, bool restart, Tally* t);
  void ReplayExpired(uint64_t session, uint64_t epoch);
  void ReplayRestart(uint64_t epoch);

  ClientArgs args_;
  std::mt19937_64 rng_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<Session> session_;
  std::vector<Held> held_;
  std::vector<Ended> ended_;
  std::string stdin_buf_;
  uint32_t next_uniq_ = 0;
  double failing_since_ = -1;  // first failed Connect of a row
};

bool ChaosClient::HandleControl() {
  for (;;) {
    pollfd p{0, POLLIN, 0};
    const int r = poll(&p, 1, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return true;
    char buf[1024];
    const ssize_t n = read(0, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    stdin_buf_.append(buf, static_cast<size_t>(n));
    for (size_t nl; (nl = stdin_buf_.find('\n')) != std::string::npos;) {
      const std::string line = stdin_buf_.substr(0, nl);
      stdin_buf_.erase(0, nl + 1);
      if (!HandleCommand(line)) return false;
    }
  }
}

bool ChaosClient::HandleCommand(const std::string& text) {
  const Line l = ParseLine(text);
  if (l.word == "EXPIRED") {
    ReplayExpired(l.U64("session"), l.U64("epoch"));
  } else if (l.word == "RESTARTED") {
    ReplayRestart(l.U64("epoch"));
  } else if (l.word == "PAUSE") {
    Say(absl::StrCat("PAUSED session=", session_ ? session_->id() : 0));
    // Parked until GO; the keep-alive thread holds the lease meanwhile.
    for (;;) {
      char buf[256];
      if (const size_t nl = stdin_buf_.find('\n'); nl != std::string::npos) {
        const std::string next = stdin_buf_.substr(0, nl);
        stdin_buf_.erase(0, nl + 1);
        if (ParseLine(next).word == "GO") return true;
        continue;
      }
      const ssize_t n = read(0, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      stdin_buf_.append(buf, static_cast<size_t>(n));
    }
  }
  return true;
}

bool ChaosClient::Connect() {
  ClientOptions co;
  co.rpc_timeout = absl::Seconds(10);
  auto c = Client::Connect(args_.target, co, absl::Seconds(1));
  if (c.ok()) {
    client_ = std::move(*c);
    failing_since_ = -1;
    return true;
  }
  if (failing_since_ < 0) failing_since_ = NowMs();
  if (NowMs() - failing_since_ > 60000) {
    Say(absl::StrCat("ERROR what=Connect code=", Code(c.status()), " msg=\"", c.status().message(), "\""));
    return false;
  }
  return true;
}

void ChaosClient::TryOpen() {
  SessionOptions so;
  so.tenant = args_.tenant;
  so.layout = it::SmallLayout();
  so.max_sequences = args_.max_sequences;
  so.client_name = absl::StrCat("kvarn_chaos-", args_.serial);
  auto s = client_->OpenSession(so);
  if (!s.ok()) {
    Say(absl::StrCat("OPEN_FAIL code=", Code(s.status())));
    // Pacing the retry (the daemon may be down or its tail budget full), not synchronization.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return;
  }
  session_ = std::move(*s);
  held_.clear();
  Say(absl::StrCat("OPEN session=", session_->id(), " pid=", getpid(), " epoch=", session_->epoch(),
                   " tenant=", args_.tenant));
}

void ChaosClient::Bury() {
  Say(absl::StrCat("LOST session=", session_->id(), " epoch=", session_->epoch()));
  ended_.push_back({std::move(session_), std::move(held_)});
  held_.clear();
  if (ended_.size() > kGraveyard) ended_.erase(ended_.begin());
}

int ChaosClient::Run() {
  struct sigaction sa = {};
  sa.sa_sigaction = OnContinue;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGCONT, &sa, nullptr);
  uint64_t continues = 0;
  for (;;) {
    if (const uint64_t c = g_continues.load(); c != continues) {
      continues = c;
      Say(absl::StrCat("CONTINUED from=", g_cont_pid.load(), " code=", g_cont_code.load()));
    }
    if (!HandleControl()) return 0;
    if (client_ == nullptr) {
      if (!Connect()) return 1;
      continue;
    }
    if (session_ != nullptr && !session_->alive()) Bury();
    if (session_ == nullptr) {
      TryOpen();
      continue;
    }
    DoOp();
    if (args_.think_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(Uniform(0, static_cast<uint64_t>(args_.think_us))));
  }
}

void ChaosClient::DoOp() {
  const size_t h = held_.size();
  bool growable = false, full = false, readable = false;
  for (const Held& x : held_) {
    growable |= x.tokens < kMaxTokens;
    full |= x.tokens >= kMaxTokens;
    readable |= x.tokens > 0;
  }
  const double w[5] = {
      h < args_.max_sequences ? (h == 0 ? 10.0 : 2.0) : 0.0,  // create
      growable ? 8.0 : 0.0,                                   // append
      h > 0 && h < args_.max_sequences ? 1.0 : 0.0,           // fork
      h > 0 ? (full ? 4.0 : 1.0) : 0.0,                       // release
      readable ? 1.0 : 0.0,                                   // read
  };
  switch (std::discrete_distribution<int>(std::begin(w), std::end(w))(rng_)) {
    case 0: return Create();
    case 1: return AppendOne();
    case 2: return ForkOne();
    case 3: return ReleaseOne();
    default: return ReadOne();
  }
}

void ChaosClient::Create() {
  Held h;
  h.prompt = static_cast<int>(Uniform(0, kPrompts - 1));
  h.len = static_cast<uint32_t>(Uniform(1, kMaxPromptLen));
  h.uniq = 0x40000000u + static_cast<uint32_t>((args_.serial * 64 + (next_uniq_++ % 64)) * 1024);
  std::vector<uint32_t> prompt(h.len);
  for (uint32_t i = 0; i < h.len; ++i) prompt[i] = PromptToken(h.prompt, i);
  Say(absl::StrCat("BEGIN op=create seal=0 seq=0 len=", h.len));
  auto r = session_->CreateSequence(prompt);
  if (r.ok()) {
    h.id = r->id;
    h.tokens = r->table.tokens;
    h.tail = r->table.tail_tokens;
    held_.push_back(h);
  }
  Say(absl::StrCat("DONE op=create code=", Code(r.status()), " seq=", r.ok() ? r->id : 0, " tokens=", h.tokens,
                   " len=", h.len, " cached=", r.ok() ? r->cached_tokens : 0));
  if (Code(r.status()) == kUnavailable) std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

void ChaosClient::AppendOne() {
  std::vector<size_t> candidates;
  for (size_t i = 0; i < held_.size(); ++i) {
    if (held_[i].tokens < kMaxTokens) candidates.push_back(i);
  }
  Held& h = held_[candidates[Uniform(0, candidates.size() - 1)]];
  const uint32_t room = kTile - h.tail;
  const uint32_t n = Chance(0.4) ? room : static_cast<uint32_t>(Uniform(1, room));
  const bool seal = h.tail + n == kTile;
  const bool inline_call = h.force_inline || Chance(0.5);
  const std::vector<uint32_t> ids = Content(h, h.tokens, n);
  const it::KvData kv = it::MakeKv(ids, it::SmallLayout());
  Say(absl::StrCat("BEGIN op=append seal=", seal ? 1 : 0, " seq=", h.id, " n=", n, " via=", inline_call ? "inline" : "shm"));
  absl::StatusOr<AppendInfo> r = absl::UnknownError("not run");
  bool local = false;
  if (inline_call) {
    r = session_->AppendInline(h.id, ids, kv.keys.data(), kv.values.data(), DType::kF16);
    if (r.ok()) h.force_inline = false;
  } else if (absl::Status st = session_->Stage(h.id, static_cast<int>(n), kv.keys.data(), kv.values.data(), DType::kF16);
             !st.ok()) {
    r = st;
    local = true;
  } else {
    r = session_->Commit(h.id, ids);
    if (!r.ok()) h.force_inline = true;
  }
  if (r.ok()) {
    h.tokens = r->table.tokens;
    h.tail = r->table.tail_tokens;
  }
  Say(absl::StrCat("DONE op=append code=", Code(r.status()), " seq=", h.id, " tokens=", h.tokens, " n=", n,
                   " sealed=", r.ok() && r->sealed ? 1 : 0, local ? " local=1" : ""));
  if (Code(r.status()) == kUnavailable) std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

void ChaosClient::ForkOne() {
  const Held parent = held_[Uniform(0, held_.size() - 1)];
  Say(absl::StrCat("BEGIN op=fork seal=0 seq=", parent.id));
  auto r = session_->Fork(parent.id);
  uint64_t tokens = parent.tokens;
  if (r.ok()) {
    Held child = parent;
    child.id = r->id;
    child.tokens = tokens = r->table.tokens;
    child.tail = r->table.tail_tokens;
    child.force_inline = false;
    held_.push_back(child);
  }
  Say(absl::StrCat("DONE op=fork code=", Code(r.status()), " seq=", r.ok() ? r->id : 0, " tokens=", tokens,
                   " parent=", parent.id));
  if (Code(r.status()) == kUnavailable) std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

void ChaosClient::ReleaseOne() {
  size_t at = Uniform(0, held_.size() - 1);
  for (size_t i = 0; i < held_.size(); ++i) {
    if (held_[i].tokens >= kMaxTokens) at = i;
  }
  const Held h = held_[at];
  Say(absl::StrCat("BEGIN op=release seal=0 seq=", h.id));
  const uint64_t ids[] = {h.id};
  const absl::Status s = session_->Release(ids);
  if (s.ok()) held_.erase(held_.begin() + static_cast<std::ptrdiff_t>(at));
  Say(absl::StrCat("DONE op=release code=", Code(s), " seq=", h.id, " tokens=", h.tokens));
  if (Code(s) == kUnavailable) std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

void ChaosClient::ReadOne() {
  std::vector<size_t> candidates;
  for (size_t i = 0; i < held_.size(); ++i) {
    if (held_[i].tokens > 0) candidates.push_back(i);
  }
  const Held h = held_[candidates[Uniform(0, candidates.size() - 1)]];
  const uint64_t start = Uniform(0, h.tokens - 1);
  const uint32_t count = static_cast<uint32_t>(Uniform(1, std::min<uint64_t>(kTile, h.tokens - start)));
  const uint32_t layer = static_cast<uint32_t>(Uniform(0, it::SmallLayout().num_layers - 1));
  Say(absl::StrCat("BEGIN op=read seal=0 seq=", h.id));
  std::vector<float> k, v;
  const absl::Status s = session_->Read(h.id, layer, start, count, &k, &v);
  Say(absl::StrCat("DONE op=read code=", Code(s), " seq=", h.id, " tokens=", h.tokens));
  if (Code(s) == kUnavailable) std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

void ChaosClient::Replay(Session& s, const std::vector<Held>& held, bool restart, Tally* t) {
  const char* tag = restart ? "OLD" : "EXPIRY";
  const char* accepted = restart ? "OLD_HANDLE_ACCEPTED" : "ACCEPTED_AFTER_EXPIRY";
  const auto report = [&](const std::string& op, const absl::Status& st) {
    const int c = Code(st);
    ++t->calls;
    Say(absl::StrCat(tag, " op=", op, " code=", c, " session=", s.id(), " epoch=", s.epoch()));
    if (st.ok()) {
      ++t->accepted;
      Say(absl::StrCat(accepted, " op=", op, " session=", s.id(), " epoch=", s.epoch()));
    } else if (restart ? c != kFailedPrecondition : (c != kNotFound && c != kFailedPrecondition)) {
      ++t->wrong;
    }
  };
  // A sequence id the session held (or one it never had, when it held none).
  const Held h = held.empty() ? Held{.id = 1, .len = 1} : held[0];
  const std::vector<uint32_t> ids = Content(h, h.tokens, 1);
  const it::KvData kv = it::MakeKv(ids, it::SmallLayout());
  if (!held.empty() && !h.force_inline && h.tail < kTile) {
    // Stage only writes this process's own mapping of a tail the daemon let go of (or of a dead
    // daemon's pool); the commit is the call the daemon must refuse.
    if (absl::Status st = s.Stage(h.id, 1, kv.keys.data(), kv.values.data(), DType::kF16); st.ok()) {
      report("commit", s.Commit(h.id, ids).status());
    }
  }
  report("append_inline", s.AppendInline(h.id, ids, kv.keys.data(), kv.values.data(), DType::kF16).status());
  std::vector<float> k, v;
  report("read", s.Read(h.id, 0, 0, 1, &k, &v));
  report("fork", s.Fork(h.id).status());
  std::vector<uint64_t> all;
  for (const Held& x : held) all.push_back(x.id);
  if (all.empty()) all.push_back(h.id);
  report("release", s.Release(all));
  std::vector<uint32_t> prompt(kTile + 1);
  for (uint32_t i = 0; i < prompt.size(); ++i) prompt[i] = PromptToken(0, i);
  report("create", s.CreateSequence(prompt).status());
  report("lookup", s.Lookup(prompt).status());
  report("stats", s.Stats().status());
  report("list", s.ListSequences().status());
  report("evict", s.Evict(v1::EvictRequest::SCOPE_TENANT).status());
}

void ChaosClient::ReplayExpired(uint64_t session, uint64_t epoch) {
  Tally t;
  if (session_ != nullptr && session_->id() == session && session_->epoch() == epoch) {
    Replay(*session_, held_, /*restart=*/false, &t);
    session_.reset();  // the lease is gone: the next loop opens a new session
    held_.clear();
  } else {
    for (size_t i = 0; i < ended_.size(); ++i) {
      if (ended_[i].session->id() == session && ended_[i].session->epoch() == epoch) {
        Replay(*ended_[i].session, ended_[i].held, /*restart=*/false, &t);
        ended_.erase(ended_.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
    }
  }
  Say(absl::StrCat("EXPIRY_DONE session=", session, " calls=", t.calls, " accepted=", t.accepted, " wrong=", t.wrong));
}

void ChaosClient::ReplayRestart(uint64_t epoch) {
  Tally t;
  int sessions = 0;
  if (client_ != nullptr) {
    // The old channel reconnects to the new daemon by itself; wait until it has, so that the
    // replayed calls reach the daemon rather than failing UNAVAILABLE on the way.
    grpc::ClientContext ctx;
    ctx.set_wait_for_ready(true);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::DescribeRequest req;
    v1::DescribeResponse resp;
    (void)client_->stub().Describe(&ctx, req, &resp);
    for (Ended& e : ended_) {
      if (e.session->epoch() == epoch) continue;
      Replay(*e.session, e.held, /*restart=*/true, &t);
      ++sessions;
    }
    if (session_ != nullptr && session_->epoch() != epoch) {
      Replay(*session_, held_, /*restart=*/true, &t);
      ++sessions;
    }
  }
  Say(absl::StrCat("REPLAYED sessions=", sessions, " calls=", t.calls, " accepted=", t.accepted, " wrong=", t.wrong));
  // Reconnect: every Session goes before the Client whose channel it uses.
  ended_.clear();
  session_.reset();
  held_.clear();
  client_.reset();
}

}  // namespace

int RunClient(const ClientArgs& args) { return ChaosClient(args).Run(); }

}  // namespace kvarn::chaos
