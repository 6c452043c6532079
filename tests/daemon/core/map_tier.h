// A tier below the pool in a map, for the core's tests and its fuzzer: it validates what it
// serves as the real tiers do (CheckRecord), unless told not to (a faulty tier, which the core
// must survive too), and can refuse writes. Put is synchronous and calls the listener.
#ifndef KVARN_TESTS_DAEMON_CORE_MAP_TIER_H_
#define KVARN_TESTS_DAEMON_CORE_MAP_TIER_H_

#include <map>
#include <memory>
#include <string>

#include "common/mutex.h"
#include "daemon/core/block_record.h"
#include "daemon/core/tier.h"

namespace kvarn::testing {

class MapTier final : public BlockTier {
 public:
  MapTier(const TierIdentity& id, TierWrite write, std::string name = "map") : id_(id), write_(write), name_(std::move(name)) {}

  std::string_view name() const override { return name_; }
  TierWrite write_policy() const override { return write_; }
  bool Put(const BlockHash& hash, std::shared_ptr<const std::string> record, uint32_t tenant) override {
    Listener l;
    {
      MutexLock lock(&mu_);
      if (refuse_puts) return false;
      ++puts;
      records[hash] = *record;
      l = listener_;
    }
    if (l) l(hash, true, tenant);
    return true;
  }
  bool Contains(const BlockHash& hash) override {
    MutexLock lock(&mu_);
    return records.contains(hash);
  }
  absl::StatusOr<std::string> Get(const BlockHash& hash) override {
    MutexLock lock(&mu_);
    auto it = records.find(hash);
    if (it == records.end()) return absl::NotFoundError("miss");
    // A tier that does not validate plays a faulty one: the core must still refuse.
    if (validate) {
      RecordFault fault;
      if (!CheckRecord(id_, it->second, &hash, &fault).ok()) return absl::NotFoundError("rejected");
    }
    ++gets;
    return it->second;
  }
  bool Flush(absl::Time) override { return true; }
  TierStats Stats() const override {
    MutexLock lock(&mu_);
    TierStats s;
    s.blocks = records.size();
    s.hits = gets;
    return s;
  }
  void SetListener(Listener listener) override {
    MutexLock lock(&mu_);
    listener_ = std::move(listener);
  }

  // The tier lets a record go (its own LRU, or a read found it bad) and says so.
  void Drop(const BlockHash& hash) {
    Listener l;
    {
      MutexLock lock(&mu_);
      records.erase(hash);
      l = listener_;
    }
    if (l) l(hash, false, 0);
  }

  size_t size() const {
    MutexLock lock(&mu_);
    return records.size();
  }

  mutable Mutex mu_;
  std::map<BlockHash, std::string> records;  // tests touch these single-threaded
  uint64_t puts = 0, gets = 0;
  bool validate = true;
  bool refuse_puts = false;

 private:
  const TierIdentity id_;
  const TierWrite write_;
  const std::string name_;
  Listener listener_;
};

}  // namespace kvarn::testing

#endif  // KVARN_TESTS_DAEMON_CORE_MAP_TIER_H_
