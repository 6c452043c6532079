#include "common/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvarn {

namespace {

// hugetlbfs's f_type (linux/magic.h).
constexpr long kHugetlbfsMagic = 0x958458f6;

size_t RoundUp(size_t bytes, size_t unit) { return (bytes + unit - 1) / unit * unit; }

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
    // EINVAL: a kernel without hugetlbfs.
    if (huge) return absl::ResourceExhaustedError(absl::StrCat("no huge pages for ", name, ": memfd_create: ", strerror(errno)));
    return absl::ErrnoToStatus(errno, absl::StrCat("memfd_create ", name));
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return absl::ErrnoToStatus(errno, absl::StrCat("fstat of ", name));
  const size_t page = huge ? static_cast<size_t>(st.st_blksize) : static_cast<size_t>(sysconf(_SC_PAGESIZE));
  if (huge) bytes = RoundUp(bytes, page);
  if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot size ", name, " to ", bytes, " bytes: ", strerror(errno)));
  }
  // On huge pages this reserves the whole segment: ENOMEM when the pool has too few free.
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) {
    if (huge) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot reserve ", bytes / page, " huge pages of ", page, " bytes for ", name,
                                                       " (", strerror(errno), "): see HugePages_Free in /proc/meminfo"));
    }
    return absl::ResourceExhaustedError(absl::StrCat("cannot map ", name, " (", bytes, " bytes): ", strerror(errno)));
  }
  SharedMemory m(std::move(fd), static_cast<uint8_t*>(p), bytes, access, page);
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
    page_bytes_ = o.page_bytes_;
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
  // A hugetlbfs segment can only be unmapped in whole huge pages: map them whole.
  struct statfs fs;
  if (fstatfs(fd, &fs) != 0) return absl::ErrnoToStatus(errno, "fstatfs of a segment descriptor");
  const size_t page = static_cast<long>(fs.f_type) == kHugetlbfsMagic ? static_cast<size_t>(st.st_blksize)
                                                                    : static_cast<size_t>(sysconf(_SC_PAGESIZE));
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
    page_bytes_ = o.page_bytes_;
  }
  return *this;
}

void FdMapping::Reset() {
  if (data_ != nullptr) munmap(data_, mapped_);
  data_ = nullptr;
  size_ = mapped_ = 0;
  fd_.Reset();
}

uint64_t FdMapping::AllocatedBytes() const {
  struct stat st;
  if (!fd_.valid() || fstat(fd_.get(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

FdMapping::~FdMapping() { Reset(); }

}  // namespace kvarn
