// The encode kernel. Compiled with -fmad=false (see CMakeLists.txt): its arithmetic must be
// the CPU reference's, operation for operation.
#include "kernels/cuda/encode_body.h"
#include "kernels/cuda/launch.h"

namespace kvarn::cuda {
namespace {

// One block per work item (2 * slot + K|V); when tiles live in global scratch, a persistent
// grid loops over the work items, each block reusing its own scratch tile.
__global__ void __launch_bounds__(kEncodeThreads, 1)
    EncodeKernel(const EncodeParams p, float* scratch) {
  extern __shared__ __align__(16) unsigned char smem[];
  const DeviceCtx ctx;
  float* tile =
      scratch != nullptr ? scratch + static_cast<size_t>(blockIdx.x) * p.g * p.d : nullptr;
  for (int w = static_cast<int>(blockIdx.x); w < 2 * p.num_slots;
       w += static_cast<int>(gridDim.x)) {
    EncodeWork(ctx, p, w, smem, tile);
  }
}

}  // namespace

cudaError_t LaunchEncode(const EncodeParams& p, int grid, float* scratch, cudaStream_t stream) {
  const size_t smem = p.plan.smem_bytes;
  cudaError_t err = cudaFuncSetAttribute(EncodeKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  EncodeKernel<<<grid, kEncodeThreads, smem, stream>>>(p, scratch);
  return cudaGetLastError();
}

}  // namespace kvarn::cuda
