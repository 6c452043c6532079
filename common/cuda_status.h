// CUDA runtime errors as absl::Status for the daemon's and the client's CUDA code: the codec's
// one mapping (kernels/cuda/cuda_status.h) through the one codec bridge (codec_status.h).
#ifndef KVARN_COMMON_CUDA_STATUS_H_
#define KVARN_COMMON_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "common/codec_status.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device_scope.h"

namespace kvarn {

inline absl::Status CudaStatus(cudaError_t err, const char* what) { return FromCodec(cuda::FromCuda(err, what)); }

// A device made current for a scope (cuda::DeviceScope), with its error as a status.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) : scope_(device), status_(FromCodec(scope_.status())) {}
  const absl::Status& status() const { return status_; }

 private:
  cuda::DeviceScope scope_;
  absl::Status status_;
};

}  // namespace kvarn

#endif  // KVARN_COMMON_CUDA_STATUS_H_
