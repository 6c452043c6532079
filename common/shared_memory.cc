#include "common/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvarn {

namespace {

size_t RoundUp(size_t bytes, size_t unit) { return (bytes + unit - 1) / unit * unit; }

// The size of the pages behind a memfd: st_blksize is the base page size on tmpfs and the huge
// page size on hugetlbfs.
size_t PageBytes(const struct stat& st) { return static_cast<size_t>(st.st_blksize); }

}  // namespace

absl::StatusOr<SharedMemory> SharedMemory::Create(const std::string& name, size_t bytes, ClientAccess access) {
  return Make(name, bytes, access, false);
}

absl::StatusOr<SharedMemory> SharedMemory::CreateOnHugePages(const std::string& name, size_t bytes, ClientAccess access) {
  return Make(name, bytes, access, true);
}

absl::StatusOr<SharedMemory> SharedMemory::Make(const std::string& name, size_t bytes, ClientAccess access, bool huge) {
  if (bytes == 0) return absl::InvalidArgumentError("a shared memory segment needs at least one byte");
  UniqueFd fd(memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING | (huge ? MFD_HUGETLB : 0)));
  if (!fd.valid()) {
    if (huge && errno == EINVAL) {
      return absl::FailedPreconditionError(absl::StrCat("cannot put ", name, " on huge pages: this kernel has no hugetlbfs"));
    }
    return absl::ErrnoToStatus(errno, absl::StrCat("memfd_create ", name));
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return absl::ErrnoToStatus(errno, absl::StrCat("fstat of ", name));
  const size_t page = PageBytes(st);
  if (huge) bytes = RoundUp(bytes, page);
  if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot size ", name, " to ", bytes, " bytes: ", strerror(errno)));
  }
  // On huge pages this reserves the whole segment: ENOMEM when the pool has too few that are
  // neither in use nor reserved.
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) {
    if (huge) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot reserve ", bytes / page, " huge pages of ", page, " bytes for ", name, " (",
                                                       strerror(errno), "): /proc/meminfo's HugePages_Free less HugePages_Rsvd are left"));
    }
    return absl::ResourceExhaustedError(absl::StrCat("cannot map ", name, " (", bytes, " bytes): ", strerror(errno)));
  }
  // A writable segment on huge pages is sealed for good by Pin, once its writer has mapped it.
  const bool needs_pin = huge && access == ClientAccess::kReadWrite;
  SharedMemory m(std::move(fd), static_cast<uint8_t*>(p), bytes, access, page, needs_pin);
  // Every huge page is allocated now: a hugetlb cgroup limit (charged when a page is
  // allocated, not when it is reserved) fails here rather than as a SIGBUS on a later touch,
  // and Pin can tell whether a page was taken away.
  if (huge && fallocate(m.fd(), 0, 0, static_cast<off_t>(bytes)) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate the ", bytes / page, " huge pages of ", name, " (", strerror(errno),
                                                     "): a hugetlb cgroup limit below them?"));
  }
  int seals = F_SEAL_SHRINK | F_SEAL_GROW;
  if (access == ClientAccess::kReadOnly) seals |= F_SEAL_FUTURE_WRITE;
  if (!needs_pin) seals |= F_SEAL_SEAL;
  if (fcntl(m.fd(), F_ADD_SEALS, seals) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot seal ", name, " (needs Linux 5.1 or later): ", strerror(errno)));
  }
  return m;
}

