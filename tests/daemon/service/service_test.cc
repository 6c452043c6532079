// KvService in-process: the gRPC handlers over a real KvCore on the host backend, driven
// with the generated stub. Each test checks the status code the proto documents and that a
// refused request changed nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "daemon/core/tenants.h"
#include "tests/daemon/service/service_harness.h"

namespace kvarn::testing {
namespace {

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override { Restart(ServiceHarness::Options()); }
  void TearDown() override {
    if (h_ != nullptr && h_->started()) {
      EXPECT_TRUE(h_->core().CheckInvariants().ok()) << h_->core().CheckInvariants();
    }
  }
  void Restart(const ServiceHarness::Options& o) {
    h_.reset();
    h_ = std::make_unique<ServiceHarness>();
    const absl::Status s = h_->Start(o);
    ASSERT_TRUE(s.ok()) << s;
  }

  KvCore& core() { return h_->core(); }
  v1::KvCache::Stub& stub() { return h_->stub(); }

  v1::SessionRef OpenRef(const std::string& tenant, uint32_t slots = 2) {
    grpc::Status s;
    const v1::OpenSessionResponse r = h_->Open(tenant, slots, "", "", &s);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return ServiceHarness::RefOf(r);
  }

  v1::DescribeResponse Describe() {
    v1::DescribeResponse d;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    const grpc::Status s = stub().Describe(&ctx, v1::DescribeRequest(), &d);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return d;
  }

  grpc::Status CreateSequence(const v1::SessionRef& ref, v1::CreateSequenceResponse* resp) {
    v1::CreateSequenceRequest req;
    *req.mutable_session() = ref;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    return stub().CreateSequence(&ctx, req, resp);
  }

  grpc::Status Stats(const v1::SessionRef& ref, v1::StatsResponse* resp) {
    v1::StatsRequest req;
    *req.mutable_session() = ref;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    return stub().Stats(&ctx, req, resp);
  }

  grpc::Status AppendBatch(const v1::AppendBatchRequest& req, v1::AppendBatchResponse* resp) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    return stub().AppendBatch(&ctx, req, resp);
  }

  // An AppendInline of n tokens of f32 K/V (seeded), sized correctly.
  v1::AppendInlineRequest Inline(const v1::SessionRef& ref, uint64_t seq, int n, uint32_t seed = 1) {
    v1::AppendInlineRequest req;
    *req.mutable_session() = ref;
    req.set_sequence_id(seq);
    for (uint32_t id : TokenIds(100, n)) req.add_token_ids(id);
    const std::vector<float> k = RandomKv(n, seed), v = RandomKv(n, seed + 7);
    req.set_keys(k.data(), k.size() * sizeof(float));
    req.set_values(v.data(), v.size() * sizeof(float));
    req.set_dtype(v1::AppendInlineRequest::DTYPE_F32);
    return req;
  }

  grpc::Status AppendInline(const v1::AppendInlineRequest& req, v1::AppendResponse* resp = nullptr) {
    v1::AppendResponse local;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    return stub().AppendInline(&ctx, req, resp != nullptr ? resp : &local);
  }

  grpc::Status Read(const v1::SessionRef& ref, uint64_t seq, uint32_t layer, uint64_t start, uint32_t count,
                    v1::ReadResponse* resp) {
    v1::ReadRequest req;
    *req.mutable_session() = ref;
    req.set_sequence_id(seq);
    req.set_layer(layer);
    req.set_start(start);
    req.set_count(count);
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    return stub().Read(&ctx, req, resp);
  }

  grpc::Status Evict(const v1::SessionRef& ref, v1::EvictRequest::Scope scope, uint64_t bytes, const std::string& tenant,
                     v1::EvictResponse* resp) {
    v1::EvictRequest req;
    *req.mutable_session() = ref;
    req.set_scope(scope);
    req.set_bytes(bytes);
    req.set_tenant(tenant);
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    return stub().Evict(&ctx, req, resp);
  }

