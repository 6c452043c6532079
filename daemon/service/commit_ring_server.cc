#include "daemon/service/commit_ring_server.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <span>

#include "absl/strings/str_cat.h"
#include "common/commit_ring.h"
#include "common/shared_memory.h"
#include "daemon/service/log.h"

namespace kvarn {
namespace {

constexpr uint64_t kWakeTag = 0;  // session ids start at 1

void WriteMessage(absl::string_view msg, char* out, uint32_t* bytes) {
  const size_t n = std::min<size_t>(msg.size(), ring::kMessageBytes);
  std::memcpy(out, msg.data(), n);
  *bytes = static_cast<uint32_t>(n);
}

}  // namespace

struct CommitRingServer::Ring {
  SessionRef ref;
  SharedMemory memory;
  UniqueFd doorbell;
  uint32_t capacity = 0;
  // The daemon's own head: records consumed. Never read from the shared segment.
  uint32_t head = 0;
  bool broken = false;
  // Drain thread only.
  bool queued = false;                  // in ready_
  bool hot = false;                     // in hot_, its `polling` word set
  absl::Time watch_until;               // its last pipelined batch + watch
  int named_cpu = -1;  // the CPU of allowed_ its client named in that batch, -1 for none
  uint32_t accepted = 0;  // commits of its last batch the core accepted
  ring::Header* header() const { return reinterpret_cast<ring::Header*>(memory.data()); }
  const uint8_t* record(uint32_t pos) const {
    return memory.data() + ring::RecordsOffset() +
           size_t{pos & (capacity - 1)} * sizeof(ring::Record);
  }
  ring::Completion* completion(uint32_t pos) const {
    return reinterpret_cast<ring::Completion*>(memory.data() + ring::CompletionsOffset(capacity) +
                                               size_t{pos & (capacity - 1)} *
                                                   sizeof(ring::Completion));
  }
};

absl::StatusOr<std::unique_ptr<CommitRingServer>> CommitRingServer::Start(KvCore* core,
                                                                          Options options,
                                                                          RpcObserver* observer) {
  UniqueFd epoll(epoll_create1(EPOLL_CLOEXEC));
  if (!epoll.valid()) return absl::ErrnoToStatus(errno, "epoll_create1");
  UniqueFd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return absl::ErrnoToStatus(errno, "eventfd");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeTag;
  if (epoll_ctl(epoll.get(), EPOLL_CTL_ADD, wake.get(), &ev) != 0) {
    return absl::ErrnoToStatus(errno, "epoll_ctl");
  }
  std::unique_ptr<CommitRingServer> s(
      new CommitRingServer(core, options, observer, std::move(epoll), std::move(wake)));
  s->thread_ = std::thread([p = s.get()] { p->Serve(); });
  return s;
}

CommitRingServer::~CommitRingServer() { Stop(); }

size_t CommitRingServer::rings() const {
  MutexLock lock(&mu_);
  return rings_.size();
}

absl::StatusOr<CommitRingServer::Lent> CommitRingServer::Open(const SessionRef& ref, int pid) {
  if (stopped_.load()) return absl::UnavailableError("kvarnd is shutting down");
  auto slots = core_->RingGrant(ref, pid);
  if (!slots.ok()) return slots.status();
  {
    MutexLock lock(&mu_);
    if (rings_.contains(ref.session)) {
      return absl::AlreadyExistsError("this session has its commit ring already");
    }
  }
  const uint32_t capacity = std::bit_ceil(std::clamp<uint32_t>(*slots, 1, ring::kMaxCapacity));
  auto ring = std::make_shared<Ring>();
  ring->ref = ref;
  ring->capacity = capacity;
  auto memory = SharedMemory::Create(absl::StrCat("kvarn-ring-", ref.session),
                                     ring::SegmentBytes(capacity), ClientAccess::kReadWrite);
  if (!memory.ok()) return memory.status();
  ring->memory = std::move(*memory);
  ring->doorbell = UniqueFd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!ring->doorbell.valid()) {
    return absl::ResourceExhaustedError(absl::StrCat("eventfd: ", strerror(errno)));
  }
  ring::Header* h = ring->header();
  h->magic = ring::kMagic;
  h->version = ring::kVersion;
  h->capacity = capacity;
  h->record_bytes = sizeof(ring::Record);
  h->completion_bytes = sizeof(ring::Completion);
  Lent lent;
  lent.memory = UniqueFd(fcntl(ring->memory.fd(), F_DUPFD_CLOEXEC, 0));
  lent.doorbell = UniqueFd(fcntl(ring->doorbell.get(), F_DUPFD_CLOEXEC, 0));
  if (!lent.memory.valid() || !lent.doorbell.valid()) {
    return absl::ResourceExhaustedError("no descriptor left to lend a ring");
  }
  lent.capacity = capacity;
  lent.bytes = ring->memory.size();
  MutexLock lock(&mu_);
  if (stopped_.load()) return absl::UnavailableError("kvarnd is shutting down");
  if (rings_.contains(ref.session)) {
    return absl::AlreadyExistsError("this session has its commit ring already");
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = ref.session;
  if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, ring->doorbell.get(), &ev) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat("epoll_ctl: ", strerror(errno)));
  }
  rings_.emplace(ref.session, std::move(ring));
  return lent;
}

