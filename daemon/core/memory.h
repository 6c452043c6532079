// Pool memory behind an interface, so the core runs the same on POSIX shared memory (host
// backend), CUDA device memory (cuda backend) and plain heap memory (tests).
#ifndef KVARN_DAEMON_CORE_MEMORY_H_
#define KVARN_DAEMON_CORE_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace kvarn {

// What a client needs to map a region.
struct SegmentInfo {
  std::string name;             // POSIX shm name; empty for heap and cuda
  uint64_t bytes = 0;
  std::string cuda_ipc_handle;  // raw cudaIpcMemHandle_t bytes (cuda backend)
  int cuda_device = -1;
  uint64_t device_pointer = 0;  // cuda: the daemon's own pointer, for clients in its process
};

// One contiguous allocation. Move-only owners; destruction releases the memory (and for
// shared memory, unlinks the name: clients' existing mappings stay valid until unmapped).
class Region {
 public:
  virtual ~Region() = default;
  // Host pointer for host-accessible backends, device pointer for cuda.
  virtual uint8_t* data() const = 0;
  virtual size_t size() const = 0;
  // Gives the physical pages of [offset, offset + len) back to the system; the bytes read as
  // zero afterwards. Keeps resident memory within the accounted capacity when blocks are freed.
  virtual void Discard(size_t offset, size_t len) = 0;
  virtual SegmentInfo Describe() const = 0;
};

enum class RegionKind { kQuant, kSink, kTail };

class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;
  // owner_pid: the client process a kTail region is lent to (0: none). A backend whose
  // memory an importer could still write after the region is destroyed (CUDA IPC) keeps it
  // allocated until that process is gone.
  virtual absl::StatusOr<std::unique_ptr<Region>> Create(RegionKind kind, size_t bytes, int owner_pid = 0) = 0;
  // Bytes of destroyed regions the backend still holds for a live importer; the core counts
  // them as used so resident memory stays within the capacity.
  virtual uint64_t RetainedBytes() const { return 0; }
  // "host", "cuda" or "heap".
  virtual const char* name() const = 0;
  // Whether data() pointers may be dereferenced by the CPU.
  virtual bool host_accessible() const = 0;
};

// Heap memory, for tests and in-process use. Not shareable between processes.
class HeapBackend final : public MemoryBackend {
 public:
  absl::StatusOr<std::unique_ptr<Region>> Create(RegionKind kind, size_t bytes, int owner_pid = 0) override;
  const char* name() const override { return "heap"; }
  bool host_accessible() const override { return true; }
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_CORE_MEMORY_H_
