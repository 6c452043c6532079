#include "client/lib/shm_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvarn {

absl::StatusOr<ShmMapping> ShmMapping::Open(const std::string& name, size_t bytes, bool writable) {
  if (name.empty() || name.find('/') != std::string::npos || bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat("bad segment '", name, "' of ", bytes, " bytes"));
  }
  const int fd = shm_open(absl::StrCat("/", name).c_str(), writable ? O_RDWR : O_RDONLY, 0);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open segment ", name, ": ", std::strerror(errno)));
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < bytes) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat("segment ", name, " is smaller than announced"));
  }
  void* p = mmap(nullptr, bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  close(fd);  // the mapping keeps the object alive
  if (p == MAP_FAILED) return absl::InternalError(absl::StrCat("mmap ", name, ": ", std::strerror(errno)));
  return ShmMapping(static_cast<uint8_t*>(p), bytes);
}

ShmMapping::ShmMapping(ShmMapping&& o) noexcept : data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
  o.size_ = 0;
}

ShmMapping& ShmMapping::operator=(ShmMapping&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) munmap(data_, size_);
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

ShmMapping::~ShmMapping() {
  if (data_ != nullptr) munmap(data_, size_);
}

}  // namespace kvarn
