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
// CommitBatch gives them. Commit fails for the call, leaving the ring unusable, with
// DEADLINE_EXCEEDED when kvarnd does not complete the batch within the client's rpc_timeout,
// and the daemon's code when it closed the ring (FAILED_PRECONDITION: this process moved its
// tail out of bounds; NOT_FOUND: the session ended; UNAVAILABLE: kvarnd is stopping), with its
// message. When this client sees its session end mid-batch it waits up to 2 s more for that
// verdict, then gives NOT_FOUND itself. The commits kvarnd answered before the ring failed
// have their results in the sequences' tables. The others were not applied when kvarnd
// closed the ring (its verdict): their sequences are free, their tokens still staged, for
// Session::CommitBatch. After a timeout (or a failed doorbell, or a completion this process
// overwrote) their outcome is unknown, since kvarnd may still apply them: those sequences
// refuse every staging and commit call (FAILED_PRECONDITION) until released, because
// committing them again could append a token twice. Once unusable, the ring's calls
// (Commit, Publish, Collect) fail FAILED_PRECONDITION, naming the first failure.
//
// Pipelined commits, for a worker that stages sequence by sequence: Publish each sequence's
// commit as soon as it is staged, and kvarnd checks and applies it while this thread stages
// the next ones; Collect then waits for them all:
//
//   for (auto& [seq, ids] : items) {
//     (*session)->Stage(seq, 1, k, v, DType::kF16);
//     (*ring)->Publish(seq, ids);
//   }
//   auto results = (*ring)->Collect();   // one per Publish, in order, as Commit's
//
// Publish checks the item as Commit does (NOT_FOUND, INVALID_ARGUMENT), and refuses it with
// FAILED_PRECONDITION while the sequence has a commit in flight and RESOURCE_EXHAUSTED while
// capacity() commits await Collect. A refused item writes nothing; its status is also its
// entry in Collect's result. Between its Publish and Collect a sequence is in flight: Stage,
// StageDevice, MarkStaged, TailSlot, Commit, CommitBatch, AppendInline and Fork of it fail
// FAILED_PRECONDITION (where its next token goes depends on the commit's outcome), and Commit
// refuses to run while Publishes await Collect. Collect's outer status is as Commit's (the
// session's errors, a deadline, a closed ring, an unusable ring); the flights end either way,
// those of unknown outcome as above. A Publish whose doorbell fails returns INTERNAL: its
// record is in the ring, the outcome unknown, and the ring unusable. Destroying the ring
// collects what was published (waiting up to rpc_timeout), so no sequence stays in flight.
//
// Publish names its CPU with ring::kCpuPipelined in the ring's header: kvarnd's drain thread
// then runs on another CPU of its mask, beside this one, and after each batch watches the ring
// for the next record a while (kvarnd's ring_watch_us) instead of sleeping, so Publish rings
// the doorbell only when the thread is not watching and has finished the last doorbell's
// records. Commit names its CPU plainly, and the thread drains the batch this thread waits
// for there.
//
// Thread safety: Commit, Publish and Collect may be called from any thread; the ring's lock
// serializes them (one producer), and Collect answers every Publish since the last Collect,
// whichever thread made it.
// REQUIRES: the Session outlives its CommitRing; the session's pool is mapped (a Unix socket
// target; a remote session has no ring).
#ifndef KVARN_CLIENT_LIB_COMMIT_RING_H_
#define KVARN_CLIENT_LIB_COMMIT_RING_H_

