// The host memory backend: POSIX shared memory through Boost.Interprocess.
//
// Segments are created by the daemon only, mode 0600, named
//   kvarnd.<instance>.<pid>.<16 random hex digits>.<kind>
// so a client can map them (read-only for pool blocks, read-write for its own tail slots)
// (client/lib/shm_mapping.h) and a restarted daemon can recognise what a dead predecessor left behind: a segment of its
// instance whose pid is no longer a running kvarnd is removed at start, never reused.
#ifndef KVARN_DAEMON_BACKENDS_HOST_SHM_H_
#define KVARN_DAEMON_BACKENDS_HOST_SHM_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/core/memory.h"

namespace kvarn {

class HostShmBackend final : public MemoryBackend {
 public:
  // instance: a short name of letters, digits, '-' and '_' separating daemons on one host.
  static absl::StatusOr<std::unique_ptr<HostShmBackend>> Create(const std::string& instance);

  absl::StatusOr<std::unique_ptr<Region>> Create(RegionKind kind, size_t bytes, int owner_pid = 0) override;
  const char* name() const override { return "host"; }
  bool host_accessible() const override { return true; }

  // Removes segments of `instance` whose creating process is gone. Returns their names.
  static std::vector<std::string> RemoveStaleSegments(const std::string& instance);

 private:
  explicit HostShmBackend(std::string instance) : instance_(std::move(instance)) {}
  std::string instance_;
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_BACKENDS_HOST_SHM_H_
