// Makes a CUDA device current for a scope and restores the previous one after, for code that
// serves a pool on a device other than the thread's current one (the daemon's sealer and the
// client library). Header-only, CUDA runtime only.
#ifndef KVARN_KERNELS_CUDA_DEVICE_SCOPE_H_
#define KVARN_KERNELS_CUDA_DEVICE_SCOPE_H_

#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_status.h"

namespace kvarn::cuda {

class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    error_ = cudaSetDevice(device);
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  // cudaSuccess when the device was made current.
  cudaError_t error() const { return error_; }
  CodecStatus status() const { return FromCuda(error_, "cudaSetDevice"); }

 private:
  int previous_ = -1;
  cudaError_t error_ = cudaSuccess;
};

}  // namespace kvarn::cuda

#endif  // KVARN_KERNELS_CUDA_DEVICE_SCOPE_H_
