// A small fixed pool of threads that runs one loop at a time, the caller taking part.
#ifndef KVARN_DAEMON_CORE_PARALLEL_FOR_H_
#define KVARN_DAEMON_CORE_PARALLEL_FOR_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvarn {

// Runs fn(i) for i in [0, n) on `threads` workers (the caller is one of them).
class ParallelFor {
 public:
  explicit ParallelFor(int threads);
  ~ParallelFor();
  ParallelFor(const ParallelFor&) = delete;
  ParallelFor& operator=(const ParallelFor&) = delete;
  void Run(size_t n, const std::function<void(size_t)>& fn);
  int threads() const { return static_cast<int>(workers_.size()) + 1; }

 private:
  void Worker();
  std::mutex run_mu_;  // one Run at a time
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(size_t)>* fn_ = nullptr;
  size_t n_ = 0, next_ = 0, active_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_CORE_PARALLEL_FOR_H_
