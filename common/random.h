// Unpredictable bytes from the operating system's CSPRNG (getrandom(2)), for credentials.
#ifndef KVARN_COMMON_RANDOM_H_
#define KVARN_COMMON_RANDOM_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace kvarn {

// Fills out[0, n) from the kernel's CSPRNG; blocks only until it is seeded (at boot).
// INTERNAL if the kernel refuses (a seccomp profile without getrandom).
absl::Status FillRandom(uint8_t* out, size_t n);

}  // namespace kvarn

#endif  // KVARN_COMMON_RANDOM_H_
