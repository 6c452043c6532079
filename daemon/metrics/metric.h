// The three value types a family hands out: Counter, Gauge and Histogram. Each is one time
// series (a family plus one set of label values). They are lock-free: every update is a
// handful of atomic operations, so hot paths keep a reference (from Family::WithLabels) and
// update it with no registry lookup and no mutex.
//
// Thread safety: every method may be called concurrently from any thread. Objects are
// created only by their family and live as long as the Registry that owns it.
#ifndef KVARN_DAEMON_METRICS_METRIC_H_
#define KVARN_DAEMON_METRICS_METRIC_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/types/span.h"

namespace kvarn::metrics {

template <typename T>
class Family;

// A monotonically increasing total, e.g. evictions or queried tokens. Whole increments take
// a wait-free integer fetch_add; fractional ones (seconds spent) a separate double, so the
// common integer path never spins on a compare-exchange loop.
class Counter {
 public:
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  void Increment(uint64_t n = 1) { whole_.fetch_add(n, std::memory_order_relaxed); }

  // Adds a non-negative amount. A negative or NaN `delta` is dropped: a counter that goes
  // down reads as a process restart to Prometheus' rate(), which is worse than a lost sample.
  void Add(double delta);

  double Value() const;

 private:
  template <typename T>
  friend class Family;
  Counter() = default;

  std::atomic<uint64_t> whole_{0};
  std::atomic<double> fraction_{0.0};
};

// A value that goes up and down, e.g. live sessions or bytes in use.
class Gauge {
 public:
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Increment(double delta = 1.0) { value_.fetch_add(delta, std::memory_order_relaxed); }
  void Decrement(double delta = 1.0) { value_.fetch_sub(delta, std::memory_order_relaxed); }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  template <typename T>
  friend class Family;
  Gauge() = default;

  std::atomic<double> value_{0.0};
};

// Observations counted into fixed buckets, e.g. seal latency. Bucket i counts observations
// v with bounds[i-1] < v <= bounds[i]; the last bucket (+Inf) counts the rest.
class Histogram {
 public:
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  // A NaN observation is dropped: it would turn _sum into NaN for the life of the process.
  void Observe(double value);

  // A consistent-enough view for exposition. Taken while Observe() runs concurrently, the
  // counts are each exact at some instant and `count` is their total, so the +Inf bucket
  // always equals _count; `sum` may be one observation ahead of or behind the counts.
  struct Snapshot {
    std::vector<uint64_t> cumulative_counts;  // one per bound, then +Inf
    uint64_t count = 0;
    double sum = 0;
  };
  Snapshot Take() const;

  // The finite upper bounds, strictly increasing.
  absl::Span<const double> bounds() const { return bounds_; }

 private:
  template <typename T>
  friend class Family;
  // REQUIRES: `bounds` strictly increasing, finite, and outliving this object (the family
  // owns them).
  explicit Histogram(absl::Span<const double> bounds);

  absl::Span<const double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1, not cumulative
  std::atomic<double> sum_{0.0};
};

}  // namespace kvarn::metrics

#endif  // KVARN_DAEMON_METRICS_METRIC_H_
