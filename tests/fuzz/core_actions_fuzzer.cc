// libFuzzer over sequences of core actions: sessions opened, closed, expired (a fake clock
// moves), streams attached and detached, sequences created, appended (inline, staged in the
// shared tail, batched), forked, released, read, looked up, evicted, watchers taken, memory
// lent, tenants reconfigured, blocks spilled to a tier below the pool and onboarded back (the
// tier's records corrupted, truncated, swapped or dropped behind the core's back); random
// sizes, ids and payloads (NaN included). After every
// action the core's CheckInvariants must hold and an expected-state model (kept here, outside
// the core) must agree with what the core reports: the sessions and sequences that exist, each
// sequence's token count, and that a session is ended exactly when its lease says so.
//
// Any failure aborts (libFuzzer reports it as a crash). Build: tests/fuzz/CMakeLists.txt;
// run: tests/fuzz/run_fuzzers.sh.
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "daemon/core/kv_core.h"
#include "kernels/fp16.h"
#include "tests/daemon/core/map_tier.h"
#include "tests/daemon/core/small_model.h"

namespace kvarn {
namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "core_actions_fuzzer: %s\n", what.c_str());
  std::abort();
}

// Actions run over the whole fuzzing session, printed at exit (the figure).
uint64_t g_actions = 0, g_inputs = 0, g_spilled = 0, g_onboarded = 0;
void PrintActions() {
  std::fprintf(stderr, "core_actions_fuzzer: %llu actions in %llu inputs, invariants and model checked after each; "
               "%llu blocks spilled to the tier, %llu onboarded from it\n",
               static_cast<unsigned long long>(g_actions), static_cast<unsigned long long>(g_inputs),
               static_cast<unsigned long long>(g_spilled), static_cast<unsigned long long>(g_onboarded));
}

void Expect(bool cond, const std::string& what) {
  if (!cond) Fail(what);
}

// Heap memory that remembers the live tail regions, so the fuzzer can play a client writing
// its tail (a region leaves the list when the core destroys it).
class TailBackend final : public MemoryBackend {
 public:
  absl::StatusOr<std::unique_ptr<Region>> Create(RegionKind kind, size_t bytes) override {
    auto r = heap_.Create(kind, bytes);
    if (!r.ok() || kind != RegionKind::kTail) return r;
    tails.push_back((*r)->data());
    return std::unique_ptr<Region>(new Tracked(std::move(*r), &tails));
  }
  const char* name() const override { return "heap"; }
  bool host_accessible() const override { return true; }
  std::vector<uint8_t*> tails;

 private:
  class Tracked final : public Region {
   public:
    Tracked(std::unique_ptr<Region> r, std::vector<uint8_t*>* list) : r_(std::move(r)), list_(list) {}
    ~Tracked() override { std::erase(*list_, r_->data()); }
    uint8_t* data() const override { return r_->data(); }
    size_t size() const override { return r_->size(); }
    SegmentInfo Describe() const override { return r_->Describe(); }

   private:
    std::unique_ptr<Region> r_;
    std::vector<uint8_t*>* list_;
  };
  HeapBackend heap_;
};

constexpr int kLayers = testing::kSmallModelLayers, kHeads = 2, kDim = testing::kSmallModelHeadDim,
              kTile = 64;

ModelConfig Model() { return testing::SmallModel("kvarn_k4v2_g64", kTile, kHeads, "fuzz"); }

struct ModelSession {
  SessionRef ref;
  uint32_t tenant = 0;
  int streams = 0;
  bool stream_seen = false;
  std::set<SequenceId> seqs;
};

struct ModelSequence {
  SessionId session = 0;
  uint64_t tokens = 0;
};

