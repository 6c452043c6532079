// The fast Walsh-Hadamard transform against its definition (KVARN_SPEC.md §2): x · H with
// H the normalized Sylvester Hadamard matrix, and H its own inverse.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/codec.h"
#include "tests/kernels/codec_test_util.h"

namespace kvarn {
namespace {

// Sylvester construction: H_1 = [1], H_2n = [[H, H], [H, -H]], then divided by sqrt(n).
std::vector<double> DenseSylvesterHadamard(int n) {
  std::vector<double> h(static_cast<size_t>(n) * n);
  h[0] = 1.0;
  for (int size = 1; size < n; size *= 2) {
    for (int r = 0; r < size; ++r) {
      for (int c = 0; c < size; ++c) {
        const double x = h[static_cast<size_t>(r) * n + c];
        h[static_cast<size_t>(r) * n + c + size] = x;
        h[static_cast<size_t>(r + size) * n + c] = x;
        h[static_cast<size_t>(r + size) * n + c + size] = -x;
      }
    }
  }
  const double norm = 1.0 / std::sqrt(static_cast<double>(n));
  for (double& x : h) x *= norm;
  return h;
}

class FwhtTest : public ::testing::TestWithParam<int> {};

TEST_P(FwhtTest, EqualsDenseProductWithNormalizedSylvesterHadamard) {
  const int n = GetParam();
  const std::vector<double> h = DenseSylvesterHadamard(n);
  for (uint32_t seed = 1; seed <= 4; ++seed) {
    std::vector<float> x = test::Gaussian(n, seed, /*stddev=*/3.0f);
    std::vector<double> want(n, 0.0);  // x · H
    for (int c = 0; c < n; ++c) {
      for (int r = 0; r < n; ++r)
        want[c] += static_cast<double>(x[r]) * h[static_cast<size_t>(r) * n + c];
    }
    FwhtInPlace(x.data(), n);
    double norm = 0.0;
    for (double w : want) norm += w * w;
    norm = std::sqrt(norm / n);  // rms of the output, the scale of float rounding here
    for (int i = 0; i < n; ++i) {
      ASSERT_NEAR(x[i], want[i], 1e-5 * norm) << "n=" << n << " seed=" << seed << " i=" << i;
    }
  }
}

TEST_P(FwhtTest, MapsEachBasisVectorToTheMatchingHadamardRow) {
  const int n = GetParam();
  const std::vector<double> h = DenseSylvesterHadamard(n);
  const float entry = 1.0f / std::sqrt(static_cast<float>(n));
  for (int r : {0, 1, n / 2 - 1, n / 2, n - 1}) {
    std::vector<float> e(n, 0.0f);
    e[r] = 1.0f;
    FwhtInPlace(e.data(), n);
    for (int c = 0; c < n; ++c) {
      ASSERT_NEAR(e[c], h[static_cast<size_t>(r) * n + c], 1e-7) << "row " << r << " col " << c;
      ASSERT_NEAR(std::fabs(e[c]), entry, 1e-7);
    }
  }
}

TEST_P(FwhtTest, AppliedTwiceIsTheIdentity) {
  const int n = GetParam();
  for (uint32_t seed = 10; seed < 14; ++seed) {
    const std::vector<float> x = test::Gaussian(n, seed, /*stddev=*/100.0f);
    std::vector<float> y = x;
    FwhtInPlace(y.data(), n);
    EXPECT_GT(test::RelL2(y.data(), x.data(), n), 0.1) << "the transform changed nothing";
    FwhtInPlace(y.data(), n);
    EXPECT_LT(test::RelL2(y.data(), x.data(), n), 1e-6) << "n=" << n << " seed=" << seed;
  }
}

TEST_P(FwhtTest, PreservesTheEuclideanNorm) {
  const int n = GetParam();
  std::vector<float> x = test::Gaussian(n, 99, /*stddev=*/2.0f);
  double before = 0.0, after = 0.0;
  for (float v : x) before += static_cast<double>(v) * v;
  FwhtInPlace(x.data(), n);
  for (float v : x) after += static_cast<double>(v) * v;
  EXPECT_NEAR(after / before, 1.0, 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Sizes, FwhtTest, ::testing::Values(64, 128, 256, 512),
                         [](const auto& info) {
                           return std::string("N").append(std::to_string(info.param));
                         });

}  // namespace
}  // namespace kvarn
