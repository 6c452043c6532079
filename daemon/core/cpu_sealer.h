// The Sealer for host-accessible memory, on the SIMD codec. Seals fan out over a small
// pool of threads (parallel_for.h): one block holds num_layers x num_kv_heads independent
// tiles.
#ifndef KVARN_DAEMON_CORE_CPU_SEALER_H_
#define KVARN_DAEMON_CORE_CPU_SEALER_H_

#include <memory>

#include "daemon/core/parallel_for.h"
#include "daemon/core/sealer.h"
#include "kernels/block_layout.h"
#include "kernels/preset.h"

namespace kvarn {

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
  absl::Status ExportBlock(const uint8_t* block, bool fp16, uint8_t* out) override;
  absl::Status ImportBlock(const uint8_t* in, bool fp16, uint8_t* block) override;
  double SampleError(const uint8_t* slot, const uint8_t* block, int layer, int head) override;

 private:
  Preset preset_;
  BlockLayout layout_;
  std::unique_ptr<ParallelFor> pool_;
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_CORE_CPU_SEALER_H_