class Harness {
 public:
  Harness() {
    CoreConfig c;
    c.model = Model();
    Preset p;
    if (!ParsePreset(c.model.preset, &p).ok()) Fail("preset");
    const uint64_t q = uint64_t{kLayers} * kHeads * p.RecordBytes(kDim);
    const uint64_t f = uint64_t{kLayers} * kHeads * 2 * kTile * kDim * 2;
    // 10 quantized blocks, 4 sinks, 12 tail slots: small enough that eviction and
    // exhaustion happen all the time.
    c.capacity_bytes = 10 * q + 16 * f;
    c.fp16_share = (16.0 * static_cast<double>(f) + 0.5) / static_cast<double>(c.capacity_bytes);
    c.sink_share = 4.5 / 16.0;
    c.lease_ttl = absl::Seconds(5);
    c.keepalive_interval = absl::Seconds(1);
    c.grace = absl::Seconds(1);
    c.default_tail_slots = 2;
    c.max_tail_slots = 8;
    c.max_observer_sessions = 3;
    c.max_watchers = 4;
    c.tenant_max_watchers = 2;
    c.admin_token = "admin";
    auto core = KvCore::Create(c, &backend_, &clock_, nullptr, nullptr, 7);
    if (!core.ok()) Fail(core.status().ToString());
    core_ = std::move(*core);
    fbytes_ = f;
    tier_ = std::make_unique<testing::MapTier>(core_->tier_identity(), TierWrite::kOnEvict);
    core_->SetTiers({tier_.get()});
  }

  void CountTierTraffic() {
    auto st = core_->Stats(std::nullopt);
    if (!st.ok() || st->tiers.empty()) return;
    g_spilled += st->tiers[0].spilled_blocks;
    g_onboarded += st->tiers[0].onboarded_blocks;
  }

  void Run(FuzzedDataProvider& in) {
    for (int step = 0; step < 400 && in.remaining_bytes() > 0; ++step) {
      const int op = in.ConsumeIntegralInRange<int>(0, 22);
      Act(op, in);
      ++g_actions;
      const absl::Status inv = core_->CheckInvariants();
      if (!inv.ok()) Fail(absl::StrCat("invariants after op ", op, " (step ", step, "): ", inv.ToString()));
      CheckModel(op);
    }
  }

 private:
  ModelSession* PickSession(FuzzedDataProvider& in) {
    if (sessions_.empty()) return nullptr;
    auto it = sessions_.begin();
    std::advance(it, in.ConsumeIntegralInRange<size_t>(0, sessions_.size() - 1));
    return &it->second;
  }
  // A sequence id: usually a live one, sometimes one that never existed or is another's.
  SequenceId PickSequence(FuzzedDataProvider& in) {
    if (seqs_.empty() || in.ConsumeIntegralInRange<int>(0, 9) == 0) return in.ConsumeIntegralInRange<SequenceId>(0, 64);
    auto it = seqs_.begin();
    std::advance(it, in.ConsumeIntegralInRange<size_t>(0, seqs_.size() - 1));
    return it->first;
  }
  // A reference as a client might present it: usually right, sometimes forged.
  SessionRef Forge(const SessionRef& r, FuzzedDataProvider& in) {
    SessionRef f = r;
    switch (in.ConsumeIntegralInRange<int>(0, 15)) {
      case 0: f.secret[in.ConsumeIntegralInRange<size_t>(0, 31)] ^= 1; break;
      case 1: f.epoch ^= 1; break;
      case 2: f.session += 1000; break;
      default: break;
    }
    return f;
  }
  static bool Forged(const SessionRef& a, const SessionRef& b) { return !(a.session == b.session && a.epoch == b.epoch && a.secret == b.secret); }

  std::vector<uint32_t> Prompt(FuzzedDataProvider& in) {
    static const uint32_t kBases[3] = {0, 100000, 0};
    const uint32_t base = kBases[in.ConsumeIntegralInRange<int>(0, 2)];
    const size_t n = in.ConsumeIntegralInRange<size_t>(0, 4 * kTile + 3);
    std::vector<uint32_t> p(n);
    for (size_t i = 0; i < n; ++i) p[i] = base + static_cast<uint32_t>(i);
    return p;
  }