absl::Status SharedMemory::Pin() {
  if (!needs_pin_) return absl::OkStatus();
  // F_SEAL_FUTURE_WRITE is what refuses hole punching; a seal is never lifted. A holder of the
  // descriptor may have added F_SEAL_SEAL first, to keep it off: then the segment cannot be
  // protected, and is never touched.
  const int seals = fcntl(fd_.get(), F_GET_SEALS);
  if (seals < 0) return absl::ErrnoToStatus(errno, "F_GET_SEALS of a shared memory segment");
  if ((seals & F_SEAL_FUTURE_WRITE) == 0 && fcntl(fd_.get(), F_ADD_SEALS, F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("this segment cannot be sealed against hole punching (",
                                                      strerror(errno), ": a holder of its descriptor sealed it first)"));
  }
  // Sealed: no page can go any more. Were they all still there?
  struct stat st;
  if (fstat(fd_.get(), &st) != 0) return absl::ErrnoToStatus(errno, "fstat of a shared memory segment");
  const uint64_t allocated = static_cast<uint64_t>(st.st_blocks) * 512;
  if (allocated < size_) {
    return absl::FailedPreconditionError(absl::StrCat("pages of this segment were removed by a holder of its descriptor (a hole "
                                                      "punched: ", allocated, " of ", size_, " bytes left); it is not touched until "
                                                      "its writer brings them back"));
  }
  needs_pin_ = false;
  return absl::OkStatus();
}

SharedMemory::SharedMemory(SharedMemory&& o) noexcept { *this = std::move(o); }

SharedMemory& SharedMemory::operator=(SharedMemory&& o) noexcept {
  if (this != &o) {
    Reset();
    fd_ = std::move(o.fd_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    access_ = o.access_;
    page_bytes_ = std::exchange(o.page_bytes_, 0);
    needs_pin_ = std::exchange(o.needs_pin_, false);
  }
  return *this;
}

SharedMemory::~SharedMemory() { Reset(); }

void SharedMemory::Reset() {
  if (data_ != nullptr) munmap(data_, size_);
  data_ = nullptr;
  size_ = page_bytes_ = 0;
  needs_pin_ = false;
  fd_.Reset();
}

uint64_t SharedMemory::ResidentBytes() const {
  struct stat st;
  if (!fd_.valid() || fstat(fd_.get(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

absl::StatusOr<FdMapping> FdMapping::Map(UniqueFd owned, size_t bytes, bool writable) {
  const int fd = owned.get();
  if (fd < 0 || bytes == 0) return absl::InvalidArgumentError(absl::StrCat("bad segment descriptor ", fd, " of ", bytes, " bytes"));
  struct stat st;
  if (fstat(fd, &st) != 0) return absl::ErrnoToStatus(errno, "fstat of a segment descriptor");
  if (static_cast<uint64_t>(st.st_size) < bytes) {
    return absl::FailedPreconditionError(absl::StrCat("segment of ", st.st_size, " bytes is smaller than the ", bytes, " announced"));
  }
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return absl::FailedPreconditionError("segment is not sealed against shrinking; refusing to map it");
  }
  // A hugetlbfs segment can only be unmapped in whole huge pages: map them whole.
  const size_t page = PageBytes(st);
  const size_t mapped = RoundUp(bytes, page);
  void* p = mmap(nullptr, mapped, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    if (errno == EPERM || errno == EACCES) {
      return absl::PermissionDeniedError(absl::StrCat("segment cannot be mapped ", writable ? "writable" : "readable", ": ", strerror(errno)));
    }
    return absl::ErrnoToStatus(errno, "mmap of a segment");
  }
  return FdMapping(std::move(owned), static_cast<uint8_t*>(p), bytes, mapped, page);
}

FdMapping::FdMapping(FdMapping&& o) noexcept { *this = std::move(o); }

FdMapping& FdMapping::operator=(FdMapping&& o) noexcept {
  if (this != &o) {
    Reset();
    fd_ = std::move(o.fd_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    mapped_ = std::exchange(o.mapped_, 0);
    page_bytes_ = std::exchange(o.page_bytes_, 0);
  }
  return *this;
}

void FdMapping::Reset() {
  if (data_ != nullptr) munmap(data_, mapped_);
  data_ = nullptr;
  size_ = mapped_ = page_bytes_ = 0;
  fd_.Reset();
}

uint64_t FdMapping::AllocatedBytes() const {
  struct stat st;
  if (!fd_.valid() || fstat(fd_.get(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

FdMapping::~FdMapping() { Reset(); }

}  // namespace kvarn
