// Pool memory behind an interface, so the core runs the same on anonymous shared memory (host
// backend), CUDA device memory (cuda backend) and plain heap memory (tests).
#ifndef KVARN_DAEMON_CORE_MEMORY_H_
#define KVARN_DAEMON_CORE_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace kvarn {

// What a client needs to map a region, besides a descriptor (Region::fd).
struct SegmentInfo {
  uint64_t bytes = 0;
  std::string cuda_ipc_handle;  // raw cudaIpcMemHandle_t bytes (cuda backend)
  int cuda_device = -1;
  uint64_t device_pointer = 0;  // cuda: the daemon's own pointer, for clients in its process
};

// Who may write a region besides the daemon.
//   kQuant, kSink: nobody (clients map them read-only; the host backend seals them).
//   kTail: the one session it belongs to.
enum class RegionKind { kQuant, kSink, kTail };
inline constexpr int kRegionKinds = 3;
// "quant", "sink", "tail": in segment names and metric labels.
inline const char* RegionKindName(RegionKind k) {
  switch (k) {
    case RegionKind::kQuant: return "quant";
    case RegionKind::kSink: return "sink";
    case RegionKind::kTail: return "tail";
  }
  return "unknown";
}

// One contiguous allocation; destruction releases the daemon's hold on the memory (a client
// mapping keeps its own pages until it unmaps them).
class Region {
 public:
  virtual ~Region() = default;
  // Host pointer for host-accessible backends, device pointer for cuda.
  virtual uint8_t* data() const = 0;
  virtual size_t size() const = 0;
  virtual SegmentInfo Describe() const = 0;
  // The descriptor a client maps (host backend), owned by the region; -1 when the memory is
  // not handed over by descriptor.
  virtual int fd() const { return -1; }
  // The process `pid` (whose start time is `identity`, so a recycled pid is told apart)
  // receives this region on the descriptor channel. A backend whose memory that process could
  // still write after the region is destroyed (CUDA IPC) keeps it allocated until the process
  // is gone. Called under the core's lock: must not block or read /proc.
  virtual void LendTo(int /*pid*/, uint64_t /*identity*/) {}
  // Called before each touch of the region's memory by the daemon (cheap once it succeeded):
  // an error means the memory is not all there (a kTail region whose client took pages away,
  // common/shared_memory.h) and must not be touched. Called under the core's lock.
  virtual absl::Status Pin() { return absl::OkStatus(); }
};

class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;
  virtual absl::StatusOr<std::unique_ptr<Region>> Create(RegionKind kind, size_t bytes) = 0;
  // Bytes of destroyed regions the backend still holds for a live importer, as of the last
  // Sweep; the core counts them as used so resident memory stays within the capacity. Cheap
  // and lock-free: called under the core's lock.
  virtual uint64_t RetainedBytes() const { return 0; }
  // Frees retained memory whose importer is gone. May read /proc and call the device, so it
  // runs outside the core's lock (the daemon's housekeeping loop).
  virtual void Sweep() {}
  // Bytes of live regions of `kind` on huge pages (host backend, huge_pages = try or on).
  // Lock-free: called under the core's lock.
  virtual uint64_t HugePageBytes(RegionKind /*kind*/) const { return 0; }
  // Regions that asked for huge pages and were created on base pages for want of them.
  virtual uint64_t HugePageFallbacks() const { return 0; }
  // "host", "cuda" or "heap".
  virtual const char* name() const = 0;
  // Whether lending memory needs the importer's pid (retention: LendTo). A peer in another
  // PID namespace (SO_PEERCRED pid 0: a worker pod next to a DaemonSet's kvarnd) can be lent
  // memory only by a backend that needs none: the host backend's segments are freed by the
  // kernel when the last mapping goes, whoever holds it.
  virtual bool NeedsImporterPid() const { return false; }
  // Whether data() pointers may be dereferenced by the CPU.
  virtual bool host_accessible() const = 0;
};

// Heap memory, for tests and in-process use. Not shareable between processes.
class HeapBackend final : public MemoryBackend {
 public:
  absl::StatusOr<std::unique_ptr<Region>> Create(RegionKind kind, size_t bytes) override;
  const char* name() const override { return "heap"; }
  bool host_accessible() const override { return true; }
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_CORE_MEMORY_H_
