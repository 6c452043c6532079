#include "common/cuda_ipc.h"

#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device_scope.h"

#include <cstring>
#include <map>
#include <memory>
#include <mutex>

namespace kvarn::cuda {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == kIpcHandleBytes, "cudaIpcMemHandle_t changed size");


// What this process exports and what it has imported. Leaked on purpose: slabs and
// mappings destroyed by static destructors at exit must still find it.
struct Registry {
  struct Import {
    IpcMapping mapping;
    size_t refs = 0;
  };
  std::mutex mu;
  std::map<IpcHandle, std::pair<uint8_t*, size_t>> exports;  // guarded by mu
  // Opening, counting and closing all happen under mu, so a handle is never open twice.
  std::map<IpcHandle, Import> imports;  // guarded by mu
};

Registry& Reg() {
  static Registry* r = new Registry();
  return *r;
}

}  // namespace

Expected<IpcHandle> IpcHandle::FromBytes(std::string_view raw) {
  if (raw.size() != kIpcHandleBytes) {
    return InvalidArgument("a CUDA IPC handle has " + std::to_string(kIpcHandleBytes) + " bytes, not " +
                           std::to_string(raw.size()));
  }
  IpcHandle h;
  std::memcpy(h.bytes.data(), raw.data(), kIpcHandleBytes);
  return h;
}

Expected<ExportedSlab> ExportedSlab::Create(int device, size_t bytes) {
  if (bytes == 0) return InvalidArgument("a slab needs at least one byte");
  DeviceScope scope(device);
  if (!scope.status().ok()) return scope.status();
  void* p = nullptr;
  if (CodecStatus s = FromCuda(cudaMalloc(&p, bytes), "cudaMalloc(" + std::to_string(bytes) + " bytes)"); !s.ok()) {
    return s;
  }
  ExportedSlab slab(static_cast<uint8_t*>(p), bytes, device, IpcHandle{});
  // Zeroed like fresh shared memory: memory freed by another allocation (another tenant's
  // tail) must not show through. The per-thread stream does not wait for unrelated streams.
  if (CodecStatus s = FromCuda(cudaMemsetAsync(p, 0, bytes, cudaStreamPerThread), "zeroing a slab"); !s.ok()) return s;
  if (CodecStatus s = FromCuda(cudaStreamSynchronize(cudaStreamPerThread), "zeroing a slab"); !s.ok()) return s;
  cudaIpcMemHandle_t h;
  if (CodecStatus s = FromCuda(cudaIpcGetMemHandle(&h, p), "cudaIpcGetMemHandle"); !s.ok()) return s;
  std::memcpy(slab.handle_.bytes.data(), &h, kIpcHandleBytes);
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  r.exports[slab.handle_] = {slab.data_, slab.size_};
  return slab;
}

ExportedSlab& ExportedSlab::operator=(ExportedSlab&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    device_ = std::exchange(other.device_, -1);
    handle_ = other.handle_;
  }
  return *this;
}

void ExportedSlab::Reset() {
  if (data_ == nullptr) return;
  {
    Registry& r = Reg();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.exports.find(handle_);
    if (it != r.exports.end() && it->second.first == data_) r.exports.erase(it);
  }
  DeviceScope scope(device_);
  cudaFree(data_);  // waits for work using it; an error here has no one to report to
  cudaGetLastError();
  data_ = nullptr;
  size_ = 0;
}

Expected<IpcMapping> IpcMapping::Open(const IpcHandle& handle, int device, size_t bytes) {
  if (bytes == 0) return InvalidArgument("an IPC mapping needs at least one byte");
  DeviceScope scope(device);
  if (!scope.status().ok()) return scope.status();
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.bytes.data(), kIpcHandleBytes);
  void* p = nullptr;
  if (CodecStatus s = FromCuda(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess),
                               "cudaIpcOpenMemHandle on device " + std::to_string(device));
      !s.ok()) {
    return s;
  }
  return IpcMapping(static_cast<uint8_t*>(p), bytes, device);
}

IpcMapping& IpcMapping::operator=(IpcMapping&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    device_ = std::exchange(other.device_, -1);
  }
  return *this;
}

void IpcMapping::Reset() {
  if (data_ == nullptr) return;
  DeviceScope scope(device_);
  cudaIpcCloseMemHandle(data_);
  cudaGetLastError();
  data_ = nullptr;
  size_ = 0;
}

Expected<SharedMapping> SharedMapping::Acquire(const IpcHandle& handle, int device, size_t bytes) {
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  if (auto e = r.exports.find(handle); e != r.exports.end()) {
    return SharedMapping(handle, /*imported=*/false, e->second.first, e->second.second);
  }
  auto it = r.imports.find(handle);
  if (it == r.imports.end()) {
    Expected<IpcMapping> m = IpcMapping::Open(handle, device, bytes);
    if (!m.ok()) return m.status();
    it = r.imports.emplace(handle, Registry::Import{std::move(m).value(), 0}).first;
  }
  ++it->second.refs;
  return SharedMapping(handle, /*imported=*/true, it->second.mapping.data(), it->second.mapping.size());
}

SharedMapping& SharedMapping::operator=(SharedMapping&& other) noexcept {
  if (this != &other) {
    Reset();
    handle_ = other.handle_;
    imported_ = std::exchange(other.imported_, false);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void SharedMapping::Reset() {
  if (imported_) {
    Registry& r = Reg();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.imports.find(handle_);
    if (it != r.imports.end() && --it->second.refs == 0) r.imports.erase(it);  // closes it
  }
  imported_ = false;
  data_ = nullptr;
  size_ = 0;
}

size_t SharedMapping::OpenMappings() {
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.imports.size();
}

size_t SharedMapping::References(const IpcHandle& handle) {
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.imports.find(handle);
  return it == r.imports.end() ? 0 : it->second.refs;
}

size_t SharedMapping::LocalExports() {
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.exports.size();
}

}  // namespace kvarn::cuda
