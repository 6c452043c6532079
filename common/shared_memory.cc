#include "common/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvarn {

absl::StatusOr<SharedMemory> SharedMemory::Create(const std::string& name, size_t bytes, ClientAccess access) {
  if (bytes == 0) return absl::InvalidArgumentError("a shared memory segment needs at least one byte");
  UniqueFd fd(memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return absl::ErrnoToStatus(errno, absl::StrCat("memfd_create ", name));
  if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot size ", name, " to ", bytes, " bytes: ", strerror(errno)));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot map ", name, " (", bytes, " bytes): ", strerror(errno)));
  }
  SharedMemory m(std::move(fd), static_cast<uint8_t*>(p), bytes, access);
  int seals = F_SEAL_SHRINK | F_SEAL_GROW;
  if (access == ClientAccess::kReadOnly) seals |= F_SEAL_FUTURE_WRITE;
  if (fcntl(m.fd(), F_ADD_SEALS, seals | F_SEAL_SEAL) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot seal ", name, " (needs Linux 5.1 or later): ", strerror(errno)));
  }
  return m;
}

SharedMemory::SharedMemory(SharedMemory&& o) noexcept { *this = std::move(o); }

SharedMemory& SharedMemory::operator=(SharedMemory&& o) noexcept {
  if (this != &o) {
    Reset();
    fd_ = std::move(o.fd_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    access_ = o.access_;
  }
  return *this;
}

SharedMemory::~SharedMemory() { Reset(); }

void SharedMemory::Reset() {
  if (data_ != nullptr) munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
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
  void* p = mmap(nullptr, bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    if (errno == EPERM || errno == EACCES) {
      return absl::PermissionDeniedError(absl::StrCat("segment cannot be mapped ", writable ? "writable" : "readable", ": ", strerror(errno)));
    }
    return absl::ErrnoToStatus(errno, "mmap of a segment");
  }
  return FdMapping(std::move(owned), static_cast<uint8_t*>(p), bytes);
}

FdMapping::FdMapping(FdMapping&& o) noexcept
    : fd_(std::move(o.fd_)), data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

FdMapping& FdMapping::operator=(FdMapping&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) munmap(data_, size_);
    fd_ = std::move(o.fd_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

uint64_t FdMapping::AllocatedBytes() const {
  struct stat st;
  if (!fd_.valid() || fstat(fd_.get(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

FdMapping::~FdMapping() {
  if (data_ != nullptr) munmap(data_, size_);
}

}  // namespace kvarn
