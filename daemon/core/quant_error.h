// The sampled quantization-error metric's baselines: what other methods at the same bit
// widths and tile size get on the very tile KVarN just sealed. hadamard rotates and rounds to
// nearest without variance balancing; kivi rounds keys per channel and values per token in
// the original frame. The error is relative L2 over keys and values together,
// ||decoded - source|| / ||source||, the same measure the sealer reports for the stored
// record (rotation is orthonormal, so either frame gives it).
#ifndef KVARN_DAEMON_CORE_QUANT_ERROR_H_
#define KVARN_DAEMON_CORE_QUANT_ERROR_H_

#include <array>
#include <string_view>

#include "kernels/preset.h"

namespace kvarn {

struct BaselineError {
  std::string_view method;  // "hadamard" or "kivi"
  double relative_l2;       // negative when the baseline could not encode the tile
};

// keys and values: one tile [G][D] fp32 in the original frame (G = preset.tile_tokens).
std::array<BaselineError, 2> QuantBaselines(const Preset& preset, int head_dim, const float* keys,
                                            const float* values);

// ||a - b|| / ||b|| over keys and values together; 0 when the source is all zero.
double RelativeL2(const float* keys, const float* values, const float* src_keys, const float* src_values,
                  size_t n);

}  // namespace kvarn

#endif  // KVARN_DAEMON_CORE_QUANT_ERROR_H_
