// The fixture and helpers of the tiers' integration tests (tiers_test.cc: the shared
// memcached tier between nodes; tiers_disk_test.cc: the disk tier). Real memcached servers
// (tests/common/memcached_servers.h) started from the test's main thread; kvarnd nodes from
// the IntegrationTest fixture, all sharing one tenant_salt_secret.
//
// The tests read and write memcached values behind kvarnd's back with a minimal text-protocol
// client (one connection per operation, to one server: a key is found by asking each server),
// and name keys and forge records with the tiers' own helpers (MemcachedKey, SealRecord).
#ifndef KVARN_TESTS_INTEGRATION_TIER_FIXTURE_H_
#define KVARN_TESTS_INTEGRATION_TIER_FIXTURE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/prefix_hash.h"
#include "daemon/core/block_record.h"
#include "daemon/tiers/memcached_tier.h"
#include "tests/common/memcached_servers.h"
#include "tests/integration/fixture.h"

namespace kvarn::it {

inline constexpr char kSecret[] = "it-tier-secret";
inline constexpr char kKeyPrefix[] = "kvarn1:";  // kvarnd's default memcached_key_prefix

// ---- memcached, spoken to directly ----

// The value of `key` on the server at `port`; nullopt when it has none.
absl::StatusOr<std::optional<std::string>> McGet(int port, const std::string& key);
absl::Status McSet(int port, const std::string& key, const std::string& value);
// Which living server holds `key` (-1: none); INTERNAL if two do.
absl::StatusOr<int> McFind(const ::kvarn::testing::MemcachedServers& servers,
                           const std::string& key);

// ---- prompts, blocks, tiers ----

// The prefix hashes of a prompt's adoptable tiles in `s`'s namespace (the daemon's own
// PrefixHashes: floor((len - 1) / tile) tiles).
std::vector<BlockHash> Hashes(const Session& s, std::span<const uint32_t> prompt);
// The bytes of each block of a table in prefix order (the sink, then the quantized blocks),
// read through the session's mapping of the pool.
std::vector<std::string> BlockBytes(const Session& s, const SequenceTable& t);
// Lookup's tokens for `tier` (a test failure if it names no such tier).
uint64_t TierTokens(const v1::LookupResponse& r, const std::string& tier);
// Stats' row of `tier` (a test failure if there is none).
v1::StatsResponse::Tier TierStats(Session& s, const std::string& tier);
uint64_t Rejected(const v1::StatsResponse::Tier& t, const std::string& fault);
// Polls Stats until `tier` has written at least `blocks` records and its queue is empty
// (20 s deadline).
absl::Status AwaitWritten(Session& s, const std::string& tier, uint64_t blocks);
// Creates a sequence for `prompt` and appends the rest of it past what was adopted (the full
// tiles are sealed); the sequence's final table.
absl::StatusOr<SequenceTable> Prefill(Session& s, std::span<const uint32_t> prompt,
                                      uint64_t* seq = nullptr);
// Prefill, then releases the sequence; with `bytes`, the bytes of every block of its table,
// read before the release.
absl::Status PrefillAndRelease(Session& s, std::span<const uint32_t> prompt,
                               std::vector<std::string>* bytes = nullptr);
// A prompt of `tiles` full tiles and 10 more tokens: all `tiles` are adoptable.
std::vector<uint32_t> Prompt(uint32_t first, size_t tiles);

// A small pool: 8 quantized blocks; 6 fp16 blocks: 4 sinks, 2 tail slots (a session's).
// Quantized blocks run out before sinks do, so a prompt loses its quantized blocks first, its
// sink later. The flags include the tier secret.
inline constexpr uint32_t kQuant = 8, kFp16 = 6, kSinks = 4;
std::vector<std::string> SmallPoolFlags();
// Prefills and releases `n` prompts of `tiles` tiles (tokens from `*first` on, which it
// advances): churn that makes a small pool evict.
absl::Status Churn(Session& s, uint32_t* first, int n, size_t tiles = 4);

// The disk tier's file of a block (daemon/tiers/disk_tier.h).
std::string DiskPath(const std::string& dir, const BlockHash& h);
void WriteFile(const std::string& path, const std::string& bytes);
// A valid record of another pool (same secret, another model id: only its fingerprint differs)
// for block `index` of a chain, with `payload` as its bytes.
std::string ForeignRecord(const Session& s, const std::vector<BlockHash>& hashes, size_t index,
                          const std::string& payload);

class TiersTest : public IntegrationTest {
 protected:
  // Three memcached servers, started from this (the test's main) thread.
  void StartMemcached(int count = 3) {
    ::kvarn::testing::MemcachedServerOptions o;
    o.count = count;
    auto s = ::kvarn::testing::MemcachedServers::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    memcached_ = std::move(*s);
  }
  std::vector<std::string> NodeFlags() const {
    return {"--memcached_servers=" + absl::StrJoin(memcached_->addresses(), ","),
            absl::StrCat("--tenant_salt_secret=", kSecret)};
  }
  // A node of the shared tier, its client and a session of `tenant`.
  struct Node {
    Daemon* daemon = nullptr;
    std::unique_ptr<Client> client;
    std::unique_ptr<Session> session;
  };
  void StartNode(Node& n, const std::string& tenant, std::vector<std::string> extra = {}) {
    std::vector<std::string> flags = NodeFlags();
    flags.insert(flags.end(), extra.begin(), extra.end());
    n.daemon = StartDaemon(flags);
    ASSERT_NE(n.daemon, nullptr);
    n.client = Connect(*n.daemon);
    ASSERT_NE(n.client, nullptr);
    auto s = Open(*n.client, tenant);
    ASSERT_TRUE(s.ok()) << s.status();
    n.session = std::move(*s);
  }
  // Two nodes of the shared tier with sessions of the same tenant.
  void StartTwoNodes(Node& n1, Node& n2, const std::string& tenant) {
    ASSERT_NO_FATAL_FAILURE(StartNode(n1, tenant));
    ASSERT_NO_FATAL_FAILURE(StartNode(n2, tenant));
  }
  std::string Key(const BlockHash& h) const { return MemcachedKey(kKeyPrefix, h); }

  std::unique_ptr<::kvarn::testing::MemcachedServers> memcached_;
};

}  // namespace kvarn::it

#endif  // KVARN_TESTS_INTEGRATION_TIER_FIXTURE_H_
