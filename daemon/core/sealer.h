// The data-plane work the core delegates: everything that reads or writes block bytes.
// Block bytes may live in device memory, so the core never touches them itself; the host
// implementation (CpuSealer) runs the SIMD codec, the CUDA one runs kernels.
//
// Thread safety: implementations are called concurrently from several request threads,
// each on different blocks and slots.
#ifndef KVARN_DAEMON_CORE_SEALER_H_
#define KVARN_DAEMON_CORE_SEALER_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "kernels/block_layout.h"
#include "kernels/codec.h"
#include "kernels/preset.h"

namespace kvarn {

// The INVALID_ARGUMENT a CheckTokens gives for the NaN/Inf at element `index` of a tail slot,
// counted in memory order from token `first`'s row (the slot is token-major, BlockLayout):
// every implementation names the same token, layer, kv-head and channel in the same words.
absl::Status NonFiniteTokenError(const BlockLayout& layout, int first, uint64_t index);

class Sealer {
 public:
  virtual ~Sealer() = default;

  // INVALID_ARGUMENT naming the first NaN/Inf among tokens [first, first + count) of a tail
  // slot, in any layer and kv-head.
  virtual absl::Status CheckTokens(const uint8_t* slot, int first, int count) = 0;
  // Quantizes a full tail slot (every layer and kv-head) into a quantized block.
  virtual absl::Status SealQuantized(const uint8_t* slot, uint8_t* block) = 0;
  // Copies a full tail slot into an fp16 sink block and validates the copy (so a client
  // rewriting its tail meanwhile cannot slip NaN into a shared block).
  virtual absl::Status SealSink(const uint8_t* slot, uint8_t* block) = 0;
  // Copies the first `tokens` tokens of every (layer, head) of one slot into another.
  virtual absl::Status CopyTail(const uint8_t* src, uint8_t* dst, int tokens) = 0;
  // Writes n tokens of original-frame K/V laid out [n][layers][kv_heads][head_dim] into a
  // slot at token `first`, rotated into the storage frame as fp16. Writes nothing when the
  // input holds NaN/Inf or values beyond the fp16 range.
  virtual absl::Status WriteTokens(uint8_t* slot, int first, int n, const void* keys,
                                   const void* values, DType dtype) = 0;
  // Decodes one (layer, kv-head) tile to fp32 [G][D] in the original frame. `fp16` selects a
  // sink block or tail slot rather than a quantized block.
  virtual absl::Status DecodeTile(const uint8_t* block, bool fp16, int layer, int head,
                                  float* keys, float* values) = 0;
  // Copies a sealed block (quantized, or an fp16 sink block when `fp16`) to host memory: the
  // payload of a record for a tier below the pool (daemon/core/tier.h).
  virtual absl::Status ExportBlock(const uint8_t* block, bool fp16, uint8_t* out) = 0;
  // Writes a tier's record payload (already validated: block_record.h) from host memory into
  // a block being onboarded; an fp16 block is checked for NaN/Inf as a sealed sink is.
  virtual absl::Status ImportBlock(const uint8_t* in, bool fp16, uint8_t* block) = 0;
  // Relative L2 error of one tile of a freshly sealed block against its fp16 source, for the
  // sampled quantization-error metric. Negative when unavailable.
  virtual double SampleError(const uint8_t* slot, const uint8_t* block, int layer, int head) = 0;
};

// Builds the sealer of a pool (the backend decides which: CPU codec or CUDA kernels).
using SealerFactory = std::function<std::unique_ptr<Sealer>(const Preset&, const BlockLayout&)>;

}  // namespace kvarn

#endif  // KVARN_DAEMON_CORE_SEALER_H_
