// Loading the user's K/V, queries and records for `kvarnctl codec`, with the checks that
// turn a wrong file into a message naming the file, its shape and what was expected.
//
// Accepted .npy element types: float32 and float16 (float64 is widened and accepted too);
// C order, little-endian (kernels/npy.h). Every loader rejects NaN, Inf and magnitudes
// beyond the fp16 range, naming the first bad element by its index.
#ifndef KVARN_CLIENT_KVARNCTL_CODEC_IO_H_
#define KVARN_CLIENT_KVARNCTL_CODEC_IO_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/npy.h"
#include "kernels/preset.h"
#include "kernels/status.h"

namespace kvarn::ctl {

// K or V of a sequence: [heads][tokens][head_dim] fp32, token-major, original frame.
struct KvTensor {
  int heads = 0;
  int tokens = 0;
  int head_dim = 0;
  bool rank2 = false;  // the file was [T, D] (heads == 1)
  NpyType file_type = NpyType::kF32;
  std::string path;
  std::vector<float> data;

  const float* Row(int head, int token) const {
    return data.data() + (static_cast<size_t>(head) * tokens + token) * head_dim;
  }
  std::string ShapeString() const;  // as in the file: "(2048, 128)" or "(4, 2048, 128)"
};

// "float32", "float16", ...
const char* NpyTypeName(NpyType type);

// Reads K or V of shape [T, D] or [H, T, D] with T >= 1 and D a supported head_dim.
CodecStatus LoadSequence(const std::string& path, KvTensor* out);

// Checks that keys and values have the same shape.
CodecStatus CheckSameShape(const KvTensor& keys, const KvTensor& values);

// Reads one tile [G, D] for `preset` (G = preset.tile_tokens, D a supported head_dim).
CodecStatus LoadTile(const std::string& path, const Preset& preset, std::vector<float>* out,
                     int* head_dim);

// Decode queries: [Nq, D] (the same queries for every kv-head) or [Hq, Nq, D] with Hq a
// multiple of the kv-heads (grouped-query attention: query head i reads kv-head
// i / (Hq / H)). D must match the keys. Produces [Hq][Nq][D] in *out.
struct QuerySet {
  int query_heads = 0;  // Hq
  int per_head = 0;     // Nq
  int head_dim = 0;
  std::vector<float> data;
  std::string source;  // how they were made, for the report
  bool from_file = false;
};
CodecStatus LoadQueries(const std::string& path, const KvTensor& keys, QuerySet* out);

// `count` queries per kv-head with independent N(0, 1) channels from a seeded generator
// (client/kvarnctl/rng.h).
QuerySet RandomQueries(const KvTensor& keys, int count, uint64_t seed);

// Reads a whole binary file.
CodecStatus ReadFileBytes(const std::string& path, std::vector<uint8_t>* out);
// Writes a whole binary file; failures are kFailedPrecondition (exit code 1).
CodecStatus WriteFileBytes(const std::string& path, const uint8_t* data, size_t size);
// WriteNpyF32 with a failure mapped to kFailedPrecondition.
CodecStatus WriteF32(const std::string& path, const std::vector<size_t>& shape, const float* data);

}  // namespace kvarn::ctl

#endif  // KVARN_CLIENT_KVARNCTL_CODEC_IO_H_
