#include "daemon/backends/cuda_backend.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "daemon/backends/cuda_sealer.h"
#include "kernels/cuda/ipc.h"

namespace kvarn {

struct CudaBackend::State {
  State(int device, const ProcessProbe* probe) : device(device), retained(probe, static_cast<int>(getpid())) {}
  const int device;
  RetentionList<cuda::ExportedSlab> retained;
};

namespace {

absl::Status FromIpc(const CodecStatus& s) {
  if (s.ok()) return absl::OkStatus();
  if (s.code() == CodecCode::kUnavailable) return absl::ResourceExhaustedError(s.message());
  if (s.code() == CodecCode::kFailedPrecondition) return absl::FailedPreconditionError(s.message());
  if (s.code() == CodecCode::kInvalidArgument) return absl::InvalidArgumentError(s.message());
  return absl::InternalError(s.message());
}

class CudaRegion final : public Region {
 public:
  CudaRegion(std::shared_ptr<CudaBackend::State> state, cuda::ExportedSlab slab, size_t size,
             std::optional<ProcessOwner> owner)
      : state_(std::move(state)), slab_(std::move(slab)), size_(size), owner_(owner) {}
  ~CudaRegion() override {
    if (owner_.has_value()) state_->retained.Retain(*owner_, slab_.size(), std::move(slab_));
  }

  uint8_t* data() const override { return slab_.data(); }
  size_t size() const override { return size_; }
  void Discard(size_t, size_t) override {}  // see cuda_backend.h
  SegmentInfo Describe() const override {
    SegmentInfo info;
    info.bytes = size_;
    info.cuda_ipc_handle = slab_.handle().ToBytes();
    info.cuda_device = slab_.device();
    info.device_pointer = reinterpret_cast<uint64_t>(slab_.data());
    return info;
  }

 private:
  std::shared_ptr<CudaBackend::State> state_;
  cuda::ExportedSlab slab_;
  size_t size_;
  std::optional<ProcessOwner> owner_;  // retain the slab for this process (tail slabs)
};

}  // namespace

bool CudaBackend::DeviceUsable(int device, std::string* why) {
  const auto fail = [&](std::string reason) {
    if (why != nullptr) *why = std::move(reason);
    cudaGetLastError();
    return false;
  };
  int count = 0;
  if (const cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    return fail(absl::StrCat("no usable CUDA device: ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
  }
  if (device < 0 || device >= count) return fail(absl::StrCat("no CUDA device ", device, " (", count, " visible)"));
  int uva = 0;
  if (cudaDeviceGetAttribute(&uva, cudaDevAttrUnifiedAddressing, device) != cudaSuccess || uva == 0) {
    return fail(absl::StrCat("CUDA device ", device, " lacks unified addressing (needed for IPC)"));
  }
  // The real test: allocate and export a small slab.
  cuda::Expected<cuda::ExportedSlab> probe = cuda::ExportedSlab::Create(device, 1 << 20);
  if (!probe.ok()) return fail(absl::StrCat("CUDA device ", device, " cannot export memory: ", probe.status().message()));
  return true;
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(int device, const ProcessProbe* probe) {
  std::string why;
  if (!DeviceUsable(device, &why)) return absl::FailedPreconditionError(why);
  return std::unique_ptr<CudaBackend>(
      new CudaBackend(std::make_shared<State>(device, probe != nullptr ? probe : ProcessProbe::System())));
}

absl::StatusOr<std::unique_ptr<Region>> CudaBackend::Create(RegionKind kind, size_t bytes, int owner_pid) {
  state_->retained.Sweep();
  std::optional<ProcessOwner> owner;
  if (kind == RegionKind::kTail) owner = state_->retained.OwnerOf(owner_pid);
  const size_t alloc = bytes == 0 ? 1 : bytes;
  if (owner.has_value()) {
    // The same process may still have this slab mapped from an earlier session; it gets
    // it back (zeroed), and no other process ever does while it runs.
    if (std::optional<cuda::ExportedSlab> kept = state_->retained.Take(*owner, alloc); kept.has_value()) {
      const int device = kept->device();
      int previous = -1;
      cudaGetDevice(&previous);
      cudaSetDevice(device);
      cudaError_t err = cudaMemsetAsync(kept->data(), 0, kept->size(), cudaStreamPerThread);
      if (err == cudaSuccess) err = cudaStreamSynchronize(cudaStreamPerThread);
      if (previous >= 0) cudaSetDevice(previous);
      if (err != cudaSuccess) {
        cudaGetLastError();
        state_->retained.Retain(*owner, kept->size(), std::move(*kept));
        return absl::InternalError(absl::StrCat("zeroing a reused tail slab: ", cudaGetErrorString(err)));
      }
      return std::unique_ptr<Region>(new CudaRegion(state_, std::move(*kept), bytes, owner));
    }
  }
  cuda::Expected<cuda::ExportedSlab> slab = cuda::ExportedSlab::Create(state_->device, alloc);
  if (!slab.ok()) {
    absl::Status s = FromIpc(slab.status());
    return absl::Status(s.code(), absl::StrCat("cannot allocate ", bytes, " bytes of device memory: ", s.message()));
  }
  return std::unique_ptr<Region>(new CudaRegion(state_, std::move(slab).value(), bytes, owner));
}

uint64_t CudaBackend::RetainedBytes() const { return state_->retained.Sweep(); }

SealerFactory CudaBackend::MakeSealerFactory(int lanes) const {
  const int device = state_->device;
  return [device, lanes](const Preset& preset, const BlockLayout& layout) -> std::unique_ptr<Sealer> {
    return std::make_unique<CudaSealer>(preset, layout, device, lanes);
  };
}

int CudaBackend::device() const { return state_->device; }

size_t CudaBackend::retained_slabs() const { return state_->retained.size(); }

}  // namespace kvarn