  // A forged reference is refused: NOT_FOUND (wrong secret or id), FAILED_PRECONDITION (stale
  // epoch), or INVALID_ARGUMENT for a request whose shape is checked before any session is.
  void ExpectForgedRefused(const absl::Status& s, bool forged, const char* what) {
    if (forged) {
      Expect(absl::IsNotFound(s) || absl::IsFailedPrecondition(s) || absl::IsInvalidArgument(s),
             absl::StrCat(what, " with a forged ref: ", s.ToString()));
    }
  }

  void Act(int op, FuzzedDataProvider& in) {
    switch (op) {
      case 0: {  // open
        OpenParams p;
        static const char* kTenants[] = {"a", "b", "c"};
        p.tenant = kTenants[in.ConsumeIntegralInRange<int>(0, 2)];
        p.layout = Model();
        p.observer = in.ConsumeIntegralInRange<int>(0, 5) == 0;
        p.max_sequences = in.ConsumeIntegralInRange<uint32_t>(0, 9);
        p.admin_token = in.ConsumeBool() ? "admin" : "";
        if (in.ConsumeIntegralInRange<int>(0, 20) == 0) p.layout.num_layers = 3;
        auto r = core_->OpenSession(p);
        if (!r.ok()) {
          Expect(absl::IsResourceExhausted(r.status()) || absl::IsInvalidArgument(r.status()) ||
                     (configured_ && absl::IsUnauthenticated(r.status())),
                 r.status().ToString());
          break;
        }
        ModelSession s;
        s.ref = SessionRef{r->session, core_->epoch(), r->secret};
        sessions_[r->session] = s;
        break;
      }
      case 1: {  // close
        ModelSession* s = PickSession(in);
        if (s == nullptr) break;
        const SessionRef ref = Forge(s->ref, in);
        auto r = core_->CloseSession(ref);
        ExpectForgedRefused(r.status(), Forged(ref, s->ref), "CloseSession");
        if (r.ok()) {
          Expect(*r == s->seqs.size(), "CloseSession released a different number of sequences");
          EndModelSession(s->ref.session);
        }
        break;
      }
      case 2: {  // create
        ModelSession* s = PickSession(in);
        if (s == nullptr) break;
        const SessionRef ref = Forge(s->ref, in);
        const std::vector<uint32_t> prompt = Prompt(in);
        auto r = core_->CreateSequence(ref, prompt);
        ExpectForgedRefused(r.status(), Forged(ref, s->ref), "CreateSequence");
        if (!r.ok()) break;
        Expect(r->cached_tokens % kTile == 0 && r->cached_tokens <= (prompt.empty() ? 0 : prompt.size() - 1),
               "adopted more than the prompt allows");
        Expect(r->table.tokens == r->cached_tokens, "a new sequence holds only its adopted tokens");
        s->seqs.insert(r->sequence);
        seqs_[r->sequence] = ModelSequence{s->ref.session, r->cached_tokens};
        break;
      }
      case 3:
      case 4:
      case 5: {  // append inline, or staged + commit
        ModelSession* s = PickSession(in);
        if (s == nullptr) break;
        const SequenceId q = PickSequence(in);
        const bool mine = s->seqs.contains(q);
        const uint64_t have = mine ? seqs_[q].tokens : 0;
        const int room = kTile - static_cast<int>(have % kTile);
        const int n = in.ConsumeIntegralInRange<int>(0, kTile + 1) == 0 ? in.ConsumeIntegralInRange<int>(0, 70)
                                                                         : in.ConsumeIntegralInRange<int>(1, room);
        std::vector<uint32_t> ids(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) ids[i] = static_cast<uint32_t>(have + i + (q * 7919));
        absl::StatusOr<AppendResult> r = absl::UnknownError("");
        const SessionRef ref = Forge(s->ref, in);
        if (op == 3) {
          std::vector<float> k(static_cast<size_t>(n) * kLayers * kHeads * kDim), v(k.size());
          for (size_t i = 0; i < k.size(); ++i) {
            k[i] = static_cast<float>((i * 31 + have) % 17) * 0.25f - 2.0f;
            v[i] = static_cast<float>((i * 7 + have) % 13) * 0.5f - 3.0f;
          }
          if (!k.empty() && in.ConsumeIntegralInRange<int>(0, 30) == 0) k[in.ConsumeIntegralInRange<size_t>(0, k.size() - 1)] = NAN;
          if (!v.empty() && in.ConsumeIntegralInRange<int>(0, 30) == 0) v[0] = 1e30f;
          r = core_->AppendInline(ref, q, ids, k.data(), v.data(), DType::kF32);
        } else {
          // The client writes its tail (possibly garbage, NaN included) and commits.
          if (mine && !backend_.tails.empty() && in.ConsumeIntegralInRange<int>(0, 6) == 0) {
            uint8_t* tail = backend_.tails[in.ConsumeIntegralInRange<size_t>(0, backend_.tails.size() - 1)];
            const size_t off = in.ConsumeIntegralInRange<size_t>(0, fbytes_ - 2) & ~size_t{1};
            const uint16_t bits = in.ConsumeIntegral<uint16_t>();
            std::memcpy(tail + off, &bits, 2);
            tails_scribbled_ = true;
          }
          r = core_->Append(ref, q, ids);
        }
        ExpectForgedRefused(r.status(), Forged(ref, s->ref), "Append");
        if (r.ok()) {
          Expect(mine, "an append to a sequence not of this session succeeded");
          seqs_[q].tokens += static_cast<uint64_t>(n);
          Expect(r->table.tokens == seqs_[q].tokens, "append result disagrees with the model's token count");
          Expect(r->sealed == (seqs_[q].tokens % kTile == 0), "sealed flag disagrees with the tile boundary");
        } else if (absl::IsNotFound(r.status()) && mine && !Forged(ref, s->ref)) {
          Fail(absl::StrCat("own sequence reported unknown: ", r.status().ToString()));
        }
        break;
      }
      case 6: {  // batch of staged commits
        ModelSession* s = PickSession(in);
        if (s == nullptr) break;
        std::vector<std::pair<SequenceId, std::vector<uint32_t>>> raw;
        const int items = in.ConsumeIntegralInRange<int>(0, 4);
        for (int i = 0; i < items; ++i) {
          const SequenceId q = PickSequence(in);
          const uint64_t have = s->seqs.contains(q) ? seqs_[q].tokens : 0;
          const int room = kTile - static_cast<int>(have % kTile);
          const int n = in.ConsumeIntegralInRange<int>(1, room);
          std::vector<uint32_t> ids(static_cast<size_t>(n));
          for (int t = 0; t < n; ++t) ids[t] = static_cast<uint32_t>(have + t + 3);
          raw.emplace_back(q, std::move(ids));
        }
        std::vector<std::pair<SequenceId, std::span<const uint32_t>>> batch;
        for (const auto& [q, ids] : raw) batch.emplace_back(q, ids);
        const SessionRef ref = Forge(s->ref, in);
        auto r = core_->AppendBatch(ref, batch);
        ExpectForgedRefused(r.status(), Forged(ref, s->ref), "AppendBatch");
        if (!r.ok()) break;
        Expect(r->size() == batch.size(), "AppendBatch answered a different number of items");
        for (size_t i = 0; i < batch.size(); ++i) {
          if (!(*r)[i].ok()) continue;
          const SequenceId q = batch[i].first;
          Expect(s->seqs.contains(q), "a batch item of another session succeeded");
          seqs_[q].tokens += batch[i].second.size();
          Expect((*r)[i]->table.tokens == seqs_[q].tokens, "batch item disagrees with the model's token count");
        }
        break;
      }
      case 7: {  // fork
        ModelSession* s = PickSession(in);
        if (s == nullptr) break;
        const SequenceId q = PickSequence(in);
        const SessionRef ref = Forge(s->ref, in);
        auto r = core_->Fork(ref, q);
        ExpectForgedRefused(r.status(), Forged(ref, s->ref), "Fork");
        if (!r.ok()) break;
        Expect(s->seqs.contains(q), "forked a sequence not of this session");
        Expect(r->table.tokens == seqs_[q].tokens, "a fork holds its parent's tokens");
        s->seqs.insert(r->sequence);
        seqs_[r->sequence] = ModelSequence{s->ref.session, seqs_[q].tokens};
        break;
      }
      case 8: {  // release
        ModelSession* s = PickSession(in);
        if (s == nullptr) break;
        std::vector<SequenceId> ids;
        const int n = in.ConsumeIntegralInRange<int>(1, 3);
        for (int i = 0; i < n; ++i) ids.push_back(PickSequence(in));
        const SessionRef ref = Forge(s->ref, in);
        auto r = core_->Release(ref, ids);
        ExpectForgedRefused(r.status(), Forged(ref, s->ref), "Release");
        if (!r.ok()) break;
        for (SequenceId q : ids) {
          Expect(s->seqs.contains(q), "released a sequence not of this session");
          s->seqs.erase(q);
          seqs_.erase(q);
        }
        break;
      }
      case 9: {  // lookup and read
        ModelSession* s = PickSession(in);
        if (s == nullptr) break;
        const SessionRef ref = Forge(s->ref, in);
        const std::vector<uint32_t> prompt = Prompt(in);
        auto l = core_->Lookup(ref, prompt);
        ExpectForgedRefused(l.status(), Forged(ref, s->ref), "Lookup");
        if (l.ok()) Expect(l->total_tokens() % kTile == 0, "lookup returned a partial tile");
        const SequenceId q = PickSequence(in);
        const uint32_t count = in.ConsumeIntegralInRange<uint32_t>(0, 200);
        const uint64_t start = in.ConsumeIntegralInRange<uint64_t>(0, 300);
        std::vector<float> k(static_cast<size_t>(std::max<uint32_t>(count, 1)) * kHeads * kDim), v(k.size());
        const absl::Status rs = core_->Read(ref, q, in.ConsumeIntegralInRange<uint32_t>(0, 2), start, count, k.data(), v.data());
        ExpectForgedRefused(rs, Forged(ref, s->ref), "Read");
        if (rs.ok()) {
          Expect(s->seqs.contains(q) && start + count <= seqs_[q].tokens, "Read beyond what the model holds");
          // Sealed tokens were validated when sealed (the encoder refuses NaN/Inf, the sink
          // copy is scanned): always finite. Unsealed ones are read from the tail as it is
          // now, and this harness scribbles arbitrary bits into tails after their commits.
          const uint64_t sealed = seqs_[q].tokens / kTile * kTile;
          const size_t row = static_cast<size_t>(kHeads) * kDim;
          for (uint32_t t = 0; t < count; ++t) {
            if (tails_scribbled_ && start + t >= sealed) break;
            for (size_t i = 0; i < row; ++i) {
              Expect(std::isfinite(k[t * row + i]) && std::isfinite(v[t * row + i]),
                     "Read returned a non-finite sealed key or value");
            }
          }
        }
        break;
      }
      case 10: {  // evict
        ModelSession* s = PickSession(in);
        if (s == nullptr) break;
        const EvictScope scope = static_cast<EvictScope>(in.ConsumeIntegralInRange<int>(0, 2));
        auto r = core_->Evict(Forge(s->ref, in), scope, in.ConsumeIntegralInRange<uint64_t>(1, 1 << 20),
                              in.ConsumeBool() ? "" : "b");
        (void)r;
        break;
      }
      case 11:
      case 12: {  // time passes; some sessions keep their lease
        clock_.Advance(absl::Milliseconds(in.ConsumeIntegralInRange<int>(0, 3000)));
        for (auto& [id, s] : sessions_) {
          if (in.ConsumeBool()) core_->KeepAlive(s.ref).IgnoreError();
        }
        const int n = core_->ExpireSessions();
        // Which ended: exactly those the core no longer knows. Reconcile the count.
        std::vector<SessionId> gone;
        for (auto& [id, s] : sessions_) {
          if (!core_->CheckSession(s.ref).ok()) gone.push_back(id);
        }
        Expect(static_cast<int>(gone.size()) == n, absl::StrCat("ExpireSessions said ", n, " but ", gone.size(), " ended"));
        for (SessionId id : gone) EndModelSession(id);
        break;
      }
      case 13: {  // keep-alive stream attached / detached, as the service does it
        ModelSession* s = PickSession(in);
        if (s == nullptr) break;
        if (s->streams > 0 && in.ConsumeBool()) {
          core_->DetachStream(s->ref.session);
          --s->streams;
        } else if (core_->AttachStream(s->ref).ok()) {
          ++s->streams;
          s->stream_seen = true;
        }
        break;
      }
      case 14: {  // watchers
        ModelSession* s = PickSession(in);
        if (s == nullptr) break;
        if (in.ConsumeBool()) {
          auto g = core_->AcquireWatcher(Forge(s->ref, in));
          if (g.ok()) ++watchers_[s->ref.session];
        } else if (watchers_[s->ref.session] > 0) {
          core_->ReleaseWatcher(s->ref.session);
          --watchers_[s->ref.session];
        }
        break;
      }
      case 15: {  // lend memory, from this process or another
        ModelSession* s = PickSession(in);
        if (s == nullptr) break;
        auto r = core_->LendMemory(Forge(s->ref, in), in.ConsumeBool() ? 100 : 101, 1);
        if (r.ok()) Expect(!r->empty(), "lent nothing");
        break;
      }
      case 16: {  // stats and listings agree with the model
        ModelSession* s = PickSession(in);
        auto st = core_->Stats(std::nullopt);
        Expect(st.ok(), "Stats without a ref failed");
        if (s != nullptr) {
          auto l = core_->ListSequences(s->ref);
          Expect(l.ok(), "ListSequences of a live session failed");
        }
        break;
      }
      case 17: {  // tenants reconfigured (rare): ends sessions of revoked tenants
        if (in.ConsumeIntegralInRange<int>(0, 30) != 0) break;
        std::vector<TenantSpec> specs;
        for (const char* name : {"a", "b"}) {
          if (!in.ConsumeBool()) continue;
          TenantSpec t;
          t.name = name;
          t.token_sha256 = HashToken(std::string(name) + "-token");
          t.max_tail_slots = in.ConsumeIntegralInRange<uint32_t>(1, 12);
          specs.push_back(t);
        }
        if (!core_->ConfigureTenants(specs).ok()) break;
        configured_ = true;
        std::vector<SessionId> gone;
        for (auto& [id, s] : sessions_) {
          if (!core_->CheckSession(s.ref).ok()) gone.push_back(id);
        }
        for (SessionId id : gone) EndModelSession(id);
        break;
      }
      case 18: {  // open with credentials once tenants are configured
        if (!configured_) break;
        OpenParams p;
        p.tenant = in.ConsumeBool() ? "a" : "b";
        p.tenant_token = in.ConsumeBool() ? p.tenant + "-token" : "guess";
        p.layout = Model();
        p.max_sequences = in.ConsumeIntegralInRange<uint32_t>(0, 3);
        auto r = core_->OpenSession(p);
        if (p.tenant_token == "guess") Expect(!r.ok(), "a wrong tenant token opened a session");
        if (r.ok()) sessions_[r->session] = ModelSession{SessionRef{r->session, core_->epoch(), r->secret}, 0, 0, false, {}};
        break;
      }
      case 19: {  // the tier's records changed behind the core's back: it must never serve them
        if (tier_->records.empty()) break;
        auto it = tier_->records.begin();
        std::advance(it, in.ConsumeIntegralInRange<size_t>(0, tier_->records.size() - 1));
        std::string& rec = it->second;
        if (rec.empty()) {
          tier_->records.erase(it);
          break;
        }
        switch (in.ConsumeIntegralInRange<int>(0, 3)) {
          case 0: rec[in.ConsumeIntegralInRange<size_t>(0, rec.size() - 1)] ^= static_cast<char>(1 + in.ConsumeIntegral<uint8_t>() % 255); break;
          case 1: rec.resize(in.ConsumeIntegralInRange<size_t>(0, rec.size() - 1)); break;
          case 2: rec = tier_->records.begin()->second; break;  // another block's record under this key
          default: tier_->records.erase(it); break;
        }
        break;
      }
      case 20: {  // a stopping daemon's spill: the pool's blocks go to the tier
        const uint64_t before = tier_->puts;
        const uint64_t handed = core_->SpillAll(absl::InfiniteFuture());
        Expect(tier_->puts - before == handed, "SpillAll counted blocks the tier did not take");
        break;
      }
      case 21: {  // a prompt prefilled with its own token ids, so that the same prompt hits later
        ModelSession* s = PickSession(in);
        if (s == nullptr) break;
        const std::vector<uint32_t> prompt = Prompt(in);
        auto r = core_->CreateSequence(s->ref, prompt);
        if (!r.ok()) break;
        s->seqs.insert(r->sequence);
        seqs_[r->sequence] = ModelSequence{s->ref.session, r->cached_tokens};
        for (uint64_t pos = r->cached_tokens; pos < prompt.size();) {
          const size_t n = std::min<size_t>(prompt.size() - pos, kTile - pos % kTile);
          const std::vector<uint32_t> ids(prompt.begin() + static_cast<long>(pos), prompt.begin() + static_cast<long>(pos + n));
          std::vector<float> k(n * kLayers * kHeads * kDim), v(k.size());
          for (size_t i = 0; i < k.size(); ++i) {
            k[i] = static_cast<float>((i * 13 + ids[i % n]) % 23) * 0.2f - 2.0f;
            v[i] = static_cast<float>((i * 5 + ids[i % n]) % 11) * 0.4f - 2.0f;
          }
          auto a = core_->AppendInline(s->ref, r->sequence, ids, k.data(), v.data(), DType::kF32);
          if (!a.ok()) break;
          pos += n;
          seqs_[r->sequence].tokens = pos;
        }
        break;
      }
      default: {  // table of a sequence
        ModelSession* s = PickSession(in);
        if (s == nullptr) break;
        const SequenceId q = PickSequence(in);
        auto t = core_->Table(s->ref, q);
        if (t.ok()) {
          Expect(s->seqs.contains(q), "Table of another session's sequence");
          Expect(t->tokens == seqs_[q].tokens, "Table disagrees with the model");
        } else {
          Expect(!s->seqs.contains(q), absl::StrCat("own sequence's table refused: ", t.status().ToString()));
        }
        break;
      }
    }
  }

