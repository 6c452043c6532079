// DeviceRunner: the CUDA kernels through the public host API, with host <-> device copies.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "kernels/cuda/cuda_codec.h"
#include "tests/gpu/runner.h"

namespace kvarn::cuda::testing {
namespace {

// A device allocation for the duration of one call.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes_ > 0 && cudaMalloc(&ptr_, bytes_) != cudaSuccess) {
      std::fprintf(stderr, "cudaMalloc(%zu) failed\n", bytes_);
      std::abort();
    }
  }
  DeviceBuffer(const void* host, size_t bytes) : DeviceBuffer(bytes) {
    if (bytes_ > 0) Check(cudaMemcpy(ptr_, host, bytes_, cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  template <class T>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  void CopyTo(void* host) const {
    if (bytes_ > 0) Check(cudaMemcpy(host, ptr_, bytes_, cudaMemcpyDeviceToHost));
  }
  static void Check(cudaError_t err) {
    if (err != cudaSuccess) {
      std::fprintf(stderr, "CUDA error: %s\n", cudaGetErrorString(err));
      std::abort();
    }
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

size_t ElemBytes(DType t) { return t == DType::kF32 ? 4 : 2; }

// Waits for the stream; a failure in a kernel surfaces here.
CodecStatus Finish(cudaStream_t stream) {
  const cudaError_t err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess) {
    return CodecStatus(CodecCode::kInternal,
                       std::string("kernel failed: ") + cudaGetErrorString(err));
  }
  return {};
}

class DeviceRunner final : public KernelRunner {
 public:
  DeviceRunner() { DeviceBuffer::Check(cudaStreamCreate(&stream_)); }
  ~DeviceRunner() override { cudaStreamDestroy(stream_); }
  const char* name() const override { return "device"; }

  CodecStatus Encode(const Preset& preset, const BlockLayout& layout, const TileSource& in,
                     int iterations, std::vector<uint8_t>* block,
                     std::vector<int32_t>* status) override {
    const size_t bytes = in.Extent(layout) * ElemBytes(in.dtype);
    DeviceBuffer k(in.keys, bytes), v(in.values, bytes);
    DeviceBuffer out(layout.quant_block_bytes()), st(layout.slots() * sizeof(int32_t));
    TileSource d = in;
    d.keys = k.get<void>();
    d.values = v.get<void>();
    EncodeOptions opt;
    opt.iterations = iterations;
    KVARN_RETURN_IF_ERROR(
        EncodeBlock(preset, layout, d, out.get<uint8_t>(), st.get<int32_t>(), stream_, opt));
    KVARN_RETURN_IF_ERROR(Finish(stream_));
    block->resize(layout.quant_block_bytes());
    status->resize(layout.slots());
    out.CopyTo(block->data());
    st.CopyTo(status->data());
    return {};
  }

  CodecStatus Decode(const Preset& preset, const BlockLayout& layout,
                     const std::vector<uint8_t>& block, DType dtype, Frame frame,
                     std::vector<uint8_t>* keys, std::vector<uint8_t>* values,
                     std::vector<int32_t>* status) override {
    const size_t bytes = layout.slots() * layout.tile_elems() * ElemBytes(dtype);
    DeviceBuffer in(block.data(), block.size()), k(bytes), v(bytes),
        st(layout.slots() * sizeof(int32_t));
    TileSink out;
    out.keys = k.get<void>();
    out.values = v.get<void>();
    out.slot_stride = layout.tile_elems();
    out.dtype = dtype;
    out.frame = frame;
    KVARN_RETURN_IF_ERROR(
        DecodeBlock(preset, layout, in.get<uint8_t>(), out, st.get<int32_t>(), stream_));
    KVARN_RETURN_IF_ERROR(Finish(stream_));
    keys->resize(bytes);
    values->resize(bytes);
    status->resize(layout.slots());
    k.CopyTo(keys->data());
    v.CopyTo(values->data());
    st.CopyTo(status->data());
    return {};
  }

  CodecStatus Store(const Preset& preset, const BlockLayout& layout, const TokenSource& in,
                    int num_tokens, int layer, int token_offset, std::vector<uint16_t>* fp16_block,
                    std::vector<int32_t>* status) override {
    const int layers = layer == kAllLayers ? layout.num_layers : 1;
    const size_t bytes = static_cast<size_t>(num_tokens) * layers * layout.num_kv_heads *
                         layout.head_dim * ElemBytes(in.dtype);
    DeviceBuffer k(in.keys, bytes), v(in.values, bytes);
    DeviceBuffer blk(fp16_block->data(), fp16_block->size() * sizeof(uint16_t));
    DeviceBuffer st(static_cast<size_t>(num_tokens) * sizeof(int32_t));
    TokenSource d = in;
    d.keys = k.get<void>();
    d.values = v.get<void>();
    KVARN_RETURN_IF_ERROR(StoreTokens(preset, layout, d, num_tokens, layer, token_offset,
                                      blk.get<uint16_t>(), st.get<int32_t>(), stream_));
    KVARN_RETURN_IF_ERROR(Finish(stream_));
    status->resize(static_cast<size_t>(num_tokens));
    blk.CopyTo(fp16_block->data());
    st.CopyTo(status->data());
    return {};
  }

  CodecStatus Attend(const Preset& preset, const BlockLayout& layout, const HostAttend& in,
                     std::vector<float>* out, std::vector<int32_t>* status,
                     std::vector<float>* lse) override {
    const size_t seqs = in.seqs.size();
    const size_t out_elems = seqs * static_cast<size_t>(in.num_q_heads) * layout.head_dim;
    DeviceBuffer qp(in.quant_pool.data(), in.quant_pool.size());
    DeviceBuffer fp(in.fp16_pool.data(), in.fp16_pool.size() * sizeof(uint16_t));
    DeviceBuffer sq(in.seqs.data(), seqs * sizeof(AttendSequence));
    DeviceBuffer ids(in.tile_ids.data(), in.tile_ids.size() * sizeof(int32_t));
    DeviceBuffer q(in.queries.data(), in.queries.size() * sizeof(float));
    DeviceBuffer o(out_elems * sizeof(float)), st(seqs * sizeof(int32_t));
    const size_t lse_elems = seqs * static_cast<size_t>(in.num_q_heads);
    DeviceBuffer ls(lse != nullptr ? lse_elems * sizeof(float) : 0);
    AttendArgs a;
    a.quant_pool = qp.get<uint8_t>();
    a.num_quant_blocks = in.num_quant_blocks;
    a.fp16_pool = fp.get<uint16_t>();
    a.num_fp16_blocks = in.num_fp16_blocks;
    a.seqs = sq.get<AttendSequence>();
    a.num_seqs = static_cast<int>(seqs);
    a.tile_ids = ids.get<int32_t>();
    a.layer = in.layer;
    a.num_q_heads = in.num_q_heads;
    a.queries = q.get<float>();
    a.out = o.get<float>();
    a.lse = lse != nullptr ? ls.get<float>() : nullptr;
    a.softmax_scale = in.softmax_scale;
    a.num_splits = in.num_splits;
    const size_t ws_bytes = AttendWorkspaceBytes(layout, a.num_seqs, a.num_q_heads, a.num_splits);
    DeviceBuffer ws(ws_bytes);
    a.workspace = ws.get<void>();
    a.workspace_bytes = ws_bytes;
    a.status = st.get<int32_t>();
    KVARN_RETURN_IF_ERROR(AttendDecode(preset, layout, a, stream_));
    KVARN_RETURN_IF_ERROR(Finish(stream_));
    out->resize(out_elems);
    status->resize(seqs);
    o.CopyTo(out->data());
    st.CopyTo(status->data());
    if (lse != nullptr) {
      lse->resize(lse_elems);
      ls.CopyTo(lse->data());
    }
    return {};
  }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace

std::unique_ptr<KernelRunner> MakeDeviceRunner() { return std::make_unique<DeviceRunner>(); }

}  // namespace kvarn::cuda::testing
