// How a fuzzer's check fails: a message on stderr, named by the fuzzer's program, then abort,
// so that libFuzzer reports the input and keeps it.
#ifndef KVARN_TESTS_FUZZ_FUZZ_CHECK_H_
#define KVARN_TESTS_FUZZ_FUZZ_CHECK_H_

#include <errno.h>  // program_invocation_short_name (glibc)

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"

namespace kvarn::testing::fuzz {

[[noreturn]] inline void Fail(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", program_invocation_short_name, what.c_str());
  std::abort();
}

// Checks `cond`; the message's parts are joined only on failure.
template <typename... Parts>
inline void Check(bool cond, const Parts&... parts) {
  if (!cond) Fail(absl::StrCat(parts...));
}

}  // namespace kvarn::testing::fuzz

#endif  // KVARN_TESTS_FUZZ_FUZZ_CHECK_H_
