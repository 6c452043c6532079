// The one mapping from CUDA runtime errors to the codec's status: no device or driver is
// FAILED_PRECONDITION, out of device memory UNAVAILABLE, anything else INTERNAL. Clears the
// runtime's non-sticky last error so later calls do not report it again. Header-only, CUDA
// runtime only (absl callers wrap it once more with FromCodec, common/cuda_status.h).
#ifndef KVARN_KERNELS_CUDA_CUDA_STATUS_H_
#define KVARN_KERNELS_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include <string>

#include "kernels/status.h"

namespace kvarn::cuda {

inline CodecStatus FromCuda(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return {};
  cudaGetLastError();
  const std::string msg = what + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver || err == cudaErrorInvalidDevice) {
    return CodecStatus(CodecCode::kFailedPrecondition, msg);
  }
  if (err == cudaErrorMemoryAllocation) return CodecStatus(CodecCode::kUnavailable, msg);
  return CodecStatus(CodecCode::kInternal, msg);
}

}  // namespace kvarn::cuda

#endif  // KVARN_KERNELS_CUDA_CUDA_STATUS_H_
