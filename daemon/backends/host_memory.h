// The host memory backend: anonymous shared memory (memfd), handed to clients by descriptor.
//
// Each region is a SharedMemory (common/shared_memory.h): nothing appears in /dev/shm, so no
// process can open a segment by name, and nothing outlives the daemon and its clients'
// mappings (a restarted daemon finds no leftovers to distrust). Quantized and sink regions are
// sealed read-only for everyone but the daemon's own mapping; a session's tail is writable by
// whoever holds its descriptor, which the descriptor channel gives only to that session's
// process. All regions are sealed against resizing, so no client can make the daemon fault.
//
// Thread safety: Create may be called concurrently.
#ifndef KVARN_DAEMON_BACKENDS_HOST_MEMORY_H_
#define KVARN_DAEMON_BACKENDS_HOST_MEMORY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/core/memory.h"

namespace kvarn {

class HostMemoryBackend final : public MemoryBackend {
 public:
  // instance: names the segments in /proc/<pid>/maps only (kvarnd.<instance>.<kind>).
  explicit HostMemoryBackend(std::string instance) : instance_(std::move(instance)) {}

  absl::StatusOr<std::unique_ptr<Region>> Create(RegionKind kind, size_t bytes) override;
  const char* name() const override { return "host"; }
  bool host_accessible() const override { return true; }

 private:
  std::string instance_;
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_BACKENDS_HOST_MEMORY_H_
