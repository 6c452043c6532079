// The memory sweeps the benchmarks share: a streaming read (the read-bandwidth reference) and
// a cache eviction by reading, so that the timed work after it is not charged for writing
// back lines the eviction dirtied.
#ifndef KVARN_TESTS_BENCH_MEMORY_SWEEP_H_
#define KVARN_TESTS_BENCH_MEMORY_SWEEP_H_

#include <cstddef>
#include <cstdint>

namespace kvarn::bench {

// Sums n 64-bit words in four independent chains (far more adds per cycle than memory
// delivers); the result keeps the reads from being optimized away.
inline uint64_t SumWords(const uint64_t* p, size_t n) {
  uint64_t a = 0, b = 0, c = 0, d = 0;
  for (size_t i = 0; i + 4 <= n; i += 4) a += p[i], b += p[i + 1], c += p[i + 2], d += p[i + 3];
  const uint64_t sum = a + b + c + d;
  asm volatile("" : : "r"(sum) : "memory");
  return sum;
}

// Reads one byte per cache line of a buffer larger than the last-level cache: afterwards the
// caches hold clean lines of that buffer only.
inline void EvictByReading(const uint8_t* buf, size_t bytes) {
  uint64_t sum = 0;
  for (size_t i = 0; i < bytes; i += 64) sum += buf[i];
  asm volatile("" : : "r"(sum) : "memory");
}

}  // namespace kvarn::bench

#endif  // KVARN_TESTS_BENCH_MEMORY_SWEEP_H_
