// The host memory backend: POSIX shared memory through Boost.Interprocess.
//
// Segments are created by the daemon only, mode 0600, named
//   kvarnd.<instance>.<pid>.<16 random hex digits>.<kind>
// so a client can map them (read-only for pool blocks, read-write for its own tail slots)
// and a restarted daemon can recognise what a dead predecessor left behind: a segment of its
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

  absl::StatusOr<std::unique_ptr<Region>> Create(RegionKind kind, size_t bytes) override;
  const char* name() const override { return "host"; }
  bool host_accessible() const override { return true; }

  // Removes segments of `instance` whose creating process is gone. Returns their names.
  static std::vector<std::string> RemoveStaleSegments(const std::string& instance);

 private:
  explicit HostShmBackend(std::string instance) : instance_(std::move(instance)) {}
  std::string instance_;
};

// A client's mapping of a daemon segment; unmapped on destruction. Move-only.
class ShmMapping {
 public:
  static absl::StatusOr<ShmMapping> Open(const std::string& name, size_t bytes, bool writable);
  ShmMapping(ShmMapping&& other) noexcept;
  ShmMapping& operator=(ShmMapping&& other) noexcept;
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;
  ~ShmMapping();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  ShmMapping(uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_BACKENDS_HOST_SHM_H_
