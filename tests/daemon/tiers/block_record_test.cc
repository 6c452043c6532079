// The record a tier stores (daemon/core/block_record.h): round trip, and each fault CheckRecord
// tells apart.
#include "daemon/core/block_record.h"

#include <gtest/gtest.h>

#include <string>

namespace kvarn {
namespace {

ModelConfig Model() {
  ModelConfig m;
  m.model_id = "llama-3-8b";
  m.num_layers = 32;
  m.num_kv_heads = 8;
  m.head_dim = 128;
  return m;
}

TierIdentity Identity(const ModelConfig& model = Model(), std::string_view secret = "s3cret") {
  return MakeTierIdentity(model, 128, /*quant_block_bytes=*/1000, /*sink_block_bytes=*/3000,
                          secret);
}

BlockHash HashOf(uint8_t seed) {
  BlockHash h{};
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint8_t>(seed * 7 + i);
  return h;
}

RecordMeta Meta(BlockClass cls = BlockClass::kQuant) {
  RecordMeta m;
  m.hash = HashOf(1);
  m.parent = HashOf(2);
  m.cls = cls;
  m.tile_index = 5;
  m.ns = HashOf(3);
  return m;
}

std::string Build(const TierIdentity& id, const RecordMeta& meta) {
  std::string r = NewRecord(id, meta.cls);
  for (size_t i = kRecordHeaderBytes; i < r.size(); ++i) r[i] = static_cast<char>(i * 13 + 1);
  SealRecord(id, meta, r);
  return r;
}

// The fault CheckRecord reports (with `meta.hash` expected); kRecordFaults when it accepts.
int FaultOf(const TierIdentity& id, const std::string& record,
            const BlockHash& expect = Meta().hash) {
  RecordFault fault = RecordFault::kCorrupt;
  absl::StatusOr<RecordMeta> got = CheckRecord(id, record, &expect, &fault);
  if (got.ok()) return kRecordFaults;
  EXPECT_TRUE(absl::IsDataLoss(got.status())) << got.status();
  EXPECT_NE(got.status().message().find(RecordFaultName(fault)), absl::string_view::npos)
      << got.status();
  return static_cast<int>(fault);
}

constexpr int kTruncated = static_cast<int>(RecordFault::kTruncated);
constexpr int kCorrupt = static_cast<int>(RecordFault::kCorrupt);
constexpr int kForeign = static_cast<int>(RecordFault::kForeign);
constexpr int kWrongKey = static_cast<int>(RecordFault::kWrongKey);

TEST(BlockRecordTest, RoundTripsEveryFieldOfBothClasses) {
  const TierIdentity id = Identity();
  for (BlockClass cls : {BlockClass::kQuant, BlockClass::kSink}) {
    const RecordMeta meta = Meta(cls);
    const std::string r = Build(id, meta);
    ASSERT_EQ(r.size(), kRecordHeaderBytes + id.payload_bytes(cls));
    EXPECT_EQ(r.substr(0, 8), "KVARNBLK");
    RecordFault fault = RecordFault::kCorrupt;
    absl::StatusOr<RecordMeta> got = CheckRecord(id, r, &meta.hash, &fault);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->hash, meta.hash);
    EXPECT_EQ(got->parent, meta.parent);
    EXPECT_EQ(got->cls, cls);
    EXPECT_EQ(got->tile_index, 5u);
    EXPECT_EQ(got->ns, meta.ns);
    EXPECT_EQ(PeekRecord(r).ns, meta.ns);
    // Scanning (no key expected) reads the same fields.
    absl::StatusOr<RecordMeta> scanned = CheckRecord(id, r, nullptr, &fault);
    ASSERT_TRUE(scanned.ok()) << scanned.status();
    EXPECT_EQ(scanned->hash, meta.hash);
    const std::span<const uint8_t> payload = RecordPayload(r);
    ASSERT_EQ(payload.size(), id.payload_bytes(cls));
    for (size_t i = 0; i < payload.size(); ++i) {
      ASSERT_EQ(payload[i], static_cast<uint8_t>((i + kRecordHeaderBytes) * 13 + 1)) << i;
    }
  }
}

TEST(BlockRecordTest, EveryShorterLengthIsTruncated) {
  const TierIdentity id = Identity();
  const std::string r = Build(id, Meta());
  for (size_t len : {size_t{0}, size_t{1}, size_t{8}, size_t{100}, kRecordHeaderBytes - 1,
                     kRecordHeaderBytes, kRecordHeaderBytes + 1, r.size() / 2, r.size() - 1}) {
    EXPECT_EQ(FaultOf(id, r.substr(0, len)), kTruncated) << len;
  }
}

TEST(BlockRecordTest, AnyFlippedBitIsRejected) {
  const TierIdentity id = Identity();
  const std::string r = Build(id, Meta());
  for (size_t byte = 0; byte < r.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = r;
      bad[byte] = static_cast<char>(bad[byte] ^ (1 << bit));
      // A payload size (offset 120) made larger than the bytes there reads as truncated;
      // every other change is corrupt: bad fields, or the MAC.
      const bool size_grew = byte >= 120 && byte < 128 && (r[byte] & (1 << bit)) == 0;
      ASSERT_EQ(FaultOf(id, bad), size_grew ? kTruncated : kCorrupt)
          << "byte " << byte << " bit " << bit;
    }
  }
}

