#include "daemon/core/parallel_for.h"

namespace kvarn {

ParallelFor::ParallelFor(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { Worker(); });
}

ParallelFor::~ParallelFor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ParallelFor::Worker() {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    ++active_;
    while (next_ < n_) {
      const size_t i = next_++;
      lock.unlock();
      (*fn_)(i);
      lock.lock();
    }
    if (--active_ == 0) done_cv_.notify_all();
  }
}

void ParallelFor::Run(size_t n, const std::function<void(size_t)>& fn) {
  if (workers_.empty() || n <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::lock_guard<std::mutex> run(run_mu_);
  std::unique_lock<std::mutex> lock(mu_);
  fn_ = &fn;
  n_ = n;
  next_ = 0;
  ++generation_;
  ++active_;  // the caller works too
  cv_.notify_all();
  while (next_ < n_) {
    const size_t i = next_++;
    lock.unlock();
    fn(i);
    lock.lock();
  }
  --active_;
  done_cv_.wait(lock, [&] { return active_ == 0; });
  fn_ = nullptr;
  n_ = 0;
}

}  // namespace kvarn
