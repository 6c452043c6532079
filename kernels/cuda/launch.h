// Kernel launchers, one per kernel, defined in the .cu files. They take the parameter blocks
// that params.h builds and enqueue one launch; the caller checks arguments first. Not part of
// the public API. Plain C++ header (the CUDA runtime API header is C++-compatible).
#ifndef KVARN_KERNELS_CUDA_LAUNCH_H_
#define KVARN_KERNELS_CUDA_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/cuda/attend_body.h"
#include "kernels/cuda/decode_store_body.h"
#include "kernels/cuda/encode_body.h"

namespace kvarn::cuda {

// `scratch`: grid * G * D floats when !p.plan.tile_in_smem, else null.
cudaError_t LaunchEncode(const EncodeParams& p, int grid, float* scratch, cudaStream_t stream);
cudaError_t LaunchDecode(const DecodeParams& p, int grid, cudaStream_t stream);
cudaError_t LaunchStore(const StoreParams& p, int grid, size_t smem_bytes, cudaStream_t stream);
// head_chunk is 1, 2, 4, 8 or 16.
cudaError_t LaunchAttend(const AttendParams& p, int head_chunk, int grid_x, int grid_y, int grid_z,
                         cudaStream_t stream);
cudaError_t LaunchCombine(const CombineParams& p, int rows, cudaStream_t stream);

}  // namespace kvarn::cuda

#endif  // KVARN_KERNELS_CUDA_LAUNCH_H_