TEST(BlockRecordTest, AnotherPoolsRecordIsForeign) {
  ModelConfig other = Model();
  other.preset = "kvarn_k4v4_g128";
  EXPECT_EQ(FaultOf(Identity(), Build(Identity(other), Meta())), kForeign);
  other = Model();
  other.num_layers = 16;
  EXPECT_EQ(FaultOf(Identity(), Build(Identity(other), Meta())), kForeign);
}

TEST(BlockRecordTest, AnotherSecretFailsTheMac) {
  EXPECT_EQ(FaultOf(Identity(Model(), "s3cret"), Build(Identity(Model(), "other"), Meta())),
            kCorrupt);
}

TEST(BlockRecordTest, WithoutTheMacCheckOnlyThePayloadGoesUnchecked) {
  // For a record the process sealed itself (a tier's queue): the header is still checked.
  const TierIdentity id = Identity();
  std::string r = Build(id, Meta());
  r[kRecordHeaderBytes + 17] ^= 4;
  RecordFault fault = RecordFault::kTruncated;
  const BlockHash expect = Meta().hash;
  EXPECT_EQ(FaultOf(id, r), kCorrupt);
  EXPECT_TRUE(CheckRecord(id, r, &expect, &fault, /*verify_mac=*/false).ok());
  const BlockHash other = HashOf(9);
  EXPECT_FALSE(CheckRecord(id, r, &other, &fault, /*verify_mac=*/false).ok());
  EXPECT_EQ(fault, RecordFault::kWrongKey);
  ModelConfig deeper = Model();
  deeper.num_layers = 16;
  EXPECT_FALSE(CheckRecord(id, Build(Identity(deeper), Meta()), &expect, &fault, /*verify_mac=*/false).ok());
  EXPECT_EQ(fault, RecordFault::kForeign);
  std::string short_record = Build(id, Meta());
  short_record.resize(short_record.size() - 1);
  EXPECT_FALSE(CheckRecord(id, short_record, &expect, &fault, /*verify_mac=*/false).ok());
  EXPECT_EQ(fault, RecordFault::kTruncated);
}

TEST(BlockRecordTest, ExpectedHashMismatchIsWrongKey) {
  const TierIdentity id = Identity();
  const std::string r = Build(id, Meta());
  EXPECT_EQ(FaultOf(id, r, HashOf(9)), kWrongKey);
  EXPECT_EQ(FaultOf(id, r, Meta().hash), kRecordFaults);
}

TEST(BlockRecordTest, PayloadSizeNotTheClassesIsForeign) {
  const TierIdentity id = Identity();
  // A quantized block's payload under the sink class, sealed by the same pool.
  std::string r = NewRecord(id, BlockClass::kQuant);
  SealRecord(id, Meta(BlockClass::kSink), r);
  EXPECT_EQ(FaultOf(id, r), kForeign);
  // Same fingerprint and key, another block size: a record the pool's blocks cannot hold.
  TierIdentity bigger = id;
  bigger.quant_block_bytes += 64;
  EXPECT_EQ(FaultOf(id, Build(bigger, Meta())), kForeign);
}

TEST(BlockRecordTest, TrailingBytesAreCorrupt) {
  const TierIdentity id = Identity();
  EXPECT_EQ(FaultOf(id, Build(id, Meta()) + "x"), kCorrupt);
}

TEST(BlockRecordTest, IdentityCoversModelAndSizesKeyCoversSecret) {
  const TierIdentity base = Identity();
  ModelConfig m = Model();
  m.model_id = "llama-3-8c";
  EXPECT_NE(Identity(m).fingerprint, base.fingerprint);
  m = Model();
  m.sink_tokens = 0;
  EXPECT_NE(Identity(m).fingerprint, base.fingerprint);
  EXPECT_NE(MakeTierIdentity(Model(), 64, 1000, 3000, "s3cret").fingerprint, base.fingerprint);
  EXPECT_NE(MakeTierIdentity(Model(), 128, 1001, 3000, "s3cret").fingerprint, base.fingerprint);
  const TierIdentity other_secret = Identity(Model(), "other");
  EXPECT_EQ(other_secret.fingerprint, base.fingerprint);
  EXPECT_NE(other_secret.mac_key, base.mac_key);
}

TEST(BlockRecordTest, FaultNames) {
  EXPECT_STREQ(RecordFaultName(RecordFault::kTruncated), "truncated");
  EXPECT_STREQ(RecordFaultName(RecordFault::kCorrupt), "corrupt");
  EXPECT_STREQ(RecordFaultName(RecordFault::kForeign), "foreign");
  EXPECT_STREQ(RecordFaultName(RecordFault::kWrongKey), "wrong_key");
}

}  // namespace
}  // namespace kvarn
