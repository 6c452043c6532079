// kvarn::CommitRing: commits without an RPC per decode step (docs/commit_ring.md).
//
//   auto ring = (*session)->OpenCommitRing();          // once per session
//   for (each decode step) {
//     for (seq : batch) (*session)->Stage(seq, 1, k, v, DType::kF16);
//     auto results = (*ring)->Commit(items);           // as Session::CommitBatch
//   }
//
// The ring is a bounded queue in shared memory that kvarnd lends to this session's process
// only; Commit writes one record per item, rings an eventfd doorbell, and waits
// (spinning briefly, then on a futex) for kvarnd's completions. kvarnd applies the batch
// through the same path as the AppendBatch RPC: the same checks, the same codes and
// messages, and a rejected commit changes nothing.
//
// Limits of the ring, checked before anything is written (nothing changes then):
//   - an item carries at most ring::kRecordTokens (28) token ids: INVALID_ARGUMENT (use
//     CommitBatch for longer commits);
//   - a batch holds at most capacity() items (the session's tail slots, rounded up to a power
//     of two): RESOURCE_EXHAUSTED for the call. The ring never fills otherwise: Commit waits
//     for its batch before it returns, so each call finds the ring empty.
// The session's own errors (unknown or ended session, stale epoch) are the call's status, as
// CommitBatch gives them. Commit fails for the call, leaving the ring unusable (use
// CommitBatch, or a new session), with DEADLINE_EXCEEDED when kvarnd does not complete the
// batch within the client's rpc_timeout (its outcome is then unknown: Table may be stale),
// and the daemon's code when it closed the ring (FAILED_PRECONDITION: this process moved its
// tail out of bounds; NOT_FOUND: the session ended; UNAVAILABLE: kvarnd is stopping), with its
// message. When this client sees its session end mid-batch it waits up to 2 s more for that
// verdict, then gives NOT_FOUND itself.
//
// Thread safety: Commit may be called from any thread; calls are serialized (one producer).
// REQUIRES: the Session outlives its CommitRing; the session's pool is mapped (a Unix socket
// target; a remote session has no ring).
#ifndef KVARN_CLIENT_LIB_COMMIT_RING_H_
#define KVARN_CLIENT_LIB_COMMIT_RING_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "client/lib/client.h"
#include "common/commit_ring.h"
#include "common/mutex.h"
#include "common/shared_memory.h"
#include "common/unique_fd.h"

namespace kvarn {

class CommitRing {
 public:
  // Asks kvarnd for the session's ring (once per session: ALREADY_EXISTS the second time).
  static absl::StatusOr<std::unique_ptr<CommitRing>> Open(Session* session);
  CommitRing(const CommitRing&) = delete;
  CommitRing& operator=(const CommitRing&) = delete;

  uint32_t capacity() const { return capacity_; }
  // How long Commit spins on the completion word before it sleeps on the futex (default
  // 60 us, about the daemon's turnaround for a 64-sequence step). A spinning client holds a
  // core: on a machine with no core to spare, 0 (sleep at once) lets the daemon run sooner.
  void set_spin(absl::Duration spin) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    spin_ = spin;
  }
  // Commits the staged tokens of many sequences, as Session::CommitBatch: the outer status is
  // the call's (the session's errors, the ring's limits above), then one status per item.
  absl::StatusOr<std::vector<absl::StatusOr<AppendInfo>>> Commit(
      const std::vector<std::pair<uint64_t, std::vector<uint32_t>>>& items);

  // The ring's shared memory and doorbell, for tests that play a client scribbling on its own
  // ring.
  uint8_t* raw_memory() const { return memory_.data(); }
  size_t raw_bytes() const { return memory_.size(); }
  int doorbell_fd() const { return doorbell_.get(); }

 private:
  CommitRing(Session* session, FdMapping memory, UniqueFd doorbell, uint32_t capacity)
      : session_(session), memory_(std::move(memory)), doorbell_(std::move(doorbell)), capacity_(capacity) {}
  ring::Header* header() const { return reinterpret_cast<ring::Header*>(memory_.data()); }
  // Waits until kvarnd completed every record before `target`; OK, or why not.
  absl::Status WaitFor(uint32_t target) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Session* const session_;
  const FdMapping memory_;
  const UniqueFd doorbell_;
  const uint32_t capacity_;
  Mutex mu_;
  uint32_t tail_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status unusable_ ABSL_GUARDED_BY(mu_);
  absl::Duration spin_ ABSL_GUARDED_BY(mu_) = absl::Microseconds(60);
};

}  // namespace kvarn

#endif  // KVARN_CLIENT_LIB_COMMIT_RING_H_
