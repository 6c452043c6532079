// Runs a CUDA kernel body (kernels/cuda/*_body.h) for one thread block on the CPU: every
// thread is a fiber, and __syncthreads, __syncthreads_or, __shfl_xor_sync and __syncwarp
// become cooperative barriers. This is how the kernels are tested on machines without a GPU.
//
// What it checks beyond the arithmetic: every barrier must be reached by all threads of the
// block (all lanes of the warp for warp operations) or the run aborts, naming the states;
// and running the fibers in different orders between barriers (forward, reverse, shuffled)
// changes the result when a body has a shared-memory race that a barrier should prevent.
// What it cannot check: device math libraries, resource limits, memory coalescing, and a
// shared-memory race between lanes of one warp that only a shuffle separates (its shuffles
// are warp barriers; the hardware's order no memory: compute-sanitizer's racecheck on a GPU
// finds those, tests/gpu/run_gpu_checks.sh).
//
// Not thread-safe; one Run at a time per emulator.
#ifndef KVARN_TESTS_GPU_BLOCK_EMULATOR_H_
#define KVARN_TESTS_GPU_BLOCK_EMULATOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <vector>

namespace kvarn::cuda::emu {

enum class Order { kForward, kReverse, kShuffled };

class BlockEmulator;

// The Ctx of block_ops.h for one emulated thread.
class EmuCtx {
 public:
  EmuCtx(BlockEmulator* emu, int tid) : emu_(emu), tid_(tid) {}
  int tid() const { return tid_; }
  int nthreads() const;
  int lane() const { return tid_ & 31; }
  int warp() const { return tid_ >> 5; }
  int nwarps() const { return nthreads() >> 5; }
  void Sync() const;
  int SyncOr(int v) const;
  void SyncWarp() const;
  float ShflXor(float v, int mask) const;
  double ShflXor(double v, int mask) const;
  void AtomicOr(int32_t* p, int32_t v) const { *p |= v; }

 private:
  uint64_t Exchange(uint64_t bits, int mask) const;
  BlockEmulator* emu_;
  int tid_;
};

class BlockEmulator {
 public:
  // REQUIRES: threads is a positive multiple of 32.
  explicit BlockEmulator(int threads, Order order = Order::kForward, uint64_t seed = 1);
  ~BlockEmulator();
  BlockEmulator(const BlockEmulator&) = delete;
  BlockEmulator& operator=(const BlockEmulator&) = delete;

  // Runs body(ctx) on every thread of one block; returns when all threads have returned.
  void Run(const std::function<void(const EmuCtx&)>& body);

  int threads() const { return threads_; }
  uint64_t barriers() const { return barriers_; }  // block barriers completed, all runs

 private:
  friend class EmuCtx;
  enum class State { kRunnable, kBlockBarrier, kWarpBarrier, kDone };
  struct Fiber;

  static void Entry(unsigned hi, unsigned lo);
  void Park(int tid, State state);  // called on the fiber: wait at a barrier
  [[noreturn]] void Fail(const char* what) const;

  const int threads_;
  const Order order_;
  std::mt19937_64 rng_;
  std::vector<std::unique_ptr<Fiber>> fibers_;
  std::unique_ptr<struct EmuMainContext> main_;
  const std::function<void(const EmuCtx&)>* body_ = nullptr;
  int current_ = -1;
  uint64_t generation_ = 0;  // block barriers completed in this run
  uint64_t barriers_ = 0;
  int or_acc_[2] = {0, 0};
  std::vector<uint64_t> exchange_;
};

}  // namespace kvarn::cuda::emu

#endif  // KVARN_TESTS_GPU_BLOCK_EMULATOR_H_