void CommitRingServer::Stop() {
  if (stopped_.exchange(true)) return;
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t w = write(wake_.get(), &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  absl::flat_hash_map<SessionId, std::shared_ptr<Ring>> rings;
  {
    MutexLock lock(&mu_);
    rings.swap(rings_);
  }
  for (auto& [id, r] : rings) Break(*r, absl::UnavailableError("kvarnd is shutting down"));
}

void CommitRingServer::Serve() {
  std::vector<std::shared_ptr<Ring>> round;
  epoll_event events[64];
  ended_seen_ = core_->sessions_ended();
  // An unknown mask is an empty one: the thread then follows no hint.
  if (!options_.cpus->GetMask(&allowed_)) CPU_ZERO(&allowed_);
  current_ = allowed_;
  for (;;) {
    if (ready_.empty() && !hot_.empty()) Watch();
    // Sleep only with nothing ready and nothing watched (a watch that ended its spin early,
    // for a doorbell or an ended session, goes on after this round).
    const int timeout_ms = ready_.empty() && hot_.empty()
                               ? static_cast<int>(absl::ToInt64Milliseconds(options_.poll))
                               : 0;
    const int n = epoll_wait(epoll_.get(), events, 64, timeout_ms);
    if (stopped_.load()) break;
    for (int i = 0; i < n; ++i) {
      const SessionId id = events[i].data.u64;
      if (id == kWakeTag) continue;
      std::shared_ptr<Ring> r;
      {
        MutexLock lock(&mu_);
        auto it = rings_.find(id);
        if (it != rings_.end()) r = it->second;
      }
      if (r == nullptr) continue;
      uint64_t count;
      // Resets the doorbell.
      [[maybe_unused]] const ssize_t got = read(r->doorbell.get(), &count, sizeof(count));
      Enqueue(r);
    }
    // A watched ring's client publishes without its doorbell: look at every hot tail once per
    // round, so its records are served in the next round even while other rings keep this
    // thread from ever running out of work (and so from Watch).
    if (!hot_.empty()) LookAtHot(options_.clock->Now());
    // One round: each ready ring gets at most one batch, in turn.
    round.swap(ready_);
    ready_.clear();
    CPU_ZERO(&pinned_);
    for (const std::shared_ptr<Ring>& r : round) {
      r->queued = false;
      if (r->broken) continue;
      const uint32_t hint = r->header()->cpu.load(std::memory_order_relaxed);  // read once
      // A doorbell without records moves nothing: only a batch's hint places the thread.
      const bool records = r->header()->tail.load(std::memory_order_relaxed) != r->head;
      if (options_.follow_client_cpu && records) PlaceThread(hint);
      const int on = options_.cpus->Current();
      last_cpu_.store(on, std::memory_order_relaxed);
      if (records)
        r->header()->drained_on.store(on >= 0 ? static_cast<uint32_t>(on) + 1 : 0,
                                      std::memory_order_relaxed);
      const uint32_t head = r->head;
      // The watch's time is read before Drain stores `done`: whoever saw `done` sees it too.
      const absl::Time turn = options_.clock->Now();
      if (Drain(*r)) Enqueue(r);
      // A doorbell without records changes nothing; a batch decides the ring's watch.
      if (r->head != head || r->broken) DecideWatch(r, hint, on, turn);
    }
    round.clear();
    if (const uint64_t ended = core_->sessions_ended(); ended != ended_seen_) {
      ended_seen_ = ended;
      Sweep();
    }
  }
  EndWatches([](const Ring&) { return true; });
  for (const auto& r : ready_) r->queued = false;
  ready_.clear();
}

void CommitRingServer::Enqueue(const std::shared_ptr<Ring>& r) {
  if (r->queued) return;
  r->queued = true;
  ready_.push_back(r);
}

CommitRingServer::ClientCpu CommitRingServer::Decode(uint32_t hint) const {
  // The hint is the client's to write: only a CPU of the thread's own mask counts.
  const uint32_t named = hint & ~ring::kCpuPipelined;
  const bool usable = named >= 1 && named <= CPU_SETSIZE && CPU_ISSET(named - 1, &allowed_);
  return {usable ? static_cast<int>(named) - 1 : -1, (hint & ring::kCpuPipelined) != 0};
}

void CommitRingServer::DecideWatch(const std::shared_ptr<Ring>& r, uint32_t hint, int on,
                                   absl::Time now) {
  // A pipelining client publishes its commits one by one as it stages them: watch for the
  // next rather than sleep until its doorbell, unless this thread shares the client's CPU
  // (spinning there would hold up the very Stage it waits for), and unless the core accepted
  // none of the batch (records refused unread cost their sender nothing: they must not buy
  // a spinning CPU). Anything else, a plain batch included, ends the watch: membership is
  // the last batch's, not the first's.
  const ClientCpu client = Decode(hint);
  const bool watch = client.pipelined && options_.watch > absl::ZeroDuration() && !r->broken &&
                     r->accepted > 0 && (client.cpu < 0 || on != client.cpu);
  if (!watch) {
    if (r->hot) EndWatches([&r](const Ring& x) { return &x == r.get(); });
    return;
  }
  r->watch_until = now + options_.watch;
  r->named_cpu = client.cpu;
  if (r->hot) return;
  r->hot = true;
  r->header()->polling.store(1, std::memory_order_relaxed);
  hot_.push_back(r);
  watched_.store(hot_.size());
}

void CommitRingServer::EndWatches(absl::FunctionRef<bool(const Ring&)> ends) {
  const auto first = std::partition(hot_.begin(), hot_.end(),
                                    [&](const std::shared_ptr<Ring>& r) { return !ends(*r); });
  if (first == hot_.end()) return;
  for (auto it = first; it != hot_.end(); ++it) {
    (*it)->header()->polling.store(0, std::memory_order_relaxed);
    (*it)->hot = false;
  }
  // The last look: a client stores its tail, fences, then reads `polling`; either this look
  // sees its records or it saw 0 and rang the doorbell.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (auto it = first; it != hot_.end(); ++it) {
    const Ring& r = **it;
    if (!r.broken && r.header()->tail.load(std::memory_order_acquire) != r.head) Enqueue(*it);
  }
  hot_.erase(first, hot_.end());
  watched_.store(hot_.size());
}

