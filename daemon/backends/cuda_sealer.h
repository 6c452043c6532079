// The Sealer for the CUDA backend: every slot and block pointer it is given is device memory
// of the daemon's own slabs (cuda_backend.h), and it runs the CUDA codec
// (kernels/cuda/cuda_codec.h) on the daemon's own streams.
//
// Work runs on a "lane": a non-blocking stream with its device and pinned host scratch.
// A call takes a free lane (creating one while fewer than max_lanes exist, else waiting),
// enqueues its work, synchronizes the lane's stream, checks the kernels' status words and
// returns the lane. So every call is complete when it returns: a sealed block is fully
// written before the core publishes it, and nothing a call wrote is still in flight when the
// next append of the sequence starts.
//
// The append contract this relies on (docs/cuda_backend.md): the worker's writes into its
// tail slot (its own kernels, or the client library's Stage) have completed before it sends
// Commit; the daemon's streams do not wait for any stream of the worker's.
//
// Errors: INVALID_ARGUMENT for NaN/Inf or out-of-range input (found on the host for inline
// K/V, on the device for tail slots), INTERNAL for CUDA runtime errors and corrupt records.
// A device-side failure may leave the destination partly written; the core never publishes
// a block whose seal failed.
//
// Memory outside the pool: each lane holds up to 2 x G x layers x kv-heads x head_dim x 4
// bytes of device scratch (inline appends of fp32 K/V) and a few tiles of pinned host memory.
//
// Thread safety: all methods may be called concurrently (on different blocks and slots, as
// the Sealer contract says).
#ifndef KVARN_DAEMON_BACKENDS_CUDA_SEALER_H_
#define KVARN_DAEMON_BACKENDS_CUDA_SEALER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "daemon/core/sealer.h"
#include "kernels/block_layout.h"
#include "kernels/preset.h"

namespace kvarn {

class CudaSealer final : public Sealer {
 public:
  // REQUIRES: max_lanes >= 1. Creates no CUDA resources until the first call.
  CudaSealer(const Preset& preset, const BlockLayout& layout, int device, int max_lanes = 4);
  ~CudaSealer() override;

  absl::Status CheckTokens(const uint8_t* slot, int first, int count) override;
  absl::Status SealQuantized(const uint8_t* slot, uint8_t* block) override;
  absl::Status SealSink(const uint8_t* slot, uint8_t* block) override;
  absl::Status CopyTail(const uint8_t* src, uint8_t* dst, int tokens) override;
  absl::Status ExportBlock(const uint8_t* block, bool fp16, uint8_t* out) override;
  absl::Status ImportBlock(const uint8_t* in, bool fp16, uint8_t* block) override;
  absl::Status WriteTokens(uint8_t* slot, int first, int n, const void* keys, const void* values,
                           DType dtype) override;
  absl::Status DecodeTile(const uint8_t* block, bool fp16, int layer, int head, float* keys,
                          float* values) override;
  double SampleError(const uint8_t* slot, const uint8_t* block, int layer, int head) override;

  // Lanes created so far (for tests and the docs' memory figure).
  int lanes_created() const;

 private:
  struct Lane;
  class LaneLease;

  absl::StatusOr<std::unique_ptr<Lane>> NewLane() const;
  absl::StatusOr<LaneLease> Acquire() ABSL_LOCKS_EXCLUDED(mu_);
  void Return(std::unique_ptr<Lane> lane) ABSL_LOCKS_EXCLUDED(mu_);

  // Scans tokens [first, first + count) of every (layer, head) of an fp16 slot on `lane`.
  absl::Status Scan(Lane& lane, const uint8_t* slot, int first, int count);
  // A whole block between host and device memory (ExportBlock, ImportBlock: `import` copies
  // host to device and scans an fp16 block as a sealed sink is).
  absl::Status CopyBlock(uint8_t* dst, const uint8_t* src, bool fp16, bool import);
  // Decodes the (layer, head) record of a quantized block into the lane's device scratch
  // (keys then values, [G][D] f32 each) in `frame`, and checks its status.
  absl::Status DecodeRecord(Lane& lane, const uint8_t* block, int layer, int head, Frame frame);
  // Enqueues the copy of (layer, head)'s fp16 keys then values, [G][D] each, from a token-major
  // device block to host memory `out` (2 * tile_elems binary16).
  absl::Status FetchFp16Tile(Lane& lane, const uint8_t* block, int layer, int head, uint8_t* out);

  const Preset preset_;
  const BlockLayout layout_;
  const BlockLayout one_tile_;  // a one-(layer, head) layout: decodes a single record
  const int device_;
  const int max_lanes_;

  mutable Mutex mu_;
  CondVar lane_free_;  // signalled when a lane is returned or a reservation fails
  std::vector<std::unique_ptr<Lane>> free_lanes_ ABSL_GUARDED_BY(mu_);
  int lanes_created_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_BACKENDS_CUDA_SEALER_H_
