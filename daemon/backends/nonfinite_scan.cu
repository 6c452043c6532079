#include "daemon/backends/nonfinite_scan.h"

namespace kvarn {
namespace {

__global__ void NonFiniteScanKernel(const uint16_t* rows, unsigned long long total,
                                    unsigned long long* first_bad) {
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  for (unsigned long long i = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < total; i += stride) {
    if ((rows[i] & 0x7C00u) == 0x7C00u) atomicMin(first_bad, i);
  }
}

}  // namespace

cudaError_t LaunchNonFiniteScan(const uint8_t* slot, const BlockLayout& layout, int first, int count,
                                unsigned long long* first_bad, cudaStream_t stream) {
  const unsigned long long total = ScanElements(layout, count);
  if (total == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const unsigned long long want = (total + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(want < 2048 ? want : 2048);
  NonFiniteScanKernel<<<blocks, kThreads, 0, stream>>>(
      reinterpret_cast<const uint16_t*>(slot +
                                        static_cast<size_t>(first) * layout.fp16_token_bytes()),
      total, first_bad);
  return cudaGetLastError();
}

}  // namespace kvarn
