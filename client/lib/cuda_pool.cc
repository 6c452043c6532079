#include "client/lib/cuda_pool.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "common/mutex.h"
#include "kernels/cuda/cuda_codec.h"
#include "common/cuda_status.h"
#include "kernels/cuda/device_scope.h"
#include "common/cuda_ipc.h"
#include "kernels/store_tokens.h"

namespace kvarn {
namespace {

#define KVARN_CLIENT_RETURN_IF_ERROR(expr)      \
  do {                                          \
    if (absl::Status s_ = (expr); !s_.ok()) return s_; \
  } while (0)

size_t Align(size_t n) { return (n + 255) / 256 * 256; }

// Device scratch for one call: taken from a free list, grown as needed, given back when the
// call (which synchronizes its stream) returns.
struct Scratch {
  uint8_t* data = nullptr;
  size_t bytes = 0;
  ~Scratch() { cudaFree(data); }
};

class CudaDevicePool final : public DevicePool {
 public:
  CudaDevicePool(const Preset& preset, const BlockLayout& layout, int device)
      : preset_(preset), layout_(layout), one_tile_{1, 1, layout.head_dim, layout.tile_tokens, layout.record_bytes},
        device_(device) {}
  ~CudaDevicePool() override {
    ScopedDevice scope(device_);
    MutexLock lock(&mu_);
    free_.clear();
  }

  absl::Status Map(const v1::PoolDescription& pool);

  uint8_t* quant() const override { return quant_ptr_; }
  uint8_t* sink() const override { return sink_ptr_; }
  uint8_t* tail() const override { return tail_ptr_; }
  int device() const override { return device_; }
  bool in_daemon_process() const override { return local_; }

  absl::Status Store(uint8_t* slot, int first, int n, const void* keys, const void* values, DType dtype,
                     bool device_input, CUstream_st* stream) override;
  absl::Status Attend(const SequenceTable& table, int layer, const float* queries, int num_q_heads,
                      float* out, float* lse, bool device_io, CUstream_st* stream) override;
  absl::Status Dequantize(uint32_t block, int layer, int head, float* keys, float* values) override;
  absl::Status WaitForEvent(CUevent_st* event) override {
    ScopedDevice scope(device_);
    return CudaStatus(cudaEventSynchronize(event), "waiting for the worker's event");
  }

 private:
  // A scratch buffer of at least `bytes`, returned to the free list on destruction.
  class Lease {
   public:
    Lease(CudaDevicePool* owner, std::unique_ptr<Scratch> s) : owner_(owner), s_(std::move(s)) {}
    Lease(Lease&& o) noexcept : owner_(o.owner_), s_(std::move(o.s_)) {}
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Lease& operator=(Lease&&) = delete;
    ~Lease() {
      if (s_ != nullptr) {
        MutexLock lock(&owner_->mu_);
        owner_->free_.push_back(std::move(s_));
      }
    }
    uint8_t* data() const { return s_->data; }

   private:
    CudaDevicePool* owner_;
    std::unique_ptr<Scratch> s_;
  };

  absl::StatusOr<Lease> TakeScratch(size_t bytes) ABSL_LOCKS_EXCLUDED(mu_) {
    std::unique_ptr<Scratch> s;
    {
      MutexLock lock(&mu_);
      if (!free_.empty()) {
        s = std::move(free_.back());
        free_.pop_back();
      }
    }
    if (s == nullptr) s = std::make_unique<Scratch>();
    if (s->bytes < bytes) {
      cudaFree(s->data);  // idle: its last call synchronized before giving it back
      s->data = nullptr;
      s->bytes = 0;
      void* p = nullptr;
      KVARN_CLIENT_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&p, bytes), "client scratch"));
      s->data = static_cast<uint8_t*>(p);
      s->bytes = bytes;
    }
    return Lease(this, std::move(s));
  }

  static cudaStream_t StreamOr(CUstream_st* stream) { return stream != nullptr ? stream : cudaStreamPerThread; }

  const Preset preset_;
  const BlockLayout layout_;
  const BlockLayout one_tile_;
  const int device_;
  bool local_ = false;
  cuda::SharedMapping quant_map_, sink_map_, tail_map_;
  uint8_t* quant_ptr_ = nullptr;
  uint8_t* sink_ptr_ = nullptr;
  uint8_t* tail_ptr_ = nullptr;
  int64_t quant_blocks_ = 0;
  Mutex mu_;
  std::vector<std::unique_ptr<Scratch>> free_ ABSL_GUARDED_BY(mu_);
};

