// kvarn_cuda_bench: throughput of the CUDA kernels by bytes moved, against the
// device-to-device copy bandwidth measured first on the same device.
//
// Bytes moved count what a kernel must read and write at least once (a copy of N bytes moves
// 2N: read + write). Targets: encode >= 40% and fused attention >= 60% of copy bandwidth.
// Usage: kvarn_cuda_bench [--quick]   (--quick: fewer repetitions)
// Prints "SKIPPED: no CUDA device" and exits 0 without a device.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_codec.h"
#include "kernels/fp16.h"
#include "tests/gpu/test_data.h"

namespace kvarn::cuda::bench {
namespace {

using testing::Fmt;
using testing::MustParse;

#define BENCH_CUDA(expr)                                                 \
  do {                                                                   \
    const cudaError_t err_ = (expr);                                     \
    if (err_ != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, \
                   cudaGetErrorString(err_));                            \
      std::exit(1);                                                      \
    }                                                                    \
  } while (0)

#define BENCH_OK(expr)                                                                            \
  do {                                                                                            \
    const CodecStatus st_ = (expr);                                                               \
    if (!st_.ok()) {                                                                              \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, st_.ToString().c_str()); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

template <class T = void>
T* Alloc(size_t bytes) {
  void* p = nullptr;
  BENCH_CUDA(cudaMalloc(&p, bytes));
  return static_cast<T*>(p);
}

// Times `reps` calls of fn() on `stream`; returns seconds per call.
template <class F>
double Time(cudaStream_t stream, int warmup, int reps, F fn) {
  for (int i = 0; i < warmup; ++i) fn(i);
  cudaEvent_t a, b;
  BENCH_CUDA(cudaEventCreate(&a));
  BENCH_CUDA(cudaEventCreate(&b));
  BENCH_CUDA(cudaEventRecord(a, stream));
  for (int i = 0; i < reps; ++i) fn(i);
  BENCH_CUDA(cudaEventRecord(b, stream));
  BENCH_CUDA(cudaEventSynchronize(b));
  float ms = 0.0f;
  BENCH_CUDA(cudaEventElapsedTime(&ms, a, b));
  BENCH_CUDA(cudaEventDestroy(a));
  BENCH_CUDA(cudaEventDestroy(b));
  return ms * 1e-3 / reps;
}

struct Result {
  std::string name;
  double gbps = 0.0;
  double target = 0.0;  // fraction of copy bandwidth; 0: none
};

std::vector<Result> g_results;
double g_copy_gbps = 0.0;

void Report(const std::string& name, double bytes, double seconds, double target,
            const std::string& extra) {
  const double gbps = bytes / seconds * 1e-9;
  const double frac = gbps / g_copy_gbps;
  std::string verdict = "no target";
  if (target > 0)
    verdict = Fmt("target >= %.0f%%: %s", 100 * target, frac >= target ? "MET" : "MISSED");
  std::printf("%-44s %8.1f GB/s = %5.1f%% of copy (%.1f GB/s); %s; %s\n", name.c_str(), gbps,
              100 * frac, g_copy_gbps, verdict.c_str(), extra.c_str());
  std::fflush(stdout);
  g_results.push_back({name, gbps, target});
}

void FillRandomHalves(uint16_t* dev, size_t count, uint64_t seed) {
  std::vector<uint16_t> host(count);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  for (uint16_t& h : host) h = FloatToHalf(n01(rng));
  BENCH_CUDA(cudaMemcpy(dev, host.data(), count * 2, cudaMemcpyHostToDevice));
}

double CopyBandwidth(cudaStream_t stream, int reps) {
  const size_t bytes = size_t{1} << 30;
  uint8_t* a = Alloc<uint8_t>(bytes);
  uint8_t* b = Alloc<uint8_t>(bytes);
  BENCH_CUDA(cudaMemset(a, 1, bytes));
  const double s = Time(stream, 2, reps, [&](int) {
    BENCH_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream));
  });
  BENCH_CUDA(cudaFree(a));
  BENCH_CUDA(cudaFree(b));
  return 2.0 * bytes / s * 1e-9;
}

