// The Sealer for host-accessible memory, on the SIMD codec. Seals fan out over a small
// pool of threads: one block holds num_layers x num_kv_heads independent tiles.
#ifndef KVARN_DAEMON_CORE_CPU_SEALER_H_
#define KVARN_DAEMON_CORE_CPU_SEALER_H_

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "daemon/core/sealer.h"
#include "kernels/block_layout.h"
#include "kernels/preset.h"

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

class CpuSealer final : public Sealer {
 public:
  // seal_threads: workers for one seal (1 = inline).
  CpuSealer(const Preset& preset, const BlockLayout& layout, int seal_threads = 1);

  absl::Status CheckTokens(const uint8_t* slot, int first, int count) override;
  absl::Status SealQuantized(const uint8_t* slot, uint8_t* block) override;
  absl::Status SealSink(const uint8_t* slot, uint8_t* block) override;
  absl::Status CopyTail(const uint8_t* src, uint8_t* dst, int tokens) override;
  absl::Status WriteTokens(uint8_t* slot, int first, int n, const void* keys, const void* values,
                           DType dtype) override;
  absl::Status DecodeTile(const uint8_t* block, bool fp16, int layer, int head, float* keys,
                          float* values) override;
  double SampleError(const uint8_t* slot, const uint8_t* block, int layer, int head) override;

 private:
  Preset preset_;
  BlockLayout layout_;
  std::unique_ptr<ParallelFor> pool_;
};

// absl::Status from a codec status (the codes share numbers).
absl::Status FromCodec(const CodecStatus& s);

}  // namespace kvarn

#endif  // KVARN_DAEMON_CORE_CPU_SEALER_H_
