// A device scan of an fp16 pool slot for NaN/Inf, for CudaSealer::CheckTokens. Plain C++
// header over the CUDA runtime API; the kernel lives in nonfinite_scan.cu.
#ifndef KVARN_DAEMON_BACKENDS_NONFINITE_SCAN_H_
#define KVARN_DAEMON_BACKENDS_NONFINITE_SCAN_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/block_layout.h"

namespace kvarn {

// Elements the scan of `count` tokens covers: their rows of the token-major slot, in memory
// order (the order of CpuSealer::CheckTokens): element i is token first + i / T (T =
// fp16_token_elems()), and in its row the (layer-major) slot's key (even) or value (odd) row
// (i % T) / D, channel i % D.
inline uint64_t ScanElements(const BlockLayout& layout, int count) {
  return static_cast<uint64_t>(count) * layout.fp16_token_elems();
}

// Enqueues on `stream`: *first_bad = min(*first_bad, index of every element among tokens
// [first, first + count) of the fp16 slot whose exponent bits are all ones (NaN or Inf)).
// The caller sets *first_bad to UINT64_MAX first (on the same stream); it stays so when
// every element is finite. REQUIRES: count >= 1, [first, first + count) within the tile.
cudaError_t LaunchNonFiniteScan(const uint8_t* slot, const BlockLayout& layout, int first, int count,
                                unsigned long long* first_bad, cudaStream_t stream);

}  // namespace kvarn

#endif  // KVARN_DAEMON_BACKENDS_NONFINITE_SCAN_H_
