// A tier below the pool: somewhere blocks go when the pool lets them go (or as soon as they
// are sealed), and where a prefix the pool no longer holds is found again. Two exist: the
// local disk (daemon/tiers/disk_tier.h) and memcached servers shared by many nodes (daemon/tiers/memcached_tier.h).
//
// A tier stores records (block_record.h) under the block's prefix hash. It validates every
// record it reads against the pool's TierIdentity and the key it asked for; a record that
// fails is counted by fault, deleted where the tier can delete, and reported as a miss: a
// tier never serves a block it cannot vouch for, and a tier that fails (a dead server, a full
// disk) only misses, it never fails the client's call.
//
// Writes are write-behind: Put queues and returns at once; a bounded queue (bytes) drops
// what does not fit, counted. Thread safety: every method may be called concurrently.
#ifndef KVARN_DAEMON_CORE_TIER_H_
#define KVARN_DAEMON_CORE_TIER_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/core/block_record.h"
#include "common/prefix_hash.h"

namespace kvarn {

// When a tier is written.
enum class TierWrite : uint8_t {
  kOnEvict = 0,  // when the pool evicts a block (the disk tier's default)
  kOnSeal = 1,   // as soon as a block is sealed (memcached's default: other nodes see it soon)
};

struct TierStats {
  uint64_t blocks = 0;          // records held (disk: exact; memcached: written by this node, not known evicted)
  uint64_t bytes = 0;           // their bytes, headers included
  uint64_t capacity_bytes = 0;  // the tier's bound (0: the servers' own)
  uint64_t hits = 0, misses = 0;  // Get
  uint64_t read_bytes = 0;
  uint64_t queued_blocks = 0, queued_bytes = 0;  // write-behind queue now
  uint64_t written_blocks = 0, written_bytes = 0;
  uint64_t dropped_writes = 0;  // queue full, or the write failed
  uint64_t evicted_blocks = 0;  // removed by the tier's own LRU
  uint64_t errors = 0;          // I/O errors and server failures (each also a miss or a drop)
  std::array<uint64_t, kRecordFaults> rejected{};  // by RecordFault
};

class BlockTier {
 public:
  // A record entered (stored = true) or left the tier, with the tenant cookie given to Put
  // (0 when unknown, e.g. records found at start). Called from the tier's own threads, never
  // under a lock the core holds.
  using Listener = std::function<void(const BlockHash& hash, bool stored, uint32_t tenant)>;

  virtual ~BlockTier() = default;
  virtual std::string_view name() const = 0;  // "disk", "memcached": the metrics' tier label
  virtual TierWrite write_policy() const = 0;
  // Queues `record` (built by SealRecord) under `hash`; false when it was dropped (the queue is
  // full). Never waits for I/O.
  virtual bool Put(const BlockHash& hash, std::shared_ptr<const std::string> record, uint32_t tenant) = 0;
  // Whether the tier holds `hash`, reading no block: the disk tier's index; one round trip to
  // a memcached server. May be wrong the other way (memcached may evict at any time).
  virtual bool Contains(const BlockHash& hash) = 0;
  // The record stored under `hash`, validated (CheckRecord with `hash` expected): NOT_FOUND on
  // a miss, including a record that failed validation (counted, deleted) or a server that
  // did not answer.
  virtual absl::StatusOr<std::string> Get(const BlockHash& hash) = 0;
  // Waits until the write-behind queue is empty or `deadline` passes; whether it emptied.
  virtual bool Flush(absl::Time deadline) = 0;
  virtual TierStats Stats() const = 0;
  virtual void SetListener(Listener listener) = 0;
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_CORE_TIER_H_
