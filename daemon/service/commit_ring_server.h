// Commit rings: per-session shared-memory queues of commits, for workers that commit every
// decode step without an RPC (docs/commit_ring.md; the layout is common/commit_ring.h).
//
// A session's process asks for its ring on the descriptor channel (after its memory was lent:
// the ring goes to that process only, KvCore::RingGrant). The daemon creates the ring in its
// own memfd segment (sealed against shrinking, so a client cannot truncate it under the
// daemon) and an eventfd doorbell, and lends both.
//
// One thread drains every ring, in rounds. A ring is "ready" when its doorbell rang, when its
// last batch ended with more records already published, or when it is watched (below) and has
// unread records; each round takes at most one batch from each ready ring, the records
// [head, tail) published when it looks, at most the ring's capacity. Each record is copied out
// of the shared segment once, then checked, then the batch goes through KvCore::AppendBatch,
// the path of the AppendBatch RPC: the same validation, the same codes and messages, and a
// rejected commit changes nothing. Results go back as completions, then `done` and a futex
// wake.
//
// Placement (follow_client_cpu), decided per batch from the header's `cpu` hint, only ever
// within the thread's mask at start: a plain batch runs on the CPU its client published it
// from (the staged K/V it scans are in that core's caches, and the client's next doorbell
// wakes the thread there); a pipelined batch (kCpuPipelined) runs on any CPU of the mask but
// the client's, so the scan overlaps the client's next Stage.
//
// Watching: after a pipelined batch drained on another CPU than its client's, of which the core
// accepted at least one commit (refused records cost their sender nothing and buy no spin), the
// ring joins the hot set (watched()) and its `polling` word is set, which tells the client it may
// publish without the doorbell. Each hot ring has its own deadline, its last batch + `watch` (by
// the injected clock). Membership is decided again at every batch: a plain batch, or one drained on
// the client's CPU, ends the ring's watch. Every round looks once at each hot ring's tail (one load
// each), so a watched ring's records are served in the next round however busy the other rings keep
// the thread. Only when no ring is ready does the thread spin over the hot tails; with
// follow_client_cpu, only on the CPUs of its mask that no hot ring's client and no plain client of
// the last round named (no such CPU: the watches end instead; without placement it spins on its
// whole mask, yielding every few rounds). The spin looks at the doorbells without blocking every
// few rounds and stops at the first one, so another ring's doorbell waits a few microseconds, not
// the rest of a watch. A watch ends, ring by ring, at its deadline, when the ring breaks or its
// session ends: `polling` cleared, a seq_cst fence, then one more look at its tail (the client
// stores its tail, fences, then reads `polling`: either that look sees its records or the client
// sees 0 and rings).
//
// What a client can do to its own ring: garbage records get errors (INVALID_ARGUMENT for a
// record's token count, the core's codes for the rest); a tail out of bounds breaks the ring
// for good (FAILED_PRECONDITION in its header) and the daemon stops reading it; doorbell
// spam costs one check per round and places the thread nowhere (only a batch's hint does);
// a scribbled `polling` word (the daemon never reads it)
// makes only its own client skip doorbells. What it costs others is its share of the one
// thread: one bounded batch per round, one tail load per round while it is watched, and
// while the thread spins for it, the spin's CPU (with placement, never one a client named).
// Each ring has its own segment, eventfd and head (in daemon memory).
//
// Rings of ended sessions are dropped, from the hot set too, when KvCore::sessions_ended()
// moves. Stop() marks every ring broken (UNAVAILABLE) and wakes its waiters.
//
// Thread safety: Open, Stop and the counters may be called from any thread; everything else
// runs on the drain thread.
#ifndef KVARN_DAEMON_SERVICE_COMMIT_RING_SERVER_H_
#define KVARN_DAEMON_SERVICE_COMMIT_RING_SERVER_H_

