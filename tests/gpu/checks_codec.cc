// Encode, decode and store checks against the CPU reference codec; see checks.h.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kernels/codec.h"
#include "kernels/cuda/params.h"
#include "kernels/fp16.h"
#include "tests/common/golden.h"
#include "tests/gpu/checks.h"
#include "tests/gpu/test_data.h"

namespace kvarn::cuda::testing {
namespace {

const Codec& Cpu() { return Codec::Reference(); }

std::vector<float> AsFloats(const std::vector<uint8_t>& bytes) {
  std::vector<float> f(bytes.size() / sizeof(float));
  std::memcpy(f.data(), bytes.data(), f.size() * sizeof(float));
  return f;
}

// The CPU reference's records for `slots` tiles in `in` (host pointers).
std::vector<uint8_t> CpuEncode(const Preset& preset, const BlockLayout& layout,
                               const TileSource& in, CodecStatus* status) {
  std::vector<uint8_t> block(layout.quant_block_bytes(), 0);
  const size_t elem = in.dtype == DType::kF32 ? 4 : 2, d = static_cast<size_t>(layout.head_dim);
  const size_t row_stride = in.row_stride != 0 ? in.row_stride : d;
  std::vector<uint8_t> keys(layout.tile_elems() * elem), values(keys.size());
  for (size_t s = 0; s < layout.slots(); ++s) {
    // The slot's rows, row_stride apart in the source, as the codec's [G][D] tile.
    for (int r = 0; r < layout.tile_tokens; ++r) {
      const size_t from = (s * in.slot_stride + static_cast<size_t>(r) * row_stride) * elem;
      std::memcpy(keys.data() + r * d * elem, static_cast<const uint8_t*>(in.keys) + from,
                  d * elem);
      std::memcpy(values.data() + r * d * elem, static_cast<const uint8_t*>(in.values) + from,
                  d * elem);
    }
    TileIn t;
    t.keys = keys.data();
    t.values = values.data();
    t.dtype = in.dtype;
    t.frame = in.frame;
    const CodecStatus st = Cpu().EncodeTile(
        preset, layout.head_dim, t,
        std::span<uint8_t>(block.data() + s * layout.record_bytes, layout.record_bytes));
    if (!st.ok()) *status = st;
  }
  return block;
}

// Compares a block's records with the CPU's and records the checks; returns how many
// records are bit-identical.
int CompareBlocks(const Preset& preset, const BlockLayout& layout, const std::vector<uint8_t>& gpu,
                  const std::vector<uint8_t>& cpu, const std::string& what, Report& report,
                  std::string* summary) {
  int identical = 0, worst_ulps = 0;
  double k_min = 1.0, v_min = 1.0;
  for (size_t s = 0; s < layout.slots(); ++s) {
    const RecordDiff d =
        CompareRecords(preset, layout.head_dim, gpu.data() + s * layout.record_bytes,
                       cpu.data() + s * layout.record_bytes);
    identical += d.identical;
    if (!preset.quantizes()) {
      report.Check(d.identical,
                   Fmt("%s slot %zu: fp16 record differs from the CPU's", what.c_str(), s));
      continue;
    }
    k_min = std::fmin(k_min, d.k_codes);
    v_min = std::fmin(v_min, d.v_codes);
    worst_ulps = std::max(worst_ulps, d.max_ulps);
    report.Check(d.k_codes >= 0.999 && d.v_codes >= 0.999 && d.max_ulps <= 2,
                 Fmt("%s slot %zu: codes K %.4f%% V %.4f%%, scales %d ulps (need >= 99.9%%, <= 2)",
                     what.c_str(), s, 100 * d.k_codes, 100 * d.v_codes, d.max_ulps));
  }
  *summary = Fmt("identical %d/%zu, codes K>=%.4f%% V>=%.4f%%, ulps<=%d", identical, layout.slots(),
                 100 * k_min, 100 * v_min, worst_ulps);
  return identical;
}

}  // namespace

bool Report::Check(bool ok, const std::string& what) {
  ++checks_;
  if (!ok) {
    ++failures_;
    std::printf("FAIL [%s] %s\n", suite_.c_str(), what.c_str());
    std::fflush(stdout);
  }
  return ok;
}

void Report::Note(const std::string& line) const {
  std::printf("[%s] %s\n", suite_.c_str(), line.c_str());
  std::fflush(stdout);
}

int Report::Finish() const {
  std::printf("%s [%s] %d checks, %d failures\n", failures_ == 0 ? "PASSED" : "FAILED",
              suite_.c_str(), checks_, failures_);
  return failures_ == 0 ? 0 : 1;
}

Coverage FullCoverage() {
  Coverage c;
  c.presets = AllPresetNames();
  c.head_dims = {64, 128, 256, 512};
  c.slots = 3;
  return c;
}

Coverage EmulatorCoverage() {
  Coverage c;
  c.presets = {"kvarn_k4v2_g128", "kvarn_k2v2_g64", "hadamard_k4v4_g128", "kivi_k2v4_g64", "fp16"};
  c.head_dims = {64, 128};
  // The largest tiles: 128 x 512 lives in global scratch, 64 x 512 fills shared memory.
  c.extra = {{"kvarn_k4v2_g128", 512}, {"kvarn_k4v4_g64", 512}, {"kvarn_k2v4_g128", 256}};
  c.slots = 2;
  return c;
}

Coverage SmokeCoverage() {
  Coverage c;
  c.presets = {"kvarn_k4v2_g128", "kvarn_k2v4_g64"};
  c.head_dims = {64};
  c.extra = {{"kvarn_k4v2_g128", 512}};  // the global-scratch encode path
  c.slots = 1;
  c.attention_cases = {1, 6, 8};
  c.golden_cases = 0;
  return c;
}

void CheckGolden(KernelRunner& runner, const Coverage& cov, Report& report) {
  using kvarn::testing::CodecOutput;
  using kvarn::testing::Conformance;
  using kvarn::testing::GoldenCase;
  const std::string dir = kvarn::testing::GoldenDir();
  std::vector<GoldenCase> cases;
  try {
    cases = kvarn::testing::LoadGoldenCases(dir);
  } catch (const std::exception& e) {
    report.Check(false, std::string("loading the golden vectors from ") + dir + ": " + e.what());
    return;
  }
  int checked = 0, identical = 0;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    if (cov.golden_cases >= 0 && static_cast<int>(ci) >= cov.golden_cases) break;
    const GoldenCase& c = cases[ci];
    for (const auto& gp : c.presets) {
      const Preset preset = MustParse(gp.preset_name);
      const BlockLayout layout = MakeBlockLayout(preset, 1, 1, c.head_dim);
      const size_t n = layout.tile_elems();
      TileSource in;
      in.keys = c.k.data();
      in.values = c.v.data();
      in.slot_stride = n;
      in.dtype = DType::kF32;
      in.frame = Frame::kOriginal;
      CodecOutput out;
      std::vector<int32_t> st;
      CodecStatus s = runner.Encode(preset, layout, in, c.iterations, &out.record, &st);
      if (!report.Check(s.ok() && st[0] == 0, gp.prefix + ": encode: " + s.ToString() +
                                                  Fmt(", status %d", st.empty() ? -1 : st[0])))
        continue;
      std::vector<uint8_t> kb, vb;
      s = runner.Decode(preset, layout, out.record, DType::kF32, Frame::kOriginal, &kb, &vb, &st);
      if (!report.Check(s.ok() && st[0] == 0, gp.prefix + ": decode: " + s.ToString())) continue;
      out.k_hat = AsFloats(kb);
      out.v_hat = AsFloats(vb);
      HostAttend a;
      a.quant_pool = out.record;
      a.num_quant_blocks = 1;
      a.seqs = {AttendSequence{-1, 0, -1, 0, 0, 1}};
      a.tile_ids = {0};
      a.num_q_heads = c.num_queries;  // one kv-head: the whole group in one block
      a.queries = c.q;
      s = runner.Attend(preset, layout, a, &out.attention, &st);
      if (!report.Check(s.ok() && st[0] == 0, gp.prefix + ": attention: " + s.ToString())) continue;
      const Conformance r = kvarn::testing::CheckConformance(dir, c, gp, out);
      for (const std::string& f : r.failures) report.Check(false, f);
      report.Check(r.failures.empty(), gp.prefix + " conforms");

      CodecStatus cs;
      const std::vector<uint8_t> cpu = CpuEncode(preset, layout, in, &cs);
      const RecordDiff d = CompareRecords(preset, c.head_dim, out.record.data(), cpu.data());
      identical += d.identical;
      report.Note(Fmt(
          "%-28s codes K %.4f%% V %.4f%%  scale ulps %d  errK %.5f (ref %.5f)  errV %.5f (ref "
          "%.5f)  "
          "attn %.5f (ref %.5f)  same record as CPU: %s",
          gp.prefix.c_str(), 100 * r.k_code_match, 100 * r.v_code_match, r.max_scale_ulps, r.k_err,
          gp.k_rel_l2_error, r.v_err, gp.v_rel_l2_error, r.attn_err, gp.attn_rel_l2_error,
          d.identical
              ? "yes"
              : Fmt("no (K %.4f%% V %.4f%%, %d ulps)", 100 * d.k_codes, 100 * d.v_codes, d.max_ulps)
                    .c_str()));
      ++checked;
    }
  }
  if (cov.golden_cases < 0)
    report.Check(checked == 21, Fmt("checked %d golden case-presets, expected 21", checked));
  report.Note(Fmt("golden: %d case-presets, %d records bit-identical to Codec::Reference()",
                  checked, identical));
}