absl::Status CheckSegment(const v1::Segment& s, uint64_t min_bytes, const char* what) {
  if (s.cuda_ipc_handle().size() != cuda::kIpcHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the ", what, " segment has a ", s.cuda_ipc_handle().size(),
                                                   "-byte CUDA IPC handle, not ", cuda::kIpcHandleBytes));
  }
  if (s.bytes() < min_bytes || s.bytes() == 0) {
    return absl::InvalidArgumentError(absl::StrCat("the ", what, " segment has ", s.bytes(), " bytes; its blocks need ",
                                                   min_bytes));
  }
  return absl::OkStatus();
}

absl::Status CudaDevicePool::Map(const v1::PoolDescription& pool) {
  local_ = pool.daemon_pid() == static_cast<int32_t>(getpid());
  struct Want {
    const v1::Segment* segment;
    uint64_t min_bytes;
    const char* what;
    cuda::SharedMapping* mapping;
    uint8_t** ptr;
  };
  std::vector<Want> wants;
  const v1::Segment& q = pool.quant_segments(0);
  wants.push_back({&q, uint64_t{q.blocks()} * pool.quant_block_bytes(), "quantized", &quant_map_, &quant_ptr_});
  if (pool.sink_segments_size() == 1) {
    const v1::Segment& s = pool.sink_segments(0);
    wants.push_back({&s, uint64_t{s.blocks()} * pool.fp16_block_bytes(), "sink", &sink_map_, &sink_ptr_});
  }
  if (pool.tail_slots() > 0) {
    wants.push_back({&pool.tail_segment(), uint64_t{pool.tail_slots()} * pool.fp16_block_bytes(), "tail", &tail_map_,
                     &tail_ptr_});
  }
  quant_blocks_ = q.blocks();
  for (const Want& w : wants) {
    KVARN_CLIENT_RETURN_IF_ERROR(CheckSegment(*w.segment, w.min_bytes, w.what));
    if (w.segment->cuda_device() != device_) {
      return absl::InvalidArgumentError("the pool's segments are on different devices");
    }
    if (local_) {
      *w.ptr = reinterpret_cast<uint8_t*>(w.segment->device_pointer());
      if (*w.ptr == nullptr) return absl::InvalidArgumentError(absl::StrCat("the ", w.what, " segment has no pointer"));
      continue;
    }
    Expected<cuda::IpcHandle> h = cuda::IpcHandle::FromBytes(w.segment->cuda_ipc_handle());
    if (!h.ok()) return FromCodec(h.status());
    Expected<cuda::SharedMapping> m = cuda::SharedMapping::Acquire(*h, device_, w.segment->bytes());
    if (!m.ok()) {
      return absl::Status(FromCodec(m.status()).code(),
                          absl::StrCat("mapping the ", w.what, " segment: ", m.status().message()));
    }
    *w.mapping = std::move(m).value();
    *w.ptr = w.mapping->data();
  }
  return absl::OkStatus();
}

