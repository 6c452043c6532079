// The checks of the CUDA codec against the CPU codec (Codec::Reference()), written once over
// KernelRunner so that the same checks run on the GPU (tests/gpu/checks_main.cc built as
// kvarn_gpu_checks) and on the CPU block emulator (kvarn_gpu_emulated_checks).
#ifndef KVARN_TESTS_GPU_CHECKS_H_
#define KVARN_TESTS_GPU_CHECKS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tests/gpu/runner.h"

namespace kvarn::cuda::testing {

// Counts checks and failures, printing each failure as it happens.
class Report {
 public:
  explicit Report(std::string suite) : suite_(std::move(suite)) {}
  // Records one check; prints `what` when it fails.
  bool Check(bool ok, const std::string& what);
  void Note(const std::string& line) const;
  int failures() const { return failures_; }
  int checks() const { return checks_; }
  // Prints the summary line; returns the process exit code (0: all passed).
  int Finish() const;

 private:
  std::string suite_;
  int checks_ = 0;
  int failures_ = 0;
};

// How much of each check to run: the emulator is ~1000x slower than the device.
struct Coverage {
  std::vector<std::string> presets;  // encode/decode cross-check: every preset x head_dim
  std::vector<int> head_dims;
  std::vector<std::pair<std::string, int>> extra;  // and these (preset, head_dim) pairs
  int slots = 3;                                   // tiles per encoded block
  bool fp16_source = true;                         // also encode from an fp16 storage-frame block
  std::vector<int> attention_cases;  // indices into the attention scenarios; empty: all
  int golden_cases = -1;             // -1: all
};
Coverage FullCoverage();      // every preset and head_dim, every scenario
Coverage EmulatorCoverage();  // a representative subset that runs in seconds
Coverage SmokeCoverage();     // a few small launches of every kernel (for compute-sanitizer)

// Golden vectors (tests/golden) on the runner, with the manifest's tolerances
// (testing::CheckConformance), and the records compared with Codec::Reference()'s.
void CheckGolden(KernelRunner& runner, const Coverage& cov, Report& report);

// Random tiles of several distributions: records equal to the CPU reference's (codes >= 99.9%,
// fp16 scales within 2 ulps; how many are bit-identical is printed); decoding a CPU record
// gives bit-identical tiles in every frame and dtype.
void CheckEncodeDecode(KernelRunner& runner, const Coverage& cov, Report& report);

// StoreTokens gives the bytes of Codec::Reference().StoreTokens (all layers) and of
// FwhtInPlace + FloatToHalf (one layer); bad input is reported and not written; rotating
// back recovers the input within fp16 rounding.
void CheckStore(KernelRunner& runner, const Coverage& cov, Report& report);

// Fused attention (GQA group sizes 1..24, split-K, sink/tiles/tail mixes, every method)
// against Codec::Reference().AttendDecode per (sequence, kv-head); bad ids and sequences
// are flagged.
void CheckAttention(KernelRunner& runner, const Coverage& cov, Report& report);

// Results do not depend on the order threads run between barriers (emulator only):
// encode, decode and attention outputs are bit-identical across fiber orders.
void CheckScheduleIndependence(Report& report);

}  // namespace kvarn::cuda::testing

#endif  // KVARN_TESTS_GPU_CHECKS_H_
