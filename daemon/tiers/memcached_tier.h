// The shared tier: block records (daemon/core/block_record.h) on memcached servers that many
// nodes use at once, addressed with libmemcached's consistent hashing (ketama, MD5, weight 1
// per server: libketama-compatible, so every node that lists the same servers, in any order,
// maps a key to the same server).
//
// Keys and values. A record is stored under key = key_prefix + the 64 hex digits of its
// prefix hash (already tenant-salted and namespaced, so the key names one block of one
// namespace). The record is cut into chunks so that no value is larger than chunk_bytes
// (memcached refuses items above its -I limit, 1 MiB by default, item header and key
// included, so chunk_bytes must stay a few hundred bytes below it):
//
//   value of `key`      = frame (16 bytes) + record bytes [0, chunk_bytes - 16)
//   value of `key.i`    = the next chunk_bytes record bytes (i = 1 .. chunks - 1; the last shorter)
//   frame: offset 0 "KVM1"; 4 u32 chunks (>= 1); 8 u64 record bytes (little-endian)
//
// Every record has the frame, one chunk or many. All chunks of a key are sent to the server
// of the main key (libmemcached's *_by_key calls, the main key as the group key), so a lost
// server loses whole records. The writer sets chunks chunks-1 .. 1 first and the main key
// last, so a reader that finds the main key finds a complete record unless memcached evicted
// a chunk since. Get asks for the main key and the chunk keys the largest record of this
// pool needs in one mget (a second one only if the frame names more chunks: a writer with a
// smaller chunk_bytes), reassembles, and checks the record (CheckRecord, the key's hash
// expected). A value that fails (bad frame: corrupt; a missing or short chunk: truncated;
// any CheckRecord fault) is deleted, main key first, counted in rejected[fault], and is a
// miss. Two nodes writing the same block at once can interleave their chunks; the mix fails
// the MAC, is deleted, and the next write heals it.
//
// A dead or hung server is a miss, never an error: connect and I/O waits are bounded by
// `timeout`; after a failure a server is skipped for `retry_timeout` (calls to it fail at
// once), and after `server_failure_limit` failures it is ejected from the continuum for
// `dead_timeout`, then tried once again. Until it is ejected its keys miss and their writes
// fail (counted in errors and dropped_writes); once ejected, its keys map to the living
// servers, whose own keys do not move (ketama), so they miss until written again there. A
// server back after dead_timeout takes its keys back (empty if it restarted: misses until
// rewritten; the copies the others got meanwhile are left to their LRU). Each handle (the
// writer's, each reader's) learns of a failure on its own, and nodes eject at different
// moments, so for a while two of them may map a key to different servers: a miss, never a
// wrong record (every value is checked against the key and the MAC). Measured on loopback
// with retry_timeout 1 s and dead_timeout 2 s: a killed server's keys were written to a
// living server 1.5 s after the kill, and to the restarted server 2 s after its restart.
//
// Stats: blocks/bytes count the records this node wrote (a block written twice counts
// twice); memcached evicts silently and other nodes write too, so they are an upper bound
// of this node's share, not what the servers hold. evicted_blocks and capacity_bytes are 0.
//
// Threads: Put queues (bounded by queue_bytes, the record in flight included) and one writer
// thread, with its own libmemcached handle, does the sets and calls the listener. Readers
// (Get, Contains) take one of `read_handles` handles (a libmemcached handle is not
// thread-safe: each is used by one thread at a time, handed over under the tier's mutex),
// waiting for one when all are busy. No lock is held during I/O or the MAC check. Every
// method may be called concurrently.
#ifndef KVARN_DAEMON_TIERS_MEMCACHED_TIER_H_
#define KVARN_DAEMON_TIERS_MEMCACHED_TIER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "daemon/core/tier.h"

// libmemcached's handle; the header stays out of the tier's includers.
struct memcached_st;

