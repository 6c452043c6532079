#include "daemon/service/watch_hub.h"

#include <utility>

#include "common/tsan.h"
#include "daemon/service/convert.h"

namespace kvarn {

class WatchHub::Stream final : public grpc::ServerWriteReactor<v1::BlockEvent> {
 public:
  // Starts finished (with the refusal) when the grant was refused. `ended` is the core's
  // count of ended sessions read before the grant: the hub re-checks the session whenever the
  // count has moved past it.
  Stream(WatchHub* hub, const SessionRef& ref, absl::StatusOr<WatchGrant> grant, uint64_t after, uint64_t ended)
      : hub_(hub), ref_(ref), after_(after), ended_checked_(ended) {
    if (!grant.ok()) {
      granted_ = false;
      {
        MutexLock lock(&mu_);
        finished_ = true;
      }
      Finish(ToGrpc(grant.status()));
      return;
    }
    grant_ = *grant;
    // Callbacks run on gRPC's threads, ordered after this constructor by gRPC's own
    // (uninstrumented) locking: say so to ThreadSanitizer (the hub gets the stream through
    // its mutex and the refcount, which TSan sees).
    KVARN_TSAN_RELEASE(this);
  }

  const SessionRef& ref() const { return ref_; }
  bool granted() const { return granted_; }
  // The hub thread's own bookkeeping: the ended-sessions count this stream was checked at.
  uint64_t ended_checked() const { return ended_checked_; }
  void set_ended_checked(uint64_t n) { ended_checked_ = n; }
  void Ref() { refs_.fetch_add(1, std::memory_order_relaxed); }
  void Unref() {
    KVARN_TSAN_RELEASE(this);
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      KVARN_TSAN_ACQUIRE(this);
      delete this;
    }
  }

  // Queues the events this stream may see (newer than its start) and writes if idle.
  void Push(const std::vector<NamedEvent>& events) {
    v1::BlockEvent* write = nullptr;
    std::optional<grpc::Status> finish;
    {
      MutexLock lock(&mu_);
      if (finished_) return;
      for (const auto& [e, tenant, tier] : events) {
        if (e.seq <= after_ || (!grant_.all_tenants && e.tenant != grant_.tenant)) continue;
        if (queue_.size() >= kMaxQueued) {
          queue_.clear();
          pending_finish_ = grpc::Status(grpc::StatusCode::DATA_LOSS, "watcher fell behind; re-sync and watch again");
          break;
        }
        v1::BlockEvent out;
        ToProto(e, tenant, tier, &out);
        queue_.push_back(std::move(out));
      }
      if (!writing_) NextLocked(&write, &finish);
    }
    Issue(write, finish);
  }

  // Ends the stream with `status` once the write in flight, if any, is done.
  void End(grpc::Status status) {
    std::optional<grpc::Status> finish;
    {
      MutexLock lock(&mu_);
      if (finished_ || pending_finish_.has_value()) return;
      queue_.clear();
      pending_finish_ = std::move(status);
      v1::BlockEvent* write = nullptr;
      if (!writing_) NextLocked(&write, &finish);
    }
    Issue(nullptr, finish);
  }

  void OnWriteDone(bool ok) override {
    KVARN_TSAN_ACQUIRE(this);
    v1::BlockEvent* write = nullptr;
    std::optional<grpc::Status> finish;
    {
      MutexLock lock(&mu_);
      writing_ = false;
      if (!ok && !pending_finish_.has_value()) {  // the client went away
        queue_.clear();
        pending_finish_ = grpc::Status::OK;
      }
      NextLocked(&write, &finish);
    }
    Issue(write, finish);
  }

  void OnCancel() override {
    KVARN_TSAN_ACQUIRE(this);
    End(grpc::Status::CANCELLED);
    // gRPC runs OnDone, whose Unref may free this stream, only after OnCancel has returned, by
    // its own (uninstrumented) locking. End may return without reaching Issue's release (the
    // stream already finished), so say it here: ThreadSanitizer otherwise took End's lock of
    // mu_ and the hub thread's delete for a race (WatchBeyondTheTenantsWatchersQuota...).
    KVARN_TSAN_RELEASE(this);
  }

  void OnDone() override {
    KVARN_TSAN_ACQUIRE(this);
    hub_->Unregister(this);
    if (granted_) hub_->core_->ReleaseWatcher(ref_.session);
    Unref();  // gRPC's reference
  }