  // The core's view of a sequence's table (no renewal, no RPC).
  BlockTableView CoreTable(const v1::SessionRef& ref, uint64_t seq) {
    auto t = core().Table(CoreRef(ref), seq);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *t : BlockTableView{};
  }

  static v1::SessionRef WithSecret(v1::SessionRef ref, std::string secret) {
    ref.set_secret(std::move(secret));
    return ref;
  }
  static v1::SessionRef WithFlippedSecret(v1::SessionRef ref) {
    std::string s = ref.secret();
    s.back() = static_cast<char>(s.back() ^ 0x01);
    ref.set_secret(s);
    return ref;
  }

  std::unique_ptr<ServiceHarness> h_;
};

// ---- Describe and OpenSession ----

TEST_F(ServiceTest, DescribeReportsTenantsUnauthenticatedWithoutATenantsFile) {
  const v1::DescribeResponse d = Describe();
  EXPECT_FALSE(d.tenants_authenticated());
  EXPECT_EQ(d.epoch(), core().epoch());
  EXPECT_EQ(d.backend(), "host");
  EXPECT_EQ(d.tile_tokens(), 64u);
  EXPECT_EQ(d.record_bytes(), core().layout().record_bytes);
  EXPECT_EQ(d.capacity_bytes(), 8ull << 20);
  EXPECT_EQ(d.layout().model_id(), "svc-model");
  EXPECT_EQ(d.layout().num_layers(), 2u);
  EXPECT_EQ(d.layout().num_kv_heads(), 2u);
  EXPECT_EQ(d.layout().head_dim(), 64u);
  EXPECT_EQ(d.layout().preset(), "kvarn_k4v2_g64");
  EXPECT_EQ(d.layout().sink_tokens(), 64u);
}

TEST_F(ServiceTest, DescribeReportsTenantsAuthenticatedOnceTenantsAreConfigured) {
  auto specs = ParseTenants(TenantLine("team-a", "token-a"));
  ASSERT_TRUE(specs.ok()) << specs.status();
  ASSERT_TRUE(core().ConfigureTenants(*specs).ok());
  EXPECT_TRUE(Describe().tenants_authenticated());
}

TEST_F(ServiceTest, OpenSessionReturnsADistinct32ByteSecretPerSession) {
  grpc::Status s1, s2;
  const v1::OpenSessionResponse a = h_->Open("tenant-a", 2, "", "", &s1);
  const v1::OpenSessionResponse b = h_->Open("tenant-a", 2, "", "", &s2);
  ASSERT_TRUE(s1.ok()) << s1.error_message();
  ASSERT_TRUE(s2.ok()) << s2.error_message();
  EXPECT_EQ(a.session_secret().size(), 32u);
  EXPECT_EQ(b.session_secret().size(), 32u);
  EXPECT_NE(a.session_secret(), b.session_secret());
  EXPECT_NE(a.session_secret(), std::string(32, '\0'));
  EXPECT_NE(a.session_id(), b.session_id());
  EXPECT_EQ(a.pool().epoch(), core().epoch());
  EXPECT_EQ(a.pool().backend(), v1::PoolDescription::BACKEND_HOST);
  EXPECT_EQ(a.pool().fp16_layout(), v1::FP16_LAYOUT_TOKEN_MAJOR);
  EXPECT_EQ(a.pool().tail_slots(), 2u);
  EXPECT_EQ(a.pool().quant_segments_size(), 1);
  EXPECT_EQ(a.pool().sink_segments_size(), 1);
  EXPECT_EQ(a.keepalive_interval_ms(), 20u);
  EXPECT_EQ(a.lease_ttl_ms(), 10000u);
}

