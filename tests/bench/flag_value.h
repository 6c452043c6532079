// `--name=value` flags of the benchmark binaries that take their own (not Google Benchmark's).
#ifndef KVARN_TESTS_BENCH_FLAG_VALUE_H_
#define KVARN_TESTS_BENCH_FLAG_VALUE_H_

#include <cstring>
#include <string>

namespace kvarn::bench {

// The value of `arg` when it starts with `prefix` (e.g. "--mib="), else nullptr.
inline const char* FlagValue(const std::string& arg, const char* prefix) {
  const size_t n = std::strlen(prefix);
  return arg.compare(0, n, prefix) == 0 ? arg.c_str() + n : nullptr;
}

}  // namespace kvarn::bench

#endif  // KVARN_TESTS_BENCH_FLAG_VALUE_H_