namespace kvarn {

struct MemcachedTierOptions {
  std::vector<std::string> servers;     // "host:port"; every node sharing the tier lists the same
  std::string key_prefix = "kvarn1:";   // keys are key_prefix + 64 hex of the prefix hash
  uint64_t queue_bytes = 256ull << 20;  // write-behind queue bound; Put beyond it drops (counted)
  TierWrite write = TierWrite::kOnSeal;
  uint32_t chunk_bytes = 512 * 1024;  // the largest value stored (frame included); see above
  absl::Duration timeout = absl::Milliseconds(250);  // connect / poll timeouts per server
  uint32_t expire_seconds = 0;                       // memcached exptime of every chunk (0: none)
  // How failing servers are skipped (libmemcached counts whole seconds), and the handles
  // readers share.
  absl::Duration retry_timeout = absl::Seconds(1);  // a failed server is skipped this long
  absl::Duration dead_timeout = absl::Seconds(30);  // an ejected server is retried after this
  uint32_t server_failure_limit = 2;                // failures in a row that eject a server
  uint32_t read_handles = 4;                        // concurrent Get/Contains calls
  absl::Duration close_timeout = absl::Seconds(5);  // the destructor's bound on the queue
};

// The frame and chunks of `record` as stored: values[0] under the key, values[i] under
// key + "." + i. Public for tests that write values directly.
std::vector<std::string> MemcachedValues(std::string_view record, uint32_t chunk_bytes);
std::string MemcachedKey(std::string_view key_prefix, const BlockHash& hash);
std::string MemcachedChunkKey(std::string_view key, uint32_t chunk);

class MemcachedTier final : public BlockTier {
 public:
  // InvalidArgument for a malformed option (no servers, a bad "host:port", a key prefix that
  // would make keys over memcached's 250 bytes or that holds spaces or control characters, a
  // chunk_bytes under 1 KiB or that would need more than kMaxChunks chunks, expire_seconds
  // over 30 days, which memcached would read as a Unix time). Servers are not
  // contacted: one that is down at start only misses.
  static absl::StatusOr<std::unique_ptr<MemcachedTier>> Open(const MemcachedTierOptions& options,
                                                             const TierIdentity& identity);
  // Finishes the queue for at most close_timeout (plus one record's I/O timeouts); what is
  // left is dropped, counted.
  ~MemcachedTier() override;
  MemcachedTier(const MemcachedTier&) = delete;
  MemcachedTier& operator=(const MemcachedTier&) = delete;

  static constexpr uint32_t kMaxChunks = 256;
  static constexpr size_t kFrameBytes = 16;

  std::string_view name() const override { return "memcached"; }
  TierWrite write_policy() const override { return options_.write; }
  bool Put(const BlockHash& hash, std::shared_ptr<const std::string> record,
           uint32_t tenant) override;
  // One round trip: a memcached "touch" of the main key with expire_seconds, which neither
  // transfers nor creates a value (memcached_exist would: it is an "add" of an empty item).
  // With expire_seconds > 0 the touch renews the main key's lifetime, not its chunks'; a
  // record whose chunk expired first is then a truncated rejection on Get.
  bool Contains(const BlockHash& hash) override;
  absl::StatusOr<std::string> Get(const BlockHash& hash) override;
  bool Flush(absl::Time deadline) override;
  TierStats Stats() const override;
  // The listener hears stored = true after each record is written, and stored = false (tenant
  // 0) after Get deletes a rejected value; both from the writer thread.
  void SetListener(Listener listener) override;

 private:
  struct HandleDeleter {
    void operator()(memcached_st* m) const;
  };
  using Handle = std::unique_ptr<memcached_st, HandleDeleter>;
  struct Write {
    BlockHash hash;
    std::shared_ptr<const std::string> record;
    uint32_t tenant = 0;
  };
  struct Event {
    BlockHash hash;
    bool stored = false;
    uint32_t tenant = 0;
  };
  class ReadLease;

  MemcachedTier(const MemcachedTierOptions& options, const TierIdentity& identity, Handle writer,
                std::vector<Handle> readers);
  void WriterLoop();
  // Sets every chunk of `w`; false at the first failed set (the main key then is not written).
  bool WriteRecord(memcached_st* m, const Write& w);
  // Fetches `keys` (all on the server of `group`) into `values` (same order; empty when absent).
  // False when the server failed.
  bool FetchChunks(memcached_st* m, const std::string& group, const std::vector<std::string>& keys,
                   std::vector<std::string>& values, std::vector<bool>& found);
  // What one Get found on the server, before the record's own check.
  struct Fetched {
    enum Outcome { kServerFailed, kAbsent, kBad, kAssembled } outcome = kAbsent;
    std::string record;   // kAssembled
    uint32_t chunks = 0;  // kBad, kAssembled: the keys to delete if it is rejected
    RecordFault fault = RecordFault::kCorrupt;  // kBad
  };
  Fetched FetchRecord(memcached_st* m, const std::string& key);
  // Deletes the value (the main key and `chunks` - 1 chunk keys), counts it, queues the
  // listener's stored = false. Takes a reader handle of its own.
  void Reject(const BlockHash& hash, const std::string& key, uint32_t chunks, RecordFault fault);

  const MemcachedTierOptions options_;
  const TierIdentity identity_;
  const uint32_t expected_chunks_;  // chunks of this pool's largest record at options_.chunk_bytes
  const uint64_t max_record_bytes_;

  mutable Mutex mu_;
  CondVar work_cv_;       // the writer: a write or event queued, or stopping
  CondVar drained_cv_;    // Flush: the queue emptied
  CondVar handle_cv_;     // readers: a handle returned
  Handle writer_handle_;  // only the writer thread uses it
  std::vector<Handle> idle_readers_ ABSL_GUARDED_BY(mu_);
  std::deque<Write> queue_ ABSL_GUARDED_BY(mu_);
  std::deque<Event> events_ ABSL_GUARDED_BY(mu_);
  bool in_flight_ ABSL_GUARDED_BY(mu_) = false;     // the writer holds a popped write
  uint64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // queue_ and the write in flight
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Listener listener_ ABSL_GUARDED_BY(mu_);
  TierStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread writer_;
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_TIERS_MEMCACHED_TIER_H_
