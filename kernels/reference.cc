// The scalar reference codec: KVARN_SPEC.md written out literally, one element at a time, in
// fp32 in the order the formulas are written (cur = T / exp(Lc) / exp(Lr), B = T / Sc / Sr,
// step = (hi - lo) / qmax, a = Sr * step), with standard deviations accumulated in double
// (kvarn_math.h BalanceStd). Kept for tests; everything else runs the SIMD codec
// (simd_encode.cc), which produces the same bits (docs/codec_arithmetic.md).
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/codec_internal.h"
#include "kernels/fp16.h"
#include "kernels/kvarn_math.h"
#include "kernels/store_tokens.h"
#include "kernels/tile_io.h"

namespace kvarn {

void FwhtInPlace(float* x, int n) {
  assert(n > 0 && (n & (n - 1)) == 0);
  for (int h = 1; h < n; h *= 2) {
    for (int i = 0; i < n; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        const float a = x[j];
        const float b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
  const float norm = 1.0f / std::sqrt(static_cast<float>(n));
  for (int i = 0; i < n; ++i) x[i] *= norm;
}

namespace {

struct AxisStd {
  std::vector<float> col, row;
};

// The two axes' stds of m (rows x cols, row-major). `rows_are_channels`: a row holds one
// channel's tokens (keys); otherwise one token's channels (values). Sums over a token's
// channels use kChannelPartials accumulators, sums over a channel's tokens one
// (kvarn_math.h BalanceStd): the order the SIMD codec sums in.
struct StdOrder {
  int row_partials, col_partials;
};
StdOrder OrderFor(bool rows_are_channels) {
  return rows_are_channels ? StdOrder{1, kChannelPartials} : StdOrder{kChannelPartials, 1};
}

void RowStds(const std::vector<float>& m, int rows, int cols, StdOrder o, std::vector<float>* row) {
  row->resize(rows);
  for (int r = 0; r < rows; ++r) (*row)[r] = BalanceStd(&m[static_cast<size_t>(r) * cols], cols, 1, o.row_partials);
}

void ComputeStd(const std::vector<float>& m, int rows, int cols, StdOrder o, AxisStd* s) {
  s->col.resize(cols);
  for (int c = 0; c < cols; ++c) s->col[c] = BalanceStd(&m[c], rows, cols, o.col_partials);
  RowStds(m, rows, cols, o, &s->row);
}

float Imbalance(const AxisStd& s) {
  float cmax = s.col[0], cmin = s.col[0], rmax = s.row[0], rmin = s.row[0];
  for (float v : s.col) cmax = std::fmax(cmax, v), cmin = std::fmin(cmin, v);
  for (float v : s.row) rmax = std::fmax(rmax, v), rmin = std::fmin(rmin, v);
  return AxisImbalance(cmax, cmin) + AxisImbalance(rmax, rmin);
}

// cur = t / exp(lc) (per column) / exp(lr) (per row), in that order, in float.
void Rescale(const float* t, int rows, int cols, const std::vector<float>& lc,
             const std::vector<float>& lr, std::vector<float>* cur) {
  std::vector<float> ec(cols);
  for (int c = 0; c < cols; ++c) ec[c] = ExpF(lc[c]);
  for (int r = 0; r < rows; ++r) {
    const float er = ExpF(lr[r]);
    for (int c = 0; c < cols; ++c) {
      (*cur)[static_cast<size_t>(r) * cols + c] = t[static_cast<size_t>(r) * cols + c] / ec[c] / er;
    }
  }
}

// §3: dual-axis balancing of a rows x cols tile (row-major). Returns the best-so-far
// column and row scales.
void Balance(const float* t, int rows, int cols, int iterations, bool rows_are_channels,
             std::vector<float>* col_scale, std::vector<float>* row_scale) {
  const StdOrder order = OrderFor(rows_are_channels);
  std::vector<float> lc(cols, 0.0f), lr(rows, 0.0f), cur(t, t + static_cast<size_t>(rows) * cols);
  col_scale->assign(cols, 1.0f);
  row_scale->assign(rows, 1.0f);
  AxisStd s;
  ComputeStd(cur, rows, cols, order, &s);
  float best = Imbalance(s);
  std::vector<float> row_std;
  for (int it = 0; it < iterations; ++it) {
    for (int c = 0; c < cols; ++c) lc[c] = ClampLogScale(lc[c] + LogClampedStd(s.col[c]));
    Rescale(t, rows, cols, lc, lr, &cur);
    RowStds(cur, rows, cols, order, &row_std);
    for (int r = 0; r < rows; ++r) lr[r] = ClampLogScale(lr[r] + LogClampedStd(row_std[r]));
    Rescale(t, rows, cols, lc, lr, &cur);
    ComputeStd(cur, rows, cols, order, &s);
    const float imb = Imbalance(s);
    if (imb <= best) {
      best = imb;
      for (int c = 0; c < cols; ++c) (*col_scale)[c] = ExpF(lc[c]);
      for (int r = 0; r < rows; ++r) (*row_scale)[r] = ExpF(lr[r]);
    }
  }
}

// §4: quantizes a rows x cols tile (row-major, storage frame) with balancing scales into
// packed codes (row-major, cols*bits/8 bytes a row) and fp16 a[rows], b[rows], s[cols].
// Returns false when a scale does not fit in fp16.
bool QuantizeTile(const float* t, int rows, int cols, int bits, bool balance, int iterations,
                  bool rows_are_channels, uint8_t* codes, uint16_t* a, uint16_t* b, uint16_t* s) {
  std::vector<float> sc, sr;
  if (balance) {
    Balance(t, rows, cols, iterations, rows_are_channels, &sc, &sr);
  } else {
    sc.assign(cols, 1.0f);
    sr.assign(rows, 1.0f);
  }
  const size_t row_bytes = static_cast<size_t>(cols) * bits / 8;
  std::vector<uint8_t> packed(row_bytes * rows, 0);
  std::vector<uint16_t> ha(rows), hb(rows), hs(cols);
  std::vector<float> row(cols);
  for (int r = 0; r < rows; ++r) {
    float lo = std::numeric_limits<float>::infinity(), hi = -lo;
    for (int c = 0; c < cols; ++c) {
      row[c] = t[static_cast<size_t>(r) * cols + c] / sc[c] / sr[r];
      lo = std::fmin(lo, row[c]);
      hi = std::fmax(hi, row[c]);
    }
    const float step = QuantStep(lo, hi, bits);
    for (int c = 0; c < cols; ++c) {
      PackCode(&packed[r * row_bytes], c, bits, QuantizeCode(row[c], lo, step, bits));
    }
    ha[r] = FloatToHalf(sr[r] * step);
    hb[r] = FloatToHalf(sr[r] * lo);
    if (!std::isfinite(HalfToFloat(ha[r])) || !std::isfinite(HalfToFloat(hb[r]))) return false;
  }
  for (int c = 0; c < cols; ++c) {
    hs[c] = FloatToHalf(sc[c]);
    if (!std::isfinite(HalfToFloat(hs[c]))) return false;
  }
  std::memcpy(codes, packed.data(), packed.size());
  std::memcpy(a, ha.data(), rows * 2);
  std::memcpy(b, hb.data(), rows * 2);
  std::memcpy(s, hs.data(), cols * 2);
  return true;
}

CodecStatus Encode(const Preset& preset, int d, const TileIn& in, uint8_t* record,
                   int iterations) {
  const int g = preset.tile_tokens;
  const size_t n = static_cast<size_t>(g) * d;
  std::vector<float> k(n), v(n);
  KVARN_RETURN_IF_ERROR(LoadTileToStorage(preset, d, in.keys, in.dtype, in.frame, k.data(), "keys"));
  KVARN_RETURN_IF_ERROR(LoadTileToStorage(preset, d, in.values, in.dtype, in.frame, v.data(), "values"));
  if (!preset.quantizes()) return StoreFp16Record(k.data(), v.data(), n, record);

  // Keys are balanced and quantized as [D][G] (rows = channels), values as [G][D].
  std::vector<float> kt(n);
  for (int t = 0; t < g; ++t) {
    for (int c = 0; c < d; ++c) kt[static_cast<size_t>(c) * g + t] = k[static_cast<size_t>(t) * d + c];
  }
  const RecordLayout l = preset.Layout(d);
  std::vector<uint8_t> out(l.total);
  auto h = [&](size_t off) { return reinterpret_cast<uint16_t*>(out.data() + off); };
  const bool ok =
      QuantizeTile(kt.data(), d, g, preset.key_bits, preset.balances(), iterations, true,
                   out.data() + l.k_codes, h(l.k_a), h(l.k_b), h(l.k_r)) &&
      QuantizeTile(v.data(), g, d, preset.value_bits, preset.balances(), iterations, false,
                   out.data() + l.v_codes, h(l.v_a), h(l.v_b), h(l.v_c));
  if (!ok) return FpRangeError();
  std::memcpy(record, out.data(), out.size());
  return {};
}

CodecStatus Decode(const Preset& preset, int d, const uint8_t* record, const TileOut& out) {
  const int g = preset.tile_tokens;
  const size_t n = static_cast<size_t>(g) * d;
  std::vector<float> k(n), v(n);
  if (!preset.quantizes()) {
    LoadFp16Record(record, n, k.data(), v.data());
  } else {
    const RecordView rv(preset, d, record);
    KVARN_RETURN_IF_ERROR(rv.CheckScales());
    for (int t = 0; t < g; ++t) {
      for (int c = 0; c < d; ++c) {
        k[static_cast<size_t>(t) * d + c] = DequantKey(rv.KeyCode(c, t), rv.KeyA(c), rv.KeyB(c), rv.KeyR(t));
        v[static_cast<size_t>(t) * d + c] = DequantValue(rv.ValueCode(t, c), rv.ValueA(t), rv.ValueB(t), rv.ValueC(c));
      }
    }
  }
  StoreTileFromStorage(preset, d, k.data(), out.keys, out.dtype, out.frame);
  StoreTileFromStorage(preset, d, v.data(), out.values, out.dtype, out.frame);
  return {};
}

// Online softmax state of one query head.
struct Softmax {
  float max = -std::numeric_limits<float>::infinity();
  float sum = 0.0f;
  std::vector<float> acc;

  // Folds a block of scores in; returns the factor by which earlier terms were rescaled,
  // and writes exp(score - max) into p.
  float Absorb(const std::vector<float>& scores, std::vector<float>* p) {
    float m = max;
    for (float s : scores) m = std::fmax(m, s);
    const float rescale = std::exp(max - m);
    max = m;
    sum *= rescale;
    for (float& x : acc) x *= rescale;
    p->resize(scores.size());
    for (size_t i = 0; i < scores.size(); ++i) {
      (*p)[i] = std::exp(scores[i] - m);
      sum += (*p)[i];
    }
    return rescale;
  }
};

void AttendFp16(const float* q, int d, const Fp16Run& run, float scale, Softmax* sm) {
  const size_t stride = run.RowStride(d);
  std::vector<float> scores(run.tokens), p;
  for (int t = 0; t < run.tokens; ++t) {
    float s = 0.0f;
    for (int c = 0; c < d; ++c)
      s += q[c] * HalfToFloat(run.keys[static_cast<size_t>(t) * stride + c]);
    scores[t] = s * scale;
  }
  sm->Absorb(scores, &p);
  for (int t = 0; t < run.tokens; ++t) {
    for (int c = 0; c < d; ++c)
      sm->acc[c] += p[t] * HalfToFloat(run.values[static_cast<size_t>(t) * stride + c]);
  }
}

// §7: scores and value sums straight from codes and scales, no dequantized tile.
void AttendTile(const Preset& preset, const float* q, int d, const uint8_t* record, float scale,
                Softmax* sm) {
  const int g = preset.tile_tokens;
  const RecordView rv(preset, d, record);
  std::vector<float> w(d), scores(g), p;
  float beta = 0.0f;
  for (int c = 0; c < d; ++c) {
    w[c] = q[c] * rv.KeyA(c);
    beta += q[c] * rv.KeyB(c);
  }
  for (int t = 0; t < g; ++t) {
    float s = 0.0f;
    for (int c = 0; c < d; ++c) s += w[c] * rv.KeyCode(c, t);
    scores[t] = rv.KeyR(t) * (s + beta) * scale;
  }
  sm->Absorb(scores, &p);
  std::vector<float> vsum(d, 0.0f);
  float bsum = 0.0f;
  for (int t = 0; t < g; ++t) {
    const float pa = p[t] * rv.ValueA(t);
    for (int c = 0; c < d; ++c) vsum[c] += pa * rv.ValueCode(t, c);
    bsum += p[t] * rv.ValueB(t);
  }
  for (int c = 0; c < d; ++c) sm->acc[c] += (vsum[c] + bsum) * rv.ValueC(c);
}

CodecStatus Attend(const Preset& preset, int d, const float* queries, int num_queries,
                   const SequenceView& seq, float* out, float scale, float* lse) {
  const int g = preset.tile_tokens;
  const size_t tile_elems = static_cast<size_t>(g) * d;
  std::vector<float> q(d);
  for (int h = 0; h < num_queries; ++h) {
    std::memcpy(q.data(), queries + static_cast<size_t>(h) * d, d * sizeof(float));
    if (preset.rotates()) FwhtInPlace(q.data(), d);
    Softmax sm;
    sm.acc.assign(d, 0.0f);
    if (seq.sink.tokens > 0) AttendFp16(q.data(), d, seq.sink, scale, &sm);
    for (const uint8_t* tile : seq.tiles) {
      if (preset.quantizes()) {
        AttendTile(preset, q.data(), d, tile, scale, &sm);
      } else {
        const auto* k = reinterpret_cast<const uint16_t*>(tile);
        AttendFp16(q.data(), d, Fp16Run{k, k + tile_elems, g}, scale, &sm);
      }
    }
    if (seq.tail.tokens > 0) AttendFp16(q.data(), d, seq.tail, scale, &sm);
    float* o = out + static_cast<size_t>(h) * d;
    for (int c = 0; c < d; ++c) o[c] = sm.acc[c] / sm.sum;
    if (lse != nullptr) lse[h] = sm.max + std::log(sm.sum);
    if (preset.rotates()) FwhtInPlace(o, d);
  }
  return {};
}

const char* Target() { return "scalar"; }

}  // namespace

const Codec::Kernels& ReferenceKernels() {
  static const Codec::Kernels kernels{&Target, &Encode, &Decode, &Attend, &ReferenceStoreTokens};
  return kernels;
}

}  // namespace kvarn