void CheckEncodeDecode(KernelRunner& runner, const Coverage& cov, Report& report) {
  std::mt19937_64 rng(20240611);
  int total = 0, identical = 0;
  std::vector<std::pair<std::string, int>> pairs;
  for (const std::string& name : cov.presets) {
    for (int d : cov.head_dims) pairs.emplace_back(name, d);
  }
  pairs.insert(pairs.end(), cov.extra.begin(), cov.extra.end());
  for (const auto& [name, d] : pairs) {
    const Preset preset = MustParse(name);
    {
      const BlockLayout layout = MakeBlockLayout(preset, 1, cov.slots, d);
      const int g = layout.tile_tokens;
      const size_t n = layout.tile_elems(), slots = layout.slots();
      const std::string tag = Fmt("%s D=%d", name.c_str(), d);
      std::vector<float> k(slots * n), v(slots * n);
      for (size_t s = 0; s < slots; ++s) {
        FillTile(rng, static_cast<int>(s), g, d, k.data() + s * n);
        FillTile(rng, static_cast<int>(s + 2), g, d, v.data() + s * n);
      }
      // 1. f32 tiles in the original frame.
      TileSource in;
      in.keys = k.data();
      in.values = v.data();
      in.slot_stride = n;
      in.dtype = DType::kF32;
      in.frame = Frame::kOriginal;
      std::vector<uint8_t> gpu;
      std::vector<int32_t> st;
      CodecStatus s = runner.Encode(preset, layout, in, kDefaultIterations, &gpu, &st);
      CodecStatus cs;
      const std::vector<uint8_t> cpu = CpuEncode(preset, layout, in, &cs);
      report.Check(cs.ok(), tag + ": CPU encode: " + cs.ToString());
      std::string line = tag + " f32/original: ";
      if (report.Check(s.ok(), tag + ": encode: " + s.ToString())) {
        for (size_t i = 0; i < slots; ++i)
          report.Check(st[i] == 0, Fmt("%s: encode status %d", tag.c_str(), st[i]));
        std::string sum;
        identical += CompareBlocks(preset, layout, gpu, cpu, tag + " f32/original", report, &sum);
        total += static_cast<int>(slots);
        line += sum;
      }
      // 2. The fp16 block the pool holds (storage frame), written by the CPU's StoreTokens.
      if (cov.fp16_source) {
        std::vector<float> kt(n * slots), vt(n * slots);  // [G][slots][D]
        for (size_t sl = 0; sl < slots; ++sl) {
          for (int t = 0; t < g; ++t) {
            std::memcpy(&kt[(t * slots + sl) * d], &k[sl * n + static_cast<size_t>(t) * d],
                        d * sizeof(float));
            std::memcpy(&vt[(t * slots + sl) * d], &v[sl * n + static_cast<size_t>(t) * d],
                        d * sizeof(float));
          }
        }
        std::vector<uint16_t> fp16(layout.fp16_block_bytes() / 2, 0);
        cs = Cpu().StoreTokens(preset, layout, reinterpret_cast<uint8_t*>(fp16.data()), 0, g,
                               kt.data(), vt.data(), DType::kF32);
        report.Check(cs.ok(), tag + ": CPU StoreTokens: " + cs.ToString());
        const TileSource src = Fp16BlockSource(layout, fp16.data());
        // The launch parameters refuse strides whose tiles would overlap (host-side checks).
        std::vector<uint8_t> unused(layout.quant_block_bytes());
        std::vector<int32_t> unused_st(slots);
        const auto refused = [&](TileSource t, const char* what) {
          EncodeLaunch launch;
          const CodecStatus b = BuildEncode(preset, layout, t, unused.data(), unused_st.data(),
                                            kDefaultIterations, kHopperLimits, &launch);
          report.Check(b.code() == CodecCode::kInvalidArgument,
                       tag + ": BuildEncode accepted " + what + ": " + b.ToString());
        };
        TileSource wide = src, short_row = src;
        wide.slot_stride = layout.fp16_token_elems();  // slot 1 starts in token 1's row
        short_row.row_stride = static_cast<size_t>(d) / 2;
        refused(wide, "slots wider than a token's row");
        refused(short_row, "a row stride below head_dim");
        s = runner.Encode(preset, layout, src, kDefaultIterations, &gpu, &st);
        const std::vector<uint8_t> cpu16 = CpuEncode(preset, layout, src, &cs);
        report.Check(cs.ok(), tag + ": CPU encode (fp16): " + cs.ToString());
        if (report.Check(s.ok(), tag + ": encode fp16 block: " + s.ToString())) {
          std::string sum;
          identical +=
              CompareBlocks(preset, layout, gpu, cpu16, tag + " fp16/storage", report, &sum);
          total += static_cast<int>(slots);
          line += " | fp16/storage: " + sum;
        }
      }
      // 3. Decoding the CPU's records, every frame and dtype: bit-identical.
      const struct {
        DType dtype;
        Frame frame;
        const char* name;
      } outs[] = {{DType::kF32, Frame::kOriginal, "f32/original"},
                  {DType::kF16, Frame::kStorage, "f16/storage"},
                  {DType::kF16, Frame::kOriginal, "f16/original"},
                  {DType::kF32, Frame::kStorage, "f32/storage"}};
      int decode_ok = 0;
      for (const auto& o : outs) {
        std::vector<uint8_t> kb, vb;
        s = runner.Decode(preset, layout, cpu, o.dtype, o.frame, &kb, &vb, &st);
        if (!report.Check(s.ok(), tag + ": decode: " + s.ToString())) continue;
        const size_t eb = o.dtype == DType::kF32 ? 4 : 2;
        std::vector<uint8_t> ck(n * eb), cvv(n * eb);
        bool same = true;
        for (size_t sl = 0; sl < slots; ++sl) {
          TileOut to;
          to.keys = ck.data();
          to.values = cvv.data();
          to.dtype = o.dtype;
          to.frame = o.frame;
          cs = Cpu().DecodeTile(
              preset, d,
              std::span<const uint8_t>(cpu.data() + sl * layout.record_bytes, layout.record_bytes),
              to);
          same &= cs.ok() && st[sl] == 0 &&
                  std::memcmp(ck.data(), kb.data() + sl * n * eb, n * eb) == 0 &&
                  std::memcmp(cvv.data(), vb.data() + sl * n * eb, n * eb) == 0;
        }
        decode_ok +=
            report.Check(same, Fmt("%s: decode to %s differs from the CPU's", tag.c_str(), o.name));
      }
      report.Note(line + Fmt(" | decode identical %d/4", decode_ok));
    }
  }
  report.Note(Fmt("encode: %d/%d records bit-identical to Codec::Reference()", identical, total));
}

