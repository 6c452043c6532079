// The memcached tier against three real memcached servers on loopback (memcached_servers.h).
#include "daemon/tiers/memcached_tier.h"

#include <libmemcached/memcached.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "common/mutex.h"
#include "daemon/core/block_record.h"  // BlockHash, ChainHash (prefix_hash.h) with it
#include "gtest/gtest.h"
#include "tests/common/memcached_servers.h"

namespace kvarn {
namespace {

using kvarn::testing::MemcachedServers;

constexpr uint64_t kQuantBytes = 700 * 1024;  // a record of two default chunks
constexpr uint64_t kSinkBytes = 64 * 1024;    // a record of one chunk

ModelConfig Model(const std::string& id = "test-model") {
  ModelConfig m;
  m.model_id = id;
  m.num_layers = 4;
  m.num_kv_heads = 2;
  return m;
}

TierIdentity Identity(const std::string& secret = "secret",
                      const std::string& model = "test-model") {
  return MakeTierIdentity(Model(model), 128, kQuantBytes, kSinkBytes, secret);
}

BlockHash HashOf(uint32_t i) {
  const uint32_t tokens[] = {i, i * 7 + 1, 42};
  return ChainHash(kRootHash, BlockHash{}, tokens);
}

std::string MakeRecord(const TierIdentity& id, const BlockHash& hash, BlockClass cls,
                       uint32_t seed) {
  std::string record = NewRecord(id, cls);
  std::mt19937 rng(seed);
  for (size_t i = kRecordHeaderBytes; i < record.size(); ++i) record[i] = static_cast<char>(rng());
  SealRecord(id, RecordMeta{hash, kRootHash, cls, 0}, record);
  return record;
}

std::shared_ptr<const std::string> Shared(std::string s) {
  return std::make_shared<const std::string>(std::move(s));
}

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

struct HandleDeleter {
  void operator()(memcached_st* m) const { memcached_free(m); }
};
using Handle = std::unique_ptr<memcached_st, HandleDeleter>;

class MemcachedTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<MemcachedServers>> servers = MemcachedServers::Start();
    ASSERT_TRUE(servers.ok()) << servers.status();
    servers_ = std::move(*servers);
    for (int i = 0; i < servers_->size(); ++i) {
      Handle h(memcached_create(nullptr));
      ASSERT_EQ(
          memcached_server_add(h.get(), "127.0.0.1", static_cast<in_port_t>(servers_->port(i))),
          MEMCACHED_SUCCESS);
      direct_.push_back(std::move(h));
    }
  }

  MemcachedTierOptions Options() const {
    MemcachedTierOptions o;
    o.servers = servers_->addresses();
    return o;
  }
  std::unique_ptr<MemcachedTier> Open(const MemcachedTierOptions& o,
                                      const TierIdentity& id = Identity()) {
    absl::StatusOr<std::unique_ptr<MemcachedTier>> tier = MemcachedTier::Open(o, id);
    EXPECT_TRUE(tier.ok()) << tier.status();
    return tier.ok() ? std::move(*tier) : nullptr;
  }

  // Straight to one server, past the tier and its hashing.
  bool Has(int server, const std::string& key) {
    size_t len = 0;
    uint32_t flags = 0;
    memcached_return_t rc;
    char* v = memcached_get(direct_[server].get(), key.data(), key.size(), &len, &flags, &rc);
    std::free(v);
    return rc == MEMCACHED_SUCCESS;
  }
  std::string Value(int server, const std::string& key) {
    size_t len = 0;
    uint32_t flags = 0;
    memcached_return_t rc;
    char* v = memcached_get(direct_[server].get(), key.data(), key.size(), &len, &flags, &rc);
    std::string out = v == nullptr ? std::string() : std::string(v, len);
    std::free(v);
    return out;
  }
  void SetValue(int server, const std::string& key, const std::string& value) {
    ASSERT_EQ(memcached_set(direct_[server].get(), key.data(), key.size(), value.data(),
                            value.size(), 0, 0),
              MEMCACHED_SUCCESS);
  }
  void Delete(int server, const std::string& key) {
    ASSERT_EQ(memcached_delete(direct_[server].get(), key.data(), key.size(), 0),
              MEMCACHED_SUCCESS);
  }
  // The server holding `key`; -1 if none, -2 if several.
  int Owner(const std::string& key) {
    int owner = -1;
    for (int i = 0; i < servers_->size(); ++i) {
      if (Has(i, key)) owner = owner == -1 ? i : -2;
    }
    return owner;
  }
  // Puts `record` through the tier and returns the server it landed on.
  int PutAndLocate(MemcachedTier& tier, const BlockHash& hash, const std::string& record) {
    EXPECT_TRUE(tier.Put(hash, Shared(record), 1));
    EXPECT_TRUE(tier.Flush(Soon()));
    return Owner(MemcachedKey("kvarn1:", hash));
  }

