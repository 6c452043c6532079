// SIMD decoder (KVARN_SPEC.md §4 dequantization) and the SIMD codec's kernel table.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd_decode.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format off
#include "hwy/highway.h"
#include "kernels/simd-inl.h"
// clang-format on

#include "kernels/codec_internal.h"
#include "kernels/fp16.h"
#include "kernels/simd_scratch.h"
#include "kernels/tile_io.h"

HWY_BEFORE_NAMESPACE();
namespace kvarn {
namespace HWY_NAMESPACE {
namespace {

void WidenHalves(const uint8_t* src, size_t n, float* dst) {
  for (size_t i = 0; i < n; i += hn::Lanes(DF())) {
    hn::StoreU(LoadHalf(reinterpret_cast<const uint16_t*>(src) + i), DF(), dst + i);
  }
}

// Writes one row of n floats as f32 or f16.
HWY_INLINE void PutRow(VF v, DType dtype, void* out, size_t i) {
  if (dtype == DType::kF32) {
    hn::StoreU(v, DF(), static_cast<float*>(out) + i);
  } else {
    StoreHalf(v, static_cast<uint16_t*>(out) + i);
  }
}

// Dequantizes keys: K[t][c] = (q[c][t] * a[c] + b[c]) * r[t]. Codes are channel-major in
// the record, so they are unpacked, transposed to token-major, then widened along channels.
void DecodeKeys(const Preset& p, size_t d, const uint8_t* record, const RecordLayout& l,
                DecodeScratch& s, void* out, DType dtype) {
  const DF df;
  const size_t N = hn::Lanes(df), g = static_cast<size_t>(p.tile_tokens);
  const size_t row_bytes = g * p.key_bits / 8;
  for (size_t c = 0; c < d; ++c) {
    UnpackCodes(record + l.k_codes + c * row_bytes, g, p.key_bits, s.codes.get() + c * g);
  }
  TransposeBytes(s.codes.get(), d, g, s.codes_t.get());
  WidenHalves(record + l.k_a, d, s.a.get());
  WidenHalves(record + l.k_b, d, s.b.get());
  WidenHalves(record + l.k_r, g, s.s.get());
  for (size_t t = 0; t < g; ++t) {
    const VF r = hn::Set(df, s.s.get()[t]);
    const uint8_t* codes = s.codes_t.get() + t * d;
    for (size_t c = 0; c < d; c += N) {
      const VF x = hn::Mul(hn::MulAdd(LoadCodes(codes + c), hn::LoadU(df, s.a.get() + c),
                                      hn::LoadU(df, s.b.get() + c)), r);
      PutRow(x, dtype, out, t * d + c);
    }
  }
}

// Dequantizes values: V[t][c] = (q[t][c] * a[t] + b[t]) * c_V[c].
void DecodeValues(const Preset& p, size_t d, const uint8_t* record, const RecordLayout& l,
                  DecodeScratch& s, void* out, DType dtype) {
  const DF df;
  const size_t N = hn::Lanes(df), g = static_cast<size_t>(p.tile_tokens);
  const size_t row_bytes = d * p.value_bits / 8;
  WidenHalves(record + l.v_c, d, s.s.get());
  WidenHalves(record + l.v_a, g, s.a.get());
  WidenHalves(record + l.v_b, g, s.b.get());
  for (size_t t = 0; t < g; ++t) {
    UnpackCodes(record + l.v_codes + t * row_bytes, d, p.value_bits, s.codes.get());
    const VF a = hn::Set(df, s.a.get()[t]), b = hn::Set(df, s.b.get()[t]);
    for (size_t c = 0; c < d; c += N) {
      const VF x = hn::Mul(hn::MulAdd(LoadCodes(s.codes.get() + c), a, b), hn::LoadU(df, s.s.get() + c));
      PutRow(x, dtype, out, t * d + c);
    }
  }
}

void DecodeFp16(const uint8_t* record, size_t n, int which, void* out, DType dtype) {
  const auto* h = reinterpret_cast<const uint16_t*>(record) + static_cast<size_t>(which) * n;
  for (size_t i = 0; i < n; i += hn::Lanes(DF())) PutRow(LoadHalf(h + i), dtype, out, i);
}

CodecStatus DecodeImpl(const Preset& preset, int head_dim, const uint8_t* record,
                       const TileOut& out) {
  const size_t g = static_cast<size_t>(preset.tile_tokens), d = static_cast<size_t>(head_dim);
  const size_t n = g * d;
  if (preset.quantizes()) KVARN_RETURN_IF_ERROR(RecordView(preset, head_dim, record).CheckScales());
  DecodeScratch& s = DecodeScratch::ForThread(g, d);
  // Unrotating needs the fp32 tile first; otherwise write straight to the output.
  const bool unrotate = preset.rotates() && out.frame == Frame::kOriginal;
  for (int which = 0; which < 2; ++which) {
    void* dst = which == 0 ? out.keys : out.values;
    void* target = unrotate ? static_cast<void*>(s.tile.get()) : dst;
    const DType target_type = unrotate ? DType::kF32 : out.dtype;
    if (!preset.quantizes()) {
      DecodeFp16(record, n, which, target, target_type);
    } else if (which == 0) {
      DecodeKeys(preset, d, record, preset.Layout(head_dim), s, target, target_type);
    } else {
      DecodeValues(preset, d, record, preset.Layout(head_dim), s, target, target_type);
    }
    if (unrotate) {
      FwhtRows(s.tile.get(), g, d);
      for (size_t i = 0; i < n; i += hn::Lanes(DF())) PutRow(hn::LoadU(DF(), s.tile.get() + i), out.dtype, dst, i);
    }
  }
  return {};
}

}  // namespace

CodecStatus DecodeEntry(const Preset& preset, int head_dim, const uint8_t* record,
                        const TileOut& out) {
  return DecodeImpl(preset, head_dim, record, out);
}

}  // namespace HWY_NAMESPACE
}  // namespace kvarn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvarn {
HWY_EXPORT(DecodeEntry);

const char* SimdTargetName();
CodecStatus SimdEncode(const Preset& preset, int head_dim, const TileIn& in, uint8_t* record,
                       int iterations);
CodecStatus SimdAttend(const Preset& preset, int head_dim, const float* queries, int num_queries,
                       const SequenceView& seq, float* out, float softmax_scale);

namespace {
CodecStatus SimdDecode(const Preset& preset, int head_dim, const uint8_t* record,
                       const TileOut& out) {
  return HWY_DYNAMIC_DISPATCH(DecodeEntry)(preset, head_dim, record, out);
}
}  // namespace

const Codec::Kernels& SimdKernels() {
  static const Codec::Kernels kernels{&SimdTargetName, &SimdEncode, &SimdDecode, &SimdAttend};
  return kernels;
}

const Codec& Codec::Simd() {
  static const Codec codec("simd", &SimdKernels());
  return codec;
}

}  // namespace kvarn
#endif
