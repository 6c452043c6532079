// Scenario 5: bad input over gRPC. Each rejected call gets its specific status code and
// changes no state (Stats and ListSequences, as an admin sees them, are identical before and
// after), and the daemon keeps serving. The raw stub is used where the Session API would
// refuse the request on the client side.
#include <cmath>
#include <cstring>
#include <functional>

#include "kernels/fp16.h"
#include "tests/integration/fixture.h"

namespace kvarn::it {
namespace {

using Code = grpc::StatusCode;

class BadInputTest : public IntegrationTest {
 protected:
  void SetUp() override {
    daemon_ = StartDaemon({"--max_message_mb=1"});
    ASSERT_NE(daemon_, nullptr);
    client_ = Connect(*daemon_);
    ASSERT_NE(client_, nullptr);
    auto admin = Open(*client_, "ops", 1, /*admin=*/true, "observer");
    ASSERT_TRUE(admin.ok()) << admin.status();
    admin_ = std::move(*admin);
    auto a = Open(*client_, "team-a");
    ASSERT_TRUE(a.ok()) << a.status();
    a_ = std::move(*a);
    // A sequence of team-a: sink, one quantized tile, 10 tail tokens.
    prompt_ = Tokens(4242, 2 * kTile + 10);
    auto q = a_->CreateSequence(prompt_);
    ASSERT_TRUE(q.ok()) << q.status();
    seq_ = q->id;
    auto t = AppendTokens(*a_, seq_, prompt_, 0, prompt_.size());
    ASSERT_TRUE(t.ok()) << t.status();
    WaitAllConnected();
  }

