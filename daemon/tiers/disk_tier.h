// The local disk tier: one file per block record (block_record.h) under a directory the tier
// owns, an LRU over those files bounded in bytes, and one writer thread behind a bounded
// queue (the BlockTier contract, daemon/core/tier.h).
//
// Layout: <dir>/<first 2 hex of the hash>/<64 hex of the hash>.kvb, plus <dir>/LOCK, which
// an open tier holds (flock) so two daemons never share a directory. A file is written to
// <name>.tmp in the same folder (fdatasync'd first if DiskTierOptions::fsync) and renamed into
// place, so a crash never leaves a partial file under a real name.
//
// Open trusts nothing it finds: every file is read and checked (CheckRecord, with the hash
// its name gives); a file that fails, a file whose name is not a record's name, a symlink or
// any other non-regular file is deleted and counted in TierStats::rejected by fault (a file
// that is not a valid record by its content counts by that fault, a valid record under
// another name as wrong_key). Leftover .tmp files are deleted uncounted. Folders the tier did
// not make are left alone. Good files enter the LRU oldest mtime first; a scan that finds more
// than capacity_bytes evicts the oldest. A hit sets the file's mtime, so the order a restart
// rebuilds is that of the last writes and reads (not of re-Puts: Put does no I/O).
//
// Bytes: TierStats::bytes (the indexed files) plus the one file being written never exceed
// capacity_bytes; a record's file is deleted before the write that evicted it begins.
//
// Listener: called only from the writer thread, never under the tier's lock: stored = true
// once a file is in place (with Put's tenant cookie), stored = false when the LRU evicts a
// file or Get finds one bad (cookie 0 for files found at Open). Not called for what Open
// finds (Index() lists them; kvarnd does not announce them on Watch, so a router asks Lookup
// for a node whose disk tier was not empty at start: docs/router.md). It must not wait for
// this tier's Flush (the writer is the thread Flush waits for).
//
// Thread safety: every method may be called concurrently. The destructor writes what is
// queued, then stops the writer; no other call may run concurrently with it.
#ifndef KVARN_DAEMON_TIERS_DISK_TIER_H_
#define KVARN_DAEMON_TIERS_DISK_TIER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "common/unique_fd.h"
#include "daemon/core/block_record.h"
#include "daemon/core/tier.h"

namespace kvarn {

struct DiskTierOptions {
  std::string dir;                      // created if missing (0700); owned by the tier
  uint64_t capacity_bytes = 0;          // bound of the tier's files (record bytes); must be > 0
  uint64_t queue_bytes = 256ull << 20;  // write-behind queue bound; a Put beyond it drops
  TierWrite write = TierWrite::kOnEvict;
  bool fsync = false;  // fdatasync each file before it is renamed into place
};

class DiskTier final : public BlockTier {
 public:
  // Opens (creating if needed) options.dir, scans it as described above and starts the
  // writer. `progress`, if set, is called from this thread every few hundred files scanned
  // and once at the end (done == total). Errors: INVALID_ARGUMENT for an empty dir or a zero
  // capacity; the errno's code, naming the path, for a folder that cannot be created or read;
  // FAILED_PRECONDITION when another open tier holds the directory.
  static absl::StatusOr<std::unique_ptr<DiskTier>> Open(
      const DiskTierOptions& options, const TierIdentity& identity,
      std::function<void(uint64_t done, uint64_t total)> progress = nullptr);

  ~DiskTier() override;
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  std::string_view name() const override { return "disk"; }
  TierWrite write_policy() const override { return options_.write; }
  // Queues the record; a hash already held only moves to the LRU's recent end (no rewrite),
  // and one already queued is not queued twice. false (dropped_writes) when the queue's bytes
  // would pass queue_bytes or `record` is null.
  bool Put(const BlockHash& hash, std::shared_ptr<const std::string> record,
           uint32_t tenant) override;
  // Held or queued; reads nothing and does not touch the LRU.
  bool Contains(const BlockHash& hash) override;
  // A queued record from the queue, a held one from its file; both checked. A hit moves the
  // record to the LRU's recent end. NOT_FOUND on a miss, an I/O error, or a bad record
  // (counted by fault, its file deleted).
  absl::StatusOr<std::string> Get(const BlockHash& hash) override;
  // Waits until the queue is empty, nothing is being written and every listener call due
  // has been made; whether that happened before `deadline`.
  bool Flush(absl::Time deadline) override;
  TierStats Stats() const override;
  void SetListener(Listener listener) override;

  // The records held (found valid at Open, plus those written since), least recently used
  // first: what a warm restart rebuilds the prefix index from.
  std::vector<RecordMeta> Index() const;

 private:
  struct Entry {
    RecordMeta meta;
    uint64_t bytes = 0;
    uint32_t tenant = 0;
    uint64_t generation = 0;  // tells a file rewritten under the same hash from the old one
    std::list<BlockHash>::iterator lru;
  };
  struct Pending {
    BlockHash hash;
    std::shared_ptr<const std::string> record;
    uint32_t tenant = 0;
  };
  // A record that left the index: its file to delete (unless already gone) and the listener
  // to tell.
  struct Removal {
    BlockHash hash;
    uint32_t tenant = 0;
    bool unlink = true;
  };
  struct Found;  // a file the scan found (disk_tier.cc)

  DiskTier(const DiskTierOptions& options, const TierIdentity& identity, UniqueFd lock);
  absl::Status Scan(const std::function<void(uint64_t, uint64_t)>& progress);
  // Reads and checks one file the scan found; false (the file deleted, the fault counted)
  // when it is not a good record.
  bool CheckFound(const Found& f, RecordMeta* meta);
  void WriterLoop();
  // Writes one queued record: checks it, evicts to make room, writes the file, indexes it.
  // Appends what the listener must hear to `removals` and `*stored`.
  void WriteOne(const Pending& job, std::vector<Removal>& removals, bool* stored);
  void DeleteFiles(const std::vector<Removal>& removals);
  // Drops `it`'s entry from the index and LRU. REQUIRES: mu_ held.
  void EraseEntry(absl::flat_hash_map<BlockHash, Entry>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The entry of `hash` if it is still the one of `generation`.
  Entry* Current(const BlockHash& hash, uint64_t generation) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string FolderOf(const BlockHash& hash) const;
  std::string PathOf(const BlockHash& hash) const;

  const DiskTierOptions options_;
  const TierIdentity identity_;
  const UniqueFd lock_;  // flock on <dir>/LOCK, held while open

  mutable Mutex mu_;
  CondVar work_cv_;  // the writer waits for work or stop_
  CondVar idle_cv_;  // Flush waits for the writer to go idle
  absl::flat_hash_map<BlockHash, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::list<BlockHash> lru_ ABSL_GUARDED_BY(mu_);  // least recently used first
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;        // of entries_
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 1;
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);
  // Queued records and the one being written, until it is indexed or dropped.
  absl::flat_hash_map<BlockHash, std::shared_ptr<const std::string>> pending_ ABSL_GUARDED_BY(mu_);
  uint64_t pending_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Removal> removals_ ABSL_GUARDED_BY(mu_);  // from Get, for the writer to carry out
  bool busy_ ABSL_GUARDED_BY(mu_) = false;              // the writer holds work taken off the lists
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<const Listener> listener_ ABSL_GUARDED_BY(mu_);
  TierStats stats_ ABSL_GUARDED_BY(mu_);  // the counters; the gauges are filled by Stats()

  std::thread writer_;  // last: started once everything above is built
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_TIERS_DISK_TIER_H_