void CommitRingServer::LookAtHot(absl::Time now) {
  // A clock that went back (before the batch) ends the watch too: a deadline it can no longer
  // be trusted for.
  const absl::Duration watch = options_.watch;
  EndWatches([now, watch](const Ring& r) {
    return r.broken || now >= r.watch_until || now < r.watch_until - watch;
  });
  for (const std::shared_ptr<Ring>& r : hot_) {
    if (r->header()->tail.load(std::memory_order_acquire) != r->head) Enqueue(r);
  }
}

void CommitRingServer::Watch() {
  if (options_.follow_client_cpu && !PlaceForWatch()) {
    watches_unplaced_.fetch_add(1);
    EndWatches([](const Ring&) { return true; });
    return;
  }
  for (int round = 1;; ++round) {
    LookAtHot(options_.clock->Now());
    if (!ready_.empty() || hot_.empty() || stopped_.load(std::memory_order_relaxed)) return;
    for (int i = 0; i < 16; ++i) ring::CpuRelax();
    if (round % 4 == 0) {
      // Another ring's doorbell (or Stop) ends the spin, every few microseconds: the probe
      // leaves it pending (level-triggered), for Serve's epoll_wait. So does a session's end,
      // for Serve's Sweep.
      epoll_event ev;
      if (epoll_wait(epoll_.get(), &ev, 1, 0) > 0) return;
      if (core_->sessions_ended() != ended_seen_) return;
      // A client the scheduler moved onto this CPU since the batch would wait for the watch
      // to end: let anything runnable here go first.
      sched_yield();
    }
  }
}