  std::unique_ptr<MemcachedServers> servers_;
  std::vector<Handle> direct_;
};

TEST_F(MemcachedTierTest, RoundTripsSmallAndMultiChunkRecordsByteIdentical) {
  auto tier = Open(Options());
  ASSERT_NE(tier, nullptr);
  const TierIdentity id = Identity();
  const std::string sink = MakeRecord(id, HashOf(1), BlockClass::kSink, 1);
  const std::string quant = MakeRecord(id, HashOf(2), BlockClass::kQuant, 2);
  ASSERT_TRUE(tier->Put(HashOf(1), Shared(sink), 7));
  ASSERT_TRUE(tier->Put(HashOf(2), Shared(quant), 7));
  ASSERT_TRUE(tier->Flush(Soon()));

  absl::StatusOr<std::string> got = tier->Get(HashOf(1));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, sink);
  got = tier->Get(HashOf(2));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, quant);

  // The quant record is two chunks on one server; the frame names them.
  const std::string key = MemcachedKey("kvarn1:", HashOf(2));
  const int owner = Owner(key);
  ASSERT_GE(owner, 0);
  EXPECT_EQ(Owner(MemcachedChunkKey(key, 1)), owner);
  EXPECT_EQ(Value(owner, key), MemcachedValues(quant, 512 * 1024)[0]);
  EXPECT_EQ(Owner(MemcachedChunkKey(key, 2)), -1);

  const TierStats s = tier->Stats();
  EXPECT_EQ(s.written_blocks, 2u);
  EXPECT_EQ(s.written_bytes, sink.size() + quant.size());
  EXPECT_EQ(s.blocks, 2u);
  EXPECT_EQ(s.hits, 2u);
  EXPECT_EQ(s.misses, 0u);
  EXPECT_EQ(s.read_bytes, sink.size() + quant.size());
  EXPECT_EQ(s.queued_blocks, 0u);
  EXPECT_EQ(s.errors, 0u);
  EXPECT_EQ(tier->Get(HashOf(3)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(tier->Stats().misses, 1u);
}

TEST_F(MemcachedTierTest, SmallChunksKeepEveryChunkOnTheMainKeysServer) {
  MemcachedTierOptions o = Options();
  o.chunk_bytes = 64 * 1024;
  auto tier = Open(o);
  ASSERT_NE(tier, nullptr);
  const TierIdentity id = Identity();
  for (uint32_t i = 0; i < 6; ++i) {
    const std::string record = MakeRecord(id, HashOf(i), BlockClass::kQuant, i);
    const std::vector<std::string> values = MemcachedValues(record, o.chunk_bytes);
    ASSERT_EQ(values.size(), 11u);  // 700 KiB + 192 in 64 KiB chunks, the frame in the first
    const int owner = PutAndLocate(*tier, HashOf(i), record);
    ASSERT_GE(owner, 0);
    const std::string key = MemcachedKey("kvarn1:", HashOf(i));
    for (uint32_t c = 0; c < values.size(); ++c) {
      EXPECT_EQ(Owner(MemcachedChunkKey(key, c)), owner) << "chunk " << c;
      EXPECT_LE(Value(owner, MemcachedChunkKey(key, c)).size(), o.chunk_bytes);
    }
    absl::StatusOr<std::string> got = tier->Get(HashOf(i));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, record);
  }
  // A reader with the default chunk_bytes reads them too (a second mget for the rest).
  auto reader = Open(Options());
  ASSERT_NE(reader, nullptr);
  absl::StatusOr<std::string> got = reader->Get(HashOf(3));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, MakeRecord(id, HashOf(3), BlockClass::kQuant, 3));
}

