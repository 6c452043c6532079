// One interface over the two executors of the CUDA kernels, so that every check is written
// once: DeviceRunner (the real kernels through kernels/cuda/cuda_codec.h, copying to and
// from the GPU) and EmuRunner (the same kernel bodies and launch parameters on the CPU block
// emulator). All buffers here are host memory.
#ifndef KVARN_TESTS_GPU_RUNNER_H_
#define KVARN_TESTS_GPU_RUNNER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/block_layout.h"
#include "kernels/codec.h"
#include "kernels/cuda/types.h"
#include "kernels/preset.h"
#include "kernels/status.h"
#include "tests/gpu/block_emulator.h"

namespace kvarn::cuda::testing {

// An attention batch in host memory (see AttendArgs).
struct HostAttend {
  std::vector<uint8_t> quant_pool;  // num_quant_blocks * quant_block_bytes()
  int64_t num_quant_blocks = 0;
  std::vector<uint16_t> fp16_pool;  // num_fp16_blocks * fp16_block_bytes() / 2
  int64_t num_fp16_blocks = 0;
  std::vector<AttendSequence> seqs;
  std::vector<int32_t> tile_ids;
  int layer = 0;
  int num_q_heads = 0;
  std::vector<float> queries;  // [seqs][Hq][D]
  float softmax_scale = 0.0f;
  int num_splits = 1;
};

class KernelRunner {
 public:
  virtual ~KernelRunner() = default;
  virtual const char* name() const = 0;

  // `in` holds host pointers to layout.slots() tiles, slot_stride elements apart.
  virtual CodecStatus Encode(const Preset& preset, const BlockLayout& layout, const TileSource& in,
                             int iterations, std::vector<uint8_t>* block,
                             std::vector<int32_t>* status) = 0;
  // Decoded keys and values, [slots][G][D] elements of `dtype`, as raw bytes.
  virtual CodecStatus Decode(const Preset& preset, const BlockLayout& layout,
                             const std::vector<uint8_t>& block, DType dtype, Frame frame,
                             std::vector<uint8_t>* keys, std::vector<uint8_t>* values,
                             std::vector<int32_t>* status) = 0;
  // Writes into *fp16_block (fp16_block_bytes() / 2 elements, updated in place).
  virtual CodecStatus Store(const Preset& preset, const BlockLayout& layout, const TokenSource& in,
                            int num_tokens, int layer, int token_offset,
                            std::vector<uint16_t>* fp16_block, std::vector<int32_t>* status) = 0;
  // out: [seqs][Hq][D]; lse (optional): [seqs][Hq].
  virtual CodecStatus Attend(const Preset& preset, const BlockLayout& layout, const HostAttend& in,
                             std::vector<float>* out, std::vector<int32_t>* status,
                             std::vector<float>* lse = nullptr) = 0;
};

// The CPU emulator of the kernels. `order`: fiber order between barriers (race detection).
std::unique_ptr<KernelRunner> MakeEmuRunner(emu::Order order = emu::Order::kForward);

// The GPU. REQUIRES: a device is available (DeviceAvailable()).
std::unique_ptr<KernelRunner> MakeDeviceRunner();

}  // namespace kvarn::cuda::testing

#endif  // KVARN_TESTS_GPU_RUNNER_H_
