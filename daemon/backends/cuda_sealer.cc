#include "daemon/backends/cuda_sealer.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/backends/nonfinite_scan.h"
#include "common/codec_status.h"
#include "kernels/cuda/cuda_codec.h"
#include "common/cuda_status.h"
#include "kernels/cuda/device_scope.h"
#include "kernels/fp16.h"
#include "kernels/store_tokens.h"

namespace kvarn {
namespace {

std::string EncodeProblem(int32_t bits) {
  if (bits & cuda::kStatusBadKeys) return "keys hold NaN, Inf or values beyond the fp16 range";
  if (bits & cuda::kStatusBadValues) return "values hold NaN, Inf or values beyond the fp16 range";
  if (bits & cuda::kStatusKeyScaleRange) return "a key scale does not fit in fp16";
  if (bits & cuda::kStatusValueScaleRange) return "a value scale does not fit in fp16";
  return absl::StrCat("encode error bits ", bits);
}

}  // namespace

// A stream with its scratch. The small buffers hold the scan result (8 bytes) and the
// kernels' status words; scratch grows to the largest request seen.
struct CudaSealer::Lane {
  cudaStream_t stream = nullptr;
  uint8_t* d_small = nullptr;
  uint8_t* h_small = nullptr;  // pinned
  size_t status_words = 0;
  uint8_t* d_scratch = nullptr;
  size_t d_scratch_bytes = 0;
  uint8_t* h_scratch = nullptr;  // pinned
  size_t h_scratch_bytes = 0;

  Lane() = default;
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;
  ~Lane() {
    if (stream != nullptr) cudaStreamSynchronize(stream);
    cudaFree(d_small);
    cudaFreeHost(h_small);
    cudaFree(d_scratch);
    cudaFreeHost(h_scratch);
    if (stream != nullptr) cudaStreamDestroy(stream);
    cudaGetLastError();
  }

  unsigned long long* d_first_bad() const { return reinterpret_cast<unsigned long long*>(d_small); }
  int32_t* d_status() const { return reinterpret_cast<int32_t*>(d_small + 8); }
  unsigned long long h_first_bad() const {
    unsigned long long v;
    std::memcpy(&v, h_small, sizeof(v));
    return v;
  }
  const int32_t* h_status() const { return reinterpret_cast<const int32_t*>(h_small + 8); }

  absl::Status Sync() const { return CudaStatus(cudaStreamSynchronize(stream), "seal stream"); }

  // Copies the first n status words to the host and waits for the stream.
  absl::Status FetchStatus(size_t n) const {
    if (absl::Status s = CudaStatus(cudaMemcpyAsync(h_small + 8, d_small + 8, n * sizeof(int32_t),
                                              cudaMemcpyDeviceToHost, stream),
                              "reading kernel status");
        !s.ok()) {
      return s;
    }
    return Sync();
  }

  absl::Status DeviceScratch(size_t bytes) {
    if (bytes <= d_scratch_bytes) return absl::OkStatus();
    if (absl::Status s = Sync(); !s.ok()) return s;  // the old buffer may be in use
    cudaFree(d_scratch);
    d_scratch = nullptr;
    d_scratch_bytes = 0;
    void* p = nullptr;
    if (absl::Status s = CudaStatus(cudaMalloc(&p, bytes), "seal scratch"); !s.ok()) return s;
    d_scratch = static_cast<uint8_t*>(p);
    d_scratch_bytes = bytes;
    return absl::OkStatus();
  }