void CheckStore(KernelRunner& runner, const Coverage& cov, Report& report) {
  std::mt19937_64 rng(77);
  std::normal_distribution<float> n01(0.0f, 3.0f);
  for (const char* name : {"kvarn_k4v2_g128", "kivi_k2v2_g64"}) {
    const Preset preset = MustParse(name);
    for (int d : cov.head_dims) {
      const BlockLayout layout = MakeBlockLayout(preset, 2, 3, d);
      const int n = 5, first = 7, layers = layout.num_layers, heads = layout.num_kv_heads;
      const std::string tag = Fmt("%s D=%d", name, d);
      const size_t all = static_cast<size_t>(n) * layers * heads * d;
      std::vector<uint16_t> pattern(layout.fp16_block_bytes() / 2);
      for (size_t i = 0; i < pattern.size(); ++i)
        pattern[i] = static_cast<uint16_t>(0x3000 + i % 0x0800);
      for (DType dtype : {DType::kF32, DType::kF16}) {
        std::vector<float> kf(all), vf(all);
        for (size_t i = 0; i < all; ++i) kf[i] = n01(rng), vf[i] = n01(rng);
        std::vector<uint16_t> kh(all), vh(all);
        for (size_t i = 0; i < all; ++i) kh[i] = FloatToHalf(kf[i]), vh[i] = FloatToHalf(vf[i]);
        const void* keys = dtype == DType::kF32 ? static_cast<const void*>(kf.data()) : kh.data();
        const void* values = dtype == DType::kF32 ? static_cast<const void*>(vf.data()) : vh.data();
        const char* dt = dtype == DType::kF32 ? "f32" : "f16";
        // All layers at once: the bytes of Codec::StoreTokens.
        std::vector<uint16_t> gpu = pattern, cpu = pattern;
        std::vector<int32_t> st;
        CodecStatus s = runner.Store(preset, layout, TokenSource{keys, values, dtype}, n,
                                     kAllLayers, first, &gpu, &st);
        const CodecStatus cs = Cpu().StoreTokens(
            preset, layout, reinterpret_cast<uint8_t*>(cpu.data()), first, n, keys, values, dtype);
        if (report.Check(s.ok() && cs.ok(),
                         tag + ": store: " + s.ToString() + " / " + cs.ToString())) {
          bool zero = true;
          for (int32_t x : st) zero &= x == 0;
          report.Check(zero, tag + ": store status not 0");
          report.Check(gpu == cpu, Fmt("%s %s: all-layer store differs from Codec::StoreTokens",
                                       tag.c_str(), dt));
        }
        // One layer: [n][H][D] of layer 1.
        std::vector<uint16_t> one = pattern, want = pattern;
        const size_t per = static_cast<size_t>(heads) * d;
        std::vector<float> k1(n * per), v1(n * per);
        std::vector<uint16_t> k1h(n * per), v1h(n * per);
        for (int t = 0; t < n; ++t) {
          for (size_t i = 0; i < per; ++i) {
            k1[t * per + i] = kf[(static_cast<size_t>(t) * layers + 1) * per + i];
            v1[t * per + i] = vf[(static_cast<size_t>(t) * layers + 1) * per + i];
            k1h[t * per + i] = kh[(static_cast<size_t>(t) * layers + 1) * per + i];
            v1h[t * per + i] = vh[(static_cast<size_t>(t) * layers + 1) * per + i];
          }
        }
        std::vector<float> row(d);
        for (int t = 0; t < n; ++t) {
          for (int h = 0; h < heads; ++h) {
            for (int which = 0; which < 2; ++which) {
              for (int c = 0; c < d; ++c) {
                const size_t i = (static_cast<size_t>(t) * heads + h) * d + c;
                row[c] = dtype == DType::kF32 ? (which ? v1 : k1)[i]
                                              : HalfToFloat((which ? v1h : k1h)[i]);
              }
              if (preset.rotates()) FwhtInPlace(row.data(), d);
              const size_t off =
                  (which ? layout.Fp16ValuesOffset(1, h) : layout.Fp16KeysOffset(1, h)) / 2 +
                  static_cast<size_t>(first + t) * layout.fp16_token_elems();
              for (int c = 0; c < d; ++c) want[off + c] = FloatToHalf(row[c]);
            }
          }
        }
        const void* k1p = dtype == DType::kF32 ? static_cast<const void*>(k1.data()) : k1h.data();
        const void* v1p = dtype == DType::kF32 ? static_cast<const void*>(v1.data()) : v1h.data();
        s = runner.Store(preset, layout, TokenSource{k1p, v1p, dtype}, n, 1, first, &one, &st);
        if (report.Check(s.ok(), tag + ": one-layer store: " + s.ToString())) {
          report.Check(one == want,
                       Fmt("%s %s: one-layer store differs from FwhtInPlace + FloatToHalf",
                           tag.c_str(), dt));
        }
        // Round trip: rotating the stored fp16 back gives the input within fp16 rounding.
        if (dtype == DType::kF32) {
          double num = 0, den = 0;
          for (int t = 0; t < n; ++t) {
            for (int l = 0; l < layers; ++l) {
              for (int h = 0; h < heads; ++h) {
                const size_t off = layout.Fp16KeysOffset(l, h) / 2 +
                                   static_cast<size_t>(first + t) * layout.fp16_token_elems();
                for (int c = 0; c < d; ++c) row[c] = HalfToFloat(gpu[off + c]);
                if (preset.rotates()) FwhtInPlace(row.data(), d);
                for (int c = 0; c < d; ++c) {
                  const double x = kf[((static_cast<size_t>(t) * layers + l) * heads + h) * d + c];
                  num += (row[c] - x) * (row[c] - x);
                  den += x * x;
                }
              }
            }
          }
          report.Check(std::sqrt(num / den) < 1e-3,
                       Fmt("%s: round trip error %.2e >= 1e-3", tag.c_str(), std::sqrt(num / den)));
        }
      }
      // Bad input: a NaN in token 2 (layer 0, head 1) is reported; that vector is not written.
      std::vector<float> kf(all, 1.0f), vf(all, -1.0f);
      kf[((2 * static_cast<size_t>(layers) + 0) * heads + 1) * d + 3] = NAN;
      std::vector<uint16_t> blk = pattern;
      std::vector<int32_t> st;
      const CodecStatus s =
          runner.Store(preset, layout, TokenSource{kf.data(), vf.data(), DType::kF32}, n,
                       kAllLayers, first, &blk, &st);
      if (report.Check(s.ok(), tag + ": store with NaN: " + s.ToString())) {
        report.Check(
            st[2] == kStoreBadInput && st[0] == 0 && st[1] == 0 && st[3] == 0 && st[4] == 0,
            Fmt("%s: NaN status %d %d %d %d %d", tag.c_str(), st[0], st[1], st[2], st[3], st[4]));
        const size_t bad = layout.Fp16KeysOffset(0, 1) / 2 +
                           static_cast<size_t>(first + 2) * layout.fp16_token_elems();
        const size_t good = layout.Fp16KeysOffset(0, 1) / 2 +
                            static_cast<size_t>(first + 3) * layout.fp16_token_elems();
        report.Check(std::memcmp(&blk[bad], &pattern[bad], d * 2) == 0 &&
                         std::memcmp(&blk[good], &pattern[good], d * 2) != 0,
                     tag + ": the NaN vector was written or a good one was not");
      }
      report.Note(tag + ": store checked");
    }
  }
}

}  // namespace kvarn::cuda::testing