bool CommitRingServer::PlaceForWatch() {
  if (CPU_COUNT(&allowed_) == 0) return true;  // mask unknown: never narrowed, nothing to undo
  cpu_set_t want = allowed_;
  for (const std::shared_ptr<Ring>& r : hot_) {
    if (r->named_cpu >= 0) CPU_CLR(r->named_cpu, &want);
  }
  cpu_set_t both;  // want minus pinned_
  CPU_AND(&both, &want, &pinned_);
  CPU_XOR(&want, &want, &both);
  if (CPU_COUNT(&want) == 0) return false;
  if (CPU_EQUAL(&want, &current_)) return true;
  if (!options_.cpus->SetMask(want)) return false;
  current_ = want;
  return true;
}

bool CommitRingServer::Drain(Ring& r) {
  ring::Header* h = r.header();
  const uint32_t tail = h->tail.load(std::memory_order_acquire);  // read once
  const uint32_t pending = tail - r.head;
  if (pending == 0) return false;
  if (pending > r.capacity) {
    Break(r, absl::FailedPreconditionError(
                 absl::StrCat("the commit ring's tail is ", pending,
                              " records past the daemon's head; the ring holds ", r.capacity,
                              ": the ring is closed, commit with CommitBatch")));
    return false;
  }
  const absl::Time start = absl::Now();
  // Copy every record out once; only the copies are looked at.
  records_.resize(pending);
  std::vector<ring::Record>& records = records_;
  for (uint32_t i = 0; i < pending; ++i) {
    // The head first; the ids only as many as the copied count says (a count beyond a record
    // is refused below, its ids unread).
    const uint8_t* src = r.record(r.head + i);
    ring::CopyOut(&records[i], src, ring::kRecordHeadBytes);
    if (records[i].tokens <= ring::kRecordTokens) {
      ring::CopyOut(records[i].ids, src + ring::kRecordHeadBytes,
                    records[i].tokens * sizeof(uint32_t));
    }
  }
  std::vector<std::pair<SequenceId, std::span<const uint32_t>>>& items = items_;
  std::vector<int>& item_of = item_of_;  // record -> index in items, -1 when refused here
  items.clear();
  item_of.assign(pending, -1);
  for (uint32_t i = 0; i < pending; ++i) {
    if (records[i].tokens > ring::kRecordTokens) continue;
    item_of[i] = static_cast<int>(items.size());
    items.emplace_back(records[i].sequence,
                       std::span<const uint32_t>(records[i].ids, records[i].tokens));
  }
  auto results = core_->AppendBatch(r.ref, items);
  r.accepted = 0;
  for (uint32_t i = 0; i < pending; ++i) {
    ring::Completion* c = r.completion(r.head + i);
    c->position = r.head + i;
    absl::Status st;
    if (!results.ok()) {
      st = results.status();
    } else if (item_of[i] < 0) {
      st = absl::InvalidArgumentError(absl::StrCat("a ring record carries 1..", ring::kRecordTokens,
                                                   " tokens, not ", records[i].tokens));
    } else {
      const absl::StatusOr<AppendResult>& a = (*results)[static_cast<size_t>(item_of[i])];
      st = a.status();
      if (a.ok()) {
        const BlockTableView& t = a->table;
        c->tokens = t.tokens;
        c->tail_slot = t.tail_slot;
        c->tail_tokens = t.tail_tokens;
        c->sealed = a->sealed ? 1 : 0;
        c->has_sink = t.has_sink ? 1 : 0;
        c->sink_block = t.sink_block;
        c->quant_blocks = a->sealed ? static_cast<uint32_t>(t.quant_blocks.size()) : 0;
        c->last_quant = a->sealed && !t.quant_blocks.empty() ? t.quant_blocks.back() : 0;
      }
    }
    c->code = static_cast<int32_t>(st.code());
    if (st.ok()) ++r.accepted;
    c->call = results.ok() ? 0 : 1;
    c->message_bytes = 0;
    if (!st.ok()) WriteMessage(st.message(), c->message, &c->message_bytes);
  }
  r.head = tail;
  h->done.store(tail, std::memory_order_release);
  ring::FutexWakeAll(&h->done);
  commits_.fetch_add(pending);
  if (observer_ != nullptr) {
    observer_->OnRpc("CommitRing",
                     static_cast<grpc::StatusCode>(static_cast<int>(results.status().code())),
                     absl::Now() - start);
  }
  if (absl::IsNotFound(results.status())) {
    Break(r, results.status());  // the session is gone; Sweep drops the ring
    return false;
  }
  // A client that saw `done` short of its last doorbell's records skipped the doorbell: this
  // look (after the fence; the client fences between its tail and its look at `done`) sees
  // what it published then.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return h->tail.load(std::memory_order_relaxed) != r.head;
}