#include <sched.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/commit_ring.h"
#include "common/mutex.h"
#include "common/unique_fd.h"
#include "daemon/core/clock.h"
#include "daemon/core/kv_core.h"
#include "daemon/service/kv_service.h"
#include "daemon/service/thread_cpus.h"

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
    // watches that ring's tail until this long after the batch, with the header's `polling`
    // word set so the client need not ring the doorbell. Zero: the thread always sleeps on
    // the doorbells.
    absl::Duration watch = absl::Microseconds(50);
    // The watch deadlines' time (tests pass a FakeClock, whose watches end only when it is
    // advanced). Not owned; outlives the server.
    const Clock* clock = SystemClock::Get();
    // The drain thread's mask and CPU: read at start, narrowed for placement (tests pass a
    // fake with CPUs the machine lacks). Not owned; outlives the server.
    const ThreadCpus* cpus = SystemThreadCpus::Get();
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
  // Rings in the hot set now (watched, their `polling` word set).
  size_t watched() const { return watched_.load(); }
  // Times the thread had hot rings and nothing ready but no CPU to spin on (every CPU of its
  // mask named by a hot ring's client or by a plain client of the last round), so it ended
  // those watches instead.
  uint64_t watches_unplaced() const { return watches_unplaced_.load(); }

 private:
  struct Ring;
  CommitRingServer(KvCore* core, Options options, RpcObserver* observer, UniqueFd epoll,
                   UniqueFd wake)
      : core_(core),
        options_(options),
        observer_(observer),
        epoll_(std::move(epoll)),
        wake_(std::move(wake)) {}
  void Serve();
  // Applies one batch of `r`; returns whether more records were published meanwhile.
  bool Drain(Ring& r);
  // Stops serving `r` for good and tells its client why.
  void Break(Ring& r, const absl::Status& why);
  // Drops the rings of ended sessions, from rings_ and from the hot set.
  void Sweep();
  // A batch's cpu hint: the CPU of allowed_ its client named (-1 for none, or one outside
  // the mask), and whether it pipelines (ring::kCpuPipelined).
  struct ClientCpu {
    int cpu;
    bool pipelined;
  };
  ClientCpu Decode(uint32_t hint) const;
  // With follow_client_cpu: sets the drain thread's mask for a batch with `hint` (the
  // client's CPU for a plain batch, every CPU of allowed_ but the client's for a pipelined
  // one, all of allowed_ for no usable hint), when it differs from current_.
  void PlaceThread(uint32_t hint);

  // The rest runs on the drain thread only.
  // Adds `r` to the next round, once.
  void Enqueue(const std::shared_ptr<Ring>& r);
  // After a batch of `r` with `hint` drained on CPU `on`, begun at `now`: starts or renews
  // its watch (a pipelined batch drained off the client's CPU, the core accepting some of
  // it), or ends it.
  void DecideWatch(const std::shared_ptr<Ring>& r, uint32_t hint, int on, absl::Time now);
  // Ends the watch of every hot ring for which `ends` holds: clears their `polling`, fences,
  // looks at their tails once more (enqueueing those with records) and drops them.
  void EndWatches(absl::FunctionRef<bool(const Ring&)> ends);
  // One look at the hot set at `now`: ends the watches past their deadline or of broken
  // rings, enqueues the hot rings with records.
  void LookAtHot(absl::Time now);
  // With nothing ready: spins over the hot tails (LookAtHot) until one has records, every
  // watch ended, a doorbell rang, a session ended or the server stops. Without a CPU to spin
  // on (placement), ends every watch instead.
  void Watch();
  // With follow_client_cpu: moves the thread to allowed_ minus every hot ring's named CPU
  // and minus the CPUs plain clients of the last round placed it on; false when no CPU is
  // left (or the move failed while the thread is pinned).
  bool PlaceForWatch();

  KvCore* const core_;
  const Options options_;
  RpcObserver* const observer_;
  UniqueFd epoll_;
  UniqueFd wake_;
  std::thread thread_;
  std::atomic<bool> stopped_{false};
  std::atomic<uint64_t> broken_{0}, commits_{0}, cpu_moves_{0}, watches_unplaced_{0};
  std::atomic<int> last_cpu_{-1};
  std::atomic<size_t> watched_{0};
  mutable Mutex mu_;
  absl::flat_hash_map<SessionId, std::shared_ptr<Ring>> rings_ ABSL_GUARDED_BY(mu_);
  // Drain thread only: the next round's rings, the hot set, the thread's mask at start and
  // now, the client CPUs plain batches of the last round placed it on, and the core's
  // sessions_ended() at the last Sweep.
  std::vector<std::shared_ptr<Ring>> ready_;
  std::vector<std::shared_ptr<Ring>> hot_;
  cpu_set_t allowed_{};
  cpu_set_t current_{};
  cpu_set_t pinned_{};
  uint64_t ended_seen_ = 0;
  // Drain thread only: a batch's copies of its records, the items handed to the core and each
  // record's item, kept from batch to batch (no allocation per batch).
  std::vector<ring::Record> records_;
  std::vector<std::pair<SequenceId, std::span<const uint32_t>>> items_;
  std::vector<int> item_of_;
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_SERVICE_COMMIT_RING_SERVER_H_
