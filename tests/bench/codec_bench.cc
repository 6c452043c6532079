// kvarn_codec_bench: throughput of the CPU KVarN codec on one core, for the scalar reference
// and the SIMD codec, beside the machine's references measured in the same binary: streaming
// read and memcpy bandwidth (beyond L3, and at the working set of the encode/decode rings), a
// q4_0 quantizer peer for the encoder (the project's own loop; llama.cpp/ggml is not packaged
// for Debian 12, so its figures are not printed here: docs/benchmarks.md), and dense fp16 and
// fp32 attention for fused decode attention. Ends with a summary table that prints every
// figure beside its reference and target. Nothing here asserts on time.
//
// Everything is single-threaded; pin it to one core so that the scheduler does not move it:
//
//   taskset -c 0 build/bin/kvarn_codec_bench
//
// One clock for every figure of the summary, milliseconds and GB/s alike: the CPU time of the
// benchmark thread (Google Benchmark's CPU time, CLOCK_THREAD_CPUTIME_ID), so that time the
// scheduler gives other processes on a shared machine does not count; on an idle machine CPU
// and wall time agree (the console shows both columns). Cache eviction before a cold call is
// not timed. Figures still move with the core's boost clock, which the summary reports.
//
// Working sets: the encode and decode rings are 4 MiB of fp16 (in L3), and their bandwidth
// reference is a memcpy of that size; attention "cold" evicts the caches before every call
// (the quantized sequences are 28.7 MB, under this machine's 32 MiB L3), and its reference is
// a streaming read beyond L3 — the read limit of a step that must come from DRAM. The dense
// baselines (fp16, what an unquantized cache holds, and fp32) are evicted the same way.
//
// Defaults: 3 repetitions, medians in the summary, only aggregates on the console. Any
// Google Benchmark flag overrides them, e.g. --benchmark_repetitions=5 or
// --benchmark_filter=attend. On a machine shared with other jobs, repeat and compare.
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/codec.h"
#include "tests/bench/bench_data.h"
#include "tests/bench/dense_attention.h"
#include "tests/bench/memory_sweep.h"
#include "tests/bench/q4_0_peer.h"
#include "tests/bench/summary.h"

