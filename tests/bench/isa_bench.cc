// kvarn_isa_bench: the throughput of the x86 instructions the AVX2 attention path is built
// from (kernels/simd_attend_avx2-inl.h) and, on CPUs with AVX-512 VNNI and VBMI, those of the
// VNNI path (kernels/simd_attend_int-inl.h), measured on this core, so that
// docs/benchmarks.md can state the floor of a tile's work from figures of the same machine
// rather than from tables. Nothing here asserts on time.
//
// Each figure is a loop of 8 (AVX2) or 12 (VNNI) independent instructions (distinct
// destinations, loop-invariant sources; an accumulating instruction's chain on its own
// destination is 12 long, more than its latency times its throughput), so it measures issue
// throughput, not latency; the first line is a chain of dependent scalar adds, one per cycle,
// which gives the core's clock; on VNNI CPUs a second chain runs beside independent vpdpbusd
// zmm, which gives the clock under 512-bit multiplies, and the VNNI lines are stated against
// both. Clock: steady_clock, the best of 5 runs of 10^8 iterations.
// Run pinned: `taskset -c 1 build/bin/kvarn_isa_bench`.
#include <algorithm>
#include <chrono>
#include <cstdio>

#if defined(__x86_64__)

namespace kvarn::bench {
namespace {

constexpr long kIterations = 100000000;
constexpr int kPerIteration = 8;
constexpr int kPerIterationVnni = 12;

#define KVARN_INDEP(insn)                                                \
  insn " %%ymm8,%%ymm9,%%ymm0\n\t" insn " %%ymm8,%%ymm9,%%ymm1\n\t" insn \
       " %%ymm8,%%ymm9,%%ymm2\n\t" insn " %%ymm8,%%ymm9,%%ymm3\n\t" insn \
       " %%ymm8,%%ymm9,%%ymm4\n\t" insn " %%ymm8,%%ymm9,%%ymm5\n\t" insn \
       " %%ymm8,%%ymm9,%%ymm6\n\t" insn " %%ymm8,%%ymm9,%%ymm7\n\t"

// clang-format off
// Twelve independent zmm or ymm instructions: destinations 0-11, sources 12 and 13.
#define KVARN_INDEP12(insn, r)                                                             \
  insn " %%" r "12,%%" r "13,%%" r "0\n\t" insn " %%" r "12,%%" r "13,%%" r "1\n\t"       \
  insn " %%" r "12,%%" r "13,%%" r "2\n\t" insn " %%" r "12,%%" r "13,%%" r "3\n\t"       \
  insn " %%" r "12,%%" r "13,%%" r "4\n\t" insn " %%" r "12,%%" r "13,%%" r "5\n\t"       \
  insn " %%" r "12,%%" r "13,%%" r "6\n\t" insn " %%" r "12,%%" r "13,%%" r "7\n\t"       \
  insn " %%" r "12,%%" r "13,%%" r "8\n\t" insn " %%" r "12,%%" r "13,%%" r "9\n\t"       \
  insn " %%" r "12,%%" r "13,%%" r "10\n\t" insn " %%" r "12,%%" r "13,%%" r "11\n\t"

// Six vpdpbusd zmm (even destinations) interleaved with six of `insn` (odd ones).
#define KVARN_PAIR(insn, a, b)                                          \
  "vpdpbusd %%zmm12,%%zmm13,%%zmm" a "\n\t" insn " %%zmm12,%%zmm13,%%zmm" b "\n\t"
#define KVARN_PAIRED6(insn)                                                          \
  KVARN_PAIR(insn, "0", "1") KVARN_PAIR(insn, "2", "3") KVARN_PAIR(insn, "4", "5")   \
  KVARN_PAIR(insn, "6", "7") KVARN_PAIR(insn, "8", "9") KVARN_PAIR(insn, "10", "11")
// clang-format on

// Nanoseconds per instruction of `body` (`per_iteration` instructions), the best of 5 runs.
template <class Body>
double BestNs(Body body, int per_iteration = kPerIteration) {
  double best = 1e30;
  for (int run = 0; run < 5; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < kIterations; ++i) body();
    const auto t1 = std::chrono::steady_clock::now();
    const double ns = std::chrono::duration<double, std::nano>(t1 - t0).count();
    best = std::min(best, ns / (static_cast<double>(kIterations) * per_iteration));
  }
  return best;
}

#define KVARN_CLOBBERS "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7"
#define KVARN_CLOBBERS12 KVARN_CLOBBERS, "xmm8", "xmm9", "xmm10", "xmm11"

struct Row {
  const char* name;
  double ns;
};

// The loop bodies of the VNNI lines, inlined into the timed loop: twelve instructions each
// (six pairs for the paired ones).
inline __attribute__((always_inline)) void DpbusdZmm() {
  asm volatile(KVARN_INDEP12("vpdpbusd", "zmm")::: KVARN_CLOBBERS12);
}
inline __attribute__((always_inline)) void DpbusdYmm() {
  asm volatile(KVARN_INDEP12("vpdpbusd", "ymm")::: KVARN_CLOBBERS12);
}
inline __attribute__((always_inline)) void Permt2bZmm() {
  asm volatile(KVARN_INDEP12("vpermt2b", "zmm")::: KVARN_CLOBBERS12);
}
inline __attribute__((always_inline)) void FmaZmm() {
  asm volatile(KVARN_INDEP12("vfmadd231ps", "zmm")::: KVARN_CLOBBERS12);
}
inline __attribute__((always_inline)) void DpbusdFma() {
  asm volatile(KVARN_PAIRED6("vfmadd231ps")::: KVARN_CLOBBERS12);
}
inline __attribute__((always_inline)) void DpbusdPermt2b() {
  asm volatile(KVARN_PAIRED6("vpermt2b")::: KVARN_CLOBBERS12);
}
inline __attribute__((always_inline)) void DpbusdAnd() {
  asm volatile(KVARN_PAIRED6("vpandq")::: KVARN_CLOBBERS12);
}

// 24 dependent scalar adds beside 12 independent vpdpbusd zmm: the add chain takes 24 cycles
// whatever the multiplies' throughput (12 of them issue in 12 cycles or fewer at one or more a
// cycle), so the loop gives the clock of a core busy with 512-bit multiplies, which is lower
// than the scalar clock on cores that drop their frequency for them (Intel's AVX-512 levels).
#define KVARN_DP_ADDS(k) \
  "vpdpbusd %%zmm12,%%zmm13,%%zmm" k "\n\tadd $1, %%r11\n\tadd $1, %%r11\n\t"
inline __attribute__((always_inline)) void AddsBesideDpbusd() {
  asm volatile(KVARN_DP_ADDS("0") KVARN_DP_ADDS("1") KVARN_DP_ADDS("2") KVARN_DP_ADDS("3")
               KVARN_DP_ADDS("4") KVARN_DP_ADDS("5") KVARN_DP_ADDS("6") KVARN_DP_ADDS("7")
               KVARN_DP_ADDS("8") KVARN_DP_ADDS("9") KVARN_DP_ADDS("10") KVARN_DP_ADDS("11")
               ::: KVARN_CLOBBERS12, "r11");
}

// The VNNI path's instructions (kernels/simd_attend_int-inl.h) and its multiply floor: the
// key dots and the value sums of a tile are 128 x 128 x 4 products each at GQA 4, 64 per
// vpdpbusd zmm.
void MeasureVnni(double ghz, int tiles_32k) {
  if (!__builtin_cpu_supports("avx512vnni") || !__builtin_cpu_supports("avx512vbmi")) {
    std::printf("\n(no AVX-512 VNNI and VBMI on this CPU: the VNNI path's lines skipped)\n");
    return;
  }
  std::printf("\nthe AVX-512 VNNI path (12 independent instructions per loop):\n");
  const double zmm_add_ns = BestNs([] { AddsBesideDpbusd(); }, 2 * kPerIterationVnni);
  const double zmm_ghz = 1.0 / zmm_add_ns;
  std::printf("%-44s %7.3f ns  (one cycle: %.2f GHz, the zmm clock below)\n",
              "dependent scalar add beside vpdpbusd zmm", zmm_add_ns, zmm_ghz);
  const Row rows[] = {
      {"vpdpbusd zmm (u8 x s8 quads into s32)", BestNs([] { DpbusdZmm(); }, kPerIterationVnni)},
      {"vpdpbusd ymm", BestNs([] { DpbusdYmm(); }, kPerIterationVnni)},
      {"vpermt2b zmm (the codes' 4x4 transpose)", BestNs([] { Permt2bZmm(); }, kPerIterationVnni)},
      {"vfmadd231ps zmm (the softmax)", BestNs([] { FmaZmm(); }, kPerIterationVnni)},
  };
  for (const Row& r : rows) {
    std::printf("%-44s %7.3f ns  = %.2f per cycle, %.2f per zmm-clock cycle\n", r.name, r.ns,
                1.0 / (r.ns * ghz), 1.0 / (r.ns * zmm_ghz));
  }
  // Whether other work can hide under the multiplies: six vpdpbusd zmm and six of another
  // instruction, interleaved. If they share the multiply pipes the pair takes as long as the
  // two apart (about 2 cycles per pair at one each per cycle); if not, about one.
  const Row mixed[] = {
      {"vpdpbusd zmm + vfmadd231ps zmm", BestNs([] { DpbusdFma(); }, kPerIterationVnni / 2)},
      {"vpdpbusd zmm + vpermt2b zmm", BestNs([] { DpbusdPermt2b(); }, kPerIterationVnni / 2)},
      {"vpdpbusd zmm + vpandq zmm", BestNs([] { DpbusdAnd(); }, kPerIterationVnni / 2)},
  };
  for (const Row& r : mixed) {
    std::printf("%-44s %7.3f ns  = %.2f cycles per pair, %.2f zmm-clock cycles\n", r.name, r.ns,
                r.ns * ghz, r.ns * zmm_ghz);
  }
  constexpr double kDpbusdPerTile = 2.0 * 128 * 128 * 4 / 64;
  const double tile_us = kDpbusdPerTile * std::min(rows[0].ns, 2 * rows[1].ns) / 1e3;
  std::printf(
      "floor of one tile's vpdpbusd at GQA 4 (%.0f zmm, or twice as many ymm, whichever is "
      "faster): %.3f us; x %d tiles (the 32K step): %.2f ms\n",
      kDpbusdPerTile, tile_us, tiles_32k, tile_us * tiles_32k / 1e3);
}

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
  MeasureVnni(ghz, kTiles32K);
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
