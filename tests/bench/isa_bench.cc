// kvarn_isa_bench: the throughput of the x86 instructions the AVX2 attention path is built
// from (kernels/simd_attend_avx2-inl.h), measured on this core, so that docs/benchmarks.md can
// state the floor of a tile's work from figures of the same machine rather than from tables.
// Nothing here asserts on time.
//
// Each figure is a loop of 8 independent instructions (distinct destinations, loop-invariant
// sources), so it measures issue throughput, not latency; the first line is a chain of
// dependent scalar adds, one per cycle, which gives the core's clock. Clock: steady_clock,
// the best of 5 runs of 10^8 iterations. Run pinned: `taskset -c 1 build/bin/kvarn_isa_bench`.
#include <algorithm>
#include <chrono>
#include <cstdio>

#if defined(__x86_64__)

namespace kvarn::bench {
namespace {

constexpr long kIterations = 100000000;
constexpr int kPerIteration = 8;

#define KVARN_INDEP(insn)                                                \
  insn " %%ymm8,%%ymm9,%%ymm0\n\t" insn " %%ymm8,%%ymm9,%%ymm1\n\t" insn \
       " %%ymm8,%%ymm9,%%ymm2\n\t" insn " %%ymm8,%%ymm9,%%ymm3\n\t" insn \
       " %%ymm8,%%ymm9,%%ymm4\n\t" insn " %%ymm8,%%ymm9,%%ymm5\n\t" insn \
       " %%ymm8,%%ymm9,%%ymm6\n\t" insn " %%ymm8,%%ymm9,%%ymm7\n\t"

// Nanoseconds per instruction of `body` (kPerIteration instructions), the best of 5 runs.
template <class Body>
double BestNs(Body body) {
  double best = 1e30;
  for (int run = 0; run < 5; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < kIterations; ++i) body();
    const auto t1 = std::chrono::steady_clock::now();
    const double ns = std::chrono::duration<double, std::nano>(t1 - t0).count();
    best = std::min(best, ns / (static_cast<double>(kIterations) * kPerIteration));
  }
  return best;
}

#define KVARN_CLOBBERS "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7"

__attribute__((target("avx2"))) int Main() {
  if (!__builtin_cpu_supports("avx2")) {
    std::printf("kvarn_isa_bench: this CPU has no AVX2; nothing to measure\n");
    return 0;
  }
  std::printf(
      "kvarn_isa_bench: issue throughput of 8 independent instructions per loop,\n"
      "steady_clock, best of 5 runs of 1e8 loops; cycles from the dependent-add line\n\n");
  const double add_ns = BestNs([] {
    asm volatile(
        "add $1, %%r11\n\tadd $1, %%r11\n\tadd $1, %%r11\n\tadd $1, %%r11\n\t"
        "add $1, %%r11\n\tadd $1, %%r11\n\tadd $1, %%r11\n\tadd $1, %%r11\n\t" ::
            : "r11");
  });
  const double ghz = 1.0 / add_ns;
  std::printf("%-44s %7.3f ns  (one cycle: %.2f GHz)\n", "dependent scalar add (1 per cycle)",
              add_ns, ghz);
  struct Row {
    const char* name;
    double ns;
  };
  const Row rows[] = {
      {"vpmaddubsw ymm (u8 x s8 pairs into s16)", BestNs([] {
         asm volatile(KVARN_INDEP("vpmaddubsw")::: KVARN_CLOBBERS);
       })},
      {"vpmaddwd ymm (s16 pairs into s32)", BestNs([] {
         asm volatile(KVARN_INDEP("vpmaddwd")::: KVARN_CLOBBERS);
       })},
      {"vpaddw ymm", BestNs([] {
         asm volatile(KVARN_INDEP("vpaddw")::: KVARN_CLOBBERS);
       })},
      {"vpunpcklbw ymm (a shuffle)", BestNs([] {
         asm volatile(KVARN_INDEP("vpunpcklbw")::: KVARN_CLOBBERS);
       })},
  };
  for (const Row& r : rows) {
    std::printf("%-44s %7.3f ns  = %.2f per cycle\n", r.name, r.ns, 1.0 / (r.ns * ghz));
  }
  // The AVX2 fast path's multiplies per tile (kvarn_k4v2_g128, D = 128, GQA 4): the key dots
  // and the value sums are 128 x 128 x 4 products each, 32 per vpmaddubsw. The 32K step of
  // kvarn_attend_bench quantizes 255 tiles per kv-head, 8 kv-heads.
  constexpr double kMaddubsPerTile = 2.0 * 128 * 128 * 4 / 32;
  constexpr int kTiles32K = 255 * 8;
  const double tile_us = kMaddubsPerTile * rows[0].ns / 1e3;
  std::printf(
      "\nfloor of one tile's vpmaddubsw at GQA 4 (%.0f of them): %.3f us; "
      "x %d tiles (kvarn_attend_bench's 32K step): %.2f ms\n",
      kMaddubsPerTile, tile_us, kTiles32K, tile_us * kTiles32K / 1e3);
  return 0;
}

}  // namespace
}  // namespace kvarn::bench

int main() { return kvarn::bench::Main(); }

#else
int main() {
  std::printf("kvarn_isa_bench: x86-64 only; nothing to measure\n");
  return 0;
}
#endif