  absl::Status HostScratch(size_t bytes) {
    if (bytes <= h_scratch_bytes) return absl::OkStatus();
    if (absl::Status s = Sync(); !s.ok()) return s;
    cudaFreeHost(h_scratch);
    h_scratch = nullptr;
    h_scratch_bytes = 0;
    void* p = nullptr;
    if (absl::Status s = CudaStatus(cudaMallocHost(&p, bytes), "pinned seal scratch"); !s.ok()) return s;
    h_scratch = static_cast<uint8_t*>(p);
    h_scratch_bytes = bytes;
    return absl::OkStatus();
  }
};

// A lane taken from the sealer; given back (after its stream drained, so no work of a failed
// call can still write a block the core has meanwhile handed to someone else) on destruction.
class CudaSealer::LaneLease {
 public:
  LaneLease(CudaSealer* owner, std::unique_ptr<Lane> lane) : owner_(owner), lane_(std::move(lane)) {}
  LaneLease(LaneLease&& o) noexcept : owner_(o.owner_), lane_(std::move(o.lane_)) {}
  LaneLease& operator=(LaneLease&&) = delete;
  LaneLease(const LaneLease&) = delete;
  LaneLease& operator=(const LaneLease&) = delete;
  ~LaneLease() {
    if (lane_ == nullptr) return;
    cudaStreamSynchronize(lane_->stream);
    cudaGetLastError();
    owner_->Return(std::move(lane_));
  }
  Lane& operator*() const { return *lane_; }
  Lane* operator->() const { return lane_.get(); }

 private:
  CudaSealer* owner_;
  std::unique_ptr<Lane> lane_;
};

CudaSealer::CudaSealer(const Preset& preset, const BlockLayout& layout, int device, int max_lanes)
    : preset_(preset),
      layout_(layout),
      one_tile_{1, 1, layout.head_dim, layout.tile_tokens, layout.record_bytes},
      device_(device),
      max_lanes_(max_lanes < 1 ? 1 : max_lanes) {}

CudaSealer::~CudaSealer() {
  ScopedDevice scope(device_);
  MutexLock lock(&mu_);
  free_lanes_.clear();
}

int CudaSealer::lanes_created() const {
  MutexLock lock(&mu_);
  return lanes_created_;
}

absl::StatusOr<std::unique_ptr<CudaSealer::Lane>> CudaSealer::NewLane() const {
  auto lane = std::make_unique<Lane>();
  if (absl::Status s = CudaStatus(cudaStreamCreateWithFlags(&lane->stream, cudaStreamNonBlocking), "seal stream");
      !s.ok()) {
    lane->stream = nullptr;
    return s;
  }
  lane->status_words = std::max(layout_.slots(), static_cast<size_t>(layout_.tile_tokens));
  const size_t small = 8 + lane->status_words * sizeof(int32_t);
  void* d = nullptr;
  void* h = nullptr;
  if (absl::Status s = CudaStatus(cudaMalloc(&d, small), "seal status words"); !s.ok()) return s;
  lane->d_small = static_cast<uint8_t*>(d);
  if (absl::Status s = CudaStatus(cudaMallocHost(&h, small), "pinned seal status words"); !s.ok()) return s;
  lane->h_small = static_cast<uint8_t*>(h);
  return lane;
}

absl::StatusOr<CudaSealer::LaneLease> CudaSealer::Acquire() {
  {
    MutexLock lock(&mu_);
    while (free_lanes_.empty() && lanes_created_ >= max_lanes_) lane_free_.Wait(&mu_);
    if (!free_lanes_.empty()) {
      std::unique_ptr<Lane> lane = std::move(free_lanes_.back());
      free_lanes_.pop_back();
      return LaneLease(this, std::move(lane));
    }
    ++lanes_created_;  // reserved; created outside the lock
  }
  absl::StatusOr<std::unique_ptr<Lane>> lane = NewLane();
  if (!lane.ok()) {
    MutexLock lock(&mu_);
    --lanes_created_;
    lane_free_.Signal();
    return lane.status();
  }
  return LaneLease(this, std::move(*lane));
}

void CudaSealer::Return(std::unique_ptr<Lane> lane) {
  MutexLock lock(&mu_);
  free_lanes_.push_back(std::move(lane));
  lane_free_.Signal();
}

absl::Status CudaSealer::Scan(Lane& lane, const uint8_t* slot, int first, int count) {
  if (absl::Status s = CudaStatus(cudaMemsetAsync(lane.d_first_bad(), 0xFF, 8, lane.stream), "scan init"); !s.ok()) return s;
  if (absl::Status s = CudaStatus(LaunchNonFiniteScan(slot, layout_, first, count, lane.d_first_bad(), lane.stream),
                            "NaN/Inf scan kernel");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CudaStatus(cudaMemcpyAsync(lane.h_small, lane.d_small, 8, cudaMemcpyDeviceToHost, lane.stream),
                            "reading the scan");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = lane.Sync(); !s.ok()) return s;
  const unsigned long long bad = lane.h_first_bad();
  return bad == ~0ull ? absl::OkStatus() : NonFiniteTokenError(layout_, first, bad);
}

absl::Status CudaSealer::CheckTokens(const uint8_t* slot, int first, int count) {
  if (count <= 0) return absl::OkStatus();
  if (first < 0 || first + count > layout_.tile_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("tokens [", first, ", ", first + count, ") leave the tile"));
  }
  ScopedDevice scope(device_);
  if (!scope.status().ok()) return scope.status();
  absl::StatusOr<LaneLease> lane = Acquire();
  if (!lane.ok()) return lane.status();
  return Scan(**lane, slot, first, count);
}

