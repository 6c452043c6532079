// Tile conversions and record access shared by the CPU implementations: loading a tile
// into the storage frame with value checks, writing a decoded tile back out, and reading
// the fields of a record. Host only; not part of the public API.
#ifndef KVARN_KERNELS_TILE_IO_H_
#define KVARN_KERNELS_TILE_IO_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/codec.h"
#include "kernels/fp16.h"
#include "kernels/kvarn_math.h"

namespace kvarn {

// Largest finite binary16 value; K/V beyond it cannot be represented by fp16 scales.
inline constexpr float kFp16Max = 65504.0f;

// Converts a [G][D] tile to fp32 in the storage frame (rotating when the preset rotates and
// the input is in the original frame). Rejects NaN, Inf and magnitudes above kFp16Max,
// naming `what` and the first bad element.
CodecStatus LoadTileToStorage(const Preset& preset, int head_dim, const void* src, DType dtype,
                              Frame frame, float* dst, const char* what);

// Writes a [G][D] fp32 storage-frame tile out in the requested frame and dtype. `src` is
// used as scratch when the output is unrotated.
void StoreTileFromStorage(const Preset& preset, int head_dim, float* src, void* dst, DType dtype,
                          Frame frame);

// The fp16 preset's record: keys then values, fp16 [G][D] each.
CodecStatus StoreFp16Record(const float* keys, const float* values, size_t n, uint8_t* record);
void LoadFp16Record(const uint8_t* record, size_t n, float* keys, float* values);

CodecStatus FpRangeError();

// Read access to the fields of a quantized record (KVARN_SPEC.md §5).
class RecordView {
 public:
  RecordView(const Preset& preset, int head_dim, const uint8_t* record)
      : record_(record), layout_(preset.Layout(head_dim)), d_(head_dim),
        g_(preset.tile_tokens), kbits_(preset.key_bits), vbits_(preset.value_bits) {}

  float KeyCode(int channel, int token) const {
    return UnpackCode(record_ + layout_.k_codes + static_cast<size_t>(channel) * (g_ * kbits_ / 8), token, kbits_);
  }
  float ValueCode(int token, int channel) const {
    return UnpackCode(record_ + layout_.v_codes + static_cast<size_t>(token) * (d_ * vbits_ / 8), channel, vbits_);
  }
  float KeyA(int c) const { return Half(layout_.k_a, c); }
  float KeyB(int c) const { return Half(layout_.k_b, c); }
  float KeyR(int t) const { return Half(layout_.k_r, t); }
  float ValueC(int c) const { return Half(layout_.v_c, c); }
  float ValueA(int t) const { return Half(layout_.v_a, t); }
  float ValueB(int t) const { return Half(layout_.v_b, t); }
  uint16_t HalfBits(size_t offset, int i) const {
    uint16_t h;
    std::memcpy(&h, record_ + offset + 2 * static_cast<size_t>(i), 2);
    return h;
  }
  const RecordLayout& layout() const { return layout_; }

  // A record whose scales are not all finite was not written by the encoder.
  CodecStatus CheckScales() const;

 private:
  float Half(size_t offset, int i) const { return HalfToFloat(HalfBits(offset, i)); }

  const uint8_t* record_;
  RecordLayout layout_;
  int d_, g_, kbits_, vbits_;
};

}  // namespace kvarn

#endif  // KVARN_KERNELS_TILE_IO_H_