void CommitRingServer::PlaceThread(uint32_t hint) {
  // No usable CPU in the hint leaves the thread on its whole mask.
  const ClientCpu client = Decode(hint);
  const bool follow = client.cpu >= 0 && !client.pipelined;
  cpu_set_t want = allowed_;
  if (client.cpu >= 0 && client.pipelined) {
    CPU_CLR(client.cpu, &want);
    if (CPU_COUNT(&want) == 0) want = allowed_;  // no other CPU: share the client's
  } else if (follow) {
    CPU_ZERO(&want);
    CPU_SET(client.cpu, &want);
  }
  if (!CPU_EQUAL(&want, &current_)) {
    if (!options_.cpus->SetMask(want)) return;  // e.g. the CPU went offline
    current_ = want;
    if (follow) cpu_moves_.fetch_add(1);
  }
  if (follow) CPU_SET(client.cpu, &pinned_);
}

void CommitRingServer::Break(Ring& r, const absl::Status& why) {
  if (r.broken) return;
  r.broken = true;
  broken_.fetch_add(1);
  // Its doorbell costs nothing now.
  epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, r.doorbell.get(), nullptr);
  ring::Header* h = r.header();
  uint32_t bytes = 0;
  WriteMessage(why.message(), h->broken_message, &bytes);
  if (bytes < ring::kMessageBytes) h->broken_message[bytes] = '\0';
  h->broken.store(static_cast<uint32_t>(why.code()), std::memory_order_release);
  ring::FutexWakeAll(&h->done);
  if (!absl::IsNotFound(why) && !absl::IsUnavailable(why)) {
    Log(LogLevel::kWarning, "commit_ring_broken",
        {{"session", r.ref.session}, {"reason", why.ToString()}});
  }
}

void CommitRingServer::Sweep() {
  std::vector<std::pair<SessionId, std::shared_ptr<Ring>>> all;
  {
    MutexLock lock(&mu_);
    for (auto& [id, r] : rings_) all.emplace_back(id, r);
  }
  for (auto& [id, r] : all) {
    if (core_->CheckSession(r->ref).ok()) continue;
    Break(*r, absl::NotFoundError("the session ended"));
    MutexLock lock(&mu_);
    rings_.erase(id);
  }
  // Nothing keeps an ended session's ring (its segment and eventfd) alive.
  EndWatches([](const Ring& r) { return r.broken; });
}

}  // namespace kvarn
