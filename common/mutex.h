// The project's mutex, lock guard, condition variable and notification: std::mutex and
// std::condition_variable underneath, Abseil's thread-safety annotations on top, so clang's
// -Wthread-safety checks every guarded field as it does with absl::Mutex.
//
// Why not absl::Mutex: Debian ships Abseil uninstrumented, and ThreadSanitizer cannot see its
// futex-based locking, so every field it guards shows up as a data race (checked: two threads
// incrementing a counter under absl::MutexLock are reported). pthread mutexes are intercepted
// by TSan, so with these the TSan job sees the real synchronization. (Debian's Abseil also
// runs its deadlock detector on every lock.)
//
// Thread safety: as std::mutex; AssertHeld checks ownership in debug builds.
#ifndef KVARN_COMMON_MUTEX_H_
#define KVARN_COMMON_MUTEX_H_

#include <atomic>
#include <cassert>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvarn {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    mu_.lock();
#ifndef NDEBUG
    owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
#endif
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
#ifndef NDEBUG
    owner_.store(std::thread::id(), std::memory_order_relaxed);
#endif
    mu_.unlock();
  }
  // Tells the analysis (and, in debug builds, checks) that this thread holds the lock.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {
#ifndef NDEBUG
    assert(owner_.load(std::memory_order_relaxed) == std::this_thread::get_id());
#endif
  }

 private:
  friend class CondVar;
  std::mutex mu_;
#ifndef NDEBUG
  std::atomic<std::thread::id> owner_{};
#endif
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

class CondVar {
 public:
  // REQUIRES: `mu` held; it is released while waiting and held again on return. Wakes
  // spuriously like std::condition_variable: wait in a loop over the condition.
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> l(mu->mu_, std::adopt_lock);
    Disown(mu);
    cv_.wait(l);
    Own(mu);
    l.release();
  }
  // As Wait, giving up at `deadline`; true when the deadline passed.
  bool WaitUntil(Mutex* mu, absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> l(mu->mu_, std::adopt_lock);
    Disown(mu);
    const bool timed_out = cv_.wait_until(l, absl::ToChronoTime(deadline)) == std::cv_status::timeout;
    Own(mu);
    l.release();
    return timed_out;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  static void Disown([[maybe_unused]] Mutex* mu) {
#ifndef NDEBUG
    mu->owner_.store(std::thread::id(), std::memory_order_relaxed);
#endif
  }
  static void Own([[maybe_unused]] Mutex* mu) {
#ifndef NDEBUG
    mu->owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
#endif
  }
  std::condition_variable cv_;
};

// A one-shot event: Notify once, wait any number of times.
class Notification {
 public:
  void Notify() {
    MutexLock lock(&mu_);
    notified_ = true;
    cv_.SignalAll();
  }
  bool HasBeenNotified() {
    MutexLock lock(&mu_);
    return notified_;
  }
  // True when notified within `timeout`.
  bool WaitForNotificationWithTimeout(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    MutexLock lock(&mu_);
    while (!notified_) {
      if (cv_.WaitUntil(&mu_, deadline)) return notified_;
    }
    return true;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  bool notified_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace kvarn

#endif  // KVARN_COMMON_MUTEX_H_