absl::Status CudaSealer::SealQuantized(const uint8_t* slot, uint8_t* block) {
  ScopedDevice scope(device_);
  if (!scope.status().ok()) return scope.status();
  absl::StatusOr<LaneLease> lease = Acquire();
  if (!lease.ok()) return lease.status();
  Lane& lane = **lease;
  const CodecStatus cs =
      cuda::EncodeBlock(preset_, layout_, cuda::Fp16BlockSource(layout_, reinterpret_cast<const uint16_t*>(slot)),
                        block, lane.d_status(), lane.stream);
  if (!cs.ok()) return FromCodec(cs);
  if (absl::Status s = lane.FetchStatus(layout_.slots()); !s.ok()) return s;
  for (size_t i = 0; i < layout_.slots(); ++i) {
    if (const int32_t bits = lane.h_status()[i]; bits != 0) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", i / layout_.num_kv_heads, ", kv-head ",
                                                     i % layout_.num_kv_heads, ": ", EncodeProblem(bits)));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaSealer::SealSink(const uint8_t* slot, uint8_t* block) {
  ScopedDevice scope(device_);
  if (!scope.status().ok()) return scope.status();
  absl::StatusOr<LaneLease> lease = Acquire();
  if (!lease.ok()) return lease.status();
  Lane& lane = **lease;
  if (absl::Status s = CudaStatus(cudaMemcpyAsync(block, slot, layout_.fp16_block_bytes(), cudaMemcpyDeviceToDevice,
                                            lane.stream),
                            "copying a sink block");
      !s.ok()) {
    return s;
  }
  // Validate the copy, not the slot: the client may rewrite its tail meanwhile.
  return Scan(lane, block, 0, layout_.tile_tokens);
}

absl::Status CudaSealer::CopyTail(const uint8_t* src, uint8_t* dst, int tokens) {
  if (tokens <= 0) return absl::OkStatus();
  if (tokens > layout_.tile_tokens) return absl::InvalidArgumentError("more tokens than a tile holds");
  ScopedDevice scope(device_);
  if (!scope.status().ok()) return scope.status();
  absl::StatusOr<LaneLease> lease = Acquire();
  if (!lease.ok()) return lease.status();
  Lane& lane = **lease;
  // The tokens' rows are the slot's first bytes (token-major): one copy.
  if (absl::Status s = CudaStatus(
          cudaMemcpyAsync(dst, src, static_cast<size_t>(tokens) * layout_.fp16_token_bytes(),
                          cudaMemcpyDeviceToDevice, lane.stream),
          "copying a tail");
      !s.ok()) {
    return s;
  }
  return lane.Sync();
}

absl::Status CudaSealer::ExportBlock(const uint8_t* block, bool fp16, uint8_t* out) {
  return CopyBlock(out, block, fp16, /*import=*/false);
}

absl::Status CudaSealer::ImportBlock(const uint8_t* in, bool fp16, uint8_t* block) {
  return CopyBlock(block, in, fp16, /*import=*/true);
}

absl::Status CudaSealer::CopyBlock(uint8_t* dst, const uint8_t* src, bool fp16, bool import) {
  ScopedDevice scope(device_);
  if (!scope.status().ok()) return scope.status();
  absl::StatusOr<LaneLease> lease = Acquire();
  if (!lease.ok()) return lease.status();
  Lane& lane = **lease;
  const size_t bytes = fp16 ? layout_.fp16_block_bytes() : layout_.quant_block_bytes();
  const cudaMemcpyKind kind = import ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  if (absl::Status s = CudaStatus(cudaMemcpyAsync(dst, src, bytes, kind, lane.stream),
                                  import ? "importing a block" : "exporting a block");
      !s.ok()) {
    return s;
  }
  if (import && fp16) return Scan(lane, dst, 0, layout_.tile_tokens);
  return lane.Sync();
}

