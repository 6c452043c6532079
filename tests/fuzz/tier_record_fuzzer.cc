// libFuzzer over the records a tier serves back to the core: a hostile or buggy tier against
// the real KvCore's onboarding path, in process. Tier 0 is the real DiskTier over a folder the
// input tampers with; tier 1 a MapTier (tests/daemon/core/map_tier.h) that validates what it
// serves as the memcached tier does, playing a poisoned memcached. The core, both tiers and the
// valid records of two prompts (sealed by the core itself as it evicted them) are built once.
//
// Per input, for each of the prompt's 5 block keys and each tier, the input picks what the tier
// holds: the valid record; nothing (on disk: the file deleted behind the index); arbitrary
// bytes (after part of the valid header, or not); the record truncated, extended or with bytes
// flipped; another block's valid record (wrong key, place, parent); the record with header
// fields changed and re-MACed with the right key, as a node holding the secret could (magic,
// version, sizes, fingerprint, key, parent, class, tile index, namespace; the payload resized);
// the record sealed with another secret or for another pool; an fp16 sink with a non-finite
// value, re-MACed; on disk also a symlink, a folder or a FIFO in the file's place. The pool may
// hold the first blocks already. Then CreateSequence onboards the prompt, after a Lookup with
// prefetch or not. Checks, any failure aborts:
// - The spec of a record (tier_record_fuzz_spec.h) says of every variant whether it is served,
//   or which faults may be named; CheckRecord called directly agrees, with the key, without
//   one (a scan) and without the MAC, and reads the header right.
// - A model of the onboarding (docs/tiers.md: for each key the disk, then the map; the first
//   record served and in its place is taken; one out of place is counted and the next tier
//   asked; a key no tier serves ends the prefix, so does a sink the import refuses) gives the
//   prefix and every counter: the disk's hits, misses, errors and rejected records by fault, the
//   map's hits, the core's onboarded blocks, hit tokens and onboard failures per tier. The core
//   matches it exactly; a record the disk rejected is gone from its index and folder; Lookup
//   agrees with the model before and after.
// - Every adopted block holds the original block's bytes; CheckInvariants holds after every
//   core call; after the release and an eviction, nothing is referenced and every block free.
// Nothing waits without a deadline (the disk tier's Flush: 10 s).
//
// Build: tests/fuzz/CMakeLists.txt; run: tests/fuzz/run_fuzzers.sh.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <optional>
#include <span>
#include <vector>

#include "daemon/core/kv_core.h"
#include "daemon/tiers/disk_tier.h"
#include "tests/daemon/core/map_tier.h"
#include "tests/daemon/core/small_model.h"
#include "tests/fuzz/tier_record_fuzz_spec.h"

namespace kvarn::testing::tier_fuzz {
namespace {

constexpr int kLayers = testing::kSmallModelLayers, kHeads = 1, kDim = testing::kSmallModelHeadDim,
              kTile = 64;
constexpr absl::Duration kDeadline = absl::Seconds(10);

// The counters a record's fate moves, from the core's Stats: the disk tier's own, the map's
// hits, and the core's own per tier.
enum Counter : size_t {
  kDiskHits,
  kDiskMisses,
  kDiskErrors,
  kDiskRejected,  // + RecordFault
  kMapHits = kDiskRejected + kRecordFaults,
  kOnboarded,  // + tier
  kHitTokens = kOnboarded + kTiers,
  kFailures = kHitTokens + kTiers,
  kCounters = kFailures + kTiers,
};
using Counts = std::array<uint64_t, kCounters>;
constexpr const char* kCounterNames[kCounters] = {"disk hits",
                                                  "disk misses",
                                                  "disk errors",
                                                  "disk truncated",
                                                  "disk corrupt",
                                                  "disk foreign",
                                                  "disk wrong_key",
                                                  "map hits",
                                                  "disk onboarded",
                                                  "map onboarded",
                                                  "disk hit tokens",
                                                  "map hit tokens",
                                                  "disk onboard failures",
                                                  "map onboard failures"};

// What one tier holds for one key in this input, and what the spec says of it.
struct Variant {
  enum class File : uint8_t { kNone, kBytes, kSymlink, kFolder, kFifo };
  Kind kind = Kind::kValid;
  File file = File::kBytes;
  std::string bytes;      // kBytes: the record (the file's contents, the map's value)
  std::string link;       // kSymlink: its target
  bool served = false;    // CheckRecord (with the key) accepts it
  bool in_place = false;  // served, and its header names exactly this key's place in the chain
  bool poisoned = false;  // served in place, an fp16 payload the import must refuse
  RecordFault fault = RecordFault::kCorrupt;  // not served: the fault the disk tier counts
};

ModelConfig FuzzModel() { return testing::SmallModel("kvarn_k4v2_g64", kTile, kHeads, "fuzz"); }

class Harness {
 public:
  Harness();
  ~Harness();
  void Run(FuzzedDataProvider& in);

