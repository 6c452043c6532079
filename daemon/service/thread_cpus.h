// The calling thread's CPUs, injected: the commit ring server reads and narrows its drain
// thread's mask only through this, so a test can give it a mask of more CPUs than the machine
// has (tests/daemon/service/fake_thread_cpus.h) and check where it would place the thread.
#ifndef KVARN_DAEMON_SERVICE_THREAD_CPUS_H_
#define KVARN_DAEMON_SERVICE_THREAD_CPUS_H_

#include <sched.h>

namespace kvarn {

class ThreadCpus {
 public:
  virtual ~ThreadCpus() = default;
  // The calling thread's mask; false when it cannot be read.
  virtual bool GetMask(cpu_set_t* mask) const = 0;
  // Restricts the calling thread to `mask`; false when the system refuses (a CPU gone
  // offline, one outside the cgroup's set).
  virtual bool SetMask(const cpu_set_t& mask) const = 0;
  // The CPU the calling thread runs on now; -1 when unknown.
  virtual int Current() const = 0;
};

// sched_getaffinity, sched_setaffinity and sched_getcpu of the calling thread.
class SystemThreadCpus final : public ThreadCpus {
 public:
  bool GetMask(cpu_set_t* mask) const override {
    return sched_getaffinity(0, sizeof(*mask), mask) == 0;
  }
  bool SetMask(const cpu_set_t& mask) const override {
    return sched_setaffinity(0, sizeof(mask), &mask) == 0;
  }
  int Current() const override { return sched_getcpu(); }
  static const SystemThreadCpus* Get() {
    static const SystemThreadCpus cpus;
    return &cpus;
  }
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_SERVICE_THREAD_CPUS_H_
