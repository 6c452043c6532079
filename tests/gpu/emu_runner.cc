// EmuRunner: the kernel bodies of kernels/cuda, launched exactly as the host API launches
// them (kernels/cuda/params.h), on the CPU block emulator. Shared memory starts filled with
// NaN bit patterns so that a read of an unwritten location shows in the results.
#include <cstring>

#include "kernels/cuda/params.h"
#include "tests/gpu/runner.h"

namespace kvarn::cuda::testing {
namespace {

using emu::BlockEmulator;
using emu::EmuCtx;

size_t ElemBytes(DType t) { return t == DType::kF32 ? 4 : 2; }

class EmuRunner final : public KernelRunner {
 public:
  explicit EmuRunner(emu::Order order) : order_(order) {}
  const char* name() const override { return "emulator"; }

  CodecStatus Encode(const Preset& preset, const BlockLayout& layout, const TileSource& in,
                     int iterations, std::vector<uint8_t>* block,
                     std::vector<int32_t>* status) override {
    block->assign(layout.quant_block_bytes(), 0xA5);
    status->assign(layout.slots(), 0);
    EncodeLaunch l;
    KVARN_RETURN_IF_ERROR(BuildEncode(preset, layout, in, block->data(), status->data(), iterations,
                                      kHopperLimits, &l));
    std::vector<unsigned char> smem(l.params.plan.smem_bytes);
    std::vector<float> scratch(l.scratch_bytes / sizeof(float));
    BlockEmulator emu(kEncodeThreads, order_, 7);
    const int work = 2 * l.params.num_slots;
    for (int b = 0; b < l.grid; ++b) {
      Poison(&smem);
      float* tile =
          scratch.empty() ? nullptr : scratch.data() + static_cast<size_t>(b) * layout.tile_elems();
      emu.Run([&](const EmuCtx& ctx) {
        for (int w = b; w < work; w += l.grid) EncodeWork(ctx, l.params, w, smem.data(), tile);
      });
    }
    return {};
  }

  CodecStatus Decode(const Preset& preset, const BlockLayout& layout,
                     const std::vector<uint8_t>& block, DType dtype, Frame frame,
                     std::vector<uint8_t>* keys, std::vector<uint8_t>* values,
                     std::vector<int32_t>* status) override {
    const size_t bytes = layout.slots() * layout.tile_elems() * ElemBytes(dtype);
    keys->assign(bytes, 0xA5);
    values->assign(bytes, 0xA5);
    status->assign(layout.slots(), 0);
    TileSink out;
    out.keys = keys->data();
    out.values = values->data();
    out.slot_stride = layout.tile_elems();
    out.dtype = dtype;
    out.frame = frame;
    DecodeLaunch l;
    KVARN_RETURN_IF_ERROR(BuildDecode(preset, layout, block.data(), out, status->data(), &l));
    std::vector<unsigned char> smem(l.params.plan.smem_bytes);
    BlockEmulator emu(kDecodeThreads, order_, 7);
    for (int b = 0; b < l.grid; ++b) {
      Poison(&smem);
      emu.Run([&](const EmuCtx& ctx) { DecodeWork(ctx, l.params, b, smem.data()); });
    }
    return {};
  }

  CodecStatus Store(const Preset& preset, const BlockLayout& layout, const TokenSource& in,
                    int num_tokens, int layer, int token_offset, std::vector<uint16_t>* fp16_block,
                    std::vector<int32_t>* status) override {
    status->assign(static_cast<size_t>(num_tokens), 0);
    StoreLaunch l;
    KVARN_RETURN_IF_ERROR(BuildStore(preset, layout, in, num_tokens, layer, token_offset,
                                     fp16_block->data(), status->data(), &l));
    std::vector<unsigned char> smem(l.smem_bytes);
    BlockEmulator emu(kStoreThreads, order_, 7);
    for (int b = 0; b < l.grid; ++b) {
      Poison(&smem);
      emu.Run([&](const EmuCtx& ctx) { StoreWork(ctx, l.params, b, smem.data()); });
    }
    return {};
  }

  CodecStatus Attend(const Preset& preset, const BlockLayout& layout, const HostAttend& in,
                     std::vector<float>* out, std::vector<int32_t>* status,
                     std::vector<float>* lse) override {
    const size_t seqs = in.seqs.size();
    out->assign(seqs * static_cast<size_t>(in.num_q_heads) * layout.head_dim, -12345.0f);
    if (lse != nullptr) lse->assign(seqs * static_cast<size_t>(in.num_q_heads), -12345.0f);
    status->assign(seqs, 0);
    AttendArgs a;
    a.quant_pool = in.quant_pool.data();
    a.num_quant_blocks = in.num_quant_blocks;
    a.fp16_pool = in.fp16_pool.data();
    a.num_fp16_blocks = in.num_fp16_blocks;
    a.seqs = in.seqs.data();
    a.num_seqs = static_cast<int>(seqs);
    a.tile_ids = in.tile_ids.data();
    a.layer = in.layer;
    a.num_q_heads = in.num_q_heads;
    a.queries = in.queries.data();
    a.out = out->data();
    a.lse = lse != nullptr ? lse->data() : nullptr;
    a.softmax_scale = in.softmax_scale;
    a.num_splits = in.num_splits;
    std::vector<float> workspace(
        AttendWorkspaceBytes(layout, a.num_seqs, a.num_q_heads, a.num_splits) / 4, -777.0f);
    a.workspace = workspace.empty() ? nullptr : workspace.data();
    a.workspace_bytes = workspace.size() * sizeof(float);
    a.status = status->data();
    AttendLaunch l;
    KVARN_RETURN_IF_ERROR(BuildAttend(preset, layout, a, kHopperLimits, &l));
    std::vector<unsigned char> smem(l.params.plan.smem_bytes);
    BlockEmulator emu(kAttendThreads, order_, 7);
    for (int z = 0; z < l.grid_z; ++z) {
      for (int y = 0; y < l.grid_y; ++y) {
        for (int x = 0; x < l.grid_x; ++x) {
          Poison(&smem);
          emu.Run([&](const EmuCtx& ctx) { RunAttend(ctx, l, x, y, z, smem.data()); });
        }
      }
    }
    if (l.combine_rows > 0) {
      std::vector<unsigned char> csmem(CombineSmemBytes(layout.head_dim));
      BlockEmulator cemu(kCombineThreads, order_, 7);
      for (int r = 0; r < l.combine_rows; ++r) {
        Poison(&csmem);
        cemu.Run([&](const EmuCtx& ctx) { CombineRow(ctx, l.combine, r, csmem.data()); });
      }
    }
    return {};
  }

 private:
  static void Poison(std::vector<unsigned char>* smem) {
    std::memset(smem->data(), 0xFF, smem->size());
  }

  static void RunAttend(const EmuCtx& ctx, const AttendLaunch& l, int x, int y, int z,
                        unsigned char* smem) {
    switch (l.head_chunk) {
      case 1:
        return AttendBlock<1>(ctx, l.params, x, y, z, smem);
      case 2:
        return AttendBlock<2>(ctx, l.params, x, y, z, smem);
      case 4:
        return AttendBlock<4>(ctx, l.params, x, y, z, smem);
      case 8:
        return AttendBlock<8>(ctx, l.params, x, y, z, smem);
      default:
        return AttendBlock<16>(ctx, l.params, x, y, z, smem);
    }
  }

  emu::Order order_;
};

}  // namespace

std::unique_ptr<KernelRunner> MakeEmuRunner(emu::Order order) {
  return std::make_unique<EmuRunner>(order);
}

}  // namespace kvarn::cuda::testing
