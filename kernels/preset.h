// Codec presets: which method, how many bits for keys and values, tokens per tile.
//
// Grammar: kvarn_k{2|4}v{2|4}_g{64|128} (rotation + dual-axis balancing + RTN, the KVarN
// codec), kivi_k{2|4}v{2|4}_g{64|128} (RTN only: keys per channel, values per token),
// hadamard_k{2|4}v{2|4}_g{64|128} (rotation + RTN), and fp16 (passthrough, 128-token
// tiles). All quantized presets share the record layout of KVARN_SPEC.md §5.
#ifndef KVARN_KERNELS_PRESET_H_
#define KVARN_KERNELS_PRESET_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/block_layout.h"
#include "kernels/kvarn_math.h"
#include "kernels/status.h"

namespace kvarn {

enum class Method { kKvarn, kKivi, kHadamard, kFp16 };

// "kvarn", "kivi", "hadamard" or "fp16": the method's part of a preset name.
const char* MethodName(Method m);

inline constexpr std::string_view kDefaultPresetName = "kvarn_k4v2_g128";

// The head dimensions the codec supports (powers of two for the Hadamard transform).
CodecStatus CheckHeadDim(int head_dim);

struct Preset {
  Method method = Method::kKvarn;
  int key_bits = 4;
  int value_bits = 2;
  int tile_tokens = 128;

  // Rotating presets keep everything, fp16 parts included, in the rotated frame.
  bool rotates() const { return method == Method::kKvarn || method == Method::kHadamard; }
  bool balances() const { return method == Method::kKvarn; }
  bool quantizes() const { return method != Method::kFp16; }

  std::string Name() const;
  // Bytes of one tile of one head. REQUIRES: CheckHeadDim(head_dim).ok().
  size_t RecordBytes(int head_dim) const;
  // Field offsets of a quantized record. REQUIRES: quantizes().
  RecordLayout Layout(int head_dim) const;
  // Stored bits per K or V element, metadata included.
  double BitsPerElement(int head_dim) const;

  friend bool operator==(const Preset&, const Preset&) = default;
};

// Parses a preset name; the error names the grammar.
CodecStatus ParsePreset(std::string_view name, Preset* out);

// Every valid preset name, for help texts and exhaustive tests.
std::vector<std::string> AllPresetNames();

// The pool layout of a model shape under `preset`: its tile and record sizes.
// REQUIRES: CheckHeadDim(head_dim).ok().
BlockLayout MakeBlockLayout(const Preset& preset, int layers, int kv_heads, int head_dim);

}  // namespace kvarn

#endif  // KVARN_KERNELS_PRESET_H_
