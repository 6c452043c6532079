// The CUDA backend and sealer on a real device, against the CPU sealer on the same bytes.
// Every test skips without a usable device ("SKIPPED: no CUDA device").
#include "daemon/backends/cuda_backend.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "daemon/backends/cuda_sealer.h"
#include "daemon/core/cpu_sealer.h"
#include "gtest/gtest.h"
#include "kernels/fp16.h"
#include "kernels/preset.h"

namespace kvarn {
namespace {

class FakeProbe final : public ProcessProbe {
 public:
  std::optional<uint64_t> Identity(int pid) const override {
    if (pid == static_cast<int>(getpid())) return 1;
    auto it = alive_.find(pid);
    if (it == alive_.end()) return std::nullopt;
    return it->second;
  }
  std::map<int, uint64_t> alive_;
};

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!CudaBackend::DeviceUsable(0, &why)) GTEST_SKIP() << "SKIPPED: no CUDA device (" << why << ")";
    auto b = CudaBackend::Create(0, &probe_);
    ASSERT_TRUE(b.ok()) << b.status();
    backend_ = std::move(*b);
    ASSERT_TRUE(ParsePreset("kvarn_k4v2_g128", &preset_).ok());
    layout_ = MakeBlockLayout(preset_, 2, 2, 128);
  }

  // A region, lent to process `owner` (its identity from the probe) when owner != 0.
  std::unique_ptr<Region> Make(RegionKind kind, size_t bytes, int owner = 0) {
    auto r = backend_->Create(kind, bytes);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return nullptr;
    if (owner != 0) (*r)->LendTo(owner, probe_.Identity(owner).value_or(0));
    return std::move(*r);
  }
  static void Upload(uint8_t* dev, const std::vector<uint8_t>& host) {
    ASSERT_EQ(cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  static std::vector<uint8_t> Download(const uint8_t* dev, size_t bytes) {
    std::vector<uint8_t> host(bytes);
    EXPECT_EQ(cudaMemcpy(host.data(), dev, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
  // A full fp16 slot of storage-frame values (what a worker's Stage writes).
  std::vector<uint8_t> RandomSlot(uint32_t seed) const {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.0f, 1.0f);
    std::vector<uint8_t> slot(layout_.fp16_block_bytes());
    auto* h = reinterpret_cast<uint16_t*>(slot.data());
    for (size_t i = 0; i < slot.size() / 2; ++i) h[i] = FloatToHalf(n(rng) * (1.0f + static_cast<float>(i % 7)));
    return slot;
  }

  FakeProbe probe_;
  std::unique_ptr<CudaBackend> backend_;
  Preset preset_;
  BlockLayout layout_;
};

TEST_F(CudaBackendTest, DescribeGivesTheHandleDeviceAndPointer) {
  auto r = Make(RegionKind::kQuant, 1 << 20);
  ASSERT_NE(r, nullptr);
  const SegmentInfo info = r->Describe();
  EXPECT_EQ(info.bytes, 1u << 20);
  EXPECT_EQ(info.cuda_ipc_handle.size(), 64u);
  EXPECT_EQ(info.cuda_device, 0);
  EXPECT_EQ(info.device_pointer, reinterpret_cast<uint64_t>(r->data()));
  EXPECT_FALSE(backend_->host_accessible());
  EXPECT_EQ(Download(r->data(), 64), std::vector<uint8_t>(64, 0)) << "slabs start zeroed";
}

TEST_F(CudaBackendTest, RetainsALentTailSlabWhileItsClientRuns) {
  constexpr int kClient = 424242;
  probe_.alive_[kClient] = 77;
  const size_t bytes = 3 << 20;
  {
    auto tail = Make(RegionKind::kTail, bytes, kClient);
    ASSERT_NE(tail, nullptr);
    Upload(tail->data(), std::vector<uint8_t>(4096, 0xAB));
  }
  EXPECT_EQ(backend_->RetainedBytes(), bytes) << "the client may still write it";
  backend_->Sweep();
  EXPECT_EQ(backend_->RetainedBytes(), bytes) << "still running";
  EXPECT_EQ(backend_->retained_slabs(), 1u);
  probe_.alive_.erase(kClient);
  backend_->Sweep();
  EXPECT_EQ(backend_->RetainedBytes(), 0u) << "freed once the client is gone";
  EXPECT_EQ(backend_->retained_slabs(), 0u);
  // Memory never lent, lent to the daemon's own process, or not a tail, is never kept.
  { auto own = Make(RegionKind::kTail, bytes, static_cast<int>(getpid())); }
  { auto none = Make(RegionKind::kTail, bytes, 0); }
  { auto quant = Make(RegionKind::kQuant, bytes, kClient); }
  EXPECT_EQ(backend_->RetainedBytes(), 0u);
}

TEST_F(CudaBackendTest, SealerMatchesTheCpuSealer) {
  CpuSealer cpu(preset_, layout_);
  auto factory = backend_->MakeSealerFactory(2);
  std::unique_ptr<Sealer> gpu = factory(preset_, layout_);
  const size_t fbb = layout_.fp16_block_bytes(), qbb = layout_.quant_block_bytes();
  auto tail = Make(RegionKind::kTail, 2 * fbb);
  auto quant = Make(RegionKind::kQuant, 2 * qbb);
  auto sink = Make(RegionKind::kSink, fbb);
  ASSERT_TRUE(tail && quant && sink);
  std::vector<uint8_t> slot = RandomSlot(1);
  Upload(tail->data(), slot);

  // Sealing: the GPU decodes the CPU's record exactly as the CPU does, and its own record
  // decodes to nearly the same tile.
  EXPECT_TRUE(gpu->CheckTokens(tail->data(), 0, layout_.tile_tokens).ok());
  std::vector<uint8_t> cpu_block(qbb);
  ASSERT_TRUE(cpu.SealQuantized(slot.data(), cpu_block.data()).ok());
  ASSERT_TRUE(gpu->SealQuantized(tail->data(), quant->data()).ok());
  Upload(quant->data() + qbb, cpu_block);
  const size_t n = layout_.tile_elems();
  std::vector<float> ck(n), cv(n), gk(n), gv(n), xk(n), xv(n);
  for (int l = 0; l < layout_.num_layers; ++l) {
    for (int h = 0; h < layout_.num_kv_heads; ++h) {
      ASSERT_TRUE(cpu.DecodeTile(cpu_block.data(), false, l, h, ck.data(), cv.data()).ok());
      ASSERT_TRUE(gpu->DecodeTile(quant->data() + qbb, false, l, h, xk.data(), xv.data()).ok());
      EXPECT_EQ(std::memcmp(ck.data(), xk.data(), n * 4), 0) << "layer " << l << " head " << h;
      EXPECT_EQ(std::memcmp(cv.data(), xv.data(), n * 4), 0) << "layer " << l << " head " << h;
      ASSERT_TRUE(gpu->DecodeTile(quant->data(), false, l, h, gk.data(), gv.data()).ok());
      double num = 0, den = 0;
      for (size_t i = 0; i < n; ++i) {
        num += (gk[i] - ck[i]) * (gk[i] - ck[i]) + (gv[i] - cv[i]) * (gv[i] - cv[i]);
        den += ck[i] * ck[i] + cv[i] * cv[i];
      }
      EXPECT_LT(std::sqrt(num / den), 1e-2) << "GPU and CPU records decode far apart";
      const double e_cpu = cpu.SampleError(slot.data(), cpu_block.data(), l, h);
      const double e_gpu = gpu->SampleError(tail->data(), quant->data() + qbb, l, h);
      EXPECT_NEAR(e_gpu, e_cpu, 1e-9);
      // fp16 tiles (sink or tail) decode to the same floats.
      ASSERT_TRUE(cpu.DecodeTile(slot.data(), true, l, h, ck.data(), cv.data()).ok());
      ASSERT_TRUE(gpu->DecodeTile(tail->data(), true, l, h, xk.data(), xv.data()).ok());
      EXPECT_EQ(std::memcmp(ck.data(), xk.data(), n * 4), 0);
    }
  }

  // Sink: an exact copy; copying a tail copies the first tokens of every (layer, head).
  ASSERT_TRUE(gpu->SealSink(tail->data(), sink->data()).ok());
  EXPECT_EQ(Download(sink->data(), fbb), slot);
  ASSERT_TRUE(gpu->CopyTail(tail->data(), tail->data() + fbb, 37).ok());
  std::vector<uint8_t> want(fbb, 0);
  ASSERT_TRUE(cpu.CopyTail(slot.data(), want.data(), 37).ok());
  EXPECT_EQ(Download(tail->data() + fbb, fbb), want);

  // NaN: the same message from both, for the slot and for the sink copy.
  std::vector<uint8_t> bad = slot;
  const size_t at = layout_.Fp16ValuesOffset(1, 0) + 70 * layout_.fp16_token_bytes() + 5 * 2;
  bad[at] = 0x00;
  bad[at + 1] = 0x7E;
  Upload(tail->data(), bad);
  const absl::Status c = cpu.CheckTokens(bad.data(), 60, 20), g = gpu->CheckTokens(tail->data(), 60, 20);
  EXPECT_EQ(g.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.message(), c.message());
  EXPECT_TRUE(gpu->CheckTokens(tail->data(), 0, 70).ok());
  EXPECT_EQ(gpu->SealSink(tail->data(), sink->data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu->SealQuantized(tail->data(), quant->data()).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaBackendTest, ExportAndImportMoveWholeBlocksAndImportScansSinks) {
  CpuSealer cpu(preset_, layout_);
  std::unique_ptr<Sealer> gpu = backend_->MakeSealerFactory(1)(preset_, layout_);
  const size_t fbb = layout_.fp16_block_bytes(), qbb = layout_.quant_block_bytes();
  auto quant = Make(RegionKind::kQuant, 2 * qbb);
  auto sink = Make(RegionKind::kSink, 2 * fbb);
  ASSERT_TRUE(quant && sink);
  const std::vector<uint8_t> slot = RandomSlot(3);
  std::vector<uint8_t> record(qbb);
  ASSERT_TRUE(cpu.SealQuantized(slot.data(), record.data()).ok());
  // A tier's record into the device pool and back out: the same bytes, what the CPU holds.
  ASSERT_TRUE(gpu->ImportBlock(record.data(), false, quant->data()).ok());
  EXPECT_EQ(Download(quant->data(), qbb), record);
  std::vector<uint8_t> out(qbb, 0);
  ASSERT_TRUE(gpu->ExportBlock(quant->data(), false, out.data()).ok());
  EXPECT_EQ(out, record);
  ASSERT_TRUE(gpu->ImportBlock(slot.data(), true, sink->data()).ok());
  std::vector<uint8_t> sink_out(fbb, 0);
  ASSERT_TRUE(gpu->ExportBlock(sink->data(), true, sink_out.data()).ok());
  EXPECT_EQ(sink_out, slot);
  // An fp16 block with NaN is refused on import, with the CPU's message.
  std::vector<uint8_t> bad = slot;
  const size_t at = layout_.Fp16KeysOffset(0, 1) + 3 * layout_.fp16_token_bytes() + 9 * 2;
  bad[at] = 0x00;
  bad[at + 1] = 0x7E;
  std::vector<uint8_t> cpu_sink(fbb);
  const absl::Status c = cpu.ImportBlock(bad.data(), true, cpu_sink.data());
  const absl::Status g = gpu->ImportBlock(bad.data(), true, sink->data() + fbb);
  EXPECT_EQ(g.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.message(), c.message());
}

TEST_F(CudaBackendTest, WriteTokensWritesTheCpuBytesAndNothingOnBadInput) {
  CpuSealer cpu(preset_, layout_);
  std::unique_ptr<Sealer> gpu = backend_->MakeSealerFactory(1)(preset_, layout_);
  const size_t fbb = layout_.fp16_block_bytes();
  auto tail = Make(RegionKind::kTail, fbb);
  ASSERT_NE(tail, nullptr);
  const int tokens = 9;
  std::vector<float> k(tokens * layout_.slots() * layout_.head_dim), v(k.size());
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = nd(rng);
    v[i] = nd(rng);
  }
  std::vector<uint8_t> want(fbb, 0);
  ASSERT_TRUE(cpu.WriteTokens(want.data(), 100, tokens, k.data(), v.data(), DType::kF32).ok());
  ASSERT_TRUE(gpu->WriteTokens(tail->data(), 100, tokens, k.data(), v.data(), DType::kF32).ok());
  EXPECT_EQ(Download(tail->data(), fbb), want);

  std::vector<float> bad = k;
  bad[3 * layout_.slots() * layout_.head_dim + 17] = INFINITY;
  std::vector<uint8_t> scratch(fbb, 0);
  const absl::Status c = cpu.WriteTokens(scratch.data(), 0, tokens, bad.data(), v.data(), DType::kF32);
  const absl::Status g = gpu->WriteTokens(tail->data(), 0, tokens, bad.data(), v.data(), DType::kF32);
  EXPECT_EQ(g.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.message(), c.message());
  EXPECT_EQ(Download(tail->data(), fbb), want) << "a rejected write changed the slot";
  EXPECT_EQ(gpu->WriteTokens(tail->data(), 125, tokens, k.data(), v.data(), DType::kF32).code(),
            absl::StatusCode::kInvalidArgument)
      << "past the tile";
}

}  // namespace
}  // namespace kvarn
