// The decode and store kernels. Compiled with -fmad=false (see CMakeLists.txt), so that
// dequantization and rotation round exactly as on the CPU.
#include "kernels/cuda/decode_store_body.h"
#include "kernels/cuda/launch.h"

namespace kvarn::cuda {
namespace {

__global__ void __launch_bounds__(kDecodeThreads) DecodeKernel(const DecodeParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  DecodeWork(DeviceCtx(), p, static_cast<int>(blockIdx.x), smem);
}

__global__ void __launch_bounds__(kStoreThreads) StoreKernel(const StoreParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  StoreWork(DeviceCtx(), p, static_cast<int>(blockIdx.x), smem);
}

}  // namespace

cudaError_t LaunchDecode(const DecodeParams& p, int grid, cudaStream_t stream) {
  const size_t smem = p.plan.smem_bytes;
  cudaError_t err = cudaFuncSetAttribute(DecodeKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  DecodeKernel<<<grid, kDecodeThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchStore(const StoreParams& p, int grid, size_t smem_bytes, cudaStream_t stream) {
  StoreKernel<<<grid, kStoreThreads, smem_bytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kvarn::cuda
