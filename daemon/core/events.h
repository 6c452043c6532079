// Block stored/removed events for Watch streams: a bounded log with sequence numbers that
// watchers poll, so the core never calls out to a slow consumer while holding its lock.
#ifndef KVARN_DAEMON_CORE_EVENTS_H_
#define KVARN_DAEMON_CORE_EVENTS_H_

#include <cstdint>
#include <deque>
#include <vector>

#include "common/mutex.h"
#include "absl/time/time.h"
#include "common/prefix_hash.h"

namespace kvarn {

inline constexpr uint32_t kNoTenant = UINT32_MAX;

struct BlockEvent {
  enum class Kind { kStored, kRemoved };
  Kind kind = Kind::kStored;
  BlockHash hash{};
  BlockHash parent_hash{};
  uint32_t block = 0;
  bool fp16 = false;
  uint32_t tenant = 0;  // kNoTenant: a tier's record whose tenant the daemon does not know
  uint8_t tier = 0;     // 0: the pool; t + 1: tier t below it (KvCore::tier_name)
  uint64_t seq = 0;     // assigned by the log, increasing from 1
};

class EventLog {
 public:
  explicit EventLog(size_t capacity = 65536) : capacity_(capacity) {}

  void Append(BlockEvent e) ABSL_LOCKS_EXCLUDED(mu_);

  // Events with seq > after, at most max; waits up to `timeout` for the first one. `lost` is
  // set when events after `after` were dropped (the watcher fell behind the log).
  std::vector<BlockEvent> Read(uint64_t after, size_t max, absl::Duration timeout, bool* lost)
      ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t last_seq() const ABSL_LOCKS_EXCLUDED(mu_);
  // Ends every Read waiting now, with what it has (possibly nothing): a watcher that is
  // stopping does not sit out its poll interval.
  void Wake() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const size_t capacity_;
  mutable Mutex mu_;
  std::deque<BlockEvent> events_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t wakes_ ABSL_GUARDED_BY(mu_) = 0;
  CondVar arrived_;  // signalled on every Append
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_CORE_EVENTS_H_
