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
// Huge pages: a segment may instead live on the kernel's huge page pool (MFD_HUGETLB, the
// default huge page size, 2 MiB on x86-64), which an administrator fills (vm.nr_hugepages, or
// a Kubernetes node's hugepages-2Mi). Its size is then rounded up to whole huge pages, and
// every page is reserved and allocated when it is created (so a hugetlb cgroup limit fails the
// creation, not a later touch).
// A touch of many scattered rows (the commit path's NaN scan, the client's staging) then costs
// one TLB entry per 2 MiB instead of per 4 KiB. Mappings of such a segment, the daemon's and a
// client's (FdMapping), cover whole huge pages: the kernel unmaps nothing smaller.
//
// A kReadWrite segment on huge pages needs one more step. Its writer may punch holes in it
// (fallocate, MADV_REMOVE): the kernel frees those pages and drops their reservation, and the
// next touch of the range by anyone needs a free huge page, or dies of SIGBUS. So such a
// segment is created without F_SEAL_SEAL, and Pin seals it
// against hole punching (F_SEAL_FUTURE_WRITE: mappings made before stay writable, new writable
// ones are refused) and checks that no page is missing. The owner calls Pin after the writer
// has mapped it and before its own first touch; once Pin succeeded, nothing can take a page
// away. Segments on base pages and kReadOnly segments are sealed for good at creation (a hole
// punched in base pages is refilled on the next touch; read-only ones cannot be punched).
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
  // The same on huge pages: RESOURCE_EXHAUSTED when the huge page pool has too few free pages
  // (reserved or in use by others), which the caller may answer with Create; FAILED_PRECONDITION
  // when the kernel has no hugetlbfs.
  static absl::StatusOr<SharedMemory> CreateOnHugePages(const std::string& name, size_t bytes, ClientAccess access);

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
  // The size of the pages behind the segment: the base page size, or the huge page size.
  size_t page_bytes() const { return page_bytes_; }
  // For a kReadWrite segment on huge pages (above): seals it against hole punching and checks
  // that every page is there: FAILED_PRECONDITION while one a holder of the descriptor punched
  // is missing (the segment must not be touched then; once the writer's own touch has brought
  // the page back, nothing can take it away again and Pin succeeds). Ok at once for every
  // other segment. One caller at a time.
  absl::Status Pin();
  // Bytes of memory actually allocated behind the segment (fstat st_blocks).
  uint64_t ResidentBytes() const;

 private:
  SharedMemory(UniqueFd fd, uint8_t* data, size_t size, ClientAccess access, size_t page_bytes, bool needs_pin)
      : fd_(std::move(fd)), data_(data), size_(size), access_(access), page_bytes_(page_bytes), needs_pin_(needs_pin) {}
  static absl::StatusOr<SharedMemory> Make(const std::string& name, size_t bytes, ClientAccess access, bool huge);
  void Reset();

  UniqueFd fd_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  ClientAccess access_ = ClientAccess::kReadOnly;
  size_t page_bytes_ = 0;
  bool needs_pin_ = false;  // until a successful Pin
};

// A client's mapping of a segment descriptor it received; unmapped (and the descriptor
// closed) on destruction.
class FdMapping {
 public:
  // Maps the first `bytes` of `fd`, read-only or read-write, and keeps the descriptor.
  // FAILED_PRECONDITION when the segment is smaller than `bytes` or not sealed against
  // shrinking (it could then be truncated under this reader); PERMISSION_DENIED when a
  // writable mapping is refused (a read-only segment).
  // A segment on huge pages is mapped to the end of its last huge page (size() stays `bytes`).
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
  // The size of the pages behind the segment: the base page size, or the huge page size.
  size_t page_bytes() const { return page_bytes_; }

 private:
  FdMapping(UniqueFd fd, uint8_t* data, size_t size, size_t mapped, size_t page_bytes)
      : fd_(std::move(fd)), data_(data), size_(size), mapped_(mapped), page_bytes_(page_bytes) {}
  void Reset();
  UniqueFd fd_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;  // size_ rounded up to whole pages
  size_t page_bytes_ = 0;
};

}  // namespace kvarn

#endif  // KVARN_COMMON_SHARED_MEMORY_H_
