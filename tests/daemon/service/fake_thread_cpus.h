// A ThreadCpus (daemon/service/thread_cpus.h) whose mask holds CPUs the machine lacks, so
// that placement across more CPUs than the machine has can be tested on it. Narrowing to a mask
// narrows the real thread to that mask's real CPUs, or leaves it on the whole real mask when the
// mask has none (the thread has to run somewhere; it then counts as on the mask's lowest CPU).
// Every mask set is recorded, so a test can wait for the one it expects. Thread-safe.
#ifndef KVARN_TESTS_DAEMON_SERVICE_FAKE_THREAD_CPUS_H_
#define KVARN_TESTS_DAEMON_SERVICE_FAKE_THREAD_CPUS_H_

#include <sched.h>

#include <algorithm>
#include <vector>

#include "common/mutex.h"
#include "daemon/service/thread_cpus.h"

namespace kvarn::testing {

class FakeThreadCpus final : public ThreadCpus {
 public:
  // The mask: the real CPUs `real` (the drain thread's own mask), and `extra` CPUs numbered
  // above them.
  FakeThreadCpus(const std::vector<int>& real, int extra) {
    CPU_ZERO(&real_);
    int top = -1;
    for (int c : real) {
      CPU_SET(c, &real_);
      top = std::max(top, c);
    }
    mask_ = real_;
    for (int i = 1; i <= extra && top + i < CPU_SETSIZE; ++i) {
      CPU_SET(top + i, &mask_);
      extra_.push_back(top + i);
    }
  }

  // The CPUs added, none of which the machine has.
  const std::vector<int>& extra() const { return extra_; }

  bool GetMask(cpu_set_t* mask) const override {
    *mask = mask_;
    return true;
  }
  bool SetMask(const cpu_set_t& mask) const override {
    cpu_set_t outside;  // the mask's CPUs that GetMask never gave
    CPU_XOR(&outside, &mask, &mask_);
    CPU_AND(&outside, &outside, &mask);
    if (CPU_COUNT(&mask) == 0 || CPU_COUNT(&outside) != 0) return false;
    cpu_set_t real;
    CPU_AND(&real, &mask, &real_);
    if (CPU_COUNT(&real) == 0) real = real_;
    if (!SystemThreadCpus::Get()->SetMask(real)) return false;
    MutexLock lock(&mu_);
    set_.push_back(mask);
    return true;
  }
  int Current() const override {
    const int on = sched_getcpu();
    MutexLock lock(&mu_);
    if (set_.empty() || (on >= 0 && CPU_ISSET(on, &set_.back()))) return on;
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set_.back())) return c;
    }
    return on;
  }

  // The masks set so far, in order.
  std::vector<cpu_set_t> masks_set() const {
    MutexLock lock(&mu_);
    return set_;
  }

 private:
  cpu_set_t real_;
  cpu_set_t mask_;
  std::vector<int> extra_;
  mutable Mutex mu_;
  mutable std::vector<cpu_set_t> set_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvarn::testing

#endif  // KVARN_TESTS_DAEMON_SERVICE_FAKE_THREAD_CPUS_H_