#include <atomic>
#include <memory>
#include <span>
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
  // Collects what was published and not yet collected (above).
  ~CommitRing();
  CommitRing(const CommitRing&) = delete;
  CommitRing& operator=(const CommitRing&) = delete;

  uint32_t capacity() const { return capacity_; }
  // How long Commit spins on the completion word before it sleeps on the futex (default
  // 60 us, about the daemon's turnaround for a 64-sequence step). A spinning client holds a
  // core: on a machine with no core to spare, 0 (sleep at once) lets the daemon run sooner.
  // It does not spin while kvarnd drains its commits on the CPU it waits on (the ring's
  // `drained_on`: kvarnd follows a plain commit's CPU hint unless pinned elsewhere).
  void set_spin(absl::Duration spin) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    spin_ = spin;
  }
  // Commits the staged tokens of many sequences, as Session::CommitBatch: the outer status is
  // the call's (the session's errors, the ring's limits above), then one status per item.
  absl::StatusOr<std::vector<absl::StatusOr<AppendInfo>>> Commit(
      const std::vector<std::pair<uint64_t, std::vector<uint32_t>>>& items)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Publishes one sequence's staged tokens for kvarnd to commit now (above); OK once the
  // record is in the ring, else why it is not (or INTERNAL: it is in, but the doorbell failed).
  absl::Status Publish(uint64_t sequence, std::span<const uint32_t> ids) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits for every commit published since the last Collect; one status per Publish, in order.
  absl::StatusOr<std::vector<absl::StatusOr<AppendInfo>>> Collect() ABSL_LOCKS_EXCLUDED(mu_);

  // The ring's shared memory and doorbell, for tests that play a client scribbling on its own
  // ring.
  uint8_t* raw_memory() const { return memory_.data(); }
  size_t raw_bytes() const { return memory_.size(); }
  int doorbell_fd() const { return doorbell_.get(); }
  // Doorbells this ring rang (Commit rings once per call; Publish only when kvarnd was not
  // watching the ring).
  uint64_t doorbells() const { return doorbells_.load(std::memory_order_relaxed); }

 private:
  CommitRing(Session* session, FdMapping memory, UniqueFd doorbell, uint32_t capacity)
      : session_(session), memory_(std::move(memory)), doorbell_(std::move(doorbell)), capacity_(capacity) {}
  ring::Header* header() const { return reinterpret_cast<ring::Header*>(memory_.data()); }
  // The checks Commit and Publish make of one item before writing it (the messages are
  // CommitBatch's): NOT_FOUND, a flight or unknown outcome, ids against the staged count,
  // the record's token limit. The sequence's state when it passes.
  absl::StatusOr<Session::SeqState*> CheckItem(uint64_t seq, std::span<const uint32_t> ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, session_->mu_);
  // FAILED_PRECONDITION naming unusable_ (which must be an error).
  absl::Status Unusable() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until kvarnd completed every record before `target`; OK, or why not.
  absl::Status WaitFor(uint32_t target) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes a record at tail_ (not yet published) and advances tail_.
  void WriteRecord(uint64_t sequence, std::span<const uint32_t> ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Publishes the records before tail_, naming `cpu_hint` (1 + a CPU, 0 for none) in the
  // header; rings the doorbell always, or only when kvarnd is not watching the ring.
  absl::Status PublishTail(uint32_t cpu_hint, bool always_ring) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for the records [first, first + seqs.size()) of `seqs` (in order) and reads their
  // completions into (*out)[index[k]]. Returns the session's own error when kvarnd gave one
  // (the call's status), the wait's failure (the ring is unusable then: the records kvarnd
  // did not complete are of unknown outcome), or OK. Every sequence's flight ends.
  absl::Status Await(uint32_t first, std::span<const uint64_t> seqs, std::span<const size_t> index,
                     std::vector<absl::StatusOr<AppendInfo>>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Session* const session_;
  const FdMapping memory_;
  const UniqueFd doorbell_;
  const uint32_t capacity_;
  Mutex mu_;
  uint32_t tail_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t rung_at_ ABSL_GUARDED_BY(mu_) = 0;  // tail_ when the doorbell last rang
  uint32_t hint_ ABSL_GUARDED_BY(mu_) = 0;  // the header's cpu word as this client last stored it
  // Publish's items since the last Collect, in order: a refused one holds its status; the
  // published ones are the records [tail_ - in_ring, tail_).
  struct Published {
    uint64_t sequence;
    absl::Status refused;
  };
  std::vector<Published> published_ ABSL_GUARDED_BY(mu_);
  uint32_t in_ring_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status unusable_ ABSL_GUARDED_BY(mu_);
  absl::Duration spin_ ABSL_GUARDED_BY(mu_) = absl::Microseconds(60);
  std::atomic<uint64_t> doorbells_{0};
};

}  // namespace kvarn

#endif  // KVARN_CLIENT_LIB_COMMIT_RING_H_