  void EndModelSession(SessionId id) {
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return;
    for (SequenceId q : it->second.seqs) seqs_.erase(q);
    watchers_.erase(id);
    sessions_.erase(it);
  }

  void CheckModel(int op) {
    auto st = core_->Stats(std::nullopt);
    Expect(st.ok(), "Stats failed");
    Expect(st->sessions == sessions_.size(), absl::StrCat("after op ", op, ": core has ", st->sessions, " sessions, model ", sessions_.size()));
    Expect(st->sequences == seqs_.size(), absl::StrCat("after op ", op, ": core has ", st->sequences, " sequences, model ", seqs_.size()));
    Expect(st->UsedBytes() <= st->capacity_bytes, "used bytes exceed the capacity");
  }

  TailBackend backend_;
  FakeClock clock_;
  std::unique_ptr<KvCore> core_;
  std::unique_ptr<testing::MapTier> tier_;  // goes before the core, which never calls it as it goes
  uint64_t fbytes_ = 0;
  bool configured_ = false;
  bool tails_scribbled_ = false;  // some tail was written behind the core's back
  std::map<SessionId, ModelSession> sessions_;
  std::map<SequenceId, ModelSequence> seqs_;
  std::map<SessionId, int> watchers_;
};

}  // namespace
}  // namespace kvarn

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::atexit(kvarn::PrintActions);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ++kvarn::g_inputs;
  FuzzedDataProvider in(data, size);
  kvarn::Harness h;
  h.Run(in);
  h.CountTierTraffic();
  return 0;
}