TEST_F(MemcachedTierTest, SpreadsRecordsOverAllServers) {
  auto tier = Open(Options());
  ASSERT_NE(tier, nullptr);
  const TierIdentity id = Identity();
  for (uint32_t i = 0; i < 60; ++i)
    ASSERT_TRUE(tier->Put(HashOf(i), Shared(MakeRecord(id, HashOf(i), BlockClass::kSink, i)), 1));
  ASSERT_TRUE(tier->Flush(Soon()));
  std::map<int, int> per_server;
  for (uint32_t i = 0; i < 60; ++i) ++per_server[Owner(MemcachedKey("kvarn1:", HashOf(i)))];
  EXPECT_EQ(per_server.count(-1), 0u);
  EXPECT_EQ(per_server.count(-2), 0u);
  for (int s = 0; s < 3; ++s) EXPECT_GE(per_server[s], 8) << "server " << s;  // ~20 each
}

TEST_F(MemcachedTierTest, KilledServerMissesOnlyItsShareQuickly) {
  auto tier = Open(Options());
  ASSERT_NE(tier, nullptr);
  const TierIdentity id = Identity();
  constexpr uint32_t kBlocks = 60;
  std::vector<std::string> records;
  for (uint32_t i = 0; i < kBlocks; ++i) {
    records.push_back(MakeRecord(id, HashOf(i), BlockClass::kSink, i));
    ASSERT_TRUE(tier->Put(HashOf(i), Shared(records.back()), 1));
  }
  ASSERT_TRUE(tier->Flush(Soon()));
  std::vector<int> owner;
  for (uint32_t i = 0; i < kBlocks; ++i) owner.push_back(Owner(MemcachedKey("kvarn1:", HashOf(i))));
  // Every reader handle has connections to all three before the kill.
  for (uint32_t i = 0; i < kBlocks; ++i) ASSERT_TRUE(tier->Get(HashOf(i)).ok());

  constexpr int kDead = 1;
  servers_->Kill(kDead);
  const TierStats before = tier->Stats();
  uint64_t hits = 0, misses = 0, dead_share = 0;
  absl::Duration slowest;
  for (int pass = 0; pass < 2; ++pass) {  // the second after the dead server's failures counted
    for (uint32_t i = 0; i < kBlocks; ++i) {
      const absl::Time start = absl::Now();
      absl::StatusOr<std::string> got = tier->Get(HashOf(i));
      slowest = std::max(slowest, absl::Now() - start);
      if (owner[i] == kDead) {
        ++dead_share;
        EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound) << i;
        ++misses;
      } else {
        ASSERT_TRUE(got.ok()) << i << ": " << got.status();
        EXPECT_EQ(*got, records[i]);
        ++hits;
      }
      EXPECT_EQ(tier->Contains(HashOf(i)), owner[i] != kDead) << i;
    }
  }
  EXPECT_GT(dead_share, 0u);
  EXPECT_LT(slowest, absl::Seconds(1)) << "a Get waited on the dead server";
  const TierStats after = tier->Stats();
  EXPECT_EQ(after.hits - before.hits, hits);
  EXPECT_EQ(after.misses - before.misses, misses);
  EXPECT_GT(after.errors, before.errors);
  for (uint64_t r : after.rejected) EXPECT_EQ(r, 0u);

  // Writes of the dead server's keys fail or go to the living servers; nothing crashes or hangs.
  for (uint32_t i = kBlocks; i < kBlocks + 20; ++i) {
    ASSERT_TRUE(tier->Put(HashOf(i), Shared(MakeRecord(id, HashOf(i), BlockClass::kSink, i)), 1));
  }
  EXPECT_TRUE(tier->Flush(Soon()));
  const TierStats written = tier->Stats();
  EXPECT_EQ(written.written_blocks + written.dropped_writes, kBlocks + 20);
}

