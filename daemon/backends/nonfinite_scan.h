// A device scan of an fp16 pool slot for NaN/Inf, for CudaSealer::CheckTokens. Plain C++
// header over the CUDA runtime API; the kernel lives in nonfinite_scan.cu.
#ifndef KVARN_DAEMON_BACKENDS_NONFINITE_SCAN_H_
#define KVARN_DAEMON_BACKENDS_NONFINITE_SCAN_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/block_layout.h"

namespace kvarn {

// Elements the scan of `count` tokens covers: slots x {keys, values} x count x head_dim.
// Element i, in this order (the order of CpuSealer::CheckTokens' loops), is
//   channel  i % D,  token first + (i / D) % count,  keys/values (i / (D * count)) % 2,
//   slot (layer-major)  i / (2 * D * count).
inline uint64_t ScanElements(const BlockLayout& layout, int count) {
  return static_cast<uint64_t>(layout.slots()) * 2u * static_cast<uint64_t>(count) *
         static_cast<uint64_t>(layout.head_dim);
}

// Enqueues on `stream`: *first_bad = min(*first_bad, index of every element among tokens
// [first, first + count) of the fp16 slot whose exponent bits are all ones (NaN or Inf)).
// The caller sets *first_bad to UINT64_MAX first (on the same stream); it stays so when
// every element is finite. REQUIRES: count >= 1, [first, first + count) within the tile.
cudaError_t LaunchNonFiniteScan(const uint8_t* slot, const BlockLayout& layout, int first, int count,
                                unsigned long long* first_bad, cudaStream_t stream);

}  // namespace kvarn

#endif  // KVARN_DAEMON_BACKENDS_NONFINITE_SCAN_H_