namespace kvarn::bench {
namespace {

// Targets, per core: encode faster than a q4_0 quantizer (issue 12: >= 2.0 GB/s of fp16 input),
// decode >= 4 GB/s, cold 32K-token attention at most 2.5 ms, i.e. at least 65% of the
// streaming-read bandwidth.
constexpr double kEncodeTargetGBps = 2.0;
constexpr double kDecodeTargetGBps = 4.0;
constexpr double kAttendTargetMs = 2.5;
constexpr double kAttendTargetReadShare = 0.65;

constexpr size_t kDramBytes = size_t{256} << 20;       // 8x the 32 MiB L3 of the dev machine
constexpr size_t kRingCopyBytes = size_t{4} << 20;     // the encode/decode rings: in L3
constexpr size_t kCacheCopyBytes = size_t{128} << 10;  // source + destination fit in L2

constexpr int kDefaultHeadDim = 128;
constexpr double kMinTime = 0.3;  // seconds per repetition

// Attention outputs of the last run of each attention benchmark, checked in the summary.
std::map<std::string, std::vector<float>>& AttentionOutputs() {
  static std::map<std::string, std::vector<float>> outputs;
  return outputs;
}

Preset MustParse(const std::string& name) {
  Preset p;
  if (!ParsePreset(name, &p).ok()) std::abort();
  return p;
}

// Bytes of fp16 K+V of one tile: what encode consumes and decode produces.
size_t TileFp16Bytes(const Preset& p, int d) {
  return 2 * 2 * static_cast<size_t>(p.tile_tokens) * d;
}

// Streaming read: a sum over `bytes` of 64-bit words (SumWords), the buffer touched first so
// that no page faults are timed.
void BM_StreamRead(benchmark::State& state, size_t bytes) {
  std::vector<uint64_t> buf(bytes / sizeof(uint64_t), 1);
  for (auto _ : state) benchmark::DoNotOptimize(SumWords(buf.data(), buf.size()));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

void BM_Memcpy(benchmark::State& state, size_t bytes) {
  std::vector<uint8_t> src(bytes, 1), dst(bytes, 0);  // touched: no page faults while timed
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

// The core's effective clock: a chain of dependent integer adds retires one add per cycle.
// The chain is unrolled 100 adds per loop trip: a loop of one add per trip is bound by its
// taken branch on some cores (it read half the clock on an Ice Lake server). Shared and
// virtual machines boost differently from run to run, and every figure here moves with it;
// the summary prints it so that runs can be compared.
void BM_Clock(benchmark::State& state) {
  constexpr int64_t kAddsPerTrip = 100;
  constexpr int64_t kTrips = 1'000'000;
  for (auto _ : state) {
    uint64_t x = 0;
    for (int64_t i = 0; i < kTrips; ++i) {
#if defined(__x86_64__)
      asm volatile(".rept 100\n\tadd $1, %0\n\t.endr" : "+r"(x));
#else
      for (int64_t k = 0; k < kAddsPerTrip; ++k) benchmark::DoNotOptimize(x += 1);
#endif
    }
    benchmark::DoNotOptimize(x);
  }
  state.counters["GHz"] = benchmark::Counter(static_cast<double>(state.iterations()) * kTrips * kAddsPerTrip / 1e9,
                                             benchmark::Counter::kIsRate);
}

void BM_Encode(benchmark::State& state, const Codec* codec, const std::string& preset_name, int d,
               Frame frame) {
  const Preset preset = MustParse(preset_name);
  const TileRing& ring = GetTileRing(preset.tile_tokens, d);
  std::vector<uint8_t> record(preset.RecordBytes(d));
  int i = 0;
  for (auto _ : state) {
    const CodecStatus s =
        codec->EncodeTile(preset, d, ring.Input(i, frame, preset.rotates()), record);
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      break;
    }
    benchmark::DoNotOptimize(record.data());
    benchmark::ClobberMemory();
    i = (i + 1) % kRingTiles;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * TileFp16Bytes(preset, d)));
}

void BM_Q4_0(benchmark::State& state, int d) {
  const TileRing& ring = GetTileRing(128, d);
  const size_t n = ring.TileElems();
  std::vector<BlockQ4_0> out(2 * n / kQ4_0BlockValues);
  int i = 0;
  for (auto _ : state) {
    const size_t off = static_cast<size_t>(i) * n;
    QuantizeQ4_0(ring.keys.data() + off, n, out.data());
    QuantizeQ4_0(ring.values.data() + off, n, out.data() + n / kQ4_0BlockValues);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
    i = (i + 1) % kRingTiles;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 2 * n * sizeof(uint16_t)));
}

void BM_Decode(benchmark::State& state, const Codec* codec, const std::string& preset_name, int d,
               DType dtype, Frame frame) {
  const Preset preset = MustParse(preset_name);
  const std::vector<uint8_t>& records = GetRecordRing(preset, d);
  const size_t record_bytes = preset.RecordBytes(d);
  const size_t elems = static_cast<size_t>(preset.tile_tokens) * d;
  const size_t out_bytes = elems * (dtype == DType::kF32 ? 4 : 2);
  std::vector<uint8_t> keys(kRingTiles * out_bytes, 0), values(kRingTiles * out_bytes, 0);
  int i = 0;
  for (auto _ : state) {
    TileOut out{keys.data() + i * out_bytes, values.data() + i * out_bytes, dtype, frame};
    const CodecStatus s = codec->DecodeTile(
        preset, d, std::span<const uint8_t>(records.data() + i * record_bytes, record_bytes), out);
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      break;
    }
    benchmark::ClobberMemory();
    i = (i + 1) % kRingTiles;
  }
  // fp16-equivalent output (2 bytes per K or V element) for either dtype.
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * TileFp16Bytes(preset, d)));
}

