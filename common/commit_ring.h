// The commit ring's memory layout, shared by kvarnd (daemon/service/commit_ring_server.h) and
// the client library (client/lib/commit_ring.h). docs/commit_ring.md states the protocol.
//
// One ring per session, in one memfd segment the daemon creates and lends to the session's
// process only (over the descriptor channel, with an eventfd doorbell):
//
//   [Header, 4 KiB][Record x capacity][Completion x capacity]
//
// The client (one producer) writes records at positions tail, tail+1, ... (mod capacity),
// publishes the new tail (release), and rings the doorbell. The daemon keeps its own head in
// its own memory; it reads only `tail`, the `cpu` hint and the records from this segment,
// copying each record out once before looking at it. It writes one completion per record (at
// the record's position), then `done` (release), then wakes `done` as a futex.
//
// Everything in the segment is writable by the client: the daemon never trusts a value it
// reads here (tail is bounded by its own head and capacity, every record field is checked, the
// cpu hint is followed only to a CPU of the daemon's own mask), and never reads back what it
// wrote (done, completions, broken).
#ifndef KVARN_COMMON_COMMIT_RING_H_
#define KVARN_COMMON_COMMIT_RING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/time/time.h"

namespace kvarn::ring {

inline constexpr uint32_t kMagic = 0x4b565243;  // "KVRC"
inline constexpr uint32_t kVersion = 2;         // 2: the polling word
// Token ids one record carries: a decode step commits 1, speculative decoding a few. Larger
// commits go through CommitBatch.
inline constexpr uint32_t kRecordTokens = 28;
// Bytes of an error message a completion carries (longer ones are cut).
inline constexpr uint32_t kMessageBytes = 200;
// Records per ring, at most (a ring has one record per tail slot of its session, up to this).
inline constexpr uint32_t kMaxCapacity = 4096;

// In Header::cpu: the client pipelines its commits; drain them away from its CPU.
inline constexpr uint32_t kCpuPipelined = 1u << 31;

struct Header {
  // Written once by the daemon at creation, for the client's checks; never read by the daemon.
  uint32_t magic;
  uint32_t version;
  uint32_t capacity;
  uint32_t record_bytes;
  uint32_t completion_bytes;
  uint32_t reserved0[11];
  // The client's: records published (a free-running count, mod 2^32).
  alignas(64) std::atomic<uint32_t> tail;
  // The client's: 1 + the CPU it last published from (sched_getcpu), 0 for none, with
  // kCpuPipelined set by a client that publishes commits one by one while it stages the next
  // (CommitRing::Publish). A hint only (docs/commit_ring.md): the daemon drains a plain
  // batch on that CPU, where the client waits for it, and a pipelined one on another CPU of
  // its mask, beside the client, watching the tail for a while after it (`polling`).
  std::atomic<uint32_t> cpu;
  // The daemon's: nonzero while the drain thread watches this ring's tail without waiting
  // for its doorbell (after a pipelined batch, for up to kvarnd's ring_watch_us). A client that
  // stored its tail and then (after a seq_cst fence) reads nonzero may skip the doorbell: the
  // daemon clears the word, fences, and looks at the tail once more before it sleeps. A hint only:
  // a client that scribbles it delays its own commits, no one else's.
  alignas(64) std::atomic<uint32_t> polling;
  // The daemon's: records completed (a free-running count); the futex word clients wait on.
  alignas(64) std::atomic<uint32_t> done;
  // The daemon's: 1 + the CPU it drained the ring's last batch on, 0 before the first. A hint
  // for the client's wait: commits drained on the client's own CPU (kvarnd follows the `cpu`
  // hint) are not spun for, since the spinning client would hold the CPU they run on.
  std::atomic<uint32_t> drained_on;
  // The daemon's: nonzero (an absl::StatusCode) once the daemon stopped serving this ring,
  // because its tail went out of bounds, its session ended or the daemon is stopping; the
  // message says why. Stored only once the daemon applies no further record of the ring,
  // after `done` counts every record it applied: a client that reads it set, then `done`,
  // knows the records past `done` were not applied.
  alignas(64) std::atomic<uint32_t> broken;
  char broken_message[kMessageBytes];
};
static_assert(sizeof(Header) <= 4096);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

struct Record {
  uint64_t sequence;
  uint32_t tokens;  // 1..kRecordTokens
  uint32_t reserved;
  uint32_t ids[kRecordTokens];
};
static_assert(sizeof(Record) == 128);
// A record's bytes before its ids: a writer fills these and the first `tokens` ids only, and
// a reader copies out these, then (for a valid count) the ids, so a one-token record is one
// cache line each way.
inline constexpr size_t kRecordHeadBytes = offsetof(Record, ids);

struct Completion {
  uint32_t position;  // the record's position (tail count) this answers
  int32_t code;       // absl::StatusCode, as CommitBatch's item status
  // 1 when `code` is the batch's status, as CommitBatch's outer status (the session's errors:
  // unknown or ended, stale epoch): every completion of the batch then carries it.
  uint32_t call;
  uint32_t reserved;
  // OK: the sequence's table after the commit (block ids of a seal below).
  uint64_t tokens;
  uint32_t tail_slot;
  uint32_t tail_tokens;
  uint32_t sealed;        // 1 when this commit filled and sealed the tail
  uint32_t has_sink;
  uint32_t sink_block;
  uint32_t quant_blocks;  // the sequence's quantized blocks after the commit
  uint32_t last_quant;    // when sealed into a quantized block: its id
  uint32_t message_bytes;
  char message[kMessageBytes];  // not NUL-terminated; message_bytes long
};
static_assert(sizeof(Completion) == 256);
// A completion's bytes before its message, which the daemon writes and the client reads only
// for an error: an OK completion is one cache line.
inline constexpr size_t kCompletionHeadBytes = offsetof(Completion, message);
static_assert(kCompletionHeadBytes <= 64);

inline constexpr size_t kHeaderBytes = 4096;
inline constexpr size_t RecordsOffset() { return kHeaderBytes; }
inline constexpr size_t CompletionsOffset(uint32_t capacity) { return kHeaderBytes + size_t{capacity} * sizeof(Record); }
inline constexpr size_t SegmentBytes(uint32_t capacity) {
  return CompletionsOffset(capacity) + size_t{capacity} * sizeof(Completion);
}

// Copies n bytes out of memory another process may be writing, once: the compiler barrier
// after the copy keeps it from reading the source again in place of the copy.
inline void CopyOut(void* dst, const void* src, size_t n) {
  std::memcpy(dst, src, n);
  asm volatile("" ::: "memory");
}

// One step of a spin-wait loop: tells the core this thread is spinning.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Futex operations on a word of a shared mapping (not FUTEX_PRIVATE: the waiter and the
// waker are different processes). Wait returns when *word != expected, on a wake, or after
// `timeout` (spurious returns are allowed: callers re-check).
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout);
void FutexWakeAll(std::atomic<uint32_t>* word);

}  // namespace kvarn::ring

#endif  // KVARN_COMMON_COMMIT_RING_H_
