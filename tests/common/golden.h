// The authors' golden vectors (tests/golden, see its README) and the conformance checks
// of KVARN_SPEC.md, shared by the CPU tests and the GPU test executables (std only).
#ifndef KVARN_TESTS_COMMON_GOLDEN_H_
#define KVARN_TESTS_COMMON_GOLDEN_H_

#include <cstdint>
#include <string>
#include <vector>

namespace kvarn::testing {

struct GoldenPreset {
  std::string prefix;  // e.g. "gaussian.k4v2"
  std::string preset_name;  // e.g. "kvarn_k4v2_g128"
  int key_bits = 0;
  int value_bits = 0;
  size_t record_bytes = 0;
  double attn_rel_l2_error = 0;
  double k_rel_l2_error = 0;
  double v_rel_l2_error = 0;
};

struct GoldenCase {
  std::string name;
  bool degenerate = false;
  int tokens = 0;    // G
  int head_dim = 0;  // D
  int iterations = 0;
  std::vector<float> k, v, q, k_rot, v_rot;  // [G][D], [16][D]
  int num_queries = 0;
  std::vector<GoldenPreset> presets;
};

// The directory holding manifest.json: $KVARN_GOLDEN_DIR, else the compiled-in default.
std::string GoldenDir();

// Loads every case of the manifest with its inputs. Throws std::runtime_error on a missing
// or malformed file.
std::vector<GoldenCase> LoadGoldenCases(const std::string& dir);

// What an implementation produced for one case and preset.
struct CodecOutput {
  std::vector<uint8_t> record;
  std::vector<float> k_hat, v_hat;  // decoded, original frame, [G][D]
  std::vector<float> attention;     // [num_queries][D], original frame
};

struct Conformance {
  double k_code_match = 0, v_code_match = 0;  // fraction of equal codes
  int max_scale_ulps = 0;                     // over all six fp16 vectors
  double k_err = 0, v_err = 0, attn_err = 0;  // relative L2, ours
  std::vector<std::string> failures;          // empty: conforms
};

// Applies the manifest's tolerances: codes equal on >= 99.9% and fp16 scales within 2 ulps
// (non-degenerate cases), reconstruction and attention errors <= reference * 1.02 + 1e-6.
Conformance CheckConformance(const std::string& dir, const GoldenCase& c, const GoldenPreset& p,
                             const CodecOutput& out);

// Exact attention in fp64: softmax(q · kᵀ / sqrt(D)) · v for each query.
std::vector<double> ExactAttention(const float* q, int num_queries, const float* k,
                                   const float* v, int tokens, int head_dim);

double RelL2(const float* approx, const float* exact, size_t n);
double RelL2(const float* approx, const double* exact, size_t n);

// Distance in units in the last place between two binary16 bit patterns.
int HalfUlpDistance(uint16_t a, uint16_t b);

}  // namespace kvarn::testing

#endif  // KVARN_TESTS_COMMON_GOLDEN_H_
