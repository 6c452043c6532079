// `kvarnctl codec encode` and `codec decode`: one tile of one head between .npy files and
// a record file (KVARN_SPEC.md §5), through Codec::Default().
#ifndef KVARN_CLIENT_KVARNCTL_CODEC_TILE_H_
#define KVARN_CLIENT_KVARNCTL_CODEC_TILE_H_

#include <cstddef>
#include <string>

#include "kernels/preset.h"
#include "kernels/status.h"

namespace kvarn::ctl {

struct EncodeRequest {
  std::string preset = std::string(kDefaultPresetName);
  std::string keys_path;    // [G, D] float, token-major, original frame
  std::string values_path;  // same shape
  std::string out_path;     // the record
  int iterations = kDefaultIterations;
  // After writing, read the record back as `decode` would (head_dim inferred from its size)
  // and check it decodes to the encoded shape; the report then carries its errors.
  bool verify = false;
};

struct EncodeReport {
  std::string preset;
  int head_dim = 0;
  size_t record_bytes = 0;
  double bits_per_element = 0;
  // Filled when verify is set: the head_dim decode infers, relative L2 error of the
  // decoded tile against the input.
  int inferred_head_dim = 0;
  double k_rel_l2 = 0;
  double v_rel_l2 = 0;
};

CodecStatus EncodeFiles(const EncodeRequest& request, EncodeReport* report);

// The head_dim whose record size for `preset` is `record_bytes`. An error lists the sizes
// the preset's records can have; if several head_dims fit, it asks for --head-dim.
CodecStatus InferHeadDim(const Preset& preset, size_t record_bytes, int* head_dim);

struct DecodeRequest {
  std::string preset = std::string(kDefaultPresetName);
  std::string record_path;
  std::string keys_out;
  std::string values_out;
  int head_dim = 0;  // 0: infer from the record size
};

struct DecodeReport {
  std::string preset;
  int head_dim = 0;
  bool head_dim_inferred = false;
  size_t record_bytes = 0;
  int tokens = 0;
};

// Writes the dequantized tile, original frame, float32 [G, D].
CodecStatus DecodeFiles(const DecodeRequest& request, DecodeReport* report);

}  // namespace kvarn::ctl

#endif  // KVARN_CLIENT_KVARNCTL_CODEC_TILE_H_