 private:
  BlockClass ClassAt(size_t i) const { return i == 0 ? BlockClass::kSink : BlockClass::kQuant; }
  std::string PathOf(const BlockHash& h) const {
    const std::string hex = HashToHex(h);
    return absl::StrCat(disk_dir_, "/", hex.substr(0, 2), "/", hex, ".kvb");
  }
  void CheckInvariants(const char* when) const {
    const absl::Status s = core_->CheckInvariants();
    Check(s.ok(), "invariants ", when, ": ", s.ToString());
  }
  void Flush() const {
    Check(disk_->Flush(absl::Now() + kDeadline), "the disk did not flush in 10 s");
  }
  CoreStats Stats() const {
    auto s = core_->Stats(std::nullopt);
    Check(s.ok(), "Stats: ", s.status().ToString());
    return *s;
  }
  Counts Snapshot() const;
  // Appends `prompt` in full, keeps its blocks' bytes, releases it and evicts the pool, so that
  // both tiers hold its records; returns them, checked, by position.
  std::vector<std::string> Fill(const std::vector<uint32_t>& prompt, std::vector<BlockHash>& keys,
                                std::vector<std::string>* payloads);
  void Restore();
  Variant MakeVariant(size_t t, size_t i, FuzzedDataProvider& in);
  void EditHeader(std::string& r, size_t i, FuzzedDataProvider& in) const;
  void Judge(Variant& v, size_t t, size_t i) const;
  void Apply(size_t i);
  Outcome Ask(size_t t, size_t i, Counts& c);
  size_t Model(size_t start, Counts& c);
  void CheckLookup(const LookupResult& l, size_t pool, const char* when) const;
  void CheckAdopted(const CreateResult& q, size_t prefix) const;
  void CheckOnDisk() const;

