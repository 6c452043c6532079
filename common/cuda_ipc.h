// Sharing device memory between processes with legacy CUDA IPC (cudaIpcGetMemHandle /
// cudaIpcOpenMemHandle): the daemon exports each slab of the pool once, every client process
// opens each exported slab once and shares that mapping among its users.
//
// Why legacy IPC rather than VMM allocations with POSIX file-descriptor handles: a legacy
// handle is 64 opaque bytes that travel in the gRPC open-session reply like any other field,
// while an fd has to cross with SCM_RIGHTS on a Unix socket, which gRPC does not expose (it
// would need a second socket with its own authentication and lifecycle beside the control
// plane, or pidfd_getfd, which needs ptrace rights over the daemon). What VMM would add (a
// read-only mapping for the shared blocks, unmapping single blocks) is not needed for
// correctness: the daemon never hands a client a block someone else may write. The types
// below are the only place that knows the flavour, so a VMM variant can replace them.
//
// Rules of legacy IPC that shape this API:
//  - The exporting process cannot open its own handle (cudaIpcOpenMemHandle fails there):
//    SharedMapping::Acquire recognises a slab exported by this process and returns its own
//    pointer without any mapping.
//  - A process may open a given handle only once per device context; opening it again is an
//    error on some drivers and a second reference on others. SharedMapping keeps one
//    IpcMapping per handle per process, reference-counted, so both cases behave the same.
//  - cudaIpcGetMemHandle of memory allocated after a cudaFree at the same address returns a
//    new, different handle, so handle bytes identify a slab for the cache.
//  - The mapping is read-write; there is no read-only import.
//
// Everything here needs only the C++ standard library and the CUDA runtime (it builds on
// the GPU machine in KVARN_KERNELS_ONLY mode). Daemon and client share it; the handles travel
// only on the authenticated descriptor channel (daemon/service/descriptor_server.h). Errors are CodecStatus: FAILED_PRECONDITION
// without a usable device, INVALID_ARGUMENT for a malformed handle or size, UNAVAILABLE when
// device memory is exhausted, INTERNAL for any other CUDA error.
//
// Thread safety: the types are move-only values, safe to use from one thread at a time each;
// SharedMapping::Acquire and the destructors may run concurrently from any threads.
#ifndef KVARN_COMMON_CUDA_IPC_H_
#define KVARN_COMMON_CUDA_IPC_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "kernels/status.h"

namespace kvarn::cuda {

// The bytes of a cudaIpcMemHandle_t.
inline constexpr size_t kIpcHandleBytes = 64;
struct IpcHandle {
  std::array<uint8_t, kIpcHandleBytes> bytes{};

  // INVALID_ARGUMENT unless `raw` holds exactly kIpcHandleBytes bytes.
  static Expected<IpcHandle> FromBytes(std::string_view raw);
  std::string ToBytes() const { return std::string(bytes.begin(), bytes.end()); }
  friend bool operator==(const IpcHandle&, const IpcHandle&) = default;
  friend auto operator<=>(const IpcHandle&, const IpcHandle&) = default;
};

// One cudaMalloc'd slab of `device`, exported once. The destructor frees it (and forgets the
// export); a client that still has it mapped keeps a mapping of freed memory, so the owner
// must keep the slab until every importer is done (daemon/backends/cuda_backend.h).
class ExportedSlab {
 public:
  // Allocates `bytes` (> 0) on `device`, zeroes them and exports the allocation. The current
  // device of the calling thread is left as it was.
  static Expected<ExportedSlab> Create(int device, size_t bytes);

  ExportedSlab() = default;
  ExportedSlab(ExportedSlab&& other) noexcept { *this = std::move(other); }
  ExportedSlab& operator=(ExportedSlab&& other) noexcept;
  ExportedSlab(const ExportedSlab&) = delete;
  ExportedSlab& operator=(const ExportedSlab&) = delete;
  ~ExportedSlab() { Reset(); }

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  int device() const { return device_; }
  const IpcHandle& handle() const { return handle_; }
  explicit operator bool() const { return data_ != nullptr; }

 private:
  ExportedSlab(uint8_t* data, size_t size, int device, const IpcHandle& handle)
      : data_(data), size_(size), device_(device), handle_(handle) {}
  void Reset();

  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  int device_ = -1;
  IpcHandle handle_;
};

// One cudaIpcOpenMemHandle of a slab exported by another process; the destructor closes it.
// Use SharedMapping instead of opening directly: a second Open of the same handle in one
// process is what legacy IPC forbids.
class IpcMapping {
 public:
  // Maps the slab on `device` (the importer's ordinal of the device holding it; peer access
  // is enabled lazily if it is another device). `bytes` is what the exporter announced (the
  // runtime cannot check it). The current device is left as it was.
  static Expected<IpcMapping> Open(const IpcHandle& handle, int device, size_t bytes);

  IpcMapping() = default;
  IpcMapping(IpcMapping&& other) noexcept { *this = std::move(other); }
  IpcMapping& operator=(IpcMapping&& other) noexcept;
  IpcMapping(const IpcMapping&) = delete;
  IpcMapping& operator=(const IpcMapping&) = delete;
  ~IpcMapping() { Reset(); }

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  int device() const { return device_; }

 private:
  IpcMapping(uint8_t* data, size_t size, int device) : data_(data), size_(size), device_(device) {}
  void Reset();

  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  int device_ = -1;
};

// A reference to this process's one view of an exported slab: the exporter's own pointer
// when this process exported it, else a process-wide IpcMapping shared by every
// SharedMapping of the same handle and closed when the last one is destroyed.
class SharedMapping {
 public:
  // Arguments as for IpcMapping::Open; `device` and `bytes` of a later Acquire of a handle
  // already open are ignored. For a slab this process exported, the pointer stays valid only
  // while that ExportedSlab lives.
  static Expected<SharedMapping> Acquire(const IpcHandle& handle, int device, size_t bytes);

  SharedMapping() = default;
  SharedMapping(SharedMapping&& other) noexcept { *this = std::move(other); }
  SharedMapping& operator=(SharedMapping&& other) noexcept;
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;
  ~SharedMapping() { Reset(); }

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // True when the slab was exported by this process (no IPC mapping behind it).
  bool local() const { return data_ != nullptr && !imported_; }
  explicit operator bool() const { return data_ != nullptr; }

  // Diagnostics for tests: IPC mappings open in this process, SharedMappings referring to
  // `handle`'s mapping, and slabs this process exports.
  static size_t OpenMappings();
  static size_t References(const IpcHandle& handle);
  static size_t LocalExports();

 private:
  SharedMapping(const IpcHandle& handle, bool imported, uint8_t* data, size_t size)
      : handle_(handle), imported_(imported), data_(data), size_(size) {}
  void Reset();

  IpcHandle handle_;
  bool imported_ = false;  // holds one reference to the process's mapping of handle_
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kvarn::cuda

#endif  // KVARN_COMMON_CUDA_IPC_H_
