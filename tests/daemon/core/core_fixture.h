// A KvCore on heap memory with a fake clock and a small model, for unit tests. Every test
// ends with the invariant checker.
#ifndef KVARN_TESTS_DAEMON_CORE_CORE_FIXTURE_H_
#define KVARN_TESTS_DAEMON_CORE_CORE_FIXTURE_H_

#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "common/mutex.h"
#include "daemon/core/kv_core.h"
#include "tests/daemon/core/small_model.h"

namespace kvarn::testing {

// Heap memory that remembers the tail regions it hands out, so tests can play a client
// scribbling on its shared-memory tail.
class RecordingBackend final : public MemoryBackend {
 public:
  // Called concurrently (the core creates tail regions outside its lock).
  absl::StatusOr<std::unique_ptr<Region>> Create(RegionKind kind, size_t bytes) override {
    auto r = heap_.Create(kind, bytes);
    if (r.ok() && kind == RegionKind::kTail) {
      MutexLock lock(&mu_);
      tails.push_back((*r)->data());
    }
    return r;
  }
  const char* name() const override { return "heap"; }
  bool host_accessible() const override { return true; }
  bool NeedsImporterPid() const override { return needs_importer_pid; }
  std::vector<uint8_t*> tails;  // read by single-threaded tests only
  bool needs_importer_pid = false;  // as the CUDA backend (retention by pid)

 private:
  Mutex mu_;
  HeapBackend heap_;
};

class CoreTest : public ::testing::Test {
 protected:
  // Sizes the pool to exactly `quant_blocks` quantized blocks, `sink_blocks` sink blocks (none
  // when the model keeps no sink) and `tail_slots` tail slots.
  void MakeCore(uint32_t quant_blocks, uint32_t sink_blocks, ModelConfig model = SmallModel(),
                CoreConfig config = CoreConfig(), uint32_t tail_slots = 16, CoreObserver* observer = nullptr) {
    Preset p;
    ASSERT_TRUE(ParsePreset(model.preset, &p).ok());
    const uint64_t slots = uint64_t{model.num_layers} * model.num_kv_heads;
    qbytes_ = slots * p.RecordBytes(static_cast<int>(model.head_dim));
    fbytes_ = slots * 2 * uint64_t(p.tile_tokens) * model.head_dim * 2;
    if (model.sink_tokens == 0) sink_blocks = 0;
    const uint64_t fp16_blocks = sink_blocks + tail_slots;
    config.model = model;
    config.capacity_bytes = quant_blocks * qbytes_ + fp16_blocks * fbytes_;
    config.fp16_share = (static_cast<double>(fp16_blocks * fbytes_) + 0.5) / config.capacity_bytes;
    config.sink_share = (sink_blocks + 0.5) / static_cast<double>(fp16_blocks);
    config.default_tail_slots = 2;
    auto core = KvCore::Create(config, &backend_, &clock_, nullptr, observer, /*epoch=*/77);
    ASSERT_TRUE(core.ok()) << core.status();
    core_ = std::move(*core);
    model_ = model;
    g_ = p.tile_tokens;
  }

  void TearDown() override {
    if (core_) {
      EXPECT_TRUE(core_->CheckInvariants().ok()) << core_->CheckInvariants();
    }
  }

  SessionRef Open(const std::string& tenant, uint32_t slots = 2, const std::string& token = "") {
    OpenParams p;
    p.tenant = tenant;
    p.tenant_token = token;
    p.layout = model_;
    p.max_sequences = slots;
    auto r = core_->OpenSession(p);
    EXPECT_TRUE(r.ok()) << r.status();
    return Ref(r);
  }
  SessionRef Ref(const absl::StatusOr<OpenResult>& r) const {
    return r.ok() ? SessionRef{r->session, core_->epoch(), r->secret} : SessionRef{};
  }

  // Deterministic original-frame K/V for n tokens: [n][L][H][D] floats.
  std::vector<float> Kv(int n, uint32_t seed) const {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(n) * model_.num_layers * model_.num_kv_heads * model_.head_dim);
    for (float& v : x) v = dist(rng);
    return x;
  }

  static std::vector<uint32_t> Tokens(uint32_t first, int n) {
    std::vector<uint32_t> t(n);
    std::iota(t.begin(), t.end(), first);
    return t;
  }

  // Appends tokens [offset, offset + n) of `prompt` with K/V derived from the token ids, in
  // tail-sized pieces. Returns the last table.
  BlockTableView AppendAll(SessionRef s, SequenceId q, const std::vector<uint32_t>& prompt, size_t offset) {
    BlockTableView table;
    while (offset < prompt.size()) {
      auto t = core_->Table(s, q);
      EXPECT_TRUE(t.ok()) << t.status();
      const size_t room = static_cast<size_t>(g_) - t->tail_tokens;
      const size_t n = std::min(room, prompt.size() - offset);
      std::vector<uint32_t> ids(prompt.begin() + offset, prompt.begin() + offset + n);
      const std::vector<float> k = Kv(static_cast<int>(n), prompt[offset]), v = Kv(static_cast<int>(n), prompt[offset] + 1000003);
      auto r = core_->AppendInline(s, q, ids, k.data(), v.data(), DType::kF32);
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok()) break;
      offset += n;
    }
    // Appends that seal nothing return tables without block ids: ask for the whole one.
    auto full = core_->Table(s, q);
    if (full.ok()) table = *full;
    return table;
  }

  RecordingBackend backend_;
  FakeClock clock_;
  std::unique_ptr<KvCore> core_;
  ModelConfig model_;
  uint64_t qbytes_ = 0, fbytes_ = 0;
  int g_ = 0;
};

}  // namespace kvarn::testing

#endif  // KVARN_TESTS_DAEMON_CORE_CORE_FIXTURE_H_
