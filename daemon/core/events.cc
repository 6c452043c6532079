#include "daemon/core/events.h"

namespace kvarn {

void EventLog::Append(BlockEvent e) {
  MutexLock lock(&mu_);
  e.seq = next_seq_++;
  events_.push_back(e);
  if (events_.size() > capacity_) events_.pop_front();
  arrived_.SignalAll();
}

std::vector<BlockEvent> EventLog::Read(uint64_t after, size_t max, absl::Duration timeout,
                                       bool* lost) {
  const absl::Time deadline = absl::Now() + timeout;
  MutexLock lock(&mu_);
  const uint64_t wakes = wakes_;
  while (next_seq_ - 1 <= after && wakes_ == wakes) {
    if (arrived_.WaitUntil(&mu_, deadline)) break;
  }
  std::vector<BlockEvent> out;
  *lost = !events_.empty() && events_.front().seq > after + 1;
  for (const BlockEvent& e : events_) {
    if (e.seq <= after) continue;
    if (out.size() >= max) break;
    out.push_back(e);
  }
  return out;
}

void EventLog::Wake() {
  MutexLock lock(&mu_);
  ++wakes_;
  arrived_.SignalAll();
}

uint64_t EventLog::last_seq() const {
  MutexLock lock(&mu_);
  return next_seq_ - 1;
}

}  // namespace kvarn