 private:
  // Picks the next action: a write of the queue's head, or the pending finish.
  void NextLocked(v1::BlockEvent** write, std::optional<grpc::Status>* finish) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || writing_) return;
    if (!queue_.empty() && !pending_finish_.has_value()) {
      current_ = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      *write = &current_;
    } else if (pending_finish_.has_value()) {
      finished_ = true;
      *finish = *pending_finish_;
    }
  }
  void Issue(v1::BlockEvent* write, const std::optional<grpc::Status>& finish) {
    KVARN_TSAN_RELEASE(this);
    if (write != nullptr) StartWrite(write);
    if (finish.has_value()) Finish(*finish);
  }

  WatchHub* const hub_;
  const SessionRef ref_;
  const uint64_t after_;  // events up to this one happened before the call
  uint64_t ended_checked_;  // read and written by the hub thread only (after construction)
  WatchGrant grant_;
  bool granted_ = true;
  std::atomic<int> refs_{1};  // gRPC's, until OnDone
  Mutex mu_;
  std::deque<v1::BlockEvent> queue_ ABSL_GUARDED_BY(mu_);
  v1::BlockEvent current_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> pending_finish_ ABSL_GUARDED_BY(mu_);
};

WatchHub::WatchHub(KvCore* core, absl::Duration poll) : core_(core), poll_(poll) {
  // The cursor starts here, before any stream can be opened, so no stream's start precedes it.
  const uint64_t cursor = core_->events().last_seq();
  thread_ = std::thread([this, cursor] { Loop(cursor); });
}

WatchHub::~WatchHub() { Stop(); }

grpc::ServerWriteReactor<v1::BlockEvent>* WatchHub::Open(const SessionRef& ref) {
  // The start and the ended-sessions count are taken before the grant, so nothing after the
  // call is missed, and a session that ends right after the grant is noticed.
  const uint64_t after = core_->events().last_seq();
  const uint64_t ended = core_->sessions_ended();
  absl::StatusOr<WatchGrant> grant = core_->AcquireWatcher(ref);
  bool stopping;
  {
    MutexLock lock(&mu_);
    stopping = stopping_;
  }
  if (stopping && grant.ok()) {
    core_->ReleaseWatcher(ref.session);
    grant = absl::UnavailableError("kvarnd is shutting down");
  }
  // Built outside the hub's lock: a refused stream finishes in its constructor.
  auto* s = new Stream(this, ref, grant, after, ended);
  if (!s->granted()) return s;
  bool late = false;
  {
    MutexLock lock(&mu_);
    late = stopping_;  // the hub's last pass may be over: end it here
    if (!late) streams_.insert(s);
  }
  if (late) s->End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "kvarnd is shutting down"));
  return s;
}

void WatchHub::Unregister(Stream* s) {
  MutexLock lock(&mu_);
  streams_.erase(s);
}

size_t WatchHub::streams() const {
  MutexLock lock(&mu_);
  return streams_.size();
}

void WatchHub::Loop(uint64_t cursor) {
  for (;;) {
    bool lost = false;
    const std::vector<BlockEvent> events = core_->events().Read(cursor, 1024, poll_, &lost);
    std::vector<NamedEvent> named;
    named.reserve(events.size());
    for (const BlockEvent& e : events) {
      cursor = e.seq;
      named.push_back(NamedEvent{e, e.tenant == kNoTenant ? std::string() : core_->TenantName(e.tenant),
                                 e.tier == 0 ? std::string_view("pool") : core_->tier_name(e.tier - 1u)});
    }
    const uint64_t ended = core_->sessions_ended();
    std::vector<Stream*> snapshot;
    bool stopping;
    {
      MutexLock lock(&mu_);
      stopping = stopping_;
      snapshot.assign(streams_.begin(), streams_.end());
      for (Stream* s : snapshot) s->Ref();
    }
    for (Stream* s : snapshot) {
      if (stopping) {
        s->End(grpc::Status::OK);
      } else if (lost) {
        s->End(grpc::Status(grpc::StatusCode::DATA_LOSS, "watcher fell behind the event log; re-sync and watch again"));
      } else {
        if (!named.empty()) s->Push(named);
        if (s->ended_checked() != ended) {
          s->set_ended_checked(ended);
          if (absl::Status alive = core_->CheckSession(s->ref()); !alive.ok()) s->End(ToGrpc(alive));
        }
      }
      s->Unref();
    }
    if (stopping) return;
    if (lost) cursor = core_->events().last_seq();
  }
}

void WatchHub::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  core_->events().Wake();
  if (thread_.joinable()) thread_.join();
}

}  // namespace kvarn