absl::Status CudaDevicePool::Store(uint8_t* slot, int first, int n, const void* keys, const void* values, DType dtype,
                                   bool device_input, CUstream_st* stream_arg) {
  if (!device_input) {
    KVARN_CLIENT_RETURN_IF_ERROR(FromCodec(CheckStoreTokens(preset_, layout_, first, n, keys, values, dtype)));
  } else if (n < 1 || first < 0 || first + n > layout_.tile_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("tokens [", first, ", ", first + n, ") do not fit a ",
                                                   layout_.tile_tokens, "-token slot"));
  }
  ScopedDevice scope(device_);
  KVARN_CLIENT_RETURN_IF_ERROR(scope.status());
  const cudaStream_t stream = StreamOr(stream_arg);
  const size_t bytes = static_cast<size_t>(n) * layout_.slots() * layout_.head_dim * (dtype == DType::kF32 ? 4 : 2);
  const size_t input = device_input ? 0 : 2 * Align(bytes);
  absl::StatusOr<Lease> scratch = TakeScratch(input + Align(static_cast<size_t>(n) * sizeof(int32_t)));
  if (!scratch.ok()) return scratch.status();
  cuda::TokenSource in;
  in.dtype = dtype;
  in.keys = keys;
  in.values = values;
  absl::Status enqueued = absl::OkStatus();
  const auto step = [&](cudaError_t err, const char* what) {
    if (enqueued.ok()) enqueued = CudaStatus(err, what);
  };
  if (!device_input) {
    in.keys = scratch->data();
    in.values = scratch->data() + Align(bytes);
    step(cudaMemcpyAsync(scratch->data(), keys, bytes, cudaMemcpyHostToDevice, stream), "uploading keys");
    step(cudaMemcpyAsync(scratch->data() + Align(bytes), values, bytes, cudaMemcpyHostToDevice, stream),
         "uploading values");
  }
  auto* status = reinterpret_cast<int32_t*>(scratch->data() + input);
  CodecStatus cs;
  if (enqueued.ok()) {
    cs = cuda::StoreTokens(preset_, layout_, in, n, cuda::kAllLayers, first, reinterpret_cast<uint16_t*>(slot),
                           status, stream);
  }
  std::vector<int32_t> bits(static_cast<size_t>(n));
  if (enqueued.ok() && cs.ok()) {
    step(cudaMemcpyAsync(bits.data(), status, bits.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, stream),
         "reading store status");
  }
  // Always drain the stream, also after a failure: the scratch goes back to the free list,
  // and Stage promises the writes are complete.
  const absl::Status synced = CudaStatus(cudaStreamSynchronize(stream), "synchronizing the store");
  KVARN_CLIENT_RETURN_IF_ERROR(enqueued);
  KVARN_CLIENT_RETURN_IF_ERROR(FromCodec(cs));
  KVARN_CLIENT_RETURN_IF_ERROR(synced);
  for (int i = 0; i < n; ++i) {
    if (bits[i] != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token ", i, (bits[i] & cuda::kStoreOverflow) ? " overflows fp16 once rotated"
                                                        : " holds NaN, Inf or values beyond the fp16 range"));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaDevicePool::Attend(const SequenceTable& table, int layer, const float* queries,
                                    int num_q_heads, float* out, float* lse, bool device_io,
                                    CUstream_st* stream_arg) {
  const int g = layout_.tile_tokens;
  const size_t d = static_cast<size_t>(layout_.head_dim);
  const size_t q_elems = static_cast<size_t>(num_q_heads) * d;
  if (!table.has_sink && table.quant_blocks.empty() && table.tail_tokens == 0) {
    return absl::InvalidArgumentError("sequence has no tokens");
  }
  if (!device_io) {
    for (size_t i = 0; i < q_elems; ++i) {
      if (!std::isfinite(queries[i])) return absl::InvalidArgumentError("query holds NaN or Inf");
    }
  }
  if (table.has_sink && sink_ptr_ == nullptr) return absl::InternalError("a sink block in a pool without sinks");
  ScopedDevice scope(device_);
  KVARN_CLIENT_RETURN_IF_ERROR(scope.status());
  const cudaStream_t stream = StreamOr(stream_arg);
  cuda::DeviceLimits limits;
  KVARN_CLIENT_RETURN_IF_ERROR(FromCodec(cuda::QueryDevice(&limits)));
  const int tiles = static_cast<int>(table.quant_blocks.size());
  const int splits = cuda::SuggestAttendSplits(limits, layout_, 1, num_q_heads, tiles);
  const size_t workspace = cuda::AttendWorkspaceBytes(layout_, 1, num_q_heads, splits);

  // The kernel reads sink and tail from one fp16 pool; they live in different slabs, so the
  // layer's part of each is copied into a two-block scratch pool (block 0 sink, 1 tail): in
  // every token's row (token-major blocks), the layer's K/V rows of all kv-heads.
  const size_t fbb = layout_.fp16_block_bytes(), pitch = layout_.fp16_token_bytes();
  const size_t layer_off = layout_.Fp16KeysOffset(layer, 0);
  const size_t layer_bytes =
      static_cast<size_t>(layout_.num_kv_heads) * layout_.fp16_pair_elems() * sizeof(uint16_t);
  size_t off = 0;
  const size_t at_fp16 = off;
  off += Align(2 * fbb);
  const size_t at_seq = off;
  off += Align(sizeof(cuda::AttendSequence));
  const size_t at_ids = off;
  off += Align(std::max<size_t>(1, table.quant_blocks.size()) * sizeof(int32_t));
  const size_t at_status = off;
  off += Align(sizeof(int32_t));
  const size_t at_work = off;
  off += Align(std::max<size_t>(1, workspace));
  const size_t at_q = off;
  off += device_io ? 0 : 2 * Align(q_elems * sizeof(float));
  const size_t at_lse = off;
  off += device_io || lse == nullptr ? 0 : Align(static_cast<size_t>(num_q_heads) * sizeof(float));
  absl::StatusOr<Lease> scratch = TakeScratch(off);
  if (!scratch.ok()) return scratch.status();
  uint8_t* base = scratch->data();

  cuda::AttendSequence seq;
  seq.sink_block = table.has_sink ? 0 : -1;
  seq.sink_tokens = table.has_sink ? g : 0;
  seq.tail_block = 1;
  seq.tail_tokens = static_cast<int32_t>(table.tail_tokens);
  seq.first_tile = 0;
  seq.num_tiles = tiles;
  std::vector<int32_t> ids(table.quant_blocks.begin(), table.quant_blocks.end());
  cuda::AttendArgs a;
  a.quant_pool = quant_ptr_;
  a.num_quant_blocks = quant_blocks_;
  a.fp16_pool = reinterpret_cast<const uint16_t*>(base + at_fp16);
  a.num_fp16_blocks = 2;
  a.seqs = reinterpret_cast<const cuda::AttendSequence*>(base + at_seq);
  a.num_seqs = 1;
  a.tile_ids = reinterpret_cast<const int32_t*>(base + at_ids);  // required whenever the pool has blocks
  a.layer = layer;
  a.num_q_heads = num_q_heads;
  a.queries = device_io ? queries : reinterpret_cast<const float*>(base + at_q);
  a.out = device_io ? out : reinterpret_cast<float*>(base + at_q + Align(q_elems * sizeof(float)));
  a.lse = lse == nullptr ? nullptr : device_io ? lse : reinterpret_cast<float*>(base + at_lse);
  a.num_splits = splits;
  a.workspace = workspace > 0 ? base + at_work : nullptr;
  a.workspace_bytes = workspace;
  a.status = reinterpret_cast<int32_t*>(base + at_status);

  absl::Status enqueued = absl::OkStatus();
  const auto step = [&](cudaError_t err, const char* what) {
    if (enqueued.ok()) enqueued = CudaStatus(err, what);
  };
  if (table.has_sink) {
    step(cudaMemcpy2DAsync(base + at_fp16 + layer_off, pitch,
                           sink_ptr_ + static_cast<size_t>(table.sink_block) * fbb + layer_off,
                           pitch, layer_bytes, static_cast<size_t>(g), cudaMemcpyDeviceToDevice,
                           stream),
         "copying the sink tile");
  }
  if (table.tail_tokens > 0) {
    step(cudaMemcpy2DAsync(base + at_fp16 + fbb + layer_off, pitch,
                           tail_ptr_ + static_cast<size_t>(table.tail_slot) * fbb + layer_off,
                           pitch, layer_bytes, table.tail_tokens, cudaMemcpyDeviceToDevice, stream),
         "copying the tail tile");
  }
  step(cudaMemcpyAsync(base + at_seq, &seq, sizeof(seq), cudaMemcpyHostToDevice, stream), "uploading the sequence");
  if (tiles > 0) {
    step(cudaMemcpyAsync(base + at_ids, ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream),
         "uploading the block table");
  }
  if (!device_io) {
    step(cudaMemcpyAsync(base + at_q, queries, q_elems * sizeof(float), cudaMemcpyHostToDevice, stream),
         "uploading the queries");
  }
  CodecStatus cs;
  if (enqueued.ok()) cs = cuda::AttendDecode(preset_, layout_, a, stream);
  int32_t bits = 0;
  if (enqueued.ok() && cs.ok()) {
    step(cudaMemcpyAsync(&bits, a.status, sizeof(bits), cudaMemcpyDeviceToHost, stream), "reading attention status");
    if (!device_io) {
      step(cudaMemcpyAsync(out, a.out, q_elems * sizeof(float), cudaMemcpyDeviceToHost, stream), "reading the output");
      if (lse != nullptr) {
        step(cudaMemcpyAsync(lse, a.lse, static_cast<size_t>(num_q_heads) * sizeof(float),
                             cudaMemcpyDeviceToHost, stream),
             "reading the log-sum-exp");
      }
    }
  }
  const absl::Status synced = CudaStatus(cudaStreamSynchronize(stream), "synchronizing attention");
  KVARN_CLIENT_RETURN_IF_ERROR(enqueued);
  KVARN_CLIENT_RETURN_IF_ERROR(FromCodec(cs));
  KVARN_CLIENT_RETURN_IF_ERROR(synced);
  if (bits & cuda::kAttendBadBlockId) return absl::InternalError("block table names a block outside the pool");
  if (bits != 0) return absl::InvalidArgumentError("the sequence's token counts are out of range");
  return absl::OkStatus();
}

