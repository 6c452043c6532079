// A move-only owner of a POSIX file descriptor: closes it on destruction. Low-level enough
// for both the daemon and the client, so it lives in common/ and depends on nothing but
// POSIX.
//
// Thread safety: none; like any value, one owner uses it at a time.
#ifndef KVARN_COMMON_UNIQUE_FD_H_
#define KVARN_COMMON_UNIQUE_FD_H_

#include <unistd.h>

#include <utility>

namespace kvarn {

class UniqueFd {
 public:
  UniqueFd() = default;
  // Takes ownership of `fd` (-1 for none).
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { Reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

  // Closes the descriptor now. close(2)'s result is ignored: on Linux the descriptor is
  // released even when close reports an error, and there is nothing to retry.
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  // Gives up ownership without closing: returns the descriptor (-1 if none), which the
  // caller must now close, and leaves this owner empty.
  [[nodiscard]] int Release() { return std::exchange(fd_, -1); }

 private:
  int fd_ = -1;
};

}  // namespace kvarn

#endif  // KVARN_COMMON_UNIQUE_FD_H_
