// Fused decode attention and the split-K combine. Ordinary fp32 contraction rules apply
// (fused multiply-adds allowed): attention is compared with the CPU within a tolerance.
#include "kernels/cuda/attend_body.h"
#include "kernels/cuda/launch.h"

namespace kvarn::cuda {
namespace {

// Six resident blocks per SM (80 registers) hide the latency of each block's record loads;
// without the bound ptxas settles on 64 registers and spills.
template <int HC>
__global__ void __launch_bounds__(kAttendThreads, 6) AttendKernel(const AttendParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  AttendBlock<HC>(DeviceCtx(), p, static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y),
                  static_cast<int>(blockIdx.z), smem);
}

__global__ void __launch_bounds__(kCombineThreads) CombineKernel(const CombineParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  CombineRow(DeviceCtx(), p, static_cast<int>(blockIdx.x), smem);
}

template <int HC>
cudaError_t Launch(const AttendParams& p, dim3 grid, cudaStream_t stream) {
  const size_t smem = p.plan.smem_bytes;
  cudaError_t err = cudaFuncSetAttribute(
      AttendKernel<HC>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  AttendKernel<HC><<<grid, kAttendThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchAttend(const AttendParams& p, int head_chunk, int grid_x, int grid_y, int grid_z,
                         cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y),
                  static_cast<unsigned>(grid_z));
  switch (head_chunk) {
    case 1:
      return Launch<1>(p, grid, stream);
    case 2:
      return Launch<2>(p, grid, stream);
    case 4:
      return Launch<4>(p, grid, stream);
    case 8:
      return Launch<8>(p, grid, stream);
    case 16:
      return Launch<16>(p, grid, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchCombine(const CombineParams& p, int rows, cudaStream_t stream) {
  CombineKernel<<<rows, kCombineThreads, CombineSmemBytes(p.d), stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kvarn::cuda