absl::Status CudaDevicePool::Dequantize(uint32_t block, int layer, int head, float* keys, float* values) {
  ScopedDevice scope(device_);
  KVARN_CLIENT_RETURN_IF_ERROR(scope.status());
  const cudaStream_t stream = cudaStreamPerThread;
  const size_t n = layout_.tile_elems();
  absl::StatusOr<Lease> scratch = TakeScratch(2 * n * sizeof(float) + Align(sizeof(int32_t)));
  if (!scratch.ok()) return scratch.status();
  cuda::TileSink sink;
  sink.keys = scratch->data();
  sink.values = scratch->data() + n * sizeof(float);
  sink.slot_stride = n;
  sink.dtype = DType::kF32;
  sink.frame = Frame::kOriginal;
  auto* status = reinterpret_cast<int32_t*>(scratch->data() + 2 * n * sizeof(float));
  const uint8_t* record = quant_ptr_ + static_cast<size_t>(block) * layout_.quant_block_bytes() +
                          layout_.RecordOffset(layer, head);
  const CodecStatus cs = cuda::DecodeBlock(preset_, one_tile_, record, sink, status, stream);
  int32_t bits = 0;
  absl::Status copied;
  if (cs.ok()) {
    copied = CudaStatus(cudaMemcpyAsync(keys, sink.keys, n * sizeof(float), cudaMemcpyDeviceToHost, stream), "reading keys");
    if (copied.ok()) {
      copied = CudaStatus(cudaMemcpyAsync(values, sink.values, n * sizeof(float), cudaMemcpyDeviceToHost, stream),
                    "reading values");
    }
    if (copied.ok()) {
      copied = CudaStatus(cudaMemcpyAsync(&bits, status, sizeof(bits), cudaMemcpyDeviceToHost, stream), "reading status");
    }
  }
  const absl::Status synced = CudaStatus(cudaStreamSynchronize(stream), "synchronizing the decode");
  KVARN_CLIENT_RETURN_IF_ERROR(FromCodec(cs));
  KVARN_CLIENT_RETURN_IF_ERROR(copied);
  KVARN_CLIENT_RETURN_IF_ERROR(synced);
  if (bits != 0) return absl::InternalError("corrupt record: non-finite scales");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<DevicePool>> OpenDevicePool(const v1::PoolDescription& pool, const Preset& preset,
                                                           const BlockLayout& layout) {
  if (pool.quant_segments_size() != 1) return absl::FailedPreconditionError("expected one quantized segment");
  std::string why;
  if (!cuda::DeviceAvailable(&why)) {
    return absl::FailedPreconditionError(absl::StrCat("the pool is in GPU memory but no CUDA device is usable: ", why));
  }
  const int device = pool.quant_segments(0).cuda_device();
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat("the pool is on CUDA device ", device, "; this process sees ",
                                                      count, " (CUDA_VISIBLE_DEVICES must number devices as the "
                                                      "daemon's does)"));
  }
  auto p = std::make_unique<CudaDevicePool>(preset, layout, device);
  KVARN_CLIENT_RETURN_IF_ERROR(p->Map(pool));
  return std::unique_ptr<DevicePool>(std::move(p));
}

}  // namespace kvarn