absl::Status CudaSealer::WriteTokens(uint8_t* slot, int first, int n, const void* keys, const void* values,
                                     DType dtype) {
  // The host checks the input exactly as the CPU codec does (same messages), so bad input
  // writes nothing at all.
  if (CodecStatus cs = CheckStoreTokens(preset_, layout_, first, n, keys, values, dtype); !cs.ok()) {
    return FromCodec(cs);
  }
  ScopedDevice scope(device_);
  if (!scope.status().ok()) return scope.status();
  absl::StatusOr<LaneLease> lease = Acquire();
  if (!lease.ok()) return lease.status();
  Lane& lane = **lease;
  const size_t bytes = static_cast<size_t>(n) * layout_.slots() * layout_.head_dim * (dtype == DType::kF32 ? 4 : 2);
  if (absl::Status s = lane.DeviceScratch(2 * bytes); !s.ok()) return s;
  uint8_t* d_keys = lane.d_scratch;
  uint8_t* d_values = lane.d_scratch + bytes;
  if (absl::Status s = CudaStatus(cudaMemcpyAsync(d_keys, keys, bytes, cudaMemcpyHostToDevice, lane.stream), "uploading keys");
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CudaStatus(cudaMemcpyAsync(d_values, values, bytes, cudaMemcpyHostToDevice, lane.stream), "uploading values");
      !s.ok()) {
    return s;
  }
  cuda::TokenSource in;
  in.keys = d_keys;
  in.values = d_values;
  in.dtype = dtype;
  const CodecStatus cs = cuda::StoreTokens(preset_, layout_, in, n, cuda::kAllLayers, first,
                                           reinterpret_cast<uint16_t*>(slot), lane.d_status(), lane.stream);
  if (!cs.ok()) return FromCodec(cs);
  if (absl::Status s = lane.FetchStatus(static_cast<size_t>(n)); !s.ok()) return s;
  for (int i = 0; i < n; ++i) {
    if (const int32_t bits = lane.h_status()[i]; bits != 0) {
      // The host check passed, so only a rounding difference at the fp16 limit gets here.
      return absl::InvalidArgumentError(absl::StrCat(
          "token ", i, (bits & cuda::kStoreOverflow) ? " overflows fp16 once rotated" : " holds NaN, Inf or values beyond the fp16 range"));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaSealer::FetchFp16Tile(Lane& lane, const uint8_t* block, int layer, int head,
                                       uint8_t* out) {
  const size_t row = static_cast<size_t>(layout_.head_dim) * sizeof(uint16_t);
  for (int which = 0; which < 2; ++which) {
    const size_t off =
        which == 0 ? layout_.Fp16KeysOffset(layer, head) : layout_.Fp16ValuesOffset(layer, head);
    if (absl::Status s =
            CudaStatus(cudaMemcpy2DAsync(out + which * layout_.tile_elems() * sizeof(uint16_t), row,
                                         block + off, layout_.fp16_token_bytes(), row,
                                         layout_.tile_tokens, cudaMemcpyDeviceToHost, lane.stream),
                       "reading an fp16 tile");
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status CudaSealer::DecodeRecord(Lane& lane, const uint8_t* block, int layer, int head, Frame frame) {
  const size_t n = layout_.tile_elems();
  if (absl::Status s = lane.DeviceScratch(2 * n * sizeof(float)); !s.ok()) return s;
  cuda::TileSink out;
  out.keys = lane.d_scratch;
  out.values = lane.d_scratch + n * sizeof(float);
  out.slot_stride = n;
  out.dtype = DType::kF32;
  out.frame = frame;
  const CodecStatus cs =
      cuda::DecodeBlock(preset_, one_tile_, block + layout_.RecordOffset(layer, head), out, lane.d_status(), lane.stream);
  if (!cs.ok()) return FromCodec(cs);
  if (absl::Status s = lane.FetchStatus(1); !s.ok()) return s;
  if (lane.h_status()[0] != 0) {
    return absl::InternalError(absl::StrCat("corrupt record (layer ", layer, ", kv-head ", head, "): non-finite scales"));
  }
  return absl::OkStatus();
}

absl::Status CudaSealer::DecodeTile(const uint8_t* block, bool fp16, int layer, int head, float* keys,
                                    float* values) {
  if (layer < 0 || layer >= layout_.num_layers || head < 0 || head >= layout_.num_kv_heads) {
    return absl::InvalidArgumentError("layer or kv-head out of range");
  }
  ScopedDevice scope(device_);
  if (!scope.status().ok()) return scope.status();
  absl::StatusOr<LaneLease> lease = Acquire();
  if (!lease.ok()) return lease.status();
  Lane& lane = **lease;
  const size_t n = layout_.tile_elems();
  if (!fp16) {
    if (absl::Status s = DecodeRecord(lane, block, layer, head, Frame::kOriginal); !s.ok()) return s;
    if (absl::Status s = lane.HostScratch(2 * n * sizeof(float)); !s.ok()) return s;
    if (absl::Status s = CudaStatus(cudaMemcpyAsync(lane.h_scratch, lane.d_scratch, 2 * n * sizeof(float),
                                              cudaMemcpyDeviceToHost, lane.stream),
                              "reading a decoded tile");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = lane.Sync(); !s.ok()) return s;
    std::memcpy(keys, lane.h_scratch, n * sizeof(float));
    std::memcpy(values, lane.h_scratch + n * sizeof(float), n * sizeof(float));
    return absl::OkStatus();
  }
  // An fp16 tile: fetch the bits and widen (and unrotate) on the host, as the CPU sealer does.
  if (absl::Status s = lane.HostScratch(2 * n * sizeof(uint16_t)); !s.ok()) return s;
  if (absl::Status s = FetchFp16Tile(lane, block, layer, head, lane.h_scratch); !s.ok()) return s;
  if (absl::Status s = lane.Sync(); !s.ok()) return s;
  const auto* k = reinterpret_cast<const uint16_t*>(lane.h_scratch);
  return FromCodec(Codec::Default().DecodeFp16Tile(preset_, layout_.head_dim,
                                                   Fp16Run{k, k + n, layout_.tile_tokens},
                                                   {keys, values, DType::kF32, Frame::kOriginal}));
}

double CudaSealer::SampleError(const uint8_t* slot, const uint8_t* block, int layer, int head) {
  if (layer < 0 || layer >= layout_.num_layers || head < 0 || head >= layout_.num_kv_heads) return -1.0;
  ScopedDevice scope(device_);
  if (!scope.status().ok()) return -1.0;
  absl::StatusOr<LaneLease> lease = Acquire();
  if (!lease.ok()) return -1.0;
  Lane& lane = **lease;
  const size_t n = layout_.tile_elems();
  if (!DecodeRecord(lane, block, layer, head, Frame::kStorage).ok()) return -1.0;
  const size_t f32 = 2 * n * sizeof(float);
  if (!lane.HostScratch(f32 + 2 * n * sizeof(uint16_t)).ok()) return -1.0;
  if (!CudaStatus(cudaMemcpyAsync(lane.h_scratch, lane.d_scratch, f32, cudaMemcpyDeviceToHost,
                                  lane.stream),
                  "")
           .ok() ||
      !FetchFp16Tile(lane, slot, layer, head, lane.h_scratch + f32).ok() || !lane.Sync().ok()) {
    return -1.0;
  }
  const auto* k = reinterpret_cast<const float*>(lane.h_scratch);
  const float* v = k + n;
  const auto* ks = reinterpret_cast<const uint16_t*>(lane.h_scratch + f32);
  const uint16_t* vs = ks + n;
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double sk = HalfToFloat(ks[i]), sv = HalfToFloat(vs[i]);
    const double ek = k[i] - sk, ev = v[i] - sv;
    num += ek * ek + ev * ev;
    den += sk * sk + sv * sv;
  }
  return den > 0 ? std::sqrt(num / den) : 0.0;
}

}  // namespace kvarn
