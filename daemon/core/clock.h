// Time, injected: the core never reads a clock of its own, so lease expiry is testable with
// a fake clock.
#ifndef KVARN_DAEMON_CORE_CLOCK_H_
#define KVARN_DAEMON_CORE_CLOCK_H_

#include "common/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvarn {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

class SystemClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  static SystemClock* Get() {
    static SystemClock clock;
    return &clock;
  }
};

// A clock that moves only when told to. Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch() + absl::Hours(24)) : now_(start) {}
  absl::Time Now() const override {
    MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_CORE_CLOCK_H_
