// Commit rings: per-session shared-memory queues of commits, for workers that commit every
// decode step without an RPC (docs/commit_ring.md; the layout is common/commit_ring.h).
//
// A session's process asks for its ring on the descriptor channel (after its memory was lent:
// the ring goes to that process only, KvCore::RingGrant). The daemon creates the ring in its
// own memfd segment (sealed against shrinking, so a client cannot truncate it under the
// daemon) and an eventfd doorbell, and lends both. One thread drains every ring: it waits on
// the doorbells (epoll), and in each round takes at most one batch from each rung ring, the
// records [head, tail) published when it looks, at most the ring's capacity. Each record is
// copied out of the shared segment once, then checked, then the batch goes through
// KvCore::AppendBatch, the path of the AppendBatch RPC: the same validation, the same codes
// and messages, and a rejected commit changes nothing. Results go back as completions. Before
// a batch the thread moves to the CPU its client published from (the header's hint), when
// that CPU is in the thread's own mask: the staged K/V the commit scans are in that core's
// caches, and the client's next doorbell wakes the thread there.
//
// What a client can do to its own ring: garbage records get errors (INVALID_ARGUMENT for a
// record's token count, the core's codes for the rest); a tail out of bounds breaks the ring
// for good (FAILED_PRECONDITION in its header) and the daemon stops reading it; doorbell
// spam costs one check per round. None of it reaches another session's ring: each has its own
// segment, eventfd and head (in daemon memory), and each round serves each ring at most one
// bounded batch, in turn.
//
// Rings of ended sessions are dropped when KvCore::sessions_ended() moves. Stop() marks every
// ring broken (UNAVAILABLE) and wakes its waiters.
//
// Thread safety: Open and Stop may be called from any thread.
#ifndef KVARN_DAEMON_SERVICE_COMMIT_RING_SERVER_H_
#define KVARN_DAEMON_SERVICE_COMMIT_RING_SERVER_H_

#include <sched.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "common/unique_fd.h"
#include "daemon/core/kv_core.h"
#include "daemon/service/kv_service.h"

namespace kvarn {

class CommitRingServer {
 public:
  struct Options {
    // Longest the drain thread sleeps before it looks at ended sessions and shutdown.
    absl::Duration poll = absl::Milliseconds(200);
    // Place the drain thread by the client's hint (the header's cpu word), within the CPUs of
    // its mask at start: a batch on the CPU its client published it from, where the client
    // waits for it; a pipelined batch (kCpuPipelined) on any CPU of the mask but that one,
    // beside the client. False: the thread stays on its whole mask.
    bool follow_client_cpu = true;
    // After a pipelined batch, when the drain thread runs on another CPU than its client, it
    // watches that ring's tail this long before it sleeps, with the header's `polling` word
    // set so the client need not ring the doorbell. Zero: the thread always sleeps on the
    // doorbells.
    absl::Duration watch = absl::Microseconds(50);
  };
  static absl::StatusOr<std::unique_ptr<CommitRingServer>> Start(KvCore* core, Options options,
                                                                 RpcObserver* observer = nullptr);
  ~CommitRingServer();
  CommitRingServer(const CommitRingServer&) = delete;
  CommitRingServer& operator=(const CommitRingServer&) = delete;

  // What a session's process receives: duplicated descriptors (the caller sends and closes).
  struct Lent {
    UniqueFd memory;    // the ring segment, writable, SegmentBytes(capacity) long
    UniqueFd doorbell;  // an eventfd: write 1 after publishing records
    uint32_t capacity = 0;
    uint64_t bytes = 0;
  };
  // Creates the session's ring for process `pid` (as the descriptor channel saw it). The
  // capacity is the session's tail slots rounded up to a power of two (at most
  // ring::kMaxCapacity). KvCore::RingGrant's errors; ALREADY_EXISTS when the session has its
  // ring; UNAVAILABLE once stopped; RESOURCE_EXHAUSTED when memory or descriptors run out.
  absl::StatusOr<Lent> Open(const SessionRef& ref, int pid);

  // Stops draining; every ring is marked broken (UNAVAILABLE) and its waiters woken.
  // Idempotent.
  void Stop();
  size_t rings() const;
  uint64_t broken() const { return broken_.load(); }
  uint64_t commits() const { return commits_.load(); }
  // Times the drain thread moved to a client's CPU.
  uint64_t cpu_moves() const { return cpu_moves_.load(); }
  // The CPU the last batch was drained on (-1 before the first).
  int last_cpu() const { return last_cpu_.load(); }

 private:
  struct Ring;
  CommitRingServer(KvCore* core, Options options, RpcObserver* observer, UniqueFd epoll, UniqueFd wake)
      : core_(core), options_(options), observer_(observer), epoll_(std::move(epoll)), wake_(std::move(wake)) {}
  void Serve();
  // Applies one batch of `r`; returns whether more records were published meanwhile.
  bool Drain(Ring& r);
  // Stops serving `r` for good and tells its client why.
  void Break(Ring& r, const absl::Status& why);
  // Drops the rings of ended sessions.
  void Sweep();
  // With follow_client_cpu: sets the drain thread's mask for a batch with `hint` (the
  // client's CPU for a plain batch, every CPU of `allowed` but the client's for a pipelined
  // one, all of `allowed` for no usable hint), when it differs from `*current`.
  void PlaceThread(uint32_t hint, const cpu_set_t& allowed, cpu_set_t* current);
  // Watches the tails of `hot` rings (their `polling` word set) for up to options_.watch:
  // returns as soon as one has records (added to `ready`, the rings stay hot), or the time
  // passes (their `polling` cleared, then each tail looked at once more; `hot` emptied).
  void Watch(std::vector<std::shared_ptr<Ring>>* hot, std::vector<SessionId>* ready);

  KvCore* const core_;
  const Options options_;
  RpcObserver* const observer_;
  UniqueFd epoll_;
  UniqueFd wake_;
  std::thread thread_;
  std::atomic<bool> stopped_{false};
  std::atomic<uint64_t> broken_{0}, commits_{0}, cpu_moves_{0};
  std::atomic<int> last_cpu_{-1};
  mutable Mutex mu_;
  absl::flat_hash_map<SessionId, std::shared_ptr<Ring>> rings_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_SERVICE_COMMIT_RING_SERVER_H_
