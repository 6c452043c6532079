// Waiting on a condition in a test: poll it, with a deadline (tests never sleep for a
// condition to become true, and never assert on how long something took).
#ifndef KVARN_TESTS_COMMON_WAIT_FOR_H_
#define KVARN_TESTS_COMMON_WAIT_FOR_H_

#include <functional>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvarn::testing {

// Polls `done` (every millisecond) until it holds or `timeout` passes; returns its last value.
inline bool WaitFor(const std::function<bool()>& done, absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() >= deadline) return done();
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

}  // namespace kvarn::testing

#endif  // KVARN_TESTS_COMMON_WAIT_FOR_H_
