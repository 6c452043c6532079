// SIMD decoder (KVARN_SPEC.md §4 dequantization) and the SIMD codec's kernel table.

// The codec's results must not depend on the compiler fusing a * b + c into one rounding:
// every fused multiply-add is written out (MulAdd), and nothing else may be contracted.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd_decode.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format off
#include "hwy/highway.h"
#include "kernels/simd-inl.h"
// clang-format on

#include "kernels/codec_internal.h"
#include "kernels/store_tokens.h"
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

// Writes one vector of a row as f32 or f16.
HWY_INLINE void PutRow(VF v, DType dtype, void* out, size_t i) {
  if (dtype == DType::kF32) {
    hn::StoreU(v, DF(), static_cast<float*>(out) + i);
  } else {
    StoreHalf(v, static_cast<uint16_t*>(out) + i);
  }
}

// Where decoded rows go: straight to the output, or, when the output is in the original frame
// of a rotating preset, through an L1 buffer of kRows rows that are unrotated (x · H)
// together, so that the transforms of different rows overlap.
class RowSink {
 public:
  static constexpr size_t kRows = 4;

  RowSink(void* out, DType dtype, size_t d, bool unrotate, float* rows)
      : out_(out), dtype_(dtype), d_(d), unrotate_(unrotate), rows_(rows) {}
  // Stores vector c of row t. REQUIRES: rows come in order, t = 0, 1, ...
  HWY_INLINE void Put(VF v, size_t t, size_t c) {
    if (unrotate_) {
      hn::Store(v, DF(), rows_ + (t % kRows) * d_ + c);
    } else {
      PutRow(v, dtype_, out_, t * d_ + c);
    }
  }
  // Row t is complete; `last`: it is the tile's last row.
  HWY_INLINE void EndRow(size_t t, bool last) {
    if (!unrotate_ || (!last && (t + 1) % kRows != 0)) return;
    const size_t first = t - t % kRows, n = t + 1 - first;
    FwhtRows(rows_, n, d_);
    for (size_t i = 0; i < n * d_; i += hn::Lanes(DF())) {
      PutRow(hn::Load(DF(), rows_ + i), dtype_, out_, first * d_ + i);
    }
  }

 private:
  void* out_;
  DType dtype_;
  size_t d_;
  bool unrotate_;
  float* rows_;
};

// Dequantizes keys: K[t][c] = (q[c][t] * a[c] + b[c]) * r[t]. Codes are channel-major in
// the record: the packed bytes are transposed to [G/p][D] (p = 8/bits tokens per byte), so
// that each token's codes are one bit field of a token-major byte row.
void DecodeKeys(const Preset& p, size_t d, const uint8_t* record, const RecordLayout& l,
                DecodeScratch& s, RowSink& sink) {
  const DF df;
  const DI di;
  const size_t N = hn::Lanes(df), g = static_cast<size_t>(p.tile_tokens);
  const int bits = p.key_bits;
  const size_t per_byte = static_cast<size_t>(8 / bits);
  TransposeBytes(record + l.k_codes, d, g / per_byte, s.codes_t.get());
  WidenHalves(record + l.k_a, d, s.a.get());
  WidenHalves(record + l.k_b, d, s.b.get());
  WidenHalves(record + l.k_r, g, s.s.get());
  // Local copies: the output may alias anything as far as the compiler knows.
  const float* HWY_RESTRICT a = s.a.get();
  const float* HWY_RESTRICT b = s.b.get();
  const float* HWY_RESTRICT r = s.s.get();
  const uint8_t* HWY_RESTRICT codes = s.codes_t.get();
  const auto mask = hn::Set(di, (1 << bits) - 1);
  for (size_t t = 0; t < g; ++t) {
    const VF rt = hn::Set(df, r[t]);
    const uint8_t* bytes = codes + (t / per_byte) * d;
    const int shift = static_cast<int>(t % per_byte) * bits;
    for (size_t c = 0; c < d; c += N) {
      const auto q =
          hn::And(hn::ShiftRightSame(hn::PromoteTo(di, hn::LoadU(DU8F(), bytes + c)), shift), mask);
      sink.Put(
          hn::Mul(hn::MulAdd(hn::ConvertTo(df, q), hn::LoadU(df, a + c), hn::LoadU(df, b + c)), rt),
          t, c);
    }
    sink.EndRow(t, t + 1 == g);
  }
}

