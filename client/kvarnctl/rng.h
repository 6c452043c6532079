// A seeded random generator that does not depend on the standard library's distributions
// (std::normal_distribution differs between libstdc++ and libc++), so `kvarnctl codec synth
// --seed S` and eval's random queries repeat exactly for a seed. SplitMix64 for the bits
// (the same everywhere), Box-Muller for normals (through log/sin/cos, so another math
// library may differ in the last bit). Not for cryptography. One thread per Rng.
#ifndef KVARN_CLIENT_KVARNCTL_RNG_H_
#define KVARN_CLIENT_KVARNCTL_RNG_H_

#include <cmath>
#include <cstdint>

namespace kvarn::ctl {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}

  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  // Uniform in (0, 1): never 0, so log() is safe.
  double Uniform() { return (static_cast<double>(Next() >> 11) + 0.5) * 0x1.0p-53; }

  double Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double r = std::sqrt(-2.0 * std::log(Uniform()));
    const double a = 6.283185307179586 * Uniform();
    spare_ = r * std::sin(a);
    has_spare_ = true;
    return r * std::cos(a);
  }

  // Student-t with `dof` (integer >= 1) degrees of freedom: N / sqrt(chi2(dof) / dof).
  double StudentT(int dof) {
    double chi2 = 0.0;
    for (int i = 0; i < dof; ++i) {
      const double z = Normal();
      chi2 += z * z;
    }
    return Normal() / std::sqrt(chi2 / dof);
  }

 private:
  uint64_t state_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

}  // namespace kvarn::ctl

#endif  // KVARN_CLIENT_KVARNCTL_RNG_H_
