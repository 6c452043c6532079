// A client's mapping of a shared-memory segment the daemon created; unmapped on
// destruction. Move-only; built by Open, which returns a status instead of throwing.
#ifndef KVARN_CLIENT_LIB_SHM_MAPPING_H_
#define KVARN_CLIENT_LIB_SHM_MAPPING_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace kvarn {

class ShmMapping {
 public:
  // Maps the first `bytes` bytes of the POSIX shared-memory object `name` (no leading '/'),
  // read-only or read-write. NOT_FOUND when it does not exist (e.g. the daemon restarted),
  // FAILED_PRECONDITION when it is smaller than `bytes`.
  static absl::StatusOr<ShmMapping> Open(const std::string& name, size_t bytes, bool writable);

  ShmMapping() = default;
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

#endif  // KVARN_CLIENT_LIB_SHM_MAPPING_H_
