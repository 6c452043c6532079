#include "common/random.h"

#include <sys/random.h>

#include <cerrno>

#include "absl/strings/str_cat.h"

namespace kvarn {

absl::Status FillRandom(uint8_t* out, size_t n) {
  size_t done = 0;
  while (done < n) {
    const ssize_t got = getrandom(out + done, n - done, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, "getrandom");
    }
    done += static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

}  // namespace kvarn