TEST_F(ServiceTest, OpenSessionWithAnotherLayoutIsInvalidArgument) {
  v1::OpenSessionRequest req;
  req.set_tenant("tenant-a");
  ModelConfig other = SmallModel();
  other.num_layers = 3;
  *req.mutable_layout() = LayoutProto(other);
  req.set_fp16_layout(v1::FP16_LAYOUT_TOKEN_MAJOR);
  v1::OpenSessionResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  EXPECT_EQ(stub().OpenSession(&ctx, req, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(core().Stats(std::nullopt)->sessions, 0u);
}

// A client that does not declare token-major fp16 blocks (a client library from before the
// field) would stage every token at the wrong place: refused, naming both layouts.
TEST_F(ServiceTest, OpenSessionOfAClientOfAnotherFp16LayoutIsFailedPrecondition) {
  v1::OpenSessionRequest req;
  req.set_tenant("tenant-a");
  *req.mutable_layout() = LayoutProto(SmallModel());
  v1::OpenSessionResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  const grpc::Status s = stub().OpenSession(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("FP16_LAYOUT_TOKEN_MAJOR"), std::string::npos)
      << s.error_message();
  EXPECT_NE(s.error_message().find("declared FP16_LAYOUT_UNSPECIFIED"), std::string::npos)
      << s.error_message();
  EXPECT_EQ(core().Stats(std::nullopt)->sessions, 0u);
}

TEST_F(ServiceTest, OpenSessionOfAConfiguredTenantNeedsItsToken) {
  auto specs = ParseTenants(TenantLine("team-a", "token-a"));
  ASSERT_TRUE(specs.ok()) << specs.status();
  ASSERT_TRUE(core().ConfigureTenants(*specs).ok());
  grpc::Status s;
  h_->Open("team-a", 2, "wrong-token", "", &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  h_->Open("team-b", 2, "token-a", "", &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(core().Stats(std::nullopt)->sessions, 0u);
  const v1::OpenSessionResponse ok = h_->Open("team-a", 2, "token-a", "", &s);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(ok.session_secret().size(), 32u);
}

TEST_F(ServiceTest, CallsWithoutTheSecretGetNotFound) {
  const v1::SessionRef ref = OpenRef("tenant-a");
  const v1::SessionRef bare = WithSecret(ref, "");
  v1::CreateSequenceResponse created;
  EXPECT_EQ(CreateSequence(bare, &created).error_code(), grpc::StatusCode::NOT_FOUND);
  v1::StatsResponse stats;
  EXPECT_EQ(Stats(bare, &stats).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(h_->CloseSession(bare).error_code(), grpc::StatusCode::NOT_FOUND);
  // The refused CloseSession closed nothing: the real credential still works.
  EXPECT_TRUE(core().CheckSession(CoreRef(ref)).ok());
  EXPECT_TRUE(CreateSequence(ref, &created).ok());
}

TEST_F(ServiceTest, CallsWithAWrongSecretGetNotFound) {
  const v1::SessionRef ref = OpenRef("tenant-a");
  const v1::SessionRef wrong = WithFlippedSecret(ref);
  v1::CreateSequenceResponse created;
  EXPECT_EQ(CreateSequence(wrong, &created).error_code(), grpc::StatusCode::NOT_FOUND);
  // A secret of another length is no better.
  EXPECT_EQ(CreateSequence(WithSecret(ref, ref.secret() + "x"), &created).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(h_->CloseSession(wrong).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(core().Stats(std::nullopt)->sequences, 0u);
  EXPECT_TRUE(h_->CloseSession(ref).ok());
  // After a close the right secret is refused too.
  EXPECT_EQ(CreateSequence(ref, &created).error_code(), grpc::StatusCode::NOT_FOUND);
}

// ---- AppendBatch ----

TEST_F(ServiceTest, AppendBatchAnswersAnUnknownSessionWithTheCallsStatus) {
  const v1::SessionRef ref = OpenRef("tenant-a");
  const uint64_t seq = h_->CreateSequence(ref);
  ASSERT_NE(seq, 0u);
  v1::SessionRef unknown = ref;
  unknown.set_session_id(ref.session_id() + 1000);
  v1::AppendBatchRequest req;
  *req.mutable_session() = unknown;
  auto* item = req.add_items();
  item->set_sequence_id(seq);
  item->add_token_ids(1);
  v1::AppendBatchResponse resp;
  EXPECT_EQ(AppendBatch(req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(resp.items_size(), 0);
  EXPECT_EQ(CoreTable(ref, seq).tokens, 0u);
}

TEST_F(ServiceTest, AppendBatchAnswersAWrongSecretWithTheCallsStatus) {
  const v1::SessionRef ref = OpenRef("tenant-a");
  const uint64_t seq = h_->CreateSequence(ref);
  ASSERT_NE(seq, 0u);
  v1::AppendBatchRequest req;
  *req.mutable_session() = WithFlippedSecret(ref);
  auto* item = req.add_items();
  item->set_sequence_id(seq);
  item->add_token_ids(1);
  v1::AppendBatchResponse resp;
  EXPECT_EQ(AppendBatch(req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(resp.items_size(), 0);
  EXPECT_EQ(CoreTable(ref, seq).tokens, 0u);
}

TEST_F(ServiceTest, AppendBatchAnswersAStaleEpochWithTheCallsStatus) {
  const v1::SessionRef ref = OpenRef("tenant-a");
  const uint64_t seq = h_->CreateSequence(ref);
  ASSERT_NE(seq, 0u);
  v1::AppendBatchRequest req;
  *req.mutable_session() = ref;
  req.mutable_session()->set_epoch(ref.epoch() + 1);
  auto* item = req.add_items();
  item->set_sequence_id(seq);
  item->add_token_ids(1);
  v1::AppendBatchResponse resp;
  EXPECT_EQ(AppendBatch(req, &resp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(resp.items_size(), 0);
  EXPECT_EQ(CoreTable(ref, seq).tokens, 0u);
}

TEST_F(ServiceTest, AppendBatchOfAGoodSessionAnswersOkWithPerItemCodes) {
  const v1::SessionRef ref = OpenRef("tenant-a", 3);
  const uint64_t a = h_->CreateSequence(ref), b = h_->CreateSequence(ref), c = h_->CreateSequence(ref);
  ASSERT_NE(a, 0u);
  ASSERT_NE(b, 0u);
  ASSERT_NE(c, 0u);
  v1::AppendBatchRequest req;
  *req.mutable_session() = ref;
  auto* good = req.add_items();  // commits 3 zero tokens of a fresh tail
  good->set_sequence_id(a);
  for (uint32_t id : TokenIds(1, 3)) good->add_token_ids(id);
  auto* unknown = req.add_items();
  unknown->set_sequence_id(c + 1000);
  unknown->add_token_ids(1);
  req.add_items()->set_sequence_id(b);  // no tokens
  auto* past_tail = req.add_items();
  past_tail->set_sequence_id(c);
  for (uint32_t id : TokenIds(1, 65)) past_tail->add_token_ids(id);  // a tile holds 64
  v1::AppendBatchResponse resp;
  const grpc::Status s = AppendBatch(req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(resp.items_size(), 4);
  EXPECT_EQ(resp.items(0).code(), 0);
  EXPECT_EQ(resp.items(0).result().table().tokens(), 3u);
  EXPECT_EQ(resp.items(0).result().table().tail_tokens(), 3u);
  EXPECT_FALSE(resp.items(0).result().sealed());
  EXPECT_EQ(resp.items(1).code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
  EXPECT_FALSE(resp.items(1).message().empty());
  EXPECT_EQ(resp.items(2).code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_EQ(resp.items(3).code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_EQ(CoreTable(ref, a).tokens, 3u);
  EXPECT_EQ(CoreTable(ref, b).tokens, 0u);
  EXPECT_EQ(CoreTable(ref, c).tokens, 0u);
}

TEST_F(ServiceTest, AppendBatchOfMoreThanMaxBatchItemsIsInvalidArgument) {
  const v1::SessionRef ref = OpenRef("tenant-a");
  const uint32_t max = h_->options().service.max_batch;
  v1::AppendBatchRequest req;
  *req.mutable_session() = ref;
  for (uint32_t i = 0; i < max; ++i) {
    auto* item = req.add_items();
    item->set_sequence_id(1000 + i);
    item->add_token_ids(1);
  }
  v1::AppendBatchResponse resp;
  ASSERT_TRUE(AppendBatch(req, &resp).ok());  // exactly the limit: each item answered
  EXPECT_EQ(resp.items_size(), static_cast<int>(max));
  req.add_items()->set_sequence_id(5000);
  v1::AppendBatchResponse over;
  EXPECT_EQ(AppendBatch(req, &over).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(over.items_size(), 0);
}

// ---- AppendInline ----

TEST_F(ServiceTest, AppendInlineOfTheRightSizeCommitsTheTokensAndReadsThemBack) {
  const v1::SessionRef ref = OpenRef("tenant-a");
  const uint64_t seq = h_->CreateSequence(ref);
  ASSERT_NE(seq, 0u);
  v1::AppendResponse resp;
  const grpc::Status s = AppendInline(Inline(ref, seq, 3, 11), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.table().tokens(), 3u);
  EXPECT_EQ(CoreTable(ref, seq).tail_tokens, 3u);
  v1::ReadResponse read;
  ASSERT_TRUE(Read(ref, seq, /*layer=*/1, 0, 3, &read).ok());
  const ModelConfig m = SmallModel();
  ASSERT_EQ(read.keys_size(), static_cast<int>(3 * m.num_kv_heads * m.head_dim));
  // The tail keeps fp16: what comes back is what went in, to fp16 precision.
  const std::vector<float> k = RandomKv(3, 11);
  const size_t per_token = size_t{m.num_layers} * m.num_kv_heads * m.head_dim;
  const size_t per_layer = size_t{m.num_kv_heads} * m.head_dim;
  for (size_t t = 0; t < 3; ++t) {
    for (size_t i = 0; i < per_layer; ++i) {
      EXPECT_NEAR(read.keys(static_cast<int>(t * per_layer + i)), k[t * per_token + per_layer + i], 0.02)
          << "token " << t << " element " << i;
    }
  }
}

TEST_F(ServiceTest, AppendInlineWithKeysOfTheWrongSizeIsInvalidArgumentAndChangesNothing) {
  const v1::SessionRef ref = OpenRef("tenant-a");
  const uint64_t seq = h_->CreateSequence(ref);
  ASSERT_NE(seq, 0u);
  v1::AppendInlineRequest req = Inline(ref, seq, 3);
  req.mutable_keys()->resize(req.keys().size() - 4);
  EXPECT_EQ(AppendInline(req).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  req = Inline(ref, seq, 3);
  req.mutable_values()->append(4, '\0');
  EXPECT_EQ(AppendInline(req).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Sized for f16 but declared f32.
  req = Inline(ref, seq, 3);
  req.mutable_keys()->resize(req.keys().size() / 2);
  req.mutable_values()->resize(req.values().size() / 2);
  EXPECT_EQ(AppendInline(req).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  const BlockTableView t = CoreTable(ref, seq);
  EXPECT_EQ(t.tokens, 0u);
  EXPECT_EQ(t.tail_tokens, 0u);
}

TEST_F(ServiceTest, AppendInlineWithAnUnspecifiedDtypeIsInvalidArgumentAndChangesNothing) {
  const v1::SessionRef ref = OpenRef("tenant-a");
  const uint64_t seq = h_->CreateSequence(ref);
  ASSERT_NE(seq, 0u);
  v1::AppendInlineRequest req = Inline(ref, seq, 3);
  req.set_dtype(v1::AppendInlineRequest::DTYPE_UNSPECIFIED);
  EXPECT_EQ(AppendInline(req).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  req.set_dtype(static_cast<v1::AppendInlineRequest::DType>(7));
  EXPECT_EQ(AppendInline(req).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(CoreTable(ref, seq).tokens, 0u);
}

TEST_F(ServiceTest, AppendInlineAboveTheInlineLimitIsInvalidArgument) {
  const v1::SessionRef ref = OpenRef("tenant-a");
  const uint64_t seq = h_->CreateSequence(ref);
  ASSERT_NE(seq, 0u);
  // 10 tokens of f32: 10 KiB of keys and 10 KiB of values, above the 16 KiB limit.
  const grpc::Status s = AppendInline(Inline(ref, seq, 10));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("exceeds"), std::string::npos) << s.error_message();
  EXPECT_EQ(CoreTable(ref, seq).tokens, 0u);
  EXPECT_TRUE(AppendInline(Inline(ref, seq, 8)).ok());  // 16 KiB exactly
}

TEST_F(ServiceTest, AppendInlineOfZeroTokensIsInvalidArgument) {
  const v1::SessionRef ref = OpenRef("tenant-a");
  const uint64_t seq = h_->CreateSequence(ref);
  ASSERT_NE(seq, 0u);
  EXPECT_EQ(AppendInline(Inline(ref, seq, 0)).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(CoreTable(ref, seq).tokens, 0u);
}

TEST_F(ServiceTest, AppendInlineWithNonFiniteKvIsInvalidArgumentAndLeavesTheSequenceUsable) {
  const v1::SessionRef ref = OpenRef("tenant-a");
  const uint64_t seq = h_->CreateSequence(ref);
  ASSERT_NE(seq, 0u);
  v1::AppendInlineRequest req = Inline(ref, seq, 3);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(req.mutable_keys()->data() + 5 * sizeof(float), &nan, sizeof(nan));
  EXPECT_EQ(AppendInline(req).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(CoreTable(ref, seq).tokens, 0u);
  const grpc::Status s = AppendInline(Inline(ref, seq, 3));
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(CoreTable(ref, seq).tokens, 3u);
}

// ---- Read ----

TEST_F(ServiceTest, ReadRefusesCountsOfZeroAndAboveTheReadLimit) {
  const v1::SessionRef ref = OpenRef("tenant-a");
  const uint64_t seq = h_->CreateSequence(ref);
  ASSERT_NE(seq, 0u);
  ASSERT_TRUE(AppendInline(Inline(ref, seq, 3)).ok());
  v1::ReadResponse r;
  EXPECT_EQ(Read(ref, seq, 0, 0, 0, &r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::ReadResponse over;
  const uint32_t limit = h_->options().core.max_read_tokens;
  EXPECT_EQ(Read(ref, seq, 0, 0, limit + 1, &over).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(over.keys_size(), 0);
  EXPECT_EQ(Read(ref, seq, 0, 0, std::numeric_limits<uint32_t>::max(), &over).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(ServiceTest, ReadRefusesRangesBeyondTheSequenceAndLayersBeyondTheModel) {
  const v1::SessionRef ref = OpenRef("tenant-a");
  const uint64_t seq = h_->CreateSequence(ref);
  ASSERT_NE(seq, 0u);
  ASSERT_TRUE(AppendInline(Inline(ref, seq, 3)).ok());
  v1::ReadResponse r;
  EXPECT_EQ(Read(ref, seq, 0, 0, 4, &r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(r.keys_size(), 0);  // a refused Read carries no half-filled buffers
  EXPECT_EQ(Read(ref, seq, 0, 3, 1, &r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Read(ref, seq, 2, 0, 1, &r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Read(ref, seq + 100, 0, 0, 1, &r).error_code(), grpc::StatusCode::NOT_FOUND);
  v1::ReadResponse ok;
  ASSERT_TRUE(Read(ref, seq, 0, 1, 2, &ok).ok());
  EXPECT_EQ(ok.keys_size(), 2 * 2 * 64);
  EXPECT_EQ(ok.values_size(), 2 * 2 * 64);
}

// ---- Evict ----

TEST_F(ServiceTest, EvictRefusesAnUnspecifiedScopeAndScopeBytesOfZero) {
  const v1::SessionRef ref = OpenRef("tenant-a");
  v1::EvictResponse r;
  EXPECT_EQ(Evict(ref, v1::EvictRequest::SCOPE_UNSPECIFIED, 0, "", &r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Evict(ref, static_cast<v1::EvictRequest::Scope>(9), 0, "", &r).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Evict(ref, v1::EvictRequest::SCOPE_BYTES, 0, "", &r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(ServiceTest, EvictBeyondTheCallersTenantNeedsTheAdminToken) {
  ServiceHarness::Options o;
  o.core.admin_token = "admin-secret";
  Restart(o);
  const v1::SessionRef ref = OpenRef("tenant-a");
  v1::EvictResponse r;
  EXPECT_EQ(Evict(ref, v1::EvictRequest::SCOPE_BYTES, 1, "", &r).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Evict(ref, v1::EvictRequest::SCOPE_ALL, 0, "", &r).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Evict(ref, v1::EvictRequest::SCOPE_TENANT, 0, "tenant-b", &r).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(Evict(ref, v1::EvictRequest::SCOPE_TENANT, 0, "", &r).ok());
  grpc::Status s;
  const v1::OpenSessionResponse admin = h_->Open("ops", 1, "", "admin-secret", &s);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(Evict(ServiceHarness::RefOf(admin), v1::EvictRequest::SCOPE_ALL, 0, "", &r).ok());
  EXPECT_TRUE(Evict(ServiceHarness::RefOf(admin), v1::EvictRequest::SCOPE_BYTES, 1, "", &r).ok());
}

TEST_F(ServiceTest, EvictOfTheCallersTenantTakesItsCachedBlocksOnly) {
  const v1::SessionRef a = OpenRef("tenant-a"), b = OpenRef("tenant-b");
  for (const v1::SessionRef& ref : {a, b}) {
    const uint64_t seq = h_->CreateSequence(ref);
    ASSERT_NE(seq, 0u);
    v1::AppendResponse sealed;
    ASSERT_TRUE(h_->Commit(ref, seq, TokenIds(500, 64), &sealed).ok());  // seals the sink tile
    ASSERT_TRUE(sealed.sealed());
    v1::ReleaseRequest rel;
    *rel.mutable_session() = ref;
    rel.add_sequence_ids(seq);
    v1::ReleaseResponse rr;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    ASSERT_TRUE(stub().Release(&ctx, rel, &rr).ok());
  }
  ASSERT_EQ(core().Stats(std::nullopt)->sink_cached, 2u);
  v1::EvictResponse r;
  ASSERT_TRUE(Evict(b, v1::EvictRequest::SCOPE_TENANT, 0, "", &r).ok());
  EXPECT_EQ(r.blocks(), 1u);
  EXPECT_EQ(r.bytes(), core().layout().fp16_block_bytes());
  EXPECT_EQ(core().Stats(std::nullopt)->sink_cached, 1u);
  ASSERT_TRUE(Evict(b, v1::EvictRequest::SCOPE_TENANT, 0, "", &r).ok());
  EXPECT_EQ(r.blocks(), 0u);  // tenant-a's block is not b's to evict
  EXPECT_EQ(core().Stats(std::nullopt)->sink_cached, 1u);
}

// ---- KeepAlive ----

TEST_F(ServiceTest, KeepAliveWithTheSecretGetsAnAnswerPerMessage) {
  const v1::SessionRef ref = OpenRef("tenant-a");
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  auto stream = stub().KeepAlive(&ctx);
  v1::KeepAliveRequest req;
  *req.mutable_session() = ref;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(stream->Write(req));
    v1::KeepAliveResponse resp;
    ASSERT_TRUE(stream->Read(&resp));
    EXPECT_EQ(resp.epoch(), core().epoch());
    EXPECT_GT(resp.server_time_ms(), 0u);
  }
  // The stream holds the lease: the session shows as connected while it is open.
  v1::StatsResponse st;
  ASSERT_TRUE(Stats(ref, &st).ok());
  ASSERT_EQ(st.session_info_size(), 1);
  EXPECT_TRUE(st.session_info(0).connected());
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_TRUE(WaitFor([&] {
    v1::StatsResponse now;
    return Stats(ref, &now).ok() && now.session_info_size() == 1 && !now.session_info(0).connected();
  }));
}

TEST_F(ServiceTest, KeepAliveWithoutTheSecretEndsNotFound) {
  const v1::SessionRef ref = OpenRef("tenant-a");
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  auto stream = stub().KeepAlive(&ctx);
  v1::KeepAliveRequest req;
  *req.mutable_session() = WithSecret(ref, "");
  stream->Write(req);
  v1::KeepAliveResponse resp;
  EXPECT_FALSE(stream->Read(&resp));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  v1::StatsResponse st;
  ASSERT_TRUE(Stats(ref, &st).ok());
  ASSERT_EQ(st.session_info_size(), 1);
  EXPECT_FALSE(st.session_info(0).connected());  // the refused stream never attached
}

TEST_F(ServiceTest, KeepAliveWithAWrongSecretAfterAttachingEndsNotFound) {
  const v1::SessionRef ref = OpenRef("tenant-a");
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  auto stream = stub().KeepAlive(&ctx);
  v1::KeepAliveRequest req;
  *req.mutable_session() = ref;
  ASSERT_TRUE(stream->Write(req));
  v1::KeepAliveResponse resp;
  ASSERT_TRUE(stream->Read(&resp));
  *req.mutable_session() = WithFlippedSecret(ref);
  stream->Write(req);
  EXPECT_FALSE(stream->Read(&resp));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ServiceTest, OneKeepAliveStreamNamingTwoSessionsIsInvalidArgument) {
  const v1::SessionRef a = OpenRef("tenant-a"), b = OpenRef("tenant-a");
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  auto stream = stub().KeepAlive(&ctx);
  v1::KeepAliveRequest req;
  *req.mutable_session() = a;
  ASSERT_TRUE(stream->Write(req));
  v1::KeepAliveResponse resp;
  ASSERT_TRUE(stream->Read(&resp));
  *req.mutable_session() = b;
  stream->Write(req);
  EXPECT_FALSE(stream->Read(&resp));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Neither session was harmed.
  EXPECT_TRUE(core().CheckSession(CoreRef(a)).ok());
  EXPECT_TRUE(core().CheckSession(CoreRef(b)).ok());
}

TEST_F(ServiceTest, KeepAliveStreamsEndUnavailableWhenTheServiceStops) {
  const v1::SessionRef ref = OpenRef("tenant-a");
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  auto stream = stub().KeepAlive(&ctx);
  v1::KeepAliveRequest req;
  *req.mutable_session() = ref;
  ASSERT_TRUE(stream->Write(req));
  v1::KeepAliveResponse resp;
  ASSERT_TRUE(stream->Read(&resp));
  h_->service().Stop();
  EXPECT_FALSE(stream->Read(&resp));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
}

// A keep-alive stream opened after Stop() (a client reconnecting between Stop and the
// server's Shutdown) is refused with UNAVAILABLE, so Shutdown never waits on it. (Found by
// this test: such streams were once attached and served.)
TEST_F(ServiceTest, AKeepAliveStreamOpenedAfterStopEndsUnavailable) {
  const v1::SessionRef ref = OpenRef("tenant-a");
  h_->service().Stop();
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Seconds(5));
  auto stream = stub().KeepAlive(&ctx);
  v1::KeepAliveRequest req;
  *req.mutable_session() = ref;
  stream->Write(req);
  v1::KeepAliveResponse resp;
  EXPECT_FALSE(stream->Read(&resp)) << "a keep-alive stream opened after Stop() was served";
  const grpc::Status s = stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
}

}  // namespace
}  // namespace kvarn::testing
