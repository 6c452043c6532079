// The host memory backend: anonymous shared memory (memfd), handed to clients by descriptor.
//
// Each region is a SharedMemory (common/shared_memory.h): nothing appears in /dev/shm, so no
// process can open a segment by name, and nothing outlives the daemon and its clients'
// mappings (a restarted daemon finds no leftovers to distrust). Quantized and sink regions are
// sealed read-only for everyone but the daemon's own mapping; a session's tail is writable by
// whoever holds its descriptor, which the descriptor channel gives only to that session's
// process. All regions are sealed against resizing, so no client can make the daemon fault.
//
// Huge pages (common/shared_memory.h): with HugePages::kTry a region goes on the kernel's huge
// page pool when it has room (and the kernel has one) and on base pages otherwise; with kOn a
// region that does not fit there is not created (RESOURCE_EXHAUSTED: the daemon does not
// start, a session is refused). Regions on huge pages are a whole number of them, all
// allocated at creation; a tail is pinned (Region::Pin) before the daemon first touches it.
//
// Thread safety: Create may be called concurrently; the counters are atomic.
#ifndef KVARN_DAEMON_BACKENDS_HOST_MEMORY_H_
#define KVARN_DAEMON_BACKENDS_HOST_MEMORY_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/core/memory.h"

namespace kvarn {

enum class HugePages { kOff, kTry, kOn };

class HostMemoryBackend final : public MemoryBackend {
 public:
  // instance: names the segments in /proc/<pid>/maps only (kvarnd.<instance>.<kind>).
  explicit HostMemoryBackend(std::string instance, HugePages huge_pages = HugePages::kOff)
      : instance_(std::move(instance)), huge_pages_(huge_pages) {}

  absl::StatusOr<std::unique_ptr<Region>> Create(RegionKind kind, size_t bytes) override;
  const char* name() const override { return "host"; }
  bool host_accessible() const override { return true; }
  uint64_t HugePageBytes(RegionKind kind) const override;
  uint64_t HugePageFallbacks() const override { return fallbacks_.load(std::memory_order_relaxed); }

 private:
  class HostRegion;

  std::string instance_;
  HugePages huge_pages_;
  // By RegionKind; shared with the regions, which may outlive the backend's callers.
  std::shared_ptr<std::array<std::atomic<uint64_t>, kRegionKinds>> huge_bytes_ = std::make_shared<std::array<std::atomic<uint64_t>, kRegionKinds>>();
  std::atomic<uint64_t> fallbacks_{0};
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_BACKENDS_HOST_MEMORY_H_
