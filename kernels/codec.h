// The KVarN codec on the CPU: encode one tile of one head into a record, decode it, and
// run decode attention over a sequence of fp16 sink, quantized tiles and fp16 tail.
//
// Two implementations sit behind one interface: Codec::Reference(), plain scalar code kept
// as the executable specification for tests, and Codec::Simd(), Highway vectors dispatched
// at run time to the best target of the CPU, used everywhere else (Codec::Default()).
// Both validate their input the same way and pass the same tests.
//
// Thread safety: Codec objects are immutable singletons; every method may be called from
// any number of threads at once (scratch memory is thread-local).
#ifndef KVARN_KERNELS_CODEC_H_
#define KVARN_KERNELS_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "kernels/block_layout.h"
#include "kernels/preset.h"
#include "kernels/status.h"

namespace kvarn {

enum class DType { kF32, kF16 };

// kOriginal: the model's K/V as the attention layer produced them. kStorage: the frame the
// preset stores in: rotated by H for kvarn and hadamard presets, the original frame for kivi
// and fp16. The pool's fp16 sink and tail blocks are in the storage frame.
enum class Frame { kOriginal, kStorage };

// One tile of one head: keys and values, each [G][D] token-major, contiguous.
struct TileIn {
  const void* keys = nullptr;
  const void* values = nullptr;
  DType dtype = DType::kF32;
  Frame frame = Frame::kOriginal;
};
struct TileOut {
  void* keys = nullptr;
  void* values = nullptr;
  DType dtype = DType::kF32;
  Frame frame = Frame::kOriginal;
};

struct EncodeOptions {
  int iterations = kDefaultIterations;  // balancing iterations, 0..kMaxIterations
  static constexpr int kMaxIterations = 64;
};

// fp16 tokens in the storage frame: keys and values, `tokens` rows of D each, bit patterns of
// binary16. Row t starts t * stride elements after row 0: 0 means D (contiguous [tokens][D]);
// a pool's fp16 block has BlockLayout::fp16_token_elems() (its rows are token-major).
struct Fp16Run {
  const uint16_t* keys = nullptr;
  const uint16_t* values = nullptr;
  int tokens = 0;
  size_t stride = 0;

  size_t RowStride(int head_dim) const {
    return stride != 0 ? stride : static_cast<size_t>(head_dim);
  }
};

// The K/V of one (layer, kv-head) of a sequence as decode attention sees it: the fp16 sink
// (the first tokens, never quantized), the sealed tiles in order, and the fp16 tail.
// REQUIRES: every tile pointer addresses Preset::RecordBytes(head_dim) readable bytes of a
// record written by EncodeTile (the daemon is the only writer of records).
struct SequenceView {
  Fp16Run sink;
  std::span<const uint8_t* const> tiles;
  Fp16Run tail;
  // Optional, a hint: the view the caller attends next (the next kv-head of the layer, say).
  // The SIMD codec fetches its first records and its fp16 rows toward the caches while it
  // works on this view's last tiles, so that the next call does not start by waiting on
  // memory. Results never depend on it; it must stay valid for the call.
  const SequenceView* next = nullptr;
};

// How decode attention folds the quantized tiles.
//  kExact: the fp32 fold of KVARN_SPEC.md §7; equals attention over DecodeTile's output up to
//    fp32 accumulation (relative ~1e-6) on every implementation and target.
//  kFast: what the implementation does fastest within the accuracy contract: the attention
//    output's error against exact attention over the original K/V is at most 1% (relative)
//    above kExact's (tests/kernels/attend_accuracy_test.cc). The SIMD codec uses integer dot
//    products (an int8 query, u8 softmax weights) for rotating presets of 4-bit keys and 2-bit
//    values (kvarn_k4v2_*, hadamard_k4v2_*) at D = 128 on CPUs with AVX-512 VNNI and VBMI;
//    everywhere else kFast is kExact.
enum class AttendPrecision { kFast, kExact };

class Codec {
 public:
  static const Codec& Reference();
  static const Codec& Simd();
  static const Codec& Default() { return Simd(); }

  // "reference" or "simd".
  std::string_view name() const { return name_; }
  // The instruction set in use, e.g. "scalar", "AVX3", "AVX2".
  std::string_view target() const;

  // Encodes one tile. record.size() must equal preset.RecordBytes(head_dim). Inputs must be
  // finite, and within what fp16 scales can represent. On error nothing is written.
  CodecStatus EncodeTile(const Preset& preset, int head_dim, const TileIn& in,
                         std::span<uint8_t> record, const EncodeOptions& options = {}) const;

  // Decodes one record into [G][D] keys and values in the requested frame and dtype.
  CodecStatus DecodeTile(const Preset& preset, int head_dim, std::span<const uint8_t> record,
                         const TileOut& out) const;

  // Converts fp16 rows in the preset's storage frame (a sink block's or tail slot's keys and
  // values, e.g. at BlockLayout::Fp16KeysOffset with its fp16_token_elems() stride) to
  // [run.tokens][D] keys and values in the requested frame and dtype.
  CodecStatus DecodeFp16Tile(const Preset& preset, int head_dim, const Fp16Run& run,
                             const TileOut& out) const;

  // Decode attention of num_queries query heads that share this kv-head (grouped-query
  // attention: each tile is read once for the whole group). queries and out are
  // [num_queries][D] fp32 in the original frame; softmax_scale 0 means 1/sqrt(D).
  // lse, when not null, receives [num_queries] natural-log sums of exp(scaled scores) over the
  // sequence: with it, attention over this sequence merges exactly with attention over more
  // tokens computed elsewhere (a decode step's own token, another split of the sequence).
  // precision: see AttendPrecision; kFast results depend on the CPU.
  CodecStatus AttendDecode(const Preset& preset, int head_dim, const float* queries,
                           int num_queries, const SequenceView& seq, float* out,
                           float softmax_scale = 0.0f, float* lse = nullptr,
                           AttendPrecision precision = AttendPrecision::kFast) const;

  // Rotates n tokens of original-frame K/V, laid out [n][num_layers][num_kv_heads][head_dim]
  // (f32 or fp16 bits), into the storage frame and writes them as fp16 into an fp16 slot
  // (BlockLayout: token-major rows, a key row then a value row per layer and kv-head) at token
  // `first`:
  // what a worker does with new tokens before committing them. Writes nothing when the input
  // holds NaN, Inf or values beyond the fp16 range, or [first, first + n) leaves the tile.
  CodecStatus StoreTokens(const Preset& preset, const BlockLayout& layout, uint8_t* slot, int first,
                          int n, const void* keys, const void* values, DType dtype) const;

  struct Kernels;  // the implementation's entry points, defined by each implementation

 private:
  Codec(std::string_view name, const Kernels* kernels) : name_(name), kernels_(kernels) {}
  std::string_view name_;
  const Kernels* kernels_;
};

// Fast Walsh-Hadamard transform of one vector in place, normalized (x <- x · H with
// H = Sylvester Hadamard / sqrt(n)); applying it twice is the identity.
// REQUIRES: n is a power of two.
void FwhtInPlace(float* x, int n);

}  // namespace kvarn

#endif  // KVARN_KERNELS_CODEC_H_
