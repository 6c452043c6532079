#include "tests/gpu/block_emulator.h"

#include <ucontext.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>

namespace kvarn::cuda::emu {

namespace {
constexpr size_t kStackBytes = 256 * 1024;
}  // namespace

struct EmuMainContext {
  ucontext_t ctx;
};

struct BlockEmulator::Fiber {
  ucontext_t ctx;
  std::unique_ptr<char[]> stack{new char[kStackBytes]};
  State state = State::kDone;
};

int EmuCtx::nthreads() const { return emu_->threads_; }

void EmuCtx::Sync() const { emu_->Park(tid_, BlockEmulator::State::kBlockBarrier); }

int EmuCtx::SyncOr(int v) const {
  const uint64_t k = emu_->generation_;
  emu_->or_acc_[k & 1] |= v != 0;
  Sync();
  return emu_->or_acc_[k & 1];
}

void EmuCtx::SyncWarp() const { emu_->Park(tid_, BlockEmulator::State::kWarpBarrier); }

uint64_t EmuCtx::Exchange(uint64_t bits, int mask) const {
  emu_->exchange_[tid_] = bits;
  SyncWarp();
  const uint64_t r = emu_->exchange_[tid_ ^ mask];
  SyncWarp();  // nobody overwrites its slot before every lane has read
  return r;
}

float EmuCtx::ShflXor(float v, int mask) const {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  const uint32_t r = static_cast<uint32_t>(Exchange(u, mask));
  float f;
  std::memcpy(&f, &r, 4);
  return f;
}

double EmuCtx::ShflXor(double v, int mask) const {
  uint64_t u;
  std::memcpy(&u, &v, 8);
  const uint64_t r = Exchange(u, mask);
  double f;
  std::memcpy(&f, &r, 8);
  return f;
}

BlockEmulator::BlockEmulator(int threads, Order order, uint64_t seed)
    : threads_(threads), order_(order), rng_(seed), main_(new EmuMainContext) {
  if (threads <= 0 || threads % 32 != 0) Fail("threads must be a positive multiple of 32");
  for (int i = 0; i < threads; ++i) fibers_.push_back(std::make_unique<Fiber>());
  exchange_.assign(static_cast<size_t>(threads), 0);
}

BlockEmulator::~BlockEmulator() = default;

void BlockEmulator::Fail(const char* what) const {
  std::string states;
  for (int i = 0; i < threads_; ++i) {
    const State s = fibers_[i]->state;
    states += s == State::kRunnable       ? 'R'
              : s == State::kBlockBarrier ? 'B'
              : s == State::kWarpBarrier  ? 'W'
                                          : 'D';
  }
  std::fprintf(
      stderr,
      "block emulator: %s\n  thread states (R run, B block barrier, W warp barrier, D done): %s\n",
      what, states.c_str());
  std::abort();
}

void BlockEmulator::Entry(unsigned hi, unsigned lo) {
  auto* emu = reinterpret_cast<BlockEmulator*>((static_cast<uintptr_t>(hi) << 32) |
                                               static_cast<uintptr_t>(lo));
  const int tid = emu->current_;
  (*emu->body_)(EmuCtx(emu, tid));
  emu->fibers_[tid]->state = State::kDone;
  // Returning resumes uc_link, the scheduler.
}

void BlockEmulator::Park(int tid, State state) {
  fibers_[tid]->state = state;
  swapcontext(&fibers_[tid]->ctx, &main_->ctx);
}

void BlockEmulator::Run(const std::function<void(const EmuCtx&)>& body) {
  body_ = &body;
  generation_ = 0;
  or_acc_[0] = or_acc_[1] = 0;
  const uintptr_t self = reinterpret_cast<uintptr_t>(this);
  for (auto& f : fibers_) {
    getcontext(&f->ctx);
    f->ctx.uc_stack.ss_sp = f->stack.get();
    f->ctx.uc_stack.ss_size = kStackBytes;
    f->ctx.uc_link = &main_->ctx;
    makecontext(&f->ctx, reinterpret_cast<void (*)()>(&BlockEmulator::Entry), 2,
                static_cast<unsigned>(self >> 32), static_cast<unsigned>(self & 0xFFFFFFFFu));
    f->state = State::kRunnable;
  }
  std::vector<int> order(static_cast<size_t>(threads_));
  std::iota(order.begin(), order.end(), 0);
  if (order_ == Order::kReverse) std::reverse(order.begin(), order.end());
  for (;;) {
    if (order_ == Order::kShuffled) std::shuffle(order.begin(), order.end(), rng_);
    for (int i : order) {
      if (fibers_[i]->state != State::kRunnable) continue;
      current_ = i;
      swapcontext(&main_->ctx, &fibers_[i]->ctx);
    }
    int done = 0, block = 0;
    for (const auto& f : fibers_) {
      done += f->state == State::kDone;
      block += f->state == State::kBlockBarrier;
    }
    if (done == threads_) break;
    bool released = false;
    for (int w = 0; w < threads_ / 32; ++w) {
      int waiting = 0;
      for (int l = 0; l < 32; ++l) waiting += fibers_[w * 32 + l]->state == State::kWarpBarrier;
      if (waiting == 32) {
        for (int l = 0; l < 32; ++l) fibers_[w * 32 + l]->state = State::kRunnable;
        released = true;
      }
    }
    if (block == threads_) {
      or_acc_[(generation_ + 1) & 1] = 0;
      ++generation_;
      ++barriers_;
      for (auto& f : fibers_) f->state = State::kRunnable;
      released = true;
    }
    if (!released) {
      Fail(done > 0 ? "a barrier is waited on by some threads while others have exited"
                    : "deadlock: threads wait at different barriers (divergent __syncthreads or "
                      "shuffle)");
    }
  }
  body_ = nullptr;
}

}  // namespace kvarn::cuda::emu