TEST_F(MemcachedTierTest, HungServerMissesWithinTheTimeout) {
  auto tier = Open(Options());  // timeout 250 ms
  ASSERT_NE(tier, nullptr);
  const TierIdentity id = Identity();
  const int owner = PutAndLocate(*tier, HashOf(5), MakeRecord(id, HashOf(5), BlockClass::kSink, 5));
  ASSERT_GE(owner, 0);
  servers_->Pause(owner);
  absl::Time start = absl::Now();
  EXPECT_EQ(tier->Get(HashOf(5)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  start = absl::Now();
  EXPECT_FALSE(tier->Contains(HashOf(5)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_GE(tier->Stats().errors, 1u);
  servers_->Resume(owner);
}

// Each corruption is written straight into the server that holds the key.
TEST_F(MemcachedTierTest, RejectsBadValuesByFaultAndDeletesThem) {
  auto tier = Open(Options());
  ASSERT_NE(tier, nullptr);
  Mutex mu;
  std::vector<BlockHash> left;  // stored = false events
  tier->SetListener([&](const BlockHash& h, bool stored, uint32_t) {
    if (stored) return;
    MutexLock lock(&mu);
    left.push_back(h);
  });
  const TierIdentity id = Identity();
  const uint32_t chunk = 512 * 1024;
  struct Case {
    const char* name;
    RecordFault fault;
    std::function<std::vector<std::string>(const std::string& good, const BlockHash& h)>
        values;  // empty: custom
  };
  const std::vector<Case> cases = {
      {"garbage", RecordFault::kCorrupt,
       [](const std::string&, const BlockHash&) { return std::vector<std::string>{"hello"}; }},
      {"flipped byte", RecordFault::kCorrupt,
       [&](const std::string& good, const BlockHash&) {
         std::string bad = good;
         bad[kRecordHeaderBytes + 1000] ^= 0x01;
         return MemcachedValues(bad, chunk);
       }},
      {"flipped frame magic", RecordFault::kCorrupt,
       [&](const std::string& good, const BlockHash&) {
         std::vector<std::string> v = MemcachedValues(good, chunk);
         v[0][0] = 'X';
         return v;
       }},
      {"truncated", RecordFault::kTruncated,
       [&](const std::string& good, const BlockHash&) {
         std::vector<std::string> v = MemcachedValues(good, chunk);
         v[0].resize(v[0].size() - 100);
         return v;
       }},
      {"foreign identity", RecordFault::kForeign,
       [&](const std::string&, const BlockHash& h) {
         return MemcachedValues(
             MakeRecord(Identity("secret", "other-model"), h, BlockClass::kSink, 9), chunk);
       }},
      {"another secret", RecordFault::kCorrupt,
       [&](const std::string&, const BlockHash& h) {
         return MemcachedValues(MakeRecord(Identity("another secret"), h, BlockClass::kSink, 9),
                                chunk);
       }},
      {"another key's record", RecordFault::kWrongKey,
       [&](const std::string&, const BlockHash&) {
         return MemcachedValues(MakeRecord(id, HashOf(999), BlockClass::kSink, 9), chunk);
       }},
  };
  uint32_t n = 100;
  std::array<uint64_t, kRecordFaults> expected{};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const BlockHash h = HashOf(n++);
    const std::string good = MakeRecord(id, h, BlockClass::kSink, n);
    const int owner = PutAndLocate(*tier, h, good);
    ASSERT_GE(owner, 0);
    const std::string key = MemcachedKey("kvarn1:", h);
    const std::vector<std::string> values = c.values(good, h);
    for (uint32_t i = 0; i < values.size(); ++i)
      SetValue(owner, MemcachedChunkKey(key, i), values[i]);
    EXPECT_EQ(tier->Get(h).status().code(), absl::StatusCode::kNotFound);
    ++expected[static_cast<int>(c.fault)];
    EXPECT_EQ(tier->Stats().rejected, expected);
    EXPECT_FALSE(Has(owner, key)) << "not deleted";
    EXPECT_EQ(tier->Get(h).status().code(), absl::StatusCode::kNotFound);  // now a plain miss
    EXPECT_EQ(tier->Stats().rejected, expected);
  }

  // A multi-chunk record missing a chunk: truncated; every chunk deleted.
  const BlockHash h = HashOf(n++);
  const int owner = PutAndLocate(*tier, h, MakeRecord(id, h, BlockClass::kQuant, n));
  ASSERT_GE(owner, 0);
  const std::string key = MemcachedKey("kvarn1:", h);
  Delete(owner, MemcachedChunkKey(key, 1));
  SetValue(owner, MemcachedChunkKey(key, 2), "a stale chunk the frame does not name");
  EXPECT_EQ(tier->Get(h).status().code(), absl::StatusCode::kNotFound);
  ++expected[static_cast<int>(RecordFault::kTruncated)];
  EXPECT_EQ(tier->Stats().rejected, expected);
  EXPECT_FALSE(Has(owner, key));

  // Every deletion is told to the listener, from the writer thread, which tells the events
  // before the writes queued after them: a write flushed behind them means all were told.
  ASSERT_TRUE(tier->Put(HashOf(n), Shared(MakeRecord(id, HashOf(n), BlockClass::kSink, n)), 1));
  ASSERT_TRUE(tier->Flush(Soon()));
  MutexLock lock(&mu);
  EXPECT_EQ(left.size(), cases.size() + 1);
}

TEST_F(MemcachedTierTest, ContainsNeitherFetchesNorCreates) {
  auto tier = Open(Options());
  ASSERT_NE(tier, nullptr);
  const TierIdentity id = Identity();
  EXPECT_FALSE(tier->Contains(HashOf(1)));
  EXPECT_EQ(Owner(MemcachedKey("kvarn1:", HashOf(1))), -1) << "Contains stored an item";
  PutAndLocate(*tier, HashOf(2), MakeRecord(id, HashOf(2), BlockClass::kQuant, 2));
  EXPECT_TRUE(tier->Contains(HashOf(2)));
  const TierStats s = tier->Stats();
  EXPECT_EQ(s.hits + s.misses, 0u);
  EXPECT_EQ(s.read_bytes, 0u);
}

TEST_F(MemcachedTierTest, QueueBoundDropsWhatDoesNotFit) {
  const TierIdentity id = Identity();
  const std::string record = MakeRecord(id, HashOf(0), BlockClass::kSink, 0);
  MemcachedTierOptions o = Options();
  o.queue_bytes = 2 * record.size() + 10;
  o.timeout = absl::Seconds(20);  // the writer waits on the paused servers, holding its record
  auto tier = Open(o);
  ASSERT_NE(tier, nullptr);
  for (int s = 0; s < 3; ++s) servers_->Pause(s);
  EXPECT_TRUE(tier->Put(HashOf(0), Shared(record), 1));
  EXPECT_TRUE(tier->Put(HashOf(1), Shared(MakeRecord(id, HashOf(1), BlockClass::kSink, 1)), 1));
  EXPECT_FALSE(tier->Put(HashOf(2), Shared(MakeRecord(id, HashOf(2), BlockClass::kSink, 2)), 1));
  TierStats s = tier->Stats();
  EXPECT_EQ(s.dropped_writes, 1u);
  EXPECT_EQ(s.queued_blocks, 2u);
  EXPECT_EQ(s.queued_bytes, 2 * record.size());
  EXPECT_FALSE(tier->Flush(absl::Now() + absl::Milliseconds(50)));
  for (int s = 0; s < 3; ++s) servers_->Resume(s);
  ASSERT_TRUE(tier->Flush(Soon()));
  s = tier->Stats();
  EXPECT_EQ(s.written_blocks, 2u);
  EXPECT_EQ(s.queued_blocks, 0u);
  EXPECT_EQ(s.queued_bytes, 0u);
  EXPECT_TRUE(tier->Get(HashOf(0)).ok());
  EXPECT_TRUE(tier->Get(HashOf(1)).ok());
  EXPECT_EQ(tier->Get(HashOf(2)).status().code(), absl::StatusCode::kNotFound);
  // Never larger than this pool's records, nor null.
  EXPECT_FALSE(
      tier->Put(HashOf(3), Shared(std::string(kRecordHeaderBytes + kQuantBytes + 1, 'x')), 1));
  EXPECT_FALSE(tier->Put(HashOf(3), nullptr, 1));
  EXPECT_EQ(tier->Stats().dropped_writes, 3u);
}

TEST_F(MemcachedTierTest, FlushWaitsUntilEveryRecordIsWrittenAndTold) {
  auto tier = Open(Options());
  ASSERT_NE(tier, nullptr);
  Mutex mu;
  std::map<uint32_t, int> stored_by_tenant;
  tier->SetListener([&](const BlockHash&, bool stored, uint32_t tenant) {
    MutexLock lock(&mu);
    if (stored) ++stored_by_tenant[tenant];
  });
  const TierIdentity id = Identity();
  for (uint32_t i = 0; i < 20; ++i) {
    ASSERT_TRUE(tier->Put(
        HashOf(i),
        Shared(MakeRecord(id, HashOf(i), i % 2 ? BlockClass::kQuant : BlockClass::kSink, i)),
        i % 2 + 1));
  }
  ASSERT_TRUE(tier->Flush(Soon()));
  const TierStats s = tier->Stats();
  EXPECT_EQ(s.written_blocks, 20u);
  EXPECT_EQ(s.queued_blocks, 0u);
  EXPECT_EQ(s.dropped_writes, 0u);
  {
    MutexLock lock(&mu);
    EXPECT_EQ(stored_by_tenant[1], 10);
    EXPECT_EQ(stored_by_tenant[2], 10);
  }
  for (uint32_t i = 0; i < 20; ++i) EXPECT_TRUE(tier->Contains(HashOf(i))) << i;
  EXPECT_TRUE(tier->Flush(absl::Now()));  // an empty queue: at once, even past the deadline
}

TEST_F(MemcachedTierTest, AnotherNodeWithTheSameIdentityReadsWhatOneWrote) {
  auto writer = Open(Options());
  ASSERT_NE(writer, nullptr);
  const TierIdentity id = Identity();
  std::vector<std::string> records;
  for (uint32_t i = 0; i < 30; ++i) {
    records.push_back(MakeRecord(id, HashOf(i), i % 3 ? BlockClass::kSink : BlockClass::kQuant, i));
    ASSERT_TRUE(writer->Put(HashOf(i), Shared(records.back()), 1));
  }
  ASSERT_TRUE(writer->Flush(Soon()));
  // Another node lists the servers in another order: ketama maps keys the same.
  MemcachedTierOptions o = Options();
  std::reverse(o.servers.begin(), o.servers.end());
  auto reader = Open(o);
  ASSERT_NE(reader, nullptr);
  for (uint32_t i = 0; i < 30; ++i) {
    absl::StatusOr<std::string> got = reader->Get(HashOf(i));
    ASSERT_TRUE(got.ok()) << i << ": " << got.status();
    EXPECT_EQ(*got, records[i]);
  }
  EXPECT_EQ(reader->Stats().hits, 30u);
  EXPECT_EQ(reader->Stats().written_blocks, 0u);
}

TEST_F(MemcachedTierTest, DestructorFinishesTheQueueWithinItsBound) {
  MemcachedTierOptions o = Options();
  o.close_timeout = absl::Seconds(1);
  auto tier = Open(o);
  ASSERT_NE(tier, nullptr);
  const TierIdentity id = Identity();
  for (int s = 0; s < 3; ++s) servers_->Pause(s);
  for (uint32_t i = 0; i < 20; ++i)
    ASSERT_TRUE(tier->Put(HashOf(i), Shared(MakeRecord(id, HashOf(i), BlockClass::kSink, i)), 1));
  const absl::Time start = absl::Now();
  tier.reset();
  // close_timeout plus one record's waits (250 ms each), with room for a slow machine.
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
  for (int s = 0; s < 3; ++s) servers_->Resume(s);
}

TEST_F(MemcachedTierTest, ConcurrentGetsContainsAndPutsStayConsistent) {
  MemcachedTierOptions o = Options();
  o.read_handles = 2;  // fewer handles than threads: readers wait for one
  auto tier = Open(o);
  ASSERT_NE(tier, nullptr);
  const TierIdentity id = Identity();
  constexpr uint32_t kKeys = 16;
  std::vector<std::shared_ptr<const std::string>> records;
  for (uint32_t i = 0; i < kKeys; ++i)
    records.push_back(
        Shared(MakeRecord(id, HashOf(i), i % 4 ? BlockClass::kSink : BlockClass::kQuant, i)));
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int op = 0; op < 150; ++op) {
        const uint32_t k = rng() % kKeys;
        switch (rng() % 3) {
          case 0:
            tier->Put(HashOf(k), records[k], t);
            break;
          case 1: {
            absl::StatusOr<std::string> got = tier->Get(HashOf(k));
            if (got.ok() ? *got != *records[k] : got.status().code() != absl::StatusCode::kNotFound)
              ++bad;
            break;
          }
          default:
            tier->Contains(HashOf(k));
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  ASSERT_TRUE(tier->Flush(Soon()));
  for (uint32_t i = 0; i < kKeys; ++i) tier->Put(HashOf(i), records[i], 0);
  ASSERT_TRUE(tier->Flush(Soon()));
  for (uint32_t i = 0; i < kKeys; ++i) {
    absl::StatusOr<std::string> got = tier->Get(HashOf(i));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, *records[i]);
  }
  const TierStats s = tier->Stats();
  for (uint64_t r : s.rejected) EXPECT_EQ(r, 0u);
  EXPECT_EQ(s.errors, 0u);
}

TEST(MemcachedTierOpenTest, RejectsMalformedOptions) {
  const TierIdentity id = Identity();
  MemcachedTierOptions o;
  EXPECT_EQ(MemcachedTier::Open(o, id).status().code(),
            absl::StatusCode::kInvalidArgument);  // no servers
  o.servers = {"127.0.0.1"};
  EXPECT_EQ(MemcachedTier::Open(o, id).status().code(), absl::StatusCode::kInvalidArgument);
  o.servers = {"127.0.0.1:99999"};
  EXPECT_EQ(MemcachedTier::Open(o, id).status().code(), absl::StatusCode::kInvalidArgument);
  o.servers = {"127.0.0.1:11211"};
  o.key_prefix = "a b";
  EXPECT_EQ(MemcachedTier::Open(o, id).status().code(), absl::StatusCode::kInvalidArgument);
  o.key_prefix = std::string(200, 'k');
  EXPECT_EQ(MemcachedTier::Open(o, id).status().code(), absl::StatusCode::kInvalidArgument);
  o.key_prefix = "kvarn1:";
  o.chunk_bytes = 100;
  EXPECT_EQ(MemcachedTier::Open(o, id).status().code(), absl::StatusCode::kInvalidArgument);
  o.chunk_bytes = 2048;  // 700 KiB records in 2 KiB chunks: over kMaxChunks
  EXPECT_EQ(MemcachedTier::Open(o, id).status().code(), absl::StatusCode::kInvalidArgument);
  o.chunk_bytes = 512 * 1024;
  o.expire_seconds = 31 * 24 * 3600;
  EXPECT_EQ(MemcachedTier::Open(o, id).status().code(), absl::StatusCode::kInvalidArgument);
  o.expire_seconds = 3600;
  // A server that is down is not an Open error: it only misses.
  EXPECT_TRUE(MemcachedTier::Open(o, id).ok());
}

}  // namespace
}  // namespace kvarn