// Seals a block of a 32-layer, 8-kv-head model: fp16 block in, quantized block out.
void BenchEncodeDecode(cudaStream_t stream, const char* preset_name, int layers, int heads, int d,
                       int reps) {
  const Preset preset = MustParse(preset_name);
  const BlockLayout layout = MakeBlockLayout(preset, layers, heads, d);
  const int nb = 8;  // rotate over 8 blocks so that L2 does not hold the working set
  uint16_t* fp16 = Alloc<uint16_t>(nb * layout.fp16_block_bytes());
  uint8_t* quant = Alloc<uint8_t>(nb * layout.quant_block_bytes());
  int32_t* status = Alloc<int32_t>(layout.slots() * sizeof(int32_t));
  FillRandomHalves(fp16, layout.fp16_block_bytes() / 2, 1);
  for (int i = 1; i < nb; ++i) {
    BENCH_CUDA(cudaMemcpy(fp16 + i * layout.fp16_block_bytes() / 2, fp16, layout.fp16_block_bytes(),
                          cudaMemcpyDeviceToDevice));
  }
  const auto fp16_block = [&](int i) { return fp16 + (i % nb) * layout.fp16_block_bytes() / 2; };
  const auto quant_block = [&](int i) { return quant + (i % nb) * layout.quant_block_bytes(); };
  const double enc = Time(stream, 2, reps, [&](int i) {
    BENCH_OK(EncodeBlock(preset, layout, Fp16BlockSource(layout, fp16_block(i)), quant_block(i),
                         status, stream));
  });
  std::vector<int32_t> st(layout.slots());
  BENCH_CUDA(cudaMemcpy(st.data(), status, st.size() * 4, cudaMemcpyDeviceToHost));
  for (int32_t x : st) {
    if (x != 0) std::printf("WARNING: encode status %d\n", x);
  }
  const double enc_bytes =
      static_cast<double>(layout.fp16_block_bytes() + layout.quant_block_bytes());
  Report(Fmt("encode %s D=%d (%dx%d slots)", preset_name, d, layers, heads), enc_bytes, enc, 0.40,
         Fmt("%.1f us per block, %.2f M tiles/s", enc * 1e6, layout.slots() / enc * 1e-6));

  TileSink sink;  // [G][D] keys then values per slot, into a block-sized buffer
  sink.slot_stride = 2 * layout.tile_elems();
  sink.dtype = DType::kF16;
  sink.frame = Frame::kStorage;
  const double dec = Time(stream, 2, reps, [&](int i) {
    uint16_t* out = fp16_block(i + 1);
    sink.keys = out;
    sink.values = out + layout.tile_elems();
    BENCH_OK(DecodeBlock(preset, layout, quant_block(i), sink, status, stream));
  });
  Report(Fmt("decode %s D=%d to fp16", preset_name, d), enc_bytes, dec, 0.0,
         Fmt("%.1f us per block", dec * 1e6));
  BENCH_CUDA(cudaFree(fp16));
  BENCH_CUDA(cudaFree(quant));
  BENCH_CUDA(cudaFree(status));
}

