// Anonymous shared memory handed to other processes by descriptor, never by name.
//
// The daemon creates each segment with memfd_create(2): nothing appears in /dev/shm, no other
// process can open it by guessing a name, and the memory is gone once the last descriptor and
// mapping of it are. The daemon maps it read-write, then seals it:
//   - always against shrinking and growing (F_SEAL_SHRINK, F_SEAL_GROW), so no holder of a
//     descriptor can truncate it under a reader (which would kill the reader with SIGBUS);
//   - for kReadOnly segments also against every new writable mapping and write(2)
//     (F_SEAL_FUTURE_WRITE, Linux 5.1+). The daemon's own mapping, made before the seal, stays
//     writable; every other mapping is read-only, however the descriptor was obtained (a
//     client can reopen it through /proc/self/fd, but not map it writable or write it);
//   - finally against further seals (F_SEAL_SEAL).
// A sealed segment cannot give pages back (hole punching counts as a write), so its resident
// memory is whatever has been touched, at most its size.
//
// Thread safety: immutable after Create; data() may be used from any thread.
#ifndef KVARN_COMMON_SHARED_MEMORY_H_
#define KVARN_COMMON_SHARED_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace kvarn {

enum class ClientAccess { kReadOnly, kReadWrite };

class SharedMemory {
 public:
  // `bytes` of zeroed memory (no pages are allocated until touched). `name` shows in
  // /proc/<pid>/maps only. INVALID_ARGUMENT for 0 bytes; RESOURCE_EXHAUSTED when the system
  // refuses the memory; FAILED_PRECONDITION when the kernel cannot seal (older than 5.1).
  static absl::StatusOr<SharedMemory> Create(const std::string& name, size_t bytes, ClientAccess access);

  SharedMemory() = default;
  SharedMemory(SharedMemory&& other) noexcept;
  SharedMemory& operator=(SharedMemory&& other) noexcept;
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;
  ~SharedMemory();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // The descriptor to hand to clients (dup it to send: it stays owned here).
  int fd() const { return fd_.get(); }
  ClientAccess access() const { return access_; }
  // Bytes of memory actually allocated behind the segment (fstat st_blocks).
  uint64_t ResidentBytes() const;

 private:
  SharedMemory(UniqueFd fd, uint8_t* data, size_t size, ClientAccess access)
      : fd_(std::move(fd)), data_(data), size_(size), access_(access) {}
  void Reset();

  UniqueFd fd_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  ClientAccess access_ = ClientAccess::kReadOnly;
};

// A client's mapping of a segment descriptor it received; unmapped (and the descriptor
// closed) on destruction.
class FdMapping {
 public:
  // Maps the first `bytes` of `fd`, read-only or read-write, and keeps the descriptor.
  // FAILED_PRECONDITION when the segment is smaller than `bytes` or not sealed against
  // shrinking (it could then be truncated under this reader); PERMISSION_DENIED when a
  // writable mapping is refused (a read-only segment).
  static absl::StatusOr<FdMapping> Map(UniqueFd fd, size_t bytes, bool writable);

  FdMapping() = default;
  FdMapping(FdMapping&& other) noexcept;
  FdMapping& operator=(FdMapping&& other) noexcept;
  FdMapping(const FdMapping&) = delete;
  FdMapping& operator=(const FdMapping&) = delete;
  ~FdMapping();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // Bytes of memory allocated behind the whole segment, by every process (fstat st_blocks).
  uint64_t AllocatedBytes() const;

 private:
  FdMapping(UniqueFd fd, uint8_t* data, size_t size) : fd_(std::move(fd)), data_(data), size_(size) {}
  UniqueFd fd_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kvarn

#endif  // KVARN_COMMON_SHARED_MEMORY_H_