// Dequantizes values: V[t][c] = (q[t][c] * a[t] + b[t]) * c_V[c].
void DecodeValues(const Preset& p, size_t d, const uint8_t* record, const RecordLayout& l,
                  DecodeScratch& s, RowSink& sink) {
  const DF df;
  const size_t N = hn::Lanes(df), g = static_cast<size_t>(p.tile_tokens);
  const size_t row_bytes = d * p.value_bits / 8;
  WidenHalves(record + l.v_c, d, s.s.get());
  WidenHalves(record + l.v_a, g, s.a.get());
  WidenHalves(record + l.v_b, g, s.b.get());
  const float* HWY_RESTRICT a = s.a.get();
  const float* HWY_RESTRICT b = s.b.get();
  const float* HWY_RESTRICT cv = s.s.get();
  uint8_t* HWY_RESTRICT codes = s.codes.get();
  for (size_t t = 0; t < g; ++t) {
    UnpackCodes(record + l.v_codes + t * row_bytes, d, p.value_bits, codes);
    const VF at = hn::Set(df, a[t]), bt = hn::Set(df, b[t]);
    for (size_t c = 0; c < d; c += N) {
      sink.Put(hn::Mul(hn::MulAdd(LoadCodes(codes + c), at, bt), hn::LoadU(df, cv + c)), t, c);
    }
    sink.EndRow(t, t + 1 == g);
  }
}

void DecodeFp16(const uint8_t* record, size_t g, size_t d, int which, RowSink& sink) {
  const auto* h = reinterpret_cast<const uint16_t*>(record) + static_cast<size_t>(which) * g * d;
  for (size_t t = 0; t < g; ++t) {
    for (size_t c = 0; c < d; c += hn::Lanes(DF())) sink.Put(LoadHalf(h + t * d + c), t, c);
    sink.EndRow(t, t + 1 == g);
  }
}

// A record whose scales are not all finite was not written by the encoder. Vectorized over
// the two runs of fp16 fields; the scalar check names the bad one.
CodecStatus CheckScales(const Preset& preset, int head_dim, const uint8_t* record) {
  const hn::ScalableTag<uint16_t> d16;
  const RecordLayout l = preset.Layout(head_dim);
  const auto exponent = hn::Set(d16, 0x7C00);
  auto bad = hn::Lt(hn::Zero(d16), hn::Zero(d16));  // all false
  const auto scan = [&](size_t begin, size_t end) {
    const auto* h = reinterpret_cast<const uint16_t*>(record + begin);
    for (size_t i = 0; i < (end - begin) / 2; i += hn::Lanes(d16)) {
      bad = hn::Or(bad, hn::Eq(hn::And(hn::LoadU(d16, h + i), exponent), exponent));
    }
  };
  scan(l.k_a, l.v_codes);  // a_K, b_K, r_K
  scan(l.v_c, l.total);    // c_V, a_V, b_V
  if (hn::AllFalse(d16, bad)) return {};
  return RecordView(preset, head_dim, record).CheckScales();
}

CodecStatus DecodeImpl(const Preset& preset, int head_dim, const uint8_t* record,
                       const TileOut& out) {
  const size_t g = static_cast<size_t>(preset.tile_tokens), d = static_cast<size_t>(head_dim);
  if (preset.quantizes()) KVARN_RETURN_IF_ERROR(CheckScales(preset, head_dim, record));
  DecodeScratch& s = DecodeScratch::ForThread(g, d);
  const bool unrotate = preset.rotates() && out.frame == Frame::kOriginal;
  for (int which = 0; which < 2; ++which) {
    RowSink sink(which == 0 ? out.keys : out.values, out.dtype, d, unrotate, s.rows.get());
    if (!preset.quantizes()) {
      DecodeFp16(record, g, d, which, sink);
    } else if (which == 0) {
      DecodeKeys(preset, d, record, preset.Layout(head_dim), s, sink);
    } else {
      DecodeValues(preset, d, record, preset.Layout(head_dim), s, sink);
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
                       const SequenceView& seq, float* out, float softmax_scale, float* lse);
CodecStatus SimdAttendFast(const Preset& preset, int head_dim, const float* queries,
                           int num_queries, const SequenceView& seq, float* out,
                           float softmax_scale, float* lse);

namespace {
CodecStatus SimdDecode(const Preset& preset, int head_dim, const uint8_t* record,
                       const TileOut& out) {
  return HWY_DYNAMIC_DISPATCH(DecodeEntry)(preset, head_dim, record, out);
}
}  // namespace

const Codec::Kernels& SimdKernels() {
  static const Codec::Kernels kernels{&SimdTargetName, &SimdEncode, &SimdDecode, &SimdAttend,
                                      &SimdStoreTokens, &SimdAttendFast};
  return kernels;
}

const Codec& Codec::Simd() {
  static const Codec codec("simd", &SimdKernels());
  return codec;
}

}  // namespace kvarn
#endif
