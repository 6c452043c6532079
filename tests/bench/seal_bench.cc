// kvarn_seal_bench: CpuSealer::SealQuantized throughput with seal_threads = 1 and 2 (or the
// list given), over fp16 tail slots far larger than the L3 cache, and the scaling between
// them. Every figure is wall-clock time (std::chrono::steady_clock) of whole seals; beside it
// the process's CPU time (CLOCK_PROCESS_CPUTIME_ID) and the machine's busy time from
// /proc/stat, so that time lost to other processes on a shared machine shows up as
// "others busy" rather than as poor scaling.
//
//   kvarn_seal_bench [--mib=256] [--layers=32] [--heads=8] [--threads=1,2] [--repeats=3]
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/core/cpu_sealer.h"
#include "kernels/fp16.h"
#include "kernels/preset.h"
#include "tests/bench/flag_value.h"

namespace kvarn {
namespace {

struct Flags {
  size_t mib = 256;
  int layers = 32, heads = 8, repeats = 3;
  std::vector<int> threads = {1, 2};
};

Flags Parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&](const char* prefix) { return bench::FlagValue(a, prefix); };
    if (const char* v = value("--mib=")) {
      f.mib = std::strtoul(v, nullptr, 10);
    } else if (const char* v = value("--layers=")) {
      f.layers = std::atoi(v);
    } else if (const char* v = value("--heads=")) {
      f.heads = std::atoi(v);
    } else if (const char* v = value("--repeats=")) {
      f.repeats = std::atoi(v);
    } else if (const char* v = value("--threads=")) {
      f.threads.clear();
      std::stringstream ss(v);
      for (std::string t; std::getline(ss, t, ',');) f.threads.push_back(std::atoi(t.c_str()));
    } else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      std::exit(2);
    }
  }
  return f;
}

double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// Busy and total jiffies of all CPUs (/proc/stat's first line).
struct CpuTimes {
  double busy = 0, total = 0;
};
CpuTimes MachineTimes() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  double v[10] = {};
  f >> cpu;
  for (double& x : v) f >> x;
  CpuTimes t;
  for (double x : v) t.total += x;
  t.busy = t.total - v[3] - v[4];  // less idle and iowait
  return t;
}

// An fp16 storage-frame slot of gaussian-ish values (sum of four uniforms), per (layer, head).
void FillSlot(uint8_t* slot, size_t bytes, uint64_t seed) {
  auto* h = reinterpret_cast<uint16_t*>(slot);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < bytes / 2; ++i) {
    float s = 0;
    for (int k = 0; k < 4; ++k) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      s += static_cast<float>(x >> 40) * (1.0f / 16777216.0f) - 0.5f;
    }
    h[i] = FloatToHalf(1.7f * s);
  }
}

int Main(int argc, char** argv) {
  const Flags f = Parse(argc, argv);
  Preset preset;
  if (!ParsePreset("kvarn_k4v2_g128", &preset).ok()) return 1;
  const BlockLayout layout = MakeBlockLayout(preset, f.layers, f.heads, 128);
  const size_t slot_bytes = layout.fp16_block_bytes();
  const size_t slots = std::max<size_t>(1, (f.mib << 20) / slot_bytes);
  std::vector<uint8_t> input(slots * slot_bytes), output(slots * layout.quant_block_bytes());
  for (size_t s = 0; s < slots; ++s) FillSlot(input.data() + s * slot_bytes, slot_bytes, s);
  std::printf("kvarn_seal_bench: kvarn_k4v2_g128 D128, %d layers x %d kv-heads per block, %zu blocks "
              "(%.0f MiB of fp16 input, beyond a 32 MiB L3), wall clock: std::chrono::steady_clock\n",
              f.layers, f.heads, slots, input.size() / 1048576.0);
  double base = 0;
  for (int threads : f.threads) {
    CpuSealer sealer(preset, layout, threads);
    // Warm-up: every worker's thread-local codec scratch.
    if (!sealer.SealQuantized(input.data(), output.data()).ok()) return 1;
    double best = 1e30, cpu_at_best = 0, others_at_best = 0;
    for (int r = 0; r < f.repeats; ++r) {
      const CpuTimes m0 = MachineTimes();
      const double c0 = ProcessCpuSeconds();
      const auto t0 = std::chrono::steady_clock::now();
      for (size_t s = 0; s < slots; ++s) {
        if (!sealer.SealQuantized(input.data() + s * slot_bytes, output.data() + s * layout.quant_block_bytes()).ok()) {
          return 1;
        }
      }
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double cpu = ProcessCpuSeconds() - c0;
      const CpuTimes m1 = MachineTimes();
      // Machine busy time in CPU-seconds (jiffies are 1/100 s here), less ours.
      const double others = std::max(0.0, (m1.busy - m0.busy) / 100.0 - cpu);
      if (wall < best) best = wall, cpu_at_best = cpu, others_at_best = others;
    }
    const double gbs = input.size() / best / 1e9;
    if (base == 0) base = gbs;
    std::printf("seal_threads=%d  %.3f GB/s of fp16 K+V (wall, best of %d)  %.2fx of seal_threads=%d  "
                "process CPU %.2f s in %.2f s wall (%.2f cores)  others busy %.2f CPU-s\n",
                threads, gbs, f.repeats, gbs / base, f.threads[0], cpu_at_best, best,
                cpu_at_best / best, others_at_best);
  }
  return 0;
}

}  // namespace
}  // namespace kvarn

int main(int argc, char** argv) { return kvarn::Main(argc, argv); }
