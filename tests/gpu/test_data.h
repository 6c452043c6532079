// Test data and comparisons shared by the GPU checks and the benchmark.
#ifndef KVARN_TESTS_GPU_TEST_DATA_H_
#define KVARN_TESTS_GPU_TEST_DATA_H_

#include <cstdint>
#include <random>
#include <string>

#include "kernels/block_layout.h"
#include "kernels/preset.h"

namespace kvarn::cuda::testing {

// Kinds of K/V tiles, after the golden cases: gaussian, outlier channels, heavy tails, token
// scale outliers, tiny values with a constant channel (clamps and degenerate rows).
inline constexpr int kTileKinds = 5;
const char* TileKindName(int kind);

// Fills a [G][D] tile (original frame) of the given kind.
void FillTile(std::mt19937_64& rng, int kind, int g, int d, float* out);

// Parses a preset name; aborts on a bad one (test code).
Preset MustParse(const std::string& name);

// How two records of the same preset differ. For the fp16 preset only `identical` is set.
struct RecordDiff {
  double k_codes = 1.0, v_codes = 1.0;  // fraction of equal codes
  int max_ulps = 0;                     // largest fp16 distance over the six scale vectors
  bool identical = true;                // every byte equal
};
RecordDiff CompareRecords(const Preset& preset, int head_dim, const uint8_t* a, const uint8_t* b);

// printf into a std::string.
std::string Fmt(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace kvarn::cuda::testing

#endif  // KVARN_TESTS_GPU_TEST_DATA_H_