// Evicts the caches (the quantized sequences, 28 MB, would otherwise stay in a 32 MB L3 from
// one call to the next, which a server's many layers and sequences do not allow).
void EvictCaches() {
  static const std::vector<uint8_t> junk(size_t{128} << 20, 1);
  EvictByReading(junk.data(), junk.size());
}

void BM_Attend(benchmark::State& state, const Codec* codec, bool cold) {
  using A = AttentionData;
  const A& a = GetAttentionData();
  std::vector<float> out(static_cast<size_t>(A::kKvHeads) * A::kHeadsPerKv * A::kHeadDim);
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      EvictCaches();
      state.ResumeTiming();
    }
    for (int h = 0; h < A::kKvHeads; ++h) {
      const CodecStatus s =
          codec->AttendDecode(a.preset, A::kHeadDim, a.Queries(h), A::kHeadsPerKv,
                              a.heads[h].View(), out.data() + h * A::kHeadsPerKv * A::kHeadDim);
      if (!s.ok()) {
        state.SkipWithError(s.ToString().c_str());
        return;
      }
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * a.QuantizedBytes()));
  if (!cold) AttentionOutputs()[std::string(codec->name())] = out;
}

// Dense attention over the same tokens, fp16 or fp32 K/V, caches evicted before each call
// like the cold fused run (the sequences, 134 or 269 MB, are beyond L3 anyway).
void BM_DenseAttend(benchmark::State& state, bool fp16) {
  using A = AttentionData;
  const A& a = GetAttentionData();
  std::vector<float> out(static_cast<size_t>(A::kKvHeads) * A::kHeadsPerKv * A::kHeadDim);
  const float scale = 1.0f / std::sqrt(static_cast<float>(A::kHeadDim));
  for (auto _ : state) {
    state.PauseTiming();
    EvictCaches();
    state.ResumeTiming();
    for (int h = 0; h < A::kKvHeads; ++h) {
      float* o = out.data() + h * A::kHeadsPerKv * A::kHeadDim;
      if (fp16) {
        DenseAttentionF16(a.Queries(h), A::kHeadsPerKv, a.DenseKeys16(h), a.DenseValues16(h),
                          A::kTokens, A::kHeadDim, scale, o);
      } else {
        DenseAttention(a.Queries(h), A::kHeadsPerKv, a.DenseKeys(h), a.DenseValues(h),
                       A::kTokens, A::kHeadDim, scale, o);
      }
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(
      static_cast<int64_t>(state.iterations() * (fp16 ? a.DenseF16Bytes() : a.DenseBytes())));
  AttentionOutputs()[fp16 ? "dense_fp16" : "dense"] = out;
}

const char* FrameName(Frame f) { return f == Frame::kOriginal ? "original" : "storage"; }
const char* DTypeName(DType t) { return t == DType::kF32 ? "f32" : "f16"; }

std::string EncodeName(const Codec& c, const std::string& preset, int d, Frame f) {
  return "encode/" + std::string(c.name()) + "/" + preset + "/D" + std::to_string(d) + "/f16/" +
         FrameName(f);
}
std::string DecodeName(const Codec& c, const std::string& preset, int d, DType t, Frame f) {
  return "decode/" + std::string(c.name()) + "/" + preset + "/D" + std::to_string(d) + "/" +
         DTypeName(t) + "/" + FrameName(f);
}
std::string AttendName(const std::string& impl) {
  return "attend/" + impl + (impl.rfind("dense", 0) == 0 ? "" : "/kvarn_k4v2_g128") +
         "/D128/8kv_x_32832tok/gqa4";
}
std::string ColdAttendName(const std::string& impl) { return AttendName(impl) + "/cold"; }
const std::string kClockStart = "clock/dependent_adds/start";
const std::string kClockEnd = "clock/dependent_adds/end";
const std::string kReadDram = "read/256MiB_beyond_L3";
const std::string kMemcpyDram = "memcpy/256MiB_beyond_L3";
const std::string kMemcpyRing = "memcpy/4MiB_in_L3";
const std::string kMemcpyCache = "memcpy/128KiB_in_L2";
const std::string kQ4_0 = "q4_0_peer/D128/f16";

// Extra lines: other presets and head dims, encode from the storage frame and decode to it.
struct Extra {
  std::string preset;
  int head_dim;
};
const std::vector<Extra>& Extras() {
  static const std::vector<Extra> extras = {{"kvarn_k4v4_g128", 128},    {"kvarn_k2v2_g128", 128},
                                            {"kvarn_k4v2_g64", 128},     {"kivi_k4v2_g128", 128},
                                            {"hadamard_k4v2_g128", 128}, {"kvarn_k4v2_g128", 64},
                                            {"kvarn_k4v2_g128", 256}};
  return extras;
}

const Codec* const kCodecs[] = {&Codec::Simd(), &Codec::Reference()};

void RegisterAll() {
  using benchmark::RegisterBenchmark;
  RegisterBenchmark(kClockStart.c_str(), BM_Clock)->Iterations(3)->Unit(benchmark::kMillisecond);
  RegisterBenchmark(kReadDram.c_str(), BM_StreamRead, kDramBytes)->MinTime(kMinTime);
  RegisterBenchmark(kMemcpyDram.c_str(), BM_Memcpy, kDramBytes)->MinTime(kMinTime);
  RegisterBenchmark(kMemcpyRing.c_str(), BM_Memcpy, kRingCopyBytes)->MinTime(kMinTime);
  RegisterBenchmark(kMemcpyCache.c_str(), BM_Memcpy, kCacheCopyBytes)->MinTime(kMinTime);
  const std::string preset(kDefaultPresetName);
  for (const Codec* c : kCodecs) {
    for (Frame f : {Frame::kOriginal, Frame::kStorage}) {
      RegisterBenchmark(EncodeName(*c, preset, kDefaultHeadDim, f).c_str(), BM_Encode, c, preset,
                        kDefaultHeadDim, f)
          ->MinTime(kMinTime)
          ->Unit(benchmark::kMicrosecond);
    }
  }
  RegisterBenchmark(kQ4_0.c_str(), BM_Q4_0, kDefaultHeadDim)
      ->MinTime(kMinTime)
      ->Unit(benchmark::kMicrosecond);
  for (const Codec* c : kCodecs) {
    for (auto [t, f] :
         {std::pair{DType::kF16, Frame::kStorage}, std::pair{DType::kF32, Frame::kOriginal}}) {
      RegisterBenchmark(DecodeName(*c, preset, kDefaultHeadDim, t, f).c_str(), BM_Decode, c, preset,
                        kDefaultHeadDim, t, f)
          ->MinTime(kMinTime)
          ->Unit(benchmark::kMicrosecond);
    }
  }
  for (const Codec* c : kCodecs) {
    auto* b = RegisterBenchmark(AttendName(std::string(c->name())).c_str(), BM_Attend, c, false)
                  ->Unit(benchmark::kMillisecond);
    // The scalar reference takes seconds per call: one call per repetition.
    if (c == &Codec::Reference())
      b->Iterations(1);
    else
      b->MinTime(kMinTime);
  }
  RegisterBenchmark(ColdAttendName("simd").c_str(), BM_Attend, &Codec::Simd(), true)
      ->Iterations(20)
      ->Unit(benchmark::kMillisecond);
  RegisterBenchmark(ColdAttendName("dense_fp16").c_str(), BM_DenseAttend, true)
      ->Iterations(5)
      ->Unit(benchmark::kMillisecond);
  RegisterBenchmark(ColdAttendName("dense_fp32").c_str(), BM_DenseAttend, false)
      ->Iterations(5)
      ->Unit(benchmark::kMillisecond);
  for (const Extra& e : Extras()) {
    for (const Codec* c : kCodecs) {
      RegisterBenchmark(("extra/" + EncodeName(*c, e.preset, e.head_dim, Frame::kStorage)).c_str(),
                        BM_Encode, c, e.preset, e.head_dim, Frame::kStorage)
          ->MinTime(0.1)
          ->Unit(benchmark::kMicrosecond);
      RegisterBenchmark(
          ("extra/" + DecodeName(*c, e.preset, e.head_dim, DType::kF16, Frame::kStorage)).c_str(),
          BM_Decode, c, e.preset, e.head_dim, DType::kF16, Frame::kStorage)
          ->MinTime(0.1)
          ->Unit(benchmark::kMicrosecond);
    }
  }
  RegisterBenchmark(kClockEnd.c_str(), BM_Clock)->Iterations(3)->Unit(benchmark::kMillisecond);
}

std::string GBps(std::optional<double> bps) {
  return bps ? Format("%.2f GB/s", *bps / 1e9) : "(not run)";
}

// "met (+23%)" or "MISSED (-40%)": how far the measured value is beyond or short of the target.
std::string Status(std::optional<double> value, double target) {
  if (!value) return "-";
  const double rel = 100.0 * (*value / target - 1.0);
  return Format("%s (%+.0f%%)", *value >= target ? "met" : "MISSED", rel);
}

std::string Ratio(std::optional<double> a, std::optional<double> b, const char* what) {
  if (!a || !b || *b == 0) return "";
  return Format("SIMD %.1fx %s", *a / *b, what);
}

void PrintSummary(const SummaryReporter& r) {
  const Codec& simd = Codec::Simd();
  const Codec& ref = Codec::Reference();
  const std::string preset(kDefaultPresetName);
  const auto bps = [&](const std::string& name) { return r.BytesPerSecond(name); };
  const auto sec = [&](const std::string& name) { return r.SecondsPerIteration(name); };
  const auto ms = [](std::optional<double> s) {
    return s ? Format("%.2f ms", *s * 1e3) : std::string("(not run)");
  };

  TextTable t;
  t.AddRow({"figure (one core, CPU time)", "impl", "measured", "reference", "target", "status"});
  t.AddSeparator();
  const auto read = bps(kReadDram);
  const auto ring_copy = bps(kMemcpyRing);
  t.AddRow({"streaming read 256 MiB (beyond L3), bytes read", "loop", GBps(read),
            "the read limit of DRAM-bound work", "", ""});
  t.AddRow({"memcpy 256 MiB (beyond L3), bytes copied", "libc", GBps(bps(kMemcpyDram)), "", "", ""});
  t.AddRow({"memcpy 4 MiB (in L3, the rings' size), bytes copied", "libc", GBps(ring_copy),
            "reference of encode/decode", "", ""});
  t.AddRow({"memcpy 128 KiB (in L2), bytes copied", "libc", GBps(bps(kMemcpyCache)), "", "", ""});
  t.AddSeparator();

  const auto q4 = bps(kQ4_0);
  const std::string enc_ref = "q4_0 peer " + GBps(q4) + " (same ring)";
  for (Frame f : {Frame::kOriginal, Frame::kStorage}) {
    const std::string what =
        Format("encode %s D128 f16 K+V, %s frame%s", preset.c_str(), FrameName(f),
               f == Frame::kOriginal ? " (rotates)" : " (seal path)");
    const auto s = bps(EncodeName(simd, preset, kDefaultHeadDim, f));
    const auto c = bps(EncodeName(ref, preset, kDefaultHeadDim, f));
    t.AddRow({what, "simd", GBps(s), enc_ref, Format(">= %.1f GB/s", kEncodeTargetGBps),
              Status(s ? std::optional(*s / 1e9) : std::nullopt, kEncodeTargetGBps)});
    t.AddRow({"", "scalar", GBps(c), Ratio(s, c, "faster than scalar"), "", ""});
  }
  t.AddRow({"q4_0 peer (this binary's loop), f16 K+V", "scalar", GBps(q4),
            "ggml's q4_0: not packaged, not run", "", ""});
  t.AddSeparator();

  for (auto [dt, f] :
       {std::pair{DType::kF16, Frame::kStorage}, std::pair{DType::kF32, Frame::kOriginal}}) {
    const std::string what = Format("decode %s D128 -> %s %s frame, GB/s of fp16 K+V",
                                    preset.c_str(), DTypeName(dt), FrameName(f));
    const auto s = bps(DecodeName(simd, preset, kDefaultHeadDim, dt, f));
    const auto c = bps(DecodeName(ref, preset, kDefaultHeadDim, dt, f));
    t.AddRow({what, "simd", GBps(s), "memcpy 4 MiB " + GBps(ring_copy),
              Format(">= %.1f GB/s", kDecodeTargetGBps),
              Status(s ? std::optional(*s / 1e9) : std::nullopt, kDecodeTargetGBps)});
    t.AddRow({"", "scalar", GBps(c), Ratio(s, c, "faster than scalar"), "", ""});
  }
  t.AddSeparator();

  // Attention: the cold run against the read limit (the quantized bytes at streaming-read
  // bandwidth) and against dense fp16/fp32 attention over the same tokens, also cold.
  const double quantized_bytes = static_cast<double>(GetAttentionData().QuantizedBytes());
  const std::optional<double> limit =
      read ? std::optional(quantized_bytes / *read) : std::nullopt;
  const auto cold = sec(ColdAttendName("simd"));
  const auto dense16 = sec(ColdAttendName("dense_fp16"));
  const auto dense32 = sec(ColdAttendName("dense_fp32"));
  const std::string limit_ref =
      limit ? Format("read limit %s (%.1f MB at %s)", ms(limit).c_str(), quantized_bytes / 1e6,
                     GBps(read).c_str())
            : std::string("read limit (not run)");
  std::string cold_status = "-";
  if (cold && limit) {
    const double share = *limit / *cold;
    cold_status = Format("%s (%.0f%% of read)", *cold * 1e3 <= kAttendTargetMs ? "met" : "MISSED",
                         100 * share);
  }
  t.AddRow({"attention k4v2 8 kv x 32,832 tok, 4 q/kv, caches cold", "simd",
            ms(cold) + " = " + GBps(bps(ColdAttendName("simd"))), limit_ref,
            Format("<= %.1f ms, >= %.0f%% of read", kAttendTargetMs, 100 * kAttendTargetReadShare),
            cold_status});
  for (const Codec* c : kCodecs) {
    const std::string name = AttendName(std::string(c->name()));
    const auto s = sec(name);
    t.AddRow({c == &simd ? Format("  same, L3-resident (%.1f MB, repeated)", quantized_bytes / 1e6)
                         : "",
              c == &simd ? "simd" : "scalar", s ? ms(s) + " = " + GBps(bps(name)) : ms(s), "", "",
              ""});
  }
  const auto speedup = [&](std::optional<double> dense) {
    return cold && dense ? Format("fused cold %.2fx faster", *dense / *cold) : std::string();
  };
  t.AddRow({"dense fp16 attention, same tokens, caches cold", "highway",
            ms(dense16) + " = " + GBps(bps(ColdAttendName("dense_fp16"))), speedup(dense16), "",
            ""});
  t.AddRow({"dense fp32 attention, same tokens, caches cold", "highway",
            ms(dense32) + " = " + GBps(bps(ColdAttendName("dense_fp32"))), speedup(dense32), "",
            ""});
  t.AddSeparator();

  for (const Extra& e : Extras()) {
    for (bool decode : {false, true}) {
      const std::string sn =
          decode ? DecodeName(simd, e.preset, e.head_dim, DType::kF16, Frame::kStorage)
                 : EncodeName(simd, e.preset, e.head_dim, Frame::kStorage);
      const std::string cn =
          decode ? DecodeName(ref, e.preset, e.head_dim, DType::kF16, Frame::kStorage)
                 : EncodeName(ref, e.preset, e.head_dim, Frame::kStorage);
      const auto s = bps("extra/" + sn), c = bps("extra/" + cn);
      if (!s && !c) continue;
      t.AddRow({Format("extra: %s %s D%d, storage frame", decode ? "decode" : "encode",
                       e.preset.c_str(), e.head_dim),
                "simd", GBps(s), "scalar " + GBps(c), "", ""});
    }
  }

  const auto clock = [&](const std::string& name) {
    const auto ghz = r.Counter(name, "GHz");
    return ghz ? Format("%.2f", *ghz) : std::string("?");
  };
  std::printf(
      "\nSummary (median of repetitions; every figure from the benchmark thread's CPU time; GB/s "
      "= 1e9 bytes/s; SIMD target %s; effective clock %s GHz at the start, %s GHz at the "
      "end)\n\n%s",
      simd.target().data(), clock(kClockStart).c_str(), clock(kClockEnd).c_str(),
      t.Render().c_str());

  // Sanity: the fused attention computes what the dense baselines compute, up to k4v2 error.
  const auto& outs = AttentionOutputs();
  for (const char* dense : {"dense_fp16", "dense"}) {
    const auto dense_out = outs.find(dense);
    for (const char* name : {"simd", "reference"}) {
      const auto it = outs.find(name);
      if (it == outs.end() || dense_out == outs.end()) continue;
      std::printf("check: %s attention vs %s, relative L2 %.4f (k4v2 quantization error)\n", name,
                  dense_out->first == "dense" ? "dense fp32" : "dense fp16",
                  RelL2(it->second.data(), dense_out->second.data(), it->second.size()));
    }
  }
  if (outs.count("simd") && outs.count("reference")) {
    std::printf("check: simd vs scalar attention, relative L2 %.2e\n",
                RelL2(outs.at("simd").data(), outs.at("reference").data(), outs.at("simd").size()));
  }
}

// A note on the console when the process may run on more than one core.
void NotePinning() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 1) {
    std::printf("note: not pinned to one core; for stable figures run under `taskset -c 0`\n");
  }
  benchmark::AddCustomContext("simd_target", std::string(Codec::Simd().target()));
}

