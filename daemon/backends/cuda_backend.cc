#include "daemon/backends/cuda_backend.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <atomic>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/codec_status.h"
#include "daemon/backends/cuda_sealer.h"
#include "common/cuda_ipc.h"

namespace kvarn {

struct CudaBackend::State {
  State(int device, const ProcessProbe* probe) : device(device), retained(probe, static_cast<int>(getpid())) {}
  const int device;
  RetentionList<cuda::ExportedSlab> retained;
  std::atomic<uint64_t> retained_bytes{0};  // as of the last Sweep
};

namespace {

class CudaRegion final : public Region {
 public:
  CudaRegion(std::shared_ptr<CudaBackend::State> state, cuda::ExportedSlab slab, size_t size, bool lendable)
      : state_(std::move(state)), slab_(std::move(slab)), size_(size), lendable_(lendable) {}
  ~CudaRegion() override {
    if (owner_.has_value()) {
      const uint64_t bytes = slab_.size();
      state_->retained.Retain(*owner_, bytes, std::move(slab_));
      state_->retained_bytes.store(state_->retained.bytes());
    }
  }

  uint8_t* data() const override { return slab_.data(); }
  size_t size() const override { return size_; }
  void LendTo(int pid, uint64_t identity) override {
    // Tail slabs are written by their client: keep this one until that process is gone. The
    // daemon's own process and unknown processes need no retention.
    if (!lendable_ || pid <= 0 || pid == static_cast<int>(getpid()) || identity == 0) return;
    owner_ = ProcessOwner{pid, identity};
  }
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
  const bool lendable_;                // a tail slab, written by the client it is lent to
  std::optional<ProcessOwner> owner_;  // retain the slab for this process
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
  Expected<cuda::ExportedSlab> probe = cuda::ExportedSlab::Create(device, 1 << 20);
  if (!probe.ok()) return fail(absl::StrCat("CUDA device ", device, " cannot export memory: ", probe.status().message()));
  return true;
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(int device, const ProcessProbe* probe) {
  std::string why;
  if (!DeviceUsable(device, &why)) return absl::FailedPreconditionError(why);
  return std::unique_ptr<CudaBackend>(
      new CudaBackend(std::make_shared<State>(device, probe != nullptr ? probe : ProcessProbe::System())));
}

absl::StatusOr<std::unique_ptr<Region>> CudaBackend::Create(RegionKind kind, size_t bytes) {
  const size_t alloc = bytes == 0 ? 1 : bytes;
  Expected<cuda::ExportedSlab> slab = cuda::ExportedSlab::Create(state_->device, alloc);
  if (!slab.ok()) {
    const absl::Status s = FromCodec(slab.status());
    // Out of device memory is the pool's RESOURCE_EXHAUSTED, not a transient UNAVAILABLE.
    const absl::StatusCode code = absl::IsUnavailable(s) ? absl::StatusCode::kResourceExhausted : s.code();
    return absl::Status(code, absl::StrCat("cannot allocate ", bytes, " bytes of device memory: ", s.message()));
  }
  return std::unique_ptr<Region>(new CudaRegion(state_, std::move(slab).value(), bytes, kind == RegionKind::kTail));
}

uint64_t CudaBackend::RetainedBytes() const { return state_->retained_bytes.load(); }

void CudaBackend::Sweep() { state_->retained_bytes.store(state_->retained.Sweep()); }

SealerFactory CudaBackend::MakeSealerFactory(int lanes) const {
  const int device = state_->device;
  return [device, lanes](const Preset& preset, const BlockLayout& layout) -> std::unique_ptr<Sealer> {
    return std::make_unique<CudaSealer>(preset, layout, device, lanes);
  };
}

int CudaBackend::device() const { return state_->device; }

size_t CudaBackend::retained_slabs() const { return state_->retained.size(); }

}  // namespace kvarn
