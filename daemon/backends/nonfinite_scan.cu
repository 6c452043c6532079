#include "daemon/backends/nonfinite_scan.h"

namespace kvarn {
namespace {

__global__ void NonFiniteScanKernel(const uint8_t* slot, size_t slot_bytes, size_t values_offset,
                                    int first, unsigned long long count, unsigned long long d,
                                    unsigned long long total, unsigned long long* first_bad) {
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  for (unsigned long long i = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < total; i += stride) {
    const unsigned long long c = i % d;
    const unsigned long long row = i / d;
    const unsigned long long t = row % count;
    const unsigned long long half = row / count;  // slot * 2 + which
    const uint8_t* base = slot + (half >> 1) * slot_bytes + (half & 1) * values_offset;
    const uint16_t x = reinterpret_cast<const uint16_t*>(base)[(first + t) * d + c];
    if ((x & 0x7C00u) == 0x7C00u) atomicMin(first_bad, i);
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
      slot, layout.fp16_slot_bytes(), layout.tile_elems() * sizeof(uint16_t), first,
      static_cast<unsigned long long>(count), static_cast<unsigned long long>(layout.head_dim), total,
      first_bad);
  return cudaGetLastError();
}

}  // namespace kvarn