  std::string dir_, disk_dir_;
  PoolBackend backend_;
  FakeClock clock_;
  std::unique_ptr<DiskTier> disk_;
  std::unique_ptr<MapTier> map_;
  std::unique_ptr<KvCore> core_;  // goes before the tiers
  SessionRef ref_;
  TierIdentity id_;
  BlockHash ns_{}, other_ns_{}, other_secret_key_{}, other_pool_fingerprint_{};
  uint64_t qbytes_ = 0, fbytes_ = 0, max_file_bytes_ = 0;
  std::vector<uint32_t> prompt_a_, prompt_b_;
  std::vector<BlockHash> keys_a_, keys_b_;
  std::vector<std::string> valid_a_, valid_b_, payload_a_, outside_;
  // This input: what each tier holds for each key; whether the disk's index holds the key, and
  // whether the disk rejected its record.
  std::array<std::array<Variant, kTiers>, kTiles> v_;
  std::array<bool, kTiles> indexed_{}, rejected_{};
};

Harness::Harness() {
  const char* tmp = std::getenv("TMPDIR");
  std::string dir =
      absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/kvarn-tier-fuzz.XXXXXX");
  Check(::mkdtemp(dir.data()) != nullptr, "mkdtemp: ", std::strerror(errno));
  dir_ = dir;
  disk_dir_ = dir_ + "/disk";
  Check(::mkdir((dir_ + "/outside").c_str(), 0700) == 0, "mkdir: ", std::strerror(errno));

  CoreConfig c;
  c.model = FuzzModel();
  Preset p;
  Check(ParsePreset(c.model.preset, &p).ok(), "preset");
  qbytes_ = uint64_t{kLayers} * kHeads * p.RecordBytes(kDim);
  fbytes_ = uint64_t{kLayers} * kHeads * 2 * kTile * kDim * 2;
  max_file_bytes_ = kRecordHeaderBytes + std::max(qbytes_, fbytes_);
  // 8 quantized blocks, 2 sinks, 4 tail slots: one prompt never nears a watermark.
  c.capacity_bytes = 8 * qbytes_ + 6 * fbytes_;
  c.fp16_share = (6.0 * static_cast<double>(fbytes_) + 0.5) / static_cast<double>(c.capacity_bytes);
  c.sink_share = 2.5 / 6.0;
  c.default_tail_slots = 2;
  c.admin_token = "admin";
  c.tenant_salt_secret = "fuzz secret";
  auto core = KvCore::Create(c, &backend_, &clock_, nullptr, nullptr, 7);
  Check(core.ok(), core.status().ToString());
  core_ = std::move(*core);
  Check(core_->layout().quant_block_bytes() == qbytes_ &&
            core_->layout().fp16_block_bytes() == fbytes_,
        "block sizes");
  id_ = core_->tier_identity();
  DiskTierOptions d;
  d.dir = disk_dir_;
  d.capacity_bytes = 64ull << 20;
  auto disk = DiskTier::Open(d, id_);
  Check(disk.ok(), disk.status().ToString());
  disk_ = std::move(*disk);
  map_ = std::make_unique<MapTier>(id_, TierWrite::kOnEvict, "map");
  core_->SetTiers({disk_.get(), map_.get()});

  OpenParams o;
  o.tenant = "t";
  o.layout = FuzzModel();
  o.max_sequences = 2;
  o.admin_token = "admin";
  auto s = core_->OpenSession(o);
  Check(s.ok(), s.status().ToString());
  ref_ = SessionRef{s->session, core_->epoch(), s->secret};
  ns_ = s->prefix_namespace;
  Check(MakeTierIdentity(FuzzModel(), kTile, qbytes_, fbytes_, c.tenant_salt_secret).fingerprint ==
            id_.fingerprint,
        "the pool's fingerprint is not MakeTierIdentity's");
  ModelConfig other = FuzzModel();
  other.model_id = "another model";
  other_pool_fingerprint_ =
      MakeTierIdentity(other, kTile, qbytes_, fbytes_, c.tenant_salt_secret).fingerprint;
  other_secret_key_ =
      MakeTierIdentity(FuzzModel(), kTile, qbytes_, fbytes_, "another secret").mac_key;
  other_ns_ = NamespaceDigest({"fuzz", kLayers, kHeads, kDim, kTile, "kvarn_k4v2_g64", kTile,
                               TenantSalt("u", c.tenant_salt_secret)});

  for (uint32_t i = 0; i < kTiles * kTile + 1; ++i) {
    prompt_a_.push_back(1000 + i);
    prompt_b_.push_back(50000 + i);
  }
  valid_a_ = Fill(prompt_a_, keys_a_, &payload_a_);
  valid_b_ = Fill(prompt_b_, keys_b_, nullptr);
  for (size_t i = 0; i < kTiles; ++i) {
    outside_.push_back(absl::StrCat(dir_, "/outside/", i));
    WriteFile(outside_.back(), valid_a_[i]);  // a symlink's target: the right record, elsewhere
  }
  CheckInvariants("after the setup");
  // The event log is filled to its capacity (65536; nobody reads it): from here on an input
  // frees about what it allocates, which libFuzzer's leak check after each input keys on.
  for (uint64_t n = core_->events().last_seq(); n < 70000; ++n)
    core_->events().Append(BlockEvent{});
}

Harness::~Harness() {
  disk_->SetListener(nullptr);
  map_->SetListener(nullptr);
  core_.reset();
  disk_.reset();
  map_.reset();
  RemoveTree(dir_);
}

std::vector<std::string> Harness::Fill(const std::vector<uint32_t>& prompt,
                                       std::vector<BlockHash>& keys,
                                       std::vector<std::string>* payloads) {
  keys = PromptBlockHashes(ns_, kTile, prompt);
  Check(keys.size() == kTiles, "the prompt has ", keys.size(), " adoptable tiles");
  auto q = core_->CreateSequence(ref_, prompt);
  Check(q.ok() && q->cached_tokens == 0, "the setup's prompt is new");
  for (size_t pos = 0; pos < prompt.size(); pos += kTile) {
    const size_t n = std::min<size_t>(kTile, prompt.size() - pos);
    std::vector<float> k(n * kLayers * kHeads * kDim), v(k.size());
    for (size_t e = 0; e < k.size(); ++e) {
      k[e] = static_cast<float>((prompt[pos] * 31 + e * 7) % 97) * 0.05f - 2.4f;
      v[e] = static_cast<float>((prompt[pos] * 17 + e * 13) % 89) * 0.04f - 1.7f;
    }
    auto a = core_->AppendInline(ref_, q->sequence, std::span(prompt).subspan(pos, n), k.data(),
                                 v.data(), DType::kF32);
    Check(a.ok(), "setup append: ", a.status().ToString());
  }
  auto t = core_->Table(ref_, q->sequence);
  Check(t.ok() && t->has_sink && t->quant_blocks.size() == kTiles - 1,
        "the setup's tiles are not sealed");
  if (payloads != nullptr) {
    payloads->emplace_back(reinterpret_cast<const char*>(backend_.sink) + t->sink_block * fbytes_,
                           fbytes_);
    for (uint32_t b : t->quant_blocks) {
      payloads->emplace_back(reinterpret_cast<const char*>(backend_.quant) + b * qbytes_, qbytes_);
    }
  }
  Check(core_->Release(ref_, std::vector<SequenceId>{q->sequence}).ok(), "setup release");
  Check(core_->Evict(ref_, EvictScope::kAll, 0, "").ok(), "setup evict");
  Flush();
  // Both tiers hold the records the core sealed: the same bytes, valid by the spec (and this
  // harness's HMAC) and by CheckRecord, in their place in the chain, with the pool's bytes.
  std::vector<std::string> records;
  for (size_t i = 0; i < kTiles; ++i) {
    Check(map_->records.contains(keys[i]), "the map lacks block ", i);
    const std::string& r = map_->records[keys[i]];
    RecordFault f;
    Check(ReadFile(PathOf(keys[i])) == r && MacMatches(id_.mac_key, r) &&
              SpecFaults(id_, r, &keys[i], true) == 0 && CheckRecord(id_, r, &keys[i], &f).ok(),
          "the tiers' record of block ", i, " differ, or fail the spec or CheckRecord");
    const RecordMeta m = PeekRecord(r);
    Check(m.cls == ClassAt(i) && m.tile_index == i && m.ns == ns_ &&
              m.parent == (i == 0 ? kRootHash : keys[i - 1]),
          "the record of block ", i, " is not in its place");
    Check(payloads == nullptr || r.substr(kRecordHeaderBytes) == (*payloads)[i],
          "the record of block ", i, " is not the pool's bytes");
    records.push_back(r);
  }
  return records;
}

Counts Harness::Snapshot() const {
  const CoreStats s = Stats();
  Check(s.tiers.size() == kTiers && s.tiers[kDisk].name == "disk" && s.tiers[kMap].name == "map",
        "tiers");
  Counts c{};
  c[kDiskHits] = s.tiers[kDisk].hits;
  c[kDiskMisses] = s.tiers[kDisk].misses;
  c[kDiskErrors] = s.tiers[kDisk].errors;
  for (int f = 0; f < kRecordFaults; ++f) c[kDiskRejected + f] = s.tiers[kDisk].rejected[f];
  c[kMapHits] = s.tiers[kMap].hits;
  for (size_t t = 0; t < kTiers; ++t) {
    c[kOnboarded + t] = s.tiers[t].onboarded_blocks;
    c[kHitTokens + t] = s.tiers[t].hit_tokens;
    c[kFailures + t] = s.tiers[t].onboard_failures;
  }
  return c;
}

// Both tiers hold the prompt's valid records again, the disk's indexed and in their files.
void Harness::Restore() {
  Flush();
  for (size_t i = 0; i < kTiles; ++i) {
    RemovePath(PathOf(keys_a_[i]));
    if (!disk_->Contains(keys_a_[i])) {
      Check(disk_->Put(keys_a_[i], std::make_shared<const std::string>(valid_a_[i]), 0),
            "the disk refused a Put");
    }
  }
  Flush();
  for (size_t i = 0; i < kTiles; ++i) {
    Check(disk_->Contains(keys_a_[i]), "the disk did not take block ", i, " back");
    WriteFile(PathOf(keys_a_[i]), valid_a_[i]);
    map_->records[keys_a_[i]] = valid_a_[i];
    indexed_[i] = true;
    rejected_[i] = false;
  }
}

// One change to a record's header, as a node holding the secret could make it (re-MACed after):
// a field set to a value that is right elsewhere, or a byte of it flipped; or the payload
// resized, from the right one (resizing back restores it), with its size field.
void Harness::EditHeader(std::string& r, size_t i, FuzzedDataProvider& in) const {
  struct Field {
    size_t at;
    int bytes;
  };
  static constexpr Field kFields[] = {
      {0, 8},          {kVersionAt, 4}, {kHeaderBytesAt, 4}, {kFingerprintAt, 32}, {kHashAt, 32},
      {kParentAt, 32}, {kClassAt, 4},   {kTileAt, 4},        {kPayloadAt, 8},      {kNsAt, 32}};
  const size_t pick = in.ConsumeIntegralInRange<size_t>(0, std::size(kFields));
  const uint64_t have = r.size() - kRecordHeaderBytes;
  if (pick == std::size(kFields)) {
    const uint64_t to =
        in.PickValueInArray<uint64_t>({qbytes_, fbytes_, have > 0 ? have - 1 : 0, have + 1, 0});
    std::string payload = valid_a_[i].substr(kRecordHeaderBytes, to);
    payload.resize(to, '\0');
    r.replace(kRecordHeaderBytes, std::string::npos, payload);
    PutLe(r, kPayloadAt, 8, to);
    return;
  }
  const Field f = kFields[pick];
  if (in.ConsumeBool()) {
    r[f.at + in.ConsumeIntegralInRange<size_t>(0, f.bytes - 1)] ^=
        static_cast<char>(in.ConsumeIntegralInRange<int>(1, 255));
  } else if (f.bytes == 32) {  // a key of either prompt, the root, a namespace, a fingerprint
    const size_t n = in.ConsumeIntegralInRange<size_t>(0, 2 * kTiles + 3);
    const BlockHash others[] = {kRootHash, ns_, other_ns_, other_pool_fingerprint_};
    PutHash(r, f.at,
            n < kTiles       ? keys_a_[n]
            : n < 2 * kTiles ? keys_b_[n - kTiles]
                             : others[n - 2 * kTiles]);
  } else {  // a class, a tile index, a size
    PutLe(r, f.at, f.bytes,
          in.PickValueInArray<uint64_t>({0, 1, 2, i - 1, i + 1, kTiles, have - 1, have + 1, qbytes_,
                                         fbytes_, kRecordHeaderBytes, 0xFFFFFFFF,
                                         uint64_t{1} << 32}));
  }
}

Variant Harness::MakeVariant(size_t t, size_t i, FuzzedDataProvider& in) {
  const int kinds = t == kDisk ? kKinds : kMapKinds;
  // A third of the picks is the valid record, so that long valid prefixes stay common.
  const int k = in.ConsumeIntegralInRange<int>(0, kinds + kinds / 2);
  Variant v;
  v.kind = k >= kinds ? Kind::kValid : static_cast<Kind>(k);
  const std::string& own = valid_a_[i];
  v.bytes = own;
  switch (v.kind) {
    case Kind::kValid:
      break;
    case Kind::kAbsent:
      v.file = Variant::File::kNone;
      break;
    case Kind::kGarbage: {
      const size_t keep = in.ConsumeIntegralInRange<size_t>(0, kRecordHeaderBytes);
      const size_t n =
          in.ConsumeIntegralInRange<size_t>(0, in.ConsumeBool() ? 64 : max_file_bytes_ + 64);
      v.bytes = own.substr(0, keep) + in.ConsumeBytesAsString(n);
      break;
    }
    case Kind::kTruncated:
      v.bytes.resize(in.ConsumeIntegralInRange<size_t>(0, own.size() - 1));
      break;
    case Kind::kExtended: {
      const size_t n = in.ConsumeIntegralInRange<size_t>(1, 256);
      std::string tail = in.ConsumeBytesAsString(n);
      tail.resize(n, '\0');
      v.bytes += tail;
      break;
    }
    case Kind::kFlipped:
      for (int f = in.ConsumeIntegralInRange<int>(1, 8); f > 0; --f) {
        const size_t at = in.ConsumeIntegralInRange<size_t>(
            0, in.ConsumeBool() ? kRecordHeaderBytes - 1 : own.size() - 1);
        v.bytes[at] ^= static_cast<char>(in.ConsumeIntegralInRange<int>(1, 255));
      }
      break;
    case Kind::kSwapped: {  // another block's valid record: of this prompt, or of another
      const size_t j = in.ConsumeIntegralInRange<size_t>(0, 2 * kTiles - 2);
      v.bytes = j < kTiles - 1 ? valid_a_[j >= i ? j + 1 : j] : valid_b_[j - (kTiles - 1)];
      break;
    }
    case Kind::kReMaced:
      for (int e = in.ConsumeIntegralInRange<int>(1, 3); e > 0; --e) EditHeader(v.bytes, i, in);
      Remac(id_.mac_key, v.bytes);
      break;
    case Kind::kOtherSecret:
      Remac(other_secret_key_, v.bytes);
      break;
    case Kind::kOtherPool:
      PutHash(v.bytes, kFingerprintAt, other_pool_fingerprint_);
      Remac(id_.mac_key, v.bytes);
      break;
    case Kind::kPoisonedSink: {
      // A sink only: a node with the secret could give any quantized bytes, which no check can
      // tell from the right ones; non-finite fp16 values the import must refuse.
      if (ClassAt(i) != BlockClass::kSink) {
        v.kind = Kind::kValid;
        break;
      }
      const size_t at =
          kRecordHeaderBytes + 2 * in.ConsumeIntegralInRange<size_t>(0, fbytes_ / 2 - 1);
      PutLe(v.bytes, at, 2,
            in.PickValueInArray<uint16_t>({0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFFFF}));
      Remac(id_.mac_key, v.bytes);
      break;
    }
    case Kind::kSymlink: {  // to another block's file, or to the right record outside the tier
      v.file = Variant::File::kSymlink;
      const size_t j = in.ConsumeIntegralInRange<size_t>(0, kTiles);
      v.link = j == kTiles ? outside_[i] : PathOf(keys_a_[j == i ? (i + 1) % kTiles : j]);
      break;
    }
    case Kind::kFolder:
      v.file = Variant::File::kFolder;
      break;
    case Kind::kFifo:
      v.file = Variant::File::kFifo;
      break;
  }
  if (v.file == Variant::File::kBytes && v.bytes == own) v.kind = Kind::kValid;  // changes undone
  ++g.built[static_cast<int>(v.kind)];
  Judge(v, t, i);
  return v;
}

// The spec's verdict on a variant, and CheckRecord's, which must agree.
void Harness::Judge(Variant& v, size_t t, size_t i) const {
  if (v.file != Variant::File::kBytes) return;  // absent, or not a file the disk reads: corrupt
  const std::string& r = v.bytes;
  const bool mac_ok = MacMatches(id_.mac_key, r);
  const std::string what = absl::StrCat(kKindNames[static_cast<int>(v.kind)], " record of block ",
                                        i, " (", r.size(), " bytes)");
  // Three ways: with the key (a Get), without one (a scan), without the MAC (a queued record).
  const unsigned want[3] = {SpecFaults(id_, r, &keys_a_[i], mac_ok),
                            SpecFaults(id_, r, nullptr, mac_ok),
                            SpecFaults(id_, r, &keys_a_[i], true)};
  RecordFault got[3] = {};
  for (int way = 0; way < 3; ++way) {
    ++g.direct_checks;
    absl::StatusOr<RecordMeta> m =
        CheckRecord(id_, r, way == 1 ? nullptr : &keys_a_[i], &got[way], way != 2);
    if (!m.ok()) {
      Check((want[way] & Bit(got[way])) != 0, "CheckRecord (way ", way, ") refuses a ", what, ": ",
            m.status().message(), "; the spec's faults (bits of RecordFault): ", want[way]);
      continue;
    }
    Check(want[way] == 0, "CheckRecord (way ", way, ") accepts a ", what,
          "; the spec's faults: ", want[way]);
    const RecordMeta p = PeekRecord(r);
    Check(m->hash == HashAt(r, kHashAt) && m->parent == HashAt(r, kParentAt) &&
              m->ns == HashAt(r, kNsAt) && m->tile_index == GetLe(r, kTileAt, 4) &&
              static_cast<uint64_t>(m->cls) == GetLe(r, kClassAt, 4) && p.hash == m->hash &&
              p.parent == m->parent && p.ns == m->ns && p.tile_index == m->tile_index &&
              p.cls == m->cls,
          "CheckRecord or PeekRecord misreads the header of a ", what);
  }
  v.served = want[0] == 0;
  v.fault = t == kDisk && r.size() > max_file_bytes_ ? RecordFault::kCorrupt
                                                     : got[0];  // too large to read
  if (!v.served) return;
  v.in_place = GetLe(r, kClassAt, 4) == static_cast<uint64_t>(ClassAt(i)) &&
               HashAt(r, kNsAt) == ns_ && GetLe(r, kTileAt, 4) == i &&
               HashAt(r, kParentAt) == (i == 0 ? kRootHash : keys_a_[i - 1]);
  v.poisoned = v.in_place && ClassAt(i) == BlockClass::kSink &&
               HasNonFiniteHalf(std::string_view(r).substr(kRecordHeaderBytes));
  // The harness's own rule: it re-MACs changed payloads only where no check may pass.
  Check(!v.in_place || v.poisoned || r.substr(kRecordHeaderBytes) == payload_a_[i],
        "harness: an acceptable ", what, " carries other bytes");
}

// Puts block i's variants in the disk's folder (its file) and in the map.
void Harness::Apply(size_t i) {
  const std::string path = PathOf(keys_a_[i]);
  const Variant& d = v_[i][kDisk];
  if (d.file == Variant::File::kBytes) {
    if (d.bytes != valid_a_[i]) WriteFile(path, d.bytes);
  } else {
    RemovePath(path);
  }
  const bool made = d.file == Variant::File::kSymlink ? ::symlink(d.link.c_str(), path.c_str()) == 0
                    : d.file == Variant::File::kFolder ? ::mkdir(path.c_str(), 0700) == 0
                    : d.file == Variant::File::kFifo   ? ::mkfifo(path.c_str(), 0600) == 0
                                                       : true;
  Check(made, "cannot make ", path, ": ", std::strerror(errno));
  if (v_[i][kMap].file == Variant::File::kNone) {
    map_->records.erase(keys_a_[i]);
  } else {
    map_->records[keys_a_[i]] = v_[i][kMap].bytes;
  }
}

// One tier's Get of block i as the model predicts it, with the tier's counters.
Outcome Harness::Ask(size_t t, size_t i, Counts& c) {
  const Variant& v = v_[i][t];
  Outcome o = Outcome::kMiss;
  if (t == kDisk) {
    if (!indexed_[i]) {
      ++c[kDiskMisses];  // not in the index: no file is read
    } else if (v.file == Variant::File::kNone) {
      ++c[kDiskMisses];  // indexed, its file gone: dropped from the index, not counted as bad
      indexed_[i] = false;
    } else if (!v.served) {
      ++c[kDiskMisses];
      ++c[kDiskRejected + static_cast<int>(v.fault)];
      if (v.file == Variant::File::kFolder) ++c[kDiskErrors];  // the tier cannot unlink a folder
      indexed_[i] = false;
      rejected_[i] = true;
      o = Outcome::kRejected;
    } else {
      ++c[kDiskHits];
      o = Outcome::kGood;
    }
  } else if (v.file != Variant::File::kNone) {
    o = v.served ? Outcome::kGood : Outcome::kRejected;
    if (v.served) ++c[kMapHits];
  }
  if (o == Outcome::kGood && !v.in_place) o = Outcome::kOutOfPlace;
  if (o == Outcome::kGood && v.poisoned) o = Outcome::kImportRefused;
  ++g.gets;
  ++g.outcome[static_cast<int>(v.kind)][static_cast<int>(o)];
  if (o == Outcome::kRejected) ++g.fault[static_cast<int>(v.kind)][static_cast<int>(v.fault)];
  return o;
}

// One OnboardPrefix from the pool's prefix `start` (docs/tiers.md, "Onboarding"): the prefix
// adopted, its counters added to `c`.
size_t Harness::Model(size_t start, Counts& c) {
  std::array<size_t, kTiles> from{};
  std::optional<size_t> refused;
  size_t i = start;
  for (; i < kTiles; ++i) {
    std::optional<size_t> took;
    for (size_t t = 0; t < kTiers && !took.has_value(); ++t) {
      const Outcome o = Ask(t, i, c);
      if (o == Outcome::kOutOfPlace) ++c[kFailures + t];
      if (o == Outcome::kGood || o == Outcome::kImportRefused) took = t;
      if (o == Outcome::kImportRefused && !refused.has_value()) {
        refused = i;  // fetched with the batch; its import fails, and the prefix ends there
        ++c[kFailures + t];
      }
    }
    if (!took.has_value()) break;
    from[i] = *took;
  }
  const size_t prefix = std::min(i, refused.value_or(i));
  for (size_t j = start; j < prefix; ++j) {
    ++c[kOnboarded + from[j]];
    c[kHitTokens + from[j]] += kTile;
    ++g.adopted[static_cast<int>(v_[j][from[j]].kind)];
  }
  return prefix;
}

// A Lookup's answer: the pool's prefix, then each key from the first tier that holds it (the
// disk's index, the map's keys), no record read.
void Harness::CheckLookup(const LookupResult& l, size_t pool, const char* when) const {
  std::array<uint64_t, kTiers> want{};
  for (size_t i = pool; i < kTiles; ++i) {
    if (!indexed_[i] && v_[i][kMap].file == Variant::File::kNone) break;
    want[indexed_[i] ? kDisk : kMap] += kTile;
  }
  Check(l.pool_tokens == pool * kTile && l.tier_tokens.size() == kTiers &&
            l.tier_tokens[kDisk].second == want[kDisk] && l.tier_tokens[kMap].second == want[kMap],
        "Lookup ", when, ": ", l.pool_tokens, " pool tokens, then ",
        l.tier_tokens.size() == kTiers
            ? absl::StrCat(l.tier_tokens[0].second, " + ", l.tier_tokens[1].second)
            : "?",
        " from the tiers; the model ", pool * kTile, ", then ", want[kDisk], " + ", want[kMap]);
}

void Harness::CheckAdopted(const CreateResult& q, size_t prefix) const {
  const BlockTableView& t = q.table;
  Check(q.cached_tokens == prefix * kTile && t.tokens == prefix * kTile &&
            t.has_sink == (prefix > 0) && t.quant_blocks.size() == (prefix > 0 ? prefix - 1 : 0),
        "CreateSequence adopted ", q.cached_tokens, " tokens, the model ", prefix * kTile);
  if (prefix == 0) return;
  Check(std::memcmp(backend_.sink + t.sink_block * fbytes_, payload_a_[0].data(), fbytes_) == 0,
        "the adopted sink block is not the original's bytes");
  for (size_t j = 0; j + 1 < prefix; ++j) {
    Check(std::memcmp(backend_.quant + t.quant_blocks[j] * qbytes_, payload_a_[j + 1].data(),
                      qbytes_) == 0,
          "adopted block ", j + 1, " is not the original's bytes");
  }
}

// The disk's index holds what the model says; a rejected record's file is gone (a folder stays:
// the tier unlinks, and counted the error).
void Harness::CheckOnDisk() const {
  for (size_t i = 0; i < kTiles; ++i) {
    Check(disk_->Contains(keys_a_[i]) == indexed_[i], "the disk's index ",
          indexed_[i] ? "lost" : "kept", " block ", i);
    struct stat st;
    const bool there = ::lstat(PathOf(keys_a_[i]).c_str(), &st) == 0;
    Check(!rejected_[i] || there == (v_[i][kDisk].file == Variant::File::kFolder),
          "the disk kept the file of rejected block ", i);
  }
}

void Harness::Run(FuzzedDataProvider& in) {
  ++g.inputs;
  const bool prefetch = in.ConsumeBool();
  const size_t pool = in.ConsumeBool() ? 0 : in.ConsumeIntegralInRange<size_t>(0, kTiles);
  Restore();
  if (pool > 0) {  // the pool holds the first blocks already: onboarding starts after them
    auto l = core_->Lookup(ref_, std::span(prompt_a_).first(pool * kTile + 1), /*prefetch=*/true);
    Check(l.ok() && l->pool_tokens == pool * kTile, "the pool's prefix was not onboarded");
    CheckInvariants("after the prefix was put in the pool");
    Flush();
  }
  for (size_t i = 0; i < kTiles; ++i) {
    for (size_t t = 0; t < kTiers; ++t) v_[i][t] = MakeVariant(t, i, in);
    Apply(i);
  }
  Counts want = Snapshot();
  auto look = core_->Lookup(ref_, prompt_a_);
  Check(look.ok(), "Lookup: ", look.status().ToString());
  CheckLookup(*look, pool, "before onboarding");
  size_t start = pool;
  if (prefetch) {
    start = Model(pool, want);
    look = core_->Lookup(ref_, prompt_a_, /*prefetch=*/true);
    Check(look.ok(), "Lookup with prefetch: ", look.status().ToString());
    CheckInvariants("after a Lookup with prefetch");
    CheckLookup(*look, start, "with prefetch");
  }
  const size_t prefix = Model(start, want);
  auto q = core_->CreateSequence(ref_, prompt_a_);
  Check(q.ok(), "CreateSequence: ", q.status().ToString());
  CheckInvariants("after CreateSequence");
  CheckAdopted(*q, prefix);
  Flush();
  const Counts got = Snapshot();
  for (size_t n = 0; n < kCounters; ++n) {
    Check(got[n] == want[n], kCounterNames[n], ": ", got[n], ", the model ", want[n]);
  }
  CheckOnDisk();
  look = core_->Lookup(ref_, prompt_a_);
  Check(look.ok(), "Lookup: ", look.status().ToString());
  CheckLookup(*look, prefix, "after onboarding");
  ++g.prefixes[prefix];
  g.adopted_blocks += prefix;

  // Nothing of the input is left: released, nothing referenced; evicted, every block free.
  Check(core_->Release(ref_, std::vector<SequenceId>{q->sequence}).ok(), "Release");
  CheckInvariants("after Release");
  CoreStats s = Stats();
  Check(s.sequences == 0 && s.quant_active + s.sink_active + s.quant_sealing + s.sink_sealing == 0,
        "left after the release: ", s.sequences, " sequences, ", s.quant_active + s.sink_active,
        " active and ", s.quant_sealing + s.sink_sealing, " sealing blocks");
  Check(core_->Evict(ref_, EvictScope::kAll, 0, "").ok(), "Evict");
  CheckInvariants("after Evict");
  Flush();
  s = Stats();
  Check(s.quant_free == s.quant_total && s.sink_free == s.sink_total && s.tail_slots_reserved == 2,
        "left after the eviction: ", s.quant_total - s.quant_free, " quantized and ",
        s.sink_total - s.sink_free, " sink blocks, ", s.tail_slots_reserved,
        " tail slots (the session's 2)");
}

Harness* harness = nullptr;

}  // namespace
}  // namespace kvarn::testing::tier_fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kvarn::testing::tier_fuzz::harness;
  if (harness == nullptr) {
    harness = new kvarn::testing::tier_fuzz::Harness();
    std::atexit([] {
      kvarn::testing::tier_fuzz::PrintFigures();
      delete harness;
      harness = nullptr;
    });
  }
  FuzzedDataProvider in(data, size);
  harness->Run(in);
  return 0;
}
