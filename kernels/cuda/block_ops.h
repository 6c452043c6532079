// Building blocks of the CUDA kernels, written once for two executors: the GPU (nvcc, with
// DeviceCtx below) and the host block emulator of tests/gpu (g++, with its EmuCtx), which
// runs every thread of a block as a fiber so that the kernel bodies are tested on machines
// without a GPU.
//
// A kernel body is a function template over `Ctx`, which provides:
//   tid(), nthreads(), lane(), warp(), nwarps()       thread geometry of the block
//   Sync()                                            __syncthreads()
//   SyncOr(int)                                       __syncthreads_or()
//   ShflXor(float|double, int mask)                   __shfl_xor_sync over the full warp
//   SyncWarp()                                        __syncwarp() (the device's shuffles
//                                                     order no shared-memory accesses)
//   AtomicOr(int32_t*, int32_t)                       atomicOr on global memory
// Rules the bodies follow so that both executors agree: every Sync, SyncOr, ShflXor and SyncWarp is
// reached by all threads of the block (block-uniform control flow around them); shared
// memory is handed in as a pointer; no blockIdx/threadIdx outside the Ctx.
#ifndef KVARN_KERNELS_CUDA_BLOCK_OPS_H_
#define KVARN_KERNELS_CUDA_BLOCK_OPS_H_

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/fp16.h"
#include "kernels/hd.h"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
// Kernel-body code: device functions under nvcc, plain inline functions for the emulator.
// KVARN_DEV_FORCEINLINE for helpers that take references to a block's local state, which
// would otherwise live in local memory when the helper is not inlined.
#define KVARN_DEV __device__ inline
#define KVARN_DEV_FORCEINLINE __device__ __forceinline__
#else
#define KVARN_DEV inline
#define KVARN_DEV_FORCEINLINE inline
#endif

namespace kvarn::cuda {

#if defined(__CUDACC__)
struct DeviceCtx {
  __device__ int tid() const { return static_cast<int>(threadIdx.x); }
  __device__ int nthreads() const { return static_cast<int>(blockDim.x); }
  __device__ int lane() const { return static_cast<int>(threadIdx.x) & 31; }
  __device__ int warp() const { return static_cast<int>(threadIdx.x) >> 5; }
  __device__ int nwarps() const { return static_cast<int>(blockDim.x) >> 5; }
  __device__ void Sync() const { __syncthreads(); }
  __device__ int SyncOr(int v) const { return __syncthreads_or(v); }
  // Orders the shared-memory accesses of a warp's lanes (shuffles alone do not).
  __device__ void SyncWarp() const { __syncwarp(); }
  __device__ float ShflXor(float v, int mask) const {
    return __shfl_xor_sync(0xffffffffu, v, mask);
  }
  __device__ double ShflXor(double v, int mask) const {
    return __shfl_xor_sync(0xffffffffu, v, mask);
  }
  __device__ void AtomicOr(int32_t* p, int32_t v) const { atomicOr(reinterpret_cast<int*>(p), v); }
};
#endif

// Exact widening of a binary16 bit pattern (hardware conversion on the device; both are exact).
KVARN_DEV float H2F(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  return HalfToFloat(h);
#endif
}

// exp and log (ExpF, LogF) are kernels/kvarn_math.h's, shared with the CPU codecs.

template <class Ctx>
KVARN_DEV float WarpAllSum(const Ctx& ctx, float v) {
  for (int m = 16; m > 0; m >>= 1) v += ctx.ShflXor(v, m);
  return v;
}
template <class Ctx>
KVARN_DEV float WarpAllMax(const Ctx& ctx, float v) {
  for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, ctx.ShflXor(v, m));
  return v;
}

// Normalized fast Walsh-Hadamard transform of `rows` vectors of length n (a power of two)
// stored back to back at x (shared memory), in place: x <- x · H. The butterflies and the
// final scaling are the ones of FwhtInPlace (kernels/reference.cc), element for element, so
// the results are bit-identical to the CPU. Ends with a barrier.
template <class Ctx>
KVARN_DEV void FwhtRows(const Ctx& ctx, float* x, int rows, int n) {
  const int half = n >> 1;
  const int pairs = rows * half;
  for (int h = 1; h < n; h <<= 1) {
    for (int p = ctx.tid(); p < pairs; p += ctx.nthreads()) {
      const int row = p / half;
      const int k = p - row * half;
      const int i = ((k & ~(h - 1)) << 1) | (k & (h - 1));  // k-th pair of this stage
      float* r = x + static_cast<size_t>(row) * n;
      const float a = r[i];
      const float b = r[i + h];
      r[i] = a + b;
      r[i + h] = a - b;
    }
    ctx.Sync();
  }
  const float norm = 1.0f / sqrtf(static_cast<float>(n));
  for (int e = ctx.tid(); e < rows * n; e += ctx.nthreads()) x[e] *= norm;
  ctx.Sync();
}

// Copies `bytes` (a multiple of 16, both pointers 16-byte aligned) cooperatively.
template <class Ctx>
KVARN_DEV void CopyToShared(const Ctx& ctx, unsigned char* dst, const unsigned char* src,
                            size_t bytes) {
  const size_t n = bytes / 16;
  struct alignas(16) V16 {
    uint32_t w[4];
  };
  const V16* s = reinterpret_cast<const V16*>(src);
  V16* d = reinterpret_cast<V16*>(dst);
  for (size_t i = static_cast<size_t>(ctx.tid()); i < n; i += static_cast<size_t>(ctx.nthreads()))
    d[i] = s[i];
}

// Rounds a byte count up to a multiple of 16 (shared-memory carve-outs stay aligned).
KVARN_HD inline size_t AlignUp16(size_t n) { return (n + 15) & ~static_cast<size_t>(15); }

}  // namespace kvarn::cuda

#endif  // KVARN_KERNELS_CUDA_BLOCK_OPS_H_
