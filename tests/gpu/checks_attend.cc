// Fused-attention checks against Codec::Reference().AttendDecode, and the emulator's
// schedule-independence check; see checks.h.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kernels/codec.h"
#include "kernels/fp16.h"
#include "tests/gpu/checks.h"
#include "tests/gpu/test_data.h"

namespace kvarn::cuda::testing {
namespace {

struct SeqSpec {
  int sink = 0, tiles = 0, tail = 0;
  bool bad_id = false;      // one tile id in the middle lies outside the pool
  bool bad_tokens = false;  // tail_tokens beyond G: the whole sequence is rejected
};

struct Scenario {
  const char* preset;
  int d, kv_heads, group, layers, layer;
  std::vector<SeqSpec> seqs;
  std::vector<int> splits;
  float scale = 0.0f;
};

std::vector<Scenario> Scenarios() {
  return {
      // GQA 4, two layers (reads layer 1), sink+tiles+tail, tiles only, sink+tail, tail only;
      // 8 splits leave some splits without units.
      {"kvarn_k4v2_g128",
       128,
       2,
       4,
       2,
       1,
       {{128, 5, 37}, {0, 2, 0}, {128, 0, 1}, {0, 0, 128}},
       {1, 3, 8}},
      // MHA (group 1), 64-token tiles.
      {"kvarn_k2v2_g64", 64, 4, 1, 1, 0, {{64, 3, 10}, {0, 1, 63}}, {1, 2}},
      // Group 24: two head chunks of 16, the second padded.
      {"kvarn_k4v4_g128", 128, 1, 24, 1, 0, {{128, 2, 5}}, {1, 4}},
      // Group 3 (padded chunk of 4), head_dim 256.
      {"kvarn_k4v2_g128", 256, 2, 3, 1, 0, {{0, 3, 20}, {128, 1, 0}}, {1, 2}},
      // head_dim 512, the largest record.
      {"kvarn_k4v4_g128", 512, 1, 8, 1, 0, {{128, 3, 9}}, {1, 3}},
      // No rotation; an explicit softmax scale.
      {"kivi_k4v2_g128", 128, 2, 2, 1, 0, {{128, 4, 100}}, {1, 2}, 0.05f},
      // The fp16 preset: "quantized" blocks are fp16 records.
      {"fp16", 128, 2, 4, 1, 0, {{128, 2, 17}, {0, 1, 0}}, {1, 2}},
      // Hadamard-only, group 16, two layers (reads layer 0).
      {"hadamard_k2v4_g64", 256, 1, 16, 2, 0, {{64, 4, 33}}, {1, 5}},
      // Bad block id (skipped, flagged) and a bad sequence (zeros, flagged).
      {"kvarn_k4v2_g128",
       64,
       2,
       2,
       1,
       0,
       {{128, 2, 5}, {0, 3, 9, true}, {0, 1, 4, false, true}},
       {1, 2}},
  };
}

// A batch in host memory plus what the CPU needs to compute the expected output.
struct Built {
  Preset preset;
  BlockLayout layout;
  HostAttend in;
  std::vector<std::vector<int32_t>> cpu_tiles;  // per sequence, the ids the CPU attends over
  std::vector<int32_t> want_status;
};

Built Build(const Scenario& sc, std::mt19937_64& rng) {
  Built b;
  b.preset = MustParse(sc.preset);
  b.layout = MakeBlockLayout(b.preset, sc.layers, sc.kv_heads, sc.d);
  const BlockLayout& L = b.layout;
  const int g = L.tile_tokens, d = L.head_dim;
  const size_t n = L.tile_elems();
  HostAttend& in = b.in;
  in.layer = sc.layer;
  in.num_q_heads = sc.kv_heads * sc.group;
  in.softmax_scale = sc.scale;
  int max_tiles = 0;
  for (const SeqSpec& s : sc.seqs) max_tiles = std::max(max_tiles, s.tiles);
  in.num_quant_blocks = max_tiles + 2;
  in.num_fp16_blocks = 2 * static_cast<int64_t>(sc.seqs.size());

  // Quantized blocks: the attended layer's records encoded by the CPU from random tiles; the
  // other layers' records stay zero (a kernel reading the wrong layer gets other scores).
  in.quant_pool.assign(static_cast<size_t>(in.num_quant_blocks) * L.quant_block_bytes(), 0);
  std::vector<float> k(n), v(n);
  for (int64_t blk = 0; blk < in.num_quant_blocks; ++blk) {
    for (int h = 0; h < L.num_kv_heads; ++h) {
      FillTile(rng, static_cast<int>(blk + h), g, d, k.data());
      FillTile(rng, static_cast<int>(blk + h + 1), g, d, v.data());
      uint8_t* rec =
          in.quant_pool.data() + blk * L.quant_block_bytes() + L.RecordOffset(sc.layer, h);
      const CodecStatus s = Codec::Reference().EncodeTile(b.preset, d, TileIn{k.data(), v.data()},
                                                          std::span<uint8_t>(rec, L.record_bytes));
      if (!s.ok()) std::fprintf(stderr, "CPU encode failed: %s\n", s.ToString().c_str());
    }
  }
  // fp16 blocks: random storage-frame halves in every slot.
  std::normal_distribution<float> n01(0.0f, 1.0f);
  in.fp16_pool.resize(static_cast<size_t>(in.num_fp16_blocks) * L.fp16_block_bytes() / 2);
  for (uint16_t& x : in.fp16_pool) x = FloatToHalf(n01(rng));

  std::uniform_int_distribution<int> pick(0, static_cast<int>(in.num_quant_blocks) - 1);
  for (size_t i = 0; i < sc.seqs.size(); ++i) {
    const SeqSpec& s = sc.seqs[i];
    AttendSequence a;
    a.sink_block = s.sink > 0 ? static_cast<int32_t>(2 * i) : -1;
    a.sink_tokens = s.sink;
    a.tail_block = s.tail > 0 ? static_cast<int32_t>(2 * i + 1) : -1;
    a.tail_tokens = s.bad_tokens ? g + 72 : s.tail;
    a.first_tile = static_cast<int32_t>(in.tile_ids.size());
    std::vector<int32_t> cpu;
    for (int t = 0; t < s.tiles; ++t) {
      const int32_t id = pick(rng);
      in.tile_ids.push_back(id);
      cpu.push_back(id);
      if (s.bad_id && t == s.tiles / 2)
        in.tile_ids.push_back(static_cast<int32_t>(in.num_quant_blocks + 3));
    }
    a.num_tiles = static_cast<int32_t>(in.tile_ids.size()) - a.first_tile;
    in.seqs.push_back(a);
    b.cpu_tiles.push_back(s.bad_tokens ? std::vector<int32_t>{} : cpu);
    b.want_status.push_back(s.bad_tokens ? kAttendBadSequence : s.bad_id ? kAttendBadBlockId : 0);
  }
  if (in.tile_ids.empty()) in.tile_ids.push_back(0);
  in.queries.resize(sc.seqs.size() * in.num_q_heads * static_cast<size_t>(d));
  for (float& q : in.queries) q = n01(rng);
  return b;
}

// Codec::Reference().AttendDecode per (sequence, kv-head): outputs, and lse; zeros and -inf
// for rejected sequences.
struct CpuResult {
  std::vector<float> out, lse;
};
CpuResult CpuAttend(const Scenario& sc, const Built& b) {
  const BlockLayout& L = b.layout;
  const HostAttend& in = b.in;
  const int d = L.head_dim, hq = in.num_q_heads;
  std::vector<float> out(in.seqs.size() * hq * static_cast<size_t>(d), 0.0f);
  std::vector<float> lse(in.seqs.size() * hq, -INFINITY);
  for (size_t i = 0; i < in.seqs.size(); ++i) {
    if (sc.seqs[i].bad_tokens) continue;
    const AttendSequence& a = in.seqs[i];
    for (int h = 0; h < L.num_kv_heads; ++h) {
      const auto fp16 = [&](int32_t blk, size_t off) {
        return in.fp16_pool.data() + (static_cast<size_t>(blk) * L.fp16_block_bytes() + off) / 2;
      };
      SequenceView view;
      if (a.sink_tokens > 0) {
        view.sink = Fp16Run{fp16(a.sink_block, L.Fp16KeysOffset(in.layer, h)),
                            fp16(a.sink_block, L.Fp16ValuesOffset(in.layer, h)), a.sink_tokens,
                            L.fp16_token_elems()};
      }
      if (a.tail_tokens > 0) {
        view.tail = Fp16Run{fp16(a.tail_block, L.Fp16KeysOffset(in.layer, h)),
                            fp16(a.tail_block, L.Fp16ValuesOffset(in.layer, h)), a.tail_tokens,
                            L.fp16_token_elems()};
      }
      std::vector<const uint8_t*> tiles;
      for (int32_t id : b.cpu_tiles[i]) {
        tiles.push_back(in.quant_pool.data() + static_cast<size_t>(id) * L.quant_block_bytes() +
                        L.RecordOffset(in.layer, h));
      }
      view.tiles = tiles;
      const size_t head = i * hq + static_cast<size_t>(h) * sc.group, row = head * d;
      const CodecStatus s =
          Codec::Reference().AttendDecode(b.preset, d, in.queries.data() + row, sc.group, view,
                                          out.data() + row, sc.scale, lse.data() + head);
      if (!s.ok()) std::fprintf(stderr, "CPU attention failed: %s\n", s.ToString().c_str());
    }
  }
  return {out, lse};
}

}  // namespace

void CheckAttention(KernelRunner& runner, const Coverage& cov, Report& report) {
  const std::vector<Scenario> all = Scenarios();
  std::vector<int> which = cov.attention_cases;
  if (which.empty()) {
    for (size_t i = 0; i < all.size(); ++i) which.push_back(static_cast<int>(i));
  }
  for (int idx : which) {
    const Scenario& sc = all[idx];
    std::mt19937_64 rng(1000 + idx);
    Built b = Build(sc, rng);
    const CpuResult cpu = CpuAttend(sc, b);
    const std::vector<float>& want = cpu.out;
    const int d = b.layout.head_dim, hq = b.in.num_q_heads;
    for (int splits : sc.splits) {
      b.in.num_splits = splits;
      const std::string tag = Fmt("case %d %s D=%d Hkv=%d group=%d splits=%d", idx, sc.preset, d,
                                  sc.kv_heads, sc.group, splits);
      std::vector<float> got, got_lse;
      std::vector<int32_t> st;
      const CodecStatus s = runner.Attend(b.preset, b.layout, b.in, &got, &st, &got_lse);
      if (!report.Check(s.ok(), tag + ": " + s.ToString())) continue;
      double worst = 0.0, worst_lse = 0.0;
      for (size_t i = 0; i < b.in.seqs.size(); ++i) {
        report.Check(st[i] == b.want_status[i], Fmt("%s: seq %zu status %d, want %d", tag.c_str(),
                                                    i, st[i], b.want_status[i]));
        for (int h = 0; h < hq; ++h) {
          // lse: the same log-sum-exp as the CPU's, -inf where the sequence was rejected.
          const float gl = got_lse[i * hq + h], wl = cpu.lse[i * hq + h];
          const double lse_err = std::isinf(wl)
                                     ? (gl == wl ? 0.0 : 1e30)
                                     : std::fabs(static_cast<double>(gl) - wl) /
                                           std::max(1.0, std::fabs(static_cast<double>(wl)));
          worst_lse = std::max(worst_lse, std::isnan(lse_err) ? 1e30 : lse_err);
          const size_t row = (i * hq + h) * static_cast<size_t>(d);
          double num = 0.0, den = 0.0;
          for (int c = 0; c < d; ++c) {
            const double e = static_cast<double>(got[row + c]) - want[row + c];
            num += e * e;
            den += static_cast<double>(want[row + c]) * want[row + c];
          }
          const double rel = den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
          worst = std::max(worst, std::isnan(rel) ? 1e30 : rel);
        }
      }
      report.Check(worst <= 1e-4, Fmt("%s: relative L2 error %.3e vs Codec::Reference() > 1e-4",
                                      tag.c_str(), worst));
      report.Check(worst_lse <= 1e-5,
                   Fmt("%s: lse error %.3e vs Codec::Reference() > 1e-5", tag.c_str(), worst_lse));
      report.Note(Fmt("%s: worst relative L2 error vs CPU %.2e, lse error %.2e", tag.c_str(), worst,
                      worst_lse));
    }
  }
}

void CheckScheduleIndependence(Report& report) {
  std::vector<std::unique_ptr<KernelRunner>> runners;
  runners.push_back(MakeEmuRunner(emu::Order::kForward));
  runners.push_back(MakeEmuRunner(emu::Order::kReverse));
  runners.push_back(MakeEmuRunner(emu::Order::kShuffled));
  const char* orders[] = {"forward", "reverse", "shuffled"};
  std::mt19937_64 rng(5);
  for (const char* name : {"kvarn_k4v2_g128", "kvarn_k2v4_g64"}) {
    const Preset preset = MustParse(name);
    const BlockLayout layout = MakeBlockLayout(preset, 1, 2, 64);
    const size_t n = layout.tile_elems();
    std::vector<float> k(2 * n), v(2 * n);
    FillTile(rng, 1, layout.tile_tokens, 64, k.data());
    FillTile(rng, 2, layout.tile_tokens, 64, k.data() + n);
    FillTile(rng, 3, layout.tile_tokens, 64, v.data());
    FillTile(rng, 0, layout.tile_tokens, 64, v.data() + n);
    const TileSource in{k.data(), v.data(), n, DType::kF32, Frame::kOriginal};
    std::vector<uint8_t> first, blk, kb0, vb0, kb, vb;
    std::vector<int32_t> st;
    for (size_t r = 0; r < runners.size(); ++r) {
      if (!report.Check(runners[r]->Encode(preset, layout, in, kDefaultIterations, &blk, &st).ok(),
                        "encode"))
        return;
      if (r == 0) first = blk;
      report.Check(blk == first,
                   Fmt("%s: encode differs between forward and %s fiber order", name, orders[r]));
      if (!report.Check(
              runners[r]
                  ->Decode(preset, layout, first, DType::kF16, Frame::kOriginal, &kb, &vb, &st)
                  .ok(),
              "decode")) {
        return;
      }
      if (r == 0) kb0 = kb, vb0 = vb;
      report.Check(kb == kb0 && vb == vb0,
                   Fmt("%s: decode differs between forward and %s fiber order", name, orders[r]));
    }
  }
  const Scenario sc = Scenarios()[0];
  Built b = Build(sc, rng);
  b.in.num_splits = 3;
  std::vector<float> out0, out;
  std::vector<int32_t> st;
  for (size_t r = 0; r < runners.size(); ++r) {
    if (!report.Check(runners[r]->Attend(b.preset, b.layout, b.in, &out, &st).ok(), "attention"))
      return;
    if (r == 0) out0 = out;
    report.Check(std::memcmp(out.data(), out0.data(), out.size() * sizeof(float)) == 0,
                 Fmt("attention differs between forward and %s fiber order", orders[r]));
  }
  report.Note("encode, decode and attention are independent of the fiber order");
}

}  // namespace kvarn::cuda::testing
