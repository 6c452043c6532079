#include "daemon/metrics/metric.h"

#include <algorithm>
#include <cmath>

namespace kvarn::metrics {

void Counter::Add(double delta) {
  if (!(delta >= 0)) return;  // negative or NaN
  fraction_.fetch_add(delta, std::memory_order_relaxed);
}

double Counter::Value() const {
  return static_cast<double>(whole_.load(std::memory_order_relaxed)) +
         fraction_.load(std::memory_order_relaxed);
}

Histogram::Histogram(absl::Span<const double> bounds)
    : bounds_(bounds), buckets_(new std::atomic<uint64_t>[bounds.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double value) {
  if (std::isnan(value)) return;
  // First bound >= value: "le" buckets are inclusive of their upper bound.
  const size_t index = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) -
                                           bounds_.begin());
  buckets_[index].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Take() const {
  Snapshot snapshot;
  snapshot.cumulative_counts.resize(bounds_.size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    snapshot.cumulative_counts[i] = running;
  }
  snapshot.count = running;
  snapshot.sum = sum_.load(std::memory_order_relaxed);
  return snapshot;
}

}  // namespace kvarn::metrics