  // A session's `connected` flag flips when its keep-alive stream attaches, shortly after
  // OpenSession: wait for it so that the state comparisons see only what the calls did.
  void WaitAllConnected() {
    for (int i = 0; i < 500; ++i) {
      auto st = admin_->Stats();
      ASSERT_TRUE(st.ok()) << st.status();
      bool all = true;
      for (const auto& si : st->session_info()) all &= si.connected();
      if (all) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    FAIL() << "sessions' keep-alive streams did not attach";
  }

  void TearDown() override {
    if (daemon_ != nullptr && a_ != nullptr) ExpectStillServing();
    a_.reset();
    admin_.reset();
    client_.reset();
    IntegrationTest::TearDown();
  }

  // The whole observable state, as an admin sees it.
  std::string State() {
    auto st = admin_->Stats();
    auto ls = admin_->ListSequences();
    EXPECT_TRUE(st.ok() && ls.ok());
    if (!st.ok() || !ls.ok()) return "";
    return st->DebugString() + "\n" + ls->DebugString();
  }

  // Runs `call`, expects `code`, and that the state is unchanged.
  void ExpectRejected(const std::string& what, Code code, const std::function<grpc::Status()>& call) {
    SCOPED_TRACE(what);
    const std::string before = State();
    const grpc::Status s = call();
    EXPECT_EQ(s.error_code(), code) << what << ": got " << s.error_code() << " '" << s.error_message() << "'";
    EXPECT_EQ(State(), before) << what << " changed the daemon's state";
  }

  v1::SessionRef Ref(const Session& s) const { return s.Ref(); }
  std::unique_ptr<grpc::ClientContext> Ctx() {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    return c;
  }

  grpc::Status RawAppendInline(const v1::SessionRef& ref, uint64_t seq, const std::vector<uint32_t>& ids,
                               const std::string& keys, const std::string& values, v1::AppendInlineRequest::DType dtype) {
    v1::AppendInlineRequest req;
    *req.mutable_session() = ref;
    req.set_sequence_id(seq);
    for (uint32_t t : ids) req.add_token_ids(t);
    req.set_keys(keys);
    req.set_values(values);
    req.set_dtype(dtype);
    v1::AppendResponse resp;
    return client_->stub().AppendInline(Ctx().get(), req, &resp);
  }
  grpc::Status RawAppend(const v1::SessionRef& ref, uint64_t seq, const std::vector<uint32_t>& ids) {
    v1::AppendRequest req;
    *req.mutable_session() = ref;
    req.set_sequence_id(seq);
    for (uint32_t t : ids) req.add_token_ids(t);
    v1::AppendResponse resp;
    return client_->stub().Append(Ctx().get(), req, &resp);
  }
  grpc::Status RawRead(const v1::SessionRef& ref, uint64_t seq, uint32_t layer, uint64_t start, uint32_t count) {
    v1::ReadRequest req;
    *req.mutable_session() = ref;
    req.set_sequence_id(seq);
    req.set_layer(layer);
    req.set_start(start);
    req.set_count(count);
    v1::ReadResponse resp;
    return client_->stub().Read(Ctx().get(), req, &resp);
  }
  grpc::Status RawFork(const v1::SessionRef& ref, uint64_t seq) {
    v1::ForkRequest req;
    *req.mutable_session() = ref;
    req.set_sequence_id(seq);
    v1::ForkResponse resp;
    return client_->stub().Fork(Ctx().get(), req, &resp);
  }
  grpc::Status RawRelease(const v1::SessionRef& ref, const std::vector<uint64_t>& seqs) {
    v1::ReleaseRequest req;
    *req.mutable_session() = ref;
    for (uint64_t q : seqs) req.add_sequence_ids(q);
    v1::ReleaseResponse resp;
    return client_->stub().Release(Ctx().get(), req, &resp);
  }
  grpc::Status RawCreate(const v1::SessionRef& ref, const std::vector<uint32_t>& prompt) {
    v1::CreateSequenceRequest req;
    *req.mutable_session() = ref;
    for (uint32_t t : prompt) req.add_prompt_tokens(t);
    v1::CreateSequenceResponse resp;
    return client_->stub().CreateSequence(Ctx().get(), req, &resp);
  }
  grpc::Status RawEvict(const v1::SessionRef& ref, v1::EvictRequest::Scope scope, const std::string& tenant,
                        uint64_t bytes = 0) {
    v1::EvictRequest req;
    *req.mutable_session() = ref;
    req.set_scope(scope);
    req.set_tenant(tenant);
    req.set_bytes(bytes);
    v1::EvictResponse resp;
    return client_->stub().Evict(Ctx().get(), req, &resp);
  }

  // Inline K/V bytes of n tokens, fp16 or f32, all finite.
  std::string KvBytes(size_t n, bool f32) const {
    const size_t elems = n * 2 * 2 * 64;
    const std::vector<uint32_t> ids = Tokens(1, n);
    const KvData kv = MakeKv(ids, SmallLayout());
    if (!f32) return std::string(reinterpret_cast<const char*>(kv.keys.data()), elems * 2);
    const std::vector<float> f = kv.KeysF32();
    return std::string(reinterpret_cast<const char*>(f.data()), elems * 4);
  }

  // The daemon still answers, and a normal create + append works.
  void ExpectStillServing() {
    ASSERT_TRUE(daemon_->Running()) << "kvarnd died:\n" << daemon_->Log();
    auto q = a_->CreateSequence(Tokens(777000, kTile + 5));
    ASSERT_TRUE(q.ok()) << q.status();
    const std::vector<uint32_t> p = Tokens(777000, kTile + 5);
    auto t = AppendTokens(*a_, q->id, p, 0, p.size());
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->tokens, p.size());
  }

