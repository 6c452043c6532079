#include "daemon/core/events.h"

namespace kvarn {

void EventLog::Append(BlockEvent e) {
  absl::MutexLock lock(&mu_);
  e.seq = next_seq_++;
  events_.push_back(e);
  if (events_.size() > capacity_) events_.pop_front();
}

std::vector<BlockEvent> EventLog::Read(uint64_t after, size_t max, absl::Duration timeout,
                                       bool* lost) {
  absl::MutexLock lock(&mu_);
  const auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return next_seq_ - 1 > after; };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  std::vector<BlockEvent> out;
  *lost = !events_.empty() && events_.front().seq > after + 1;
  for (const BlockEvent& e : events_) {
    if (e.seq <= after) continue;
    if (out.size() >= max) break;
    out.push_back(e);
  }
  return out;
}

uint64_t EventLog::last_seq() const {
  absl::MutexLock lock(&mu_);
  return next_seq_ - 1;
}

}  // namespace kvarn