// Keeps the core busy for about half a second, so that it has ramped up to its boost clock
// before the first figure is taken.
void WarmUp() {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  uint64_t x = 0;
  while (std::chrono::steady_clock::now() < end) {
    for (int i = 0; i < 100000; ++i) benchmark::DoNotOptimize(x += i);
  }
}

bool HasFlag(int argc, char** argv, const char* prefix) {
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix, std::strlen(prefix)) == 0) return true;
  }
  return false;
}

}  // namespace
}  // namespace kvarn::bench

int main(int argc, char** argv) {
  using kvarn::bench::HasFlag;
  std::vector<char*> args(argv, argv + argc);
  static char kRepetitions[] = "--benchmark_repetitions=3";
  static char kAggregatesOnly[] = "--benchmark_display_aggregates_only=true";
  if (!HasFlag(argc, argv, "--benchmark_repetitions")) args.push_back(kRepetitions);
  if (!HasFlag(argc, argv, "--benchmark_display_aggregates_only") &&
      !HasFlag(argc, argv, "--benchmark_report_aggregates_only")) {
    args.push_back(kAggregatesOnly);
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;
  kvarn::bench::RegisterAll();
  kvarn::bench::NotePinning();
  kvarn::bench::WarmUp();
  kvarn::bench::SummaryReporter reporter(isatty(STDOUT_FILENO)
                                             ? benchmark::ConsoleReporter::OO_ColorTabular
                                             : benchmark::ConsoleReporter::OO_Tabular);
  benchmark::RunSpecifiedBenchmarks(&reporter);
  kvarn::bench::PrintSummary(reporter);
  benchmark::Shutdown();
  return 0;
}