  Daemon* daemon_ = nullptr;
  std::unique_ptr<Client> client_;
  std::unique_ptr<Session> admin_, a_;
  std::vector<uint32_t> prompt_;
  uint64_t seq_ = 0;
};

TEST_F(BadInputTest, OpenSessionWithAWrongLayoutIsInvalidArgument) {
  const std::vector<std::pair<std::string, std::function<void(Layout&)>>> wrong = {
      {"num_layers", [](Layout& l) { l.num_layers = 3; }},
      {"num_kv_heads", [](Layout& l) { l.num_kv_heads = 4; }},
      {"head_dim", [](Layout& l) { l.head_dim = 128; }},
      {"preset", [](Layout& l) { l.preset = "kvarn_k4v2_g128"; }},
      {"sink_tokens", [](Layout& l) { l.sink_tokens = 0; }},
      {"model_id", [](Layout& l) { l.model_id = "another-model"; }},
  };
  for (const auto& [field, mutate] : wrong) {
    const std::string before = State();
    SessionOptions o;
    o.tenant = "team-a";
    o.layout = SmallLayout();
    mutate(o.layout);
    auto s = client_->OpenSession(o);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << field << ": " << s.status();
    EXPECT_EQ(State(), before) << field;
  }
  // Raw requests the client library would not build: an unknown preset, no tenant, too many
  // tail slots.
  const auto raw_open = [this](const std::function<void(v1::OpenSessionRequest&)>& edit) {
    v1::OpenSessionRequest req;
    req.set_tenant("team-a");
    const Layout l = SmallLayout();
    auto* m = req.mutable_layout();
    m->set_model_id(l.model_id);
    m->set_num_layers(l.num_layers);
    m->set_num_kv_heads(l.num_kv_heads);
    m->set_head_dim(l.head_dim);
    m->set_preset(l.preset);
    m->set_sink_tokens(l.sink_tokens);
    req.set_fp16_layout(v1::FP16_LAYOUT_TOKEN_MAJOR);
    edit(req);
    v1::OpenSessionResponse resp;
    return client_->stub().OpenSession(Ctx().get(), req, &resp);
  };
  ExpectRejected("unknown preset", Code::INVALID_ARGUMENT,
                 [&] { return raw_open([](auto& r) { r.mutable_layout()->set_preset("kvarn_k3v1_g64"); }); });
  ExpectRejected("empty tenant", Code::INVALID_ARGUMENT, [&] { return raw_open([](auto& r) { r.set_tenant(""); }); });
  ExpectRejected("too many tail slots", Code::INVALID_ARGUMENT,
                 [&] { return raw_open([](auto& r) { r.set_max_sequences(1000000); }); });
  ExpectRejected("no layout", Code::INVALID_ARGUMENT, [&] { return raw_open([](auto& r) { r.clear_layout(); }); });
  // A client library from before token-major fp16 blocks declares no layout: it would stage
  // every token at the wrong place.
  ExpectRejected("no fp16 layout", Code::FAILED_PRECONDITION,
                 [&] { return raw_open([](auto& r) { r.clear_fp16_layout(); }); });
}

TEST_F(BadInputTest, NonFiniteKvIsInvalidArgument) {
  const v1::SessionRef ref = Ref(*a_);
  const std::vector<uint32_t> ids = Tokens(50000, 4);
  // NaN in f32 keys.
  std::string keys = KvBytes(4, true), values = KvBytes(4, true);
  float nan = std::nanf("");
  std::memcpy(keys.data() + 100 * 4, &nan, 4);
  ExpectRejected("NaN key (f32)", Code::INVALID_ARGUMENT,
                 [&] { return RawAppendInline(ref, seq_, ids, keys, values, v1::AppendInlineRequest::DTYPE_F32); });
  // +Inf in fp16 values.
  std::string k16 = KvBytes(4, false), v16 = KvBytes(4, false);
  const uint16_t inf = 0x7C00;
  std::memcpy(v16.data() + 2 * 300, &inf, 2);
  ExpectRejected("Inf value (f16)", Code::INVALID_ARGUMENT,
                 [&] { return RawAppendInline(ref, seq_, ids, k16, v16, v1::AppendInlineRequest::DTYPE_F16); });
  // An f32 value beyond the fp16 range (it would become Inf in storage).
  std::string big = KvBytes(4, true);
  const float huge = 1e6f;
  std::memcpy(big.data() + 4 * 7, &huge, 4);
  ExpectRejected("f32 beyond fp16 range", Code::INVALID_ARGUMENT,
                 [&] { return RawAppendInline(ref, seq_, ids, KvBytes(4, true), big, v1::AppendInlineRequest::DTYPE_F32); });
  // A NaN in an append that would seal the tile (tail 10 + 54 = 64): the block is not
  // sealed, nothing is allocated.
  const std::vector<uint32_t> seal_ids = Tokens(60000, kTile - 10);
  std::string sk = KvBytes(seal_ids.size(), false), sv = KvBytes(seal_ids.size(), false);
  const uint16_t qnan = 0x7E00;
  std::memcpy(sk.data() + sk.size() - 2, &qnan, 2);
  ExpectRejected("NaN in a sealing append", Code::INVALID_ARGUMENT,
                 [&] { return RawAppendInline(ref, seq_, seal_ids, sk, sv, v1::AppendInlineRequest::DTYPE_F16); });
  // A NaN written straight into the tail slot in shared memory, then committed.
  auto slot = a_->TailSlot(seq_);
  ASSERT_TRUE(slot.ok());
  const BlockLayout& bl = a_->block_layout();
  uint8_t* at = slot->first + bl.Fp16ValuesOffset(1, 1) +
                static_cast<size_t>(slot->second) * bl.fp16_token_bytes() + 6;
  std::memcpy(at, &qnan, 2);
  ExpectRejected("NaN committed from shared memory", Code::INVALID_ARGUMENT,
                 [&] { return RawAppend(ref, seq_, Tokens(61000, 1)); });
}

TEST_F(BadInputTest, InlineKvOfTheWrongSizeOrDtypeIsInvalidArgument) {
  const v1::SessionRef ref = Ref(*a_);
  const std::vector<uint32_t> ids = Tokens(50000, 4);
  const std::string k = KvBytes(4, false), v = KvBytes(4, false);
  ExpectRejected("keys 2 bytes short", Code::INVALID_ARGUMENT, [&] {
    return RawAppendInline(ref, seq_, ids, k.substr(0, k.size() - 2), v, v1::AppendInlineRequest::DTYPE_F16);
  });
  ExpectRejected("values one token long", Code::INVALID_ARGUMENT,
                 [&] { return RawAppendInline(ref, seq_, ids, k, v + KvBytes(1, false), v1::AppendInlineRequest::DTYPE_F16); });
  ExpectRejected("dtype unspecified", Code::INVALID_ARGUMENT,
                 [&] { return RawAppendInline(ref, seq_, ids, k, v, v1::AppendInlineRequest::DTYPE_UNSPECIFIED); });
  ExpectRejected("f32 dtype with fp16-sized K/V", Code::INVALID_ARGUMENT,
                 [&] { return RawAppendInline(ref, seq_, ids, k, v, v1::AppendInlineRequest::DTYPE_F32); });
  ExpectRejected("no K/V at all", Code::INVALID_ARGUMENT,
                 [&] { return RawAppendInline(ref, seq_, ids, "", "", v1::AppendInlineRequest::DTYPE_F16); });
  ExpectRejected("zero tokens", Code::INVALID_ARGUMENT,
                 [&] { return RawAppendInline(ref, seq_, {}, "", "", v1::AppendInlineRequest::DTYPE_F16); });
}

TEST_F(BadInputTest, UnknownSessionAndSequenceIdsAreNotFound) {
  const v1::SessionRef ref = Ref(*a_);
  v1::SessionRef ghost = ref;
  ghost.set_session_id(ref.session_id() + 1000);
  ExpectRejected("CreateSequence, unknown session", Code::NOT_FOUND, [&] { return RawCreate(ghost, Tokens(1, 10)); });
  ExpectRejected("Append, unknown session", Code::NOT_FOUND, [&] { return RawAppend(ghost, seq_, Tokens(1, 1)); });
  ExpectRejected("Stats, unknown session", Code::NOT_FOUND, [&] {
    v1::StatsRequest req;
    *req.mutable_session() = ghost;
    v1::StatsResponse resp;
    return client_->stub().Stats(Ctx().get(), req, &resp);
  });
  constexpr uint64_t kUnknown = 987654321;
  ExpectRejected("Append, unknown sequence", Code::NOT_FOUND, [&] { return RawAppend(ref, kUnknown, Tokens(1, 1)); });
  ExpectRejected("AppendInline, unknown sequence", Code::NOT_FOUND, [&] {
    return RawAppendInline(ref, kUnknown, Tokens(1, 1), KvBytes(1, false), KvBytes(1, false),
                           v1::AppendInlineRequest::DTYPE_F16);
  });
  ExpectRejected("Read, unknown sequence", Code::NOT_FOUND, [&] { return RawRead(ref, kUnknown, 0, 0, 1); });
  ExpectRejected("Fork, unknown sequence", Code::NOT_FOUND, [&] { return RawFork(ref, kUnknown); });
  ExpectRejected("Release, unknown sequence", Code::NOT_FOUND, [&] { return RawRelease(ref, {kUnknown}); });
  // All or nothing: a known id next to an unknown one is not released either.
  ExpectRejected("Release, known + unknown", Code::NOT_FOUND, [&] { return RawRelease(ref, {seq_, kUnknown}); });
  ExpectRejected("Release, the same id twice", Code::INVALID_ARGUMENT, [&] { return RawRelease(ref, {seq_, seq_}); });
  // AppendBatch answers per item: the RPC succeeds, each bad item carries its code.
  ExpectRejected("AppendBatch of bad items", Code::OK, [&] {
    v1::AppendBatchRequest req;
    *req.mutable_session() = ref;
    auto* unknown = req.add_items();
    unknown->set_sequence_id(kUnknown);
    unknown->add_token_ids(1);
    auto* past = req.add_items();
    past->set_sequence_id(seq_);
    for (uint32_t t : Tokens(1, kTile)) past->add_token_ids(t);
    v1::AppendBatchResponse resp;
    grpc::Status s = client_->stub().AppendBatch(Ctx().get(), req, &resp);
    EXPECT_EQ(resp.items_size(), 2);
    if (resp.items_size() == 2) {
      EXPECT_EQ(resp.items(0).code(), static_cast<int>(Code::NOT_FOUND));
      EXPECT_EQ(resp.items(1).code(), static_cast<int>(Code::INVALID_ARGUMENT));
    }
    return s;
  });
}

TEST_F(BadInputTest, OtherSessionsAndTenantsSequencesLookUnknown) {
  auto a2 = Open(*client_, "team-a");  // same tenant, another session
  auto b = Open(*client_, "team-b");   // another tenant
  ASSERT_TRUE(a2.ok() && b.ok()) << a2.status() << " / " << b.status();
  WaitAllConnected();
  for (const auto* other : {a2->get(), b->get()}) {
    const v1::SessionRef ref = other->Ref();
    const std::string who = other == a2->get() ? "same tenant, other session" : "other tenant";
    ExpectRejected(who + ": Append", Code::NOT_FOUND, [&] { return RawAppend(ref, seq_, Tokens(1, 1)); });
    ExpectRejected(who + ": AppendInline", Code::NOT_FOUND, [&] {
      return RawAppendInline(ref, seq_, Tokens(1, 1), KvBytes(1, false), KvBytes(1, false),
                             v1::AppendInlineRequest::DTYPE_F16);
    });
    ExpectRejected(who + ": Read", Code::NOT_FOUND, [&] { return RawRead(ref, seq_, 0, 0, 1); });
    ExpectRejected(who + ": Fork", Code::NOT_FOUND, [&] { return RawFork(ref, seq_); });
    ExpectRejected(who + ": Release", Code::NOT_FOUND, [&] { return RawRelease(ref, {seq_}); });
  }
  // Lookup: the same tenant sees team-a's cached prefix (sink + one tile = 128 tokens); the
  // other tenant sees nothing, and neither its listing nor its Stats show team-a's sessions.
  auto same = (*a2)->Lookup(prompt_);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(*same, 2u * kTile);
  auto cross = (*b)->Lookup(prompt_);
  ASSERT_TRUE(cross.ok());
  EXPECT_EQ(*cross, 0u);
  auto listing = (*b)->ListSequences();
  ASSERT_TRUE(listing.ok());
  EXPECT_EQ(listing->sequences_size(), 0);
  auto stats = (*b)->Stats();
  ASSERT_TRUE(stats.ok());
  for (const auto& si : stats->session_info()) EXPECT_EQ(si.tenant(), "team-b");
  // Creating the same prompt as team-b adopts nothing.
  auto q = (*b)->CreateSequence(prompt_);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->cached_tokens, 0u);
}

TEST_F(BadInputTest, EvictingAnotherTenantWithoutAdminIsPermissionDenied) {
  // team-a's blocks become cached (unreferenced) and so evictable.
  const uint64_t ids[] = {seq_};
  ASSERT_TRUE(a_->Release(ids).ok());
  auto b = Open(*client_, "team-b");
  ASSERT_TRUE(b.ok());
  WaitAllConnected();
  const v1::SessionRef ref = (*b)->Ref();
  ExpectRejected("SCOPE_TENANT team-a", Code::PERMISSION_DENIED,
                 [&] { return RawEvict(ref, v1::EvictRequest::SCOPE_TENANT, "team-a"); });
  ExpectRejected("SCOPE_ALL", Code::PERMISSION_DENIED, [&] { return RawEvict(ref, v1::EvictRequest::SCOPE_ALL, ""); });
  ExpectRejected("SCOPE_BYTES", Code::PERMISSION_DENIED,
                 [&] { return RawEvict(ref, v1::EvictRequest::SCOPE_BYTES, "", 1 << 20); });
  ExpectRejected("SCOPE_UNSPECIFIED", Code::INVALID_ARGUMENT,
                 [&] { return RawEvict(ref, v1::EvictRequest::SCOPE_UNSPECIFIED, ""); });
  // team-b evicting its own tenant touches nothing of team-a's.
  auto own = (*b)->Evict(v1::EvictRequest::SCOPE_TENANT);
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(own->blocks(), 0u);
  auto still = a_->Lookup(prompt_);
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(*still, 2u * kTile);
  // The admin may (control): both of team-a's cached blocks go.
  auto by_admin = admin_->Evict(v1::EvictRequest::SCOPE_TENANT, 0, "team-a");
  ASSERT_TRUE(by_admin.ok()) << by_admin.status();
  EXPECT_EQ(by_admin->blocks(), 2u);
  auto gone = a_->Lookup(prompt_);
  ASSERT_TRUE(gone.ok());
  EXPECT_EQ(*gone, 0u);
}

TEST_F(BadInputTest, OversizeMessagesAreResourceExhausted) {
  const v1::SessionRef ref = Ref(*a_);
  // --max_message_mb=1: 600 tokens of f32 K/V are 1.2 MiB.
  const std::vector<uint32_t> ids = Tokens(1, 600);
  ExpectRejected("1.2 MiB AppendInline", Code::RESOURCE_EXHAUSTED, [&] {
    return RawAppendInline(ref, seq_, ids, KvBytes(600, true), KvBytes(600, true), v1::AppendInlineRequest::DTYPE_F32);
  });
  ExpectRejected("CreateSequence with a 1.5 MB prompt", Code::RESOURCE_EXHAUSTED,
                 [&] { return RawCreate(ref, Tokens(1u << 21, 500000)); });
  // Within the message limit but over the daemon's read limit (4096 tokens).
  ExpectRejected("Read of 5000 tokens", Code::INVALID_ARGUMENT, [&] { return RawRead(ref, seq_, 0, 0, 5000); });
}

TEST_F(BadInputTest, AppendsPastTheTailAndReadsOutOfRangeAreInvalidArgument) {
  const v1::SessionRef ref = Ref(*a_);
  // The tail holds 10 tokens: 54 positions are free.
  ExpectRejected("inline append of 55", Code::INVALID_ARGUMENT, [&] {
    return RawAppendInline(ref, seq_, Tokens(1, 55), KvBytes(55, false), KvBytes(55, false),
                           v1::AppendInlineRequest::DTYPE_F16);
  });
  ExpectRejected("commit of 55", Code::INVALID_ARGUMENT, [&] { return RawAppend(ref, seq_, Tokens(1, 55)); });
  ExpectRejected("commit of 0", Code::INVALID_ARGUMENT, [&] { return RawAppend(ref, seq_, {}); });
  // The Session API refuses to stage past the tail on the client side.
  const KvData kv = MakeKv(Tokens(1, 55), SmallLayout());
  EXPECT_EQ(a_->Stage(seq_, 55, kv.keys.data(), kv.values.data(), DType::kF16).code(), absl::StatusCode::kInvalidArgument);
  ExpectRejected("Read past the end", Code::INVALID_ARGUMENT,
                 [&] { return RawRead(ref, seq_, 0, 0, static_cast<uint32_t>(prompt_.size() + 1)); });
  ExpectRejected("Read from past the end", Code::INVALID_ARGUMENT,
                 [&] { return RawRead(ref, seq_, 0, prompt_.size(), 1); });
  ExpectRejected("Read of layer 2 of 2", Code::INVALID_ARGUMENT, [&] { return RawRead(ref, seq_, 2, 0, 1); });
  ExpectRejected("Read of 0 tokens", Code::INVALID_ARGUMENT, [&] { return RawRead(ref, seq_, 0, 0, 0); });
}

TEST_F(BadInputTest, StaleEpochIsFailedPrecondition) {
  v1::SessionRef stale = Ref(*a_);
  stale.set_epoch(stale.epoch() + 1);
  ExpectRejected("CreateSequence", Code::FAILED_PRECONDITION, [&] { return RawCreate(stale, Tokens(1, 10)); });
  ExpectRejected("Append", Code::FAILED_PRECONDITION, [&] { return RawAppend(stale, seq_, Tokens(1, 1)); });
  ExpectRejected("AppendInline", Code::FAILED_PRECONDITION, [&] {
    return RawAppendInline(stale, seq_, Tokens(1, 1), KvBytes(1, false), KvBytes(1, false),
                           v1::AppendInlineRequest::DTYPE_F16);
  });
  ExpectRejected("Read", Code::FAILED_PRECONDITION, [&] { return RawRead(stale, seq_, 0, 0, 1); });
  ExpectRejected("Fork", Code::FAILED_PRECONDITION, [&] { return RawFork(stale, seq_); });
  ExpectRejected("Release", Code::FAILED_PRECONDITION, [&] { return RawRelease(stale, {seq_}); });
  ExpectRejected("Evict", Code::FAILED_PRECONDITION,
                 [&] { return RawEvict(stale, v1::EvictRequest::SCOPE_TENANT, ""); });
  ExpectRejected("Lookup", Code::FAILED_PRECONDITION, [&] {
    v1::LookupRequest req;
    *req.mutable_session() = stale;
    v1::LookupResponse resp;
    return client_->stub().Lookup(Ctx().get(), req, &resp);
  });
  ExpectRejected("ListSequences", Code::FAILED_PRECONDITION, [&] {
    v1::ListSequencesRequest req;
    *req.mutable_session() = stale;
    v1::ListSequencesResponse resp;
    return client_->stub().ListSequences(Ctx().get(), req, &resp);
  });
  ExpectRejected("CloseSession", Code::FAILED_PRECONDITION, [&] {
    v1::CloseSessionRequest req;
    *req.mutable_session() = stale;
    v1::CloseSessionResponse resp;
    return client_->stub().CloseSession(Ctx().get(), req, &resp);
  });
  ExpectRejected("Watch", Code::FAILED_PRECONDITION, [&] {
    v1::WatchRequest req;
    *req.mutable_session() = stale;
    auto ctx = Ctx();
    auto reader = client_->stub().Watch(ctx.get(), req);
    v1::BlockEvent e;
    while (reader->Read(&e)) {
    }
    return reader->Finish();
  });
  ExpectRejected("KeepAlive", Code::FAILED_PRECONDITION, [&] {
    auto ctx = Ctx();
    auto stream = client_->stub().KeepAlive(ctx.get());
    v1::KeepAliveRequest req;
    *req.mutable_session() = stale;
    v1::KeepAliveResponse resp;
    if (stream->Write(req)) stream->Read(&resp);
    stream->WritesDone();
    return stream->Finish();
  });
  // The real session is untouched and still alive.
  EXPECT_TRUE(a_->alive());
}

}  // namespace
}  // namespace kvarn::it