// Fused decode attention of one layer for a batch of sequences, each with a sink, `tiles`
// quantized tiles and a 64-token tail.
void BenchAttention(cudaStream_t stream, const DeviceLimits& limits, const char* preset_name, int d,
                    int kv_heads, int group, int seqs, int tiles, int splits, int reps) {
  const Preset preset = MustParse(preset_name);
  const BlockLayout layout = MakeBlockLayout(preset, 1, kv_heads, d);
  const int g = layout.tile_tokens, hq = kv_heads * group, tail = 64;
  const int64_t nq = static_cast<int64_t>(seqs) * tiles;
  uint8_t* qpool = Alloc<uint8_t>(nq * layout.quant_block_bytes());
  uint16_t* fpool = Alloc<uint16_t>(2 * seqs * layout.fp16_block_bytes());
  FillRandomHalves(fpool, layout.fp16_block_bytes() / 2, 2);
  for (int i = 1; i < 2 * seqs; ++i) {
    BENCH_CUDA(cudaMemcpy(fpool + i * layout.fp16_block_bytes() / 2, fpool,
                          layout.fp16_block_bytes(), cudaMemcpyDeviceToDevice));
  }
  BENCH_OK(EncodeBlock(preset, layout, Fp16BlockSource(layout, fpool), qpool, nullptr, stream));
  BENCH_CUDA(cudaStreamSynchronize(stream));
  for (int64_t i = 1; i < nq; ++i) {
    BENCH_CUDA(cudaMemcpy(qpool + i * layout.quant_block_bytes(), qpool, layout.quant_block_bytes(),
                          cudaMemcpyDeviceToDevice));
  }
  std::vector<AttendSequence> hs(seqs);
  std::vector<int32_t> ids(nq);
  for (int s = 0; s < seqs; ++s) {
    hs[s] = AttendSequence{2 * s, g, 2 * s + 1, tail, s * tiles, tiles};
    for (int t = 0; t < tiles; ++t) ids[s * tiles + t] = s * tiles + t;
  }
  AttendSequence* dseqs = Alloc<AttendSequence>(seqs * sizeof(AttendSequence));
  int32_t* dids = Alloc<int32_t>(nq * sizeof(int32_t));
  BENCH_CUDA(cudaMemcpy(dseqs, hs.data(), seqs * sizeof(AttendSequence), cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemcpy(dids, ids.data(), nq * sizeof(int32_t), cudaMemcpyHostToDevice));
  const size_t qbytes = static_cast<size_t>(seqs) * hq * d * sizeof(float);
  float* q = Alloc<float>(qbytes);
  float* out = Alloc<float>(qbytes);
  BENCH_CUDA(cudaMemset(q, 0, qbytes));
  if (splits <= 0) splits = SuggestAttendSplits(limits, layout, seqs, hq, tiles);
  const size_t ws_bytes = AttendWorkspaceBytes(layout, seqs, hq, splits);
  void* ws = ws_bytes > 0 ? Alloc<void>(ws_bytes) : nullptr;
  AttendArgs a;
  a.quant_pool = qpool;
  a.num_quant_blocks = nq;
  a.fp16_pool = fpool;
  a.num_fp16_blocks = 2 * seqs;
  a.seqs = dseqs;
  a.num_seqs = seqs;
  a.tile_ids = dids;
  a.num_q_heads = hq;
  a.queries = q;
  a.out = out;
  a.num_splits = splits;
  a.workspace = ws;
  a.workspace_bytes = ws_bytes;
  const double s =
      Time(stream, 2, reps, [&](int) { BENCH_OK(AttendDecode(preset, layout, a, stream)); });
  const double bytes = static_cast<double>(nq) * kv_heads * layout.record_bytes +
                       static_cast<double>(seqs) * kv_heads * (g + tail) * d * 2 * 2 + 2.0 * qbytes;
  Report(Fmt("attention %s D=%d Hq=%d Hkv=%d %dx%d tiles s%d", preset_name, d, hq, kv_heads, seqs,
             tiles, splits),
         bytes, s, 0.60,
         Fmt("%.1f us per call, %d tokens per sequence", s * 1e6, g + tiles * g + tail));
  for (void* p : {static_cast<void*>(qpool), static_cast<void*>(fpool), static_cast<void*>(dseqs),
                  static_cast<void*>(dids), static_cast<void*>(q), static_cast<void*>(out), ws}) {
    if (p != nullptr) BENCH_CUDA(cudaFree(p));
  }
}

int Main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  std::string why;
  if (!DeviceAvailable(&why)) {
    std::printf("SKIPPED: no CUDA device (%s)\n", why.c_str());
    return 0;
  }
  cudaDeviceProp prop;
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  DeviceLimits limits;
  BENCH_OK(QueryDevice(&limits));
  std::printf("device: %s, sm_%d%d, %d SMs, %.0f GiB\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0);
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreate(&stream));
  const int reps = quick ? 5 : 20;
  g_copy_gbps = CopyBandwidth(stream, reps);
  std::printf("reference: cudaMemcpyAsync device-to-device, 1 GiB: %.1f GB/s (read + write)\n",
              g_copy_gbps);

  BenchEncodeDecode(stream, "kvarn_k4v2_g128", 32, 8, 128, reps);
  BenchEncodeDecode(stream, "kvarn_k2v2_g128", 32, 8, 128, reps);
  if (!quick) BenchEncodeDecode(stream, "kvarn_k4v2_g128", 16, 8, 256, reps);
  // Decode batch: 64 sequences of 4K tokens, GQA 4 (Llama-3-8B-like), no split needed.
  BenchAttention(stream, limits, "kvarn_k4v2_g128", 128, 8, 4, 64, 32, 1, reps);
  // Long context, few sequences: without and with split-K.
  BenchAttention(stream, limits, "kvarn_k4v2_g128", 128, 8, 4, 4, 512, 1, reps);
  BenchAttention(stream, limits, "kvarn_k4v2_g128", 128, 8, 4, 4, 512, 0, reps);
  // MHA and a large group.
  if (!quick) {
    BenchAttention(stream, limits, "kvarn_k4v2_g128", 128, 32, 1, 16, 32, 0, reps);
    BenchAttention(stream, limits, "kvarn_k4v2_g128", 128, 2, 16, 64, 32, 0, reps);
  }

  int met = 0, targets = 0;
  for (const Result& r : g_results) {
    if (r.target > 0) ++targets, met += r.gbps / g_copy_gbps >= r.target;
  }
  std::printf("SUMMARY: %d of %d throughput targets met (copy reference %.1f GB/s)\n", met, targets,
              g_copy_gbps);
  BENCH_CUDA(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace
}  // namespace kvarn::cuda::bench

int main(int argc, char** argv) { return kvarn::cuda::bench::Main(argc, argv); }
