// The tiers below the pool with real processes: two kvarnd nodes (separate pools) sharing
// three real memcached servers, and a kvarnd with a disk tier restarted on its directory.
// A prompt prefilled on one node is onboarded by the other with the very same bytes; a dead
// server, a corrupt value, another pool's record and another tenant only ever cost misses;
// the disk tier carries a pool across a SIGTERM restart (new epoch) and across eviction, and
// whatever was damaged in its directory is deleted at start, counted and never served.
//
// The test reads and writes memcached values behind kvarnd's back with a minimal text-protocol
// client (one connection per operation, to one server: it finds a key by asking each server),
// and names the keys and records with the tier's own helpers (MemcachedKey, SealRecord).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "absl/strings/str_join.h"
#include "common/prefix_hash.h"
#include "common/unique_fd.h"
#include "daemon/core/block_record.h"
#include "daemon/tiers/memcached_tier.h"
#include "kernels/preset.h"
#include "tests/common/memcached_servers.h"
#include "tests/integration/fixture.h"

namespace kvarn::it {
namespace {

using ::kvarn::testing::MemcachedServerOptions;
using ::kvarn::testing::MemcachedServers;

constexpr char kSecret[] = "it-tier-secret";
constexpr char kKeyPrefix[] = "kvarn1:";  // kvarnd's default memcached_key_prefix
constexpr auto kWait = std::chrono::seconds(20);

// ---- memcached, spoken to directly ----

absl::StatusOr<UniqueFd> McConnect(int port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(absl::StrCat("connect to memcached :", port, ": ", std::strerror(errno)));
  }
  return fd;
}

absl::Status McSend(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::UnavailableError(absl::StrCat("send: ", std::strerror(errno)));
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Reads into `buf` until `complete(buf)` or 5 s pass.
absl::Status McReadUntil(int fd, std::string& buf, const std::function<bool(const std::string&)>& complete) {
  const double deadline = NowMs() + 5000;
  char chunk[65536];
  while (!complete(buf)) {
    const int left = static_cast<int>(deadline - NowMs());
    pollfd p{fd, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, left) <= 0) return absl::DeadlineExceededError("memcached did not answer");
    const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::UnavailableError("memcached closed the connection");
    buf.append(chunk, static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

// The value of `key` on the server at `port`; nullopt when it has none.
absl::StatusOr<std::optional<std::string>> McGet(int port, const std::string& key) {
  auto fd = McConnect(port);
  if (!fd.ok()) return fd.status();
  if (absl::Status s = McSend(fd->get(), "get " + key + "\r\n"); !s.ok()) return s;
  std::string buf;
  size_t want = 0;  // bytes of the whole reply once its first line is known
  absl::Status s = McReadUntil(fd->get(), buf, [&](const std::string& b) {
    const size_t eol = b.find("\r\n");
    if (eol == std::string::npos) return false;
    if (b.rfind("END\r\n", 0) == 0) return true;
    if (want == 0) {
      // VALUE <key> <flags> <bytes>
      const size_t sp = b.rfind(' ', eol);
      want = eol + 2 + std::stoull(b.substr(sp + 1, eol - sp - 1)) + 2 + 5;
    }
    return b.size() >= want;
  });
  if (!s.ok()) return s;
  if (buf.rfind("END\r\n", 0) == 0) return std::optional<std::string>();
  if (buf.rfind("VALUE ", 0) != 0) return absl::InternalError("memcached get: " + buf.substr(0, 80));
  const size_t eol = buf.find("\r\n");
  const size_t sp = buf.rfind(' ', eol);
  const size_t bytes = std::stoull(buf.substr(sp + 1, eol - sp - 1));
  return std::optional<std::string>(buf.substr(eol + 2, bytes));
}

absl::Status McSet(int port, const std::string& key, const std::string& value) {
  auto fd = McConnect(port);
  if (!fd.ok()) return fd.status();
  if (absl::Status s = McSend(fd->get(), absl::StrCat("set ", key, " 0 0 ", value.size(), "\r\n", value, "\r\n")); !s.ok()) {
    return s;
  }
  std::string buf;
  if (absl::Status s = McReadUntil(fd->get(), buf, [](const std::string& b) { return b.find("\r\n") != std::string::npos; });
      !s.ok()) {
    return s;
  }
  if (buf != "STORED\r\n") return absl::InternalError("memcached set: " + buf);
  return absl::OkStatus();
}

// Which living server holds `key` (-1: none).
absl::StatusOr<int> McFind(const MemcachedServers& servers, const std::string& key) {
  int found = -1;
  for (int i = 0; i < servers.size(); ++i) {
    if (!servers.alive(i)) continue;
    auto v = McGet(servers.port(i), key);
    if (!v.ok()) return v.status();
    if (v->has_value()) {
      if (found >= 0) return absl::InternalError(absl::StrCat(key, " on two servers: ", found, " and ", i));
      found = i;
    }
  }
  return found;
}

// ---- prompts, blocks, tiers ----

// The prefix hashes of a prompt's adoptable tiles in `s`'s namespace (the daemon's own
// PrefixHashes: floor((len - 1) / tile) tiles).
std::vector<BlockHash> Hashes(const Session& s, std::span<const uint32_t> prompt) {
  BlockHash ns{};
  EXPECT_EQ(s.prefix_namespace().size(), ns.size());
  std::memcpy(ns.data(), s.prefix_namespace().data(), std::min(ns.size(), s.prefix_namespace().size()));
  std::vector<BlockHash> out;
  BlockHash parent = kRootHash;
  const size_t tiles = prompt.empty() ? 0 : (prompt.size() - 1) / kTile;
  for (size_t i = 0; i < tiles; ++i) {
    parent = ChainHash(parent, ns, prompt.subspan(i * kTile, kTile));
    out.push_back(parent);
  }
  return out;
}

// The bytes of each block of a table in prefix order (the sink, then the quantized blocks),
// read through the session's mapping of the pool.
std::vector<std::string> BlockBytes(const Session& s, const SequenceTable& t) {
  std::vector<std::string> out;
  if (t.has_sink) {
    out.emplace_back(reinterpret_cast<const char*>(s.SinkBlock(t.sink_block)), s.block_layout().fp16_block_bytes());
  }
  for (uint32_t b : t.quant_blocks) {
    out.emplace_back(reinterpret_cast<const char*>(s.QuantBlock(b)), s.block_layout().quant_block_bytes());
  }
  return out;
}

uint64_t TierTokens(const v1::LookupResponse& r, const std::string& tier) {
  for (const auto& t : r.tiers()) {
    if (t.tier() == tier) return t.tokens();
  }
  ADD_FAILURE() << "Lookup names no tier " << tier << ": " << r.DebugString();
  return 0;
}

v1::StatsResponse::Tier TierStats(Session& s, const std::string& tier) {
  auto st = s.Stats();
  EXPECT_TRUE(st.ok()) << st.status();
  if (st.ok()) {
    for (const auto& t : st->tiers()) {
      if (t.name() == tier) return t;
    }
    ADD_FAILURE() << "Stats names no tier " << tier << ": " << st->DebugString();
  }
  return {};
}

uint64_t Rejected(const v1::StatsResponse::Tier& t, const std::string& fault) {
  auto it = t.rejected().find(fault);
  return it == t.rejected().end() ? 0 : it->second;
}

// Polls Stats until `tier` has written at least `blocks` records and its queue is empty.
absl::Status AwaitWritten(Session& s, const std::string& tier, uint64_t blocks) {
  const double deadline = NowMs() + 20000;
  v1::StatsResponse::Tier t;
  for (auto backoff = std::chrono::milliseconds(1);; backoff = std::min(backoff * 2, std::chrono::milliseconds(50))) {
    t = TierStats(s, tier);
    if (t.queued_blocks() == 0 && t.written_blocks() >= blocks) return absl::OkStatus();
    if (NowMs() > deadline) break;
    std::this_thread::sleep_for(backoff);
  }
  return absl::DeadlineExceededError(absl::StrCat(tier, " wrote ", t.written_blocks(), " of ", blocks,
                                                  " blocks in 20 s; queued ", t.queued_blocks()));
}

// Creates a sequence for `prompt` and appends all of it (the tiles past what was adopted are
// sealed); the sequence's final table.
absl::StatusOr<SequenceTable> Prefill(Session& s, std::span<const uint32_t> prompt, uint64_t* seq = nullptr) {
  auto q = s.CreateSequence(prompt);
  if (!q.ok()) return q.status();
  if (seq != nullptr) *seq = q->id;
  return AppendTokens(s, q->id, prompt, q->cached_tokens, prompt.size());
}

// The adoptable tiles of a prompt of `tiles` full tiles and 10 more tokens: all `tiles`.
std::vector<uint32_t> Prompt(uint32_t first, size_t tiles) { return Tokens(first, tiles * kTile + 10); }

// 8 quantized blocks; 6 fp16 blocks: 4 sinks, 2 tail slots (a session's). Quantized blocks
// run out before sinks do, so a prompt loses its quantized blocks first, its sink later.
constexpr uint32_t kQuant = 8, kFp16 = 6, kSinks = 4;
std::vector<std::string> SmallPoolFlags() {
  Preset p;
  EXPECT_TRUE(ParsePreset(SmallLayout().preset, &p).ok());
  const Layout l = SmallLayout();
  const uint64_t qbytes = uint64_t{l.num_layers} * l.num_kv_heads * p.RecordBytes(static_cast<int>(l.head_dim));
  const uint64_t fbytes = uint64_t{l.num_layers} * l.num_kv_heads * 2 * kTile * l.head_dim * 2;
  const uint64_t capacity = kQuant * qbytes + kFp16 * fbytes;
  char share[64], sink_share[64];
  std::snprintf(share, sizeof(share), "%.12f", (static_cast<double>(kFp16 * fbytes) + 0.5) / static_cast<double>(capacity));
  std::snprintf(sink_share, sizeof(sink_share), "%.12f", (kSinks + 0.5) / kFp16);
  return {absl::StrCat("--capacity=", capacity), absl::StrCat("--fp16_share=", share),
          absl::StrCat("--sink_share=", sink_share), absl::StrCat("--tenant_salt_secret=", kSecret)};
}

// Prefills and releases `n` prompts of `tiles` tiles (tokens from `*first` on, which it
// advances): churn that makes a small pool evict.
absl::Status Churn(Session& s, uint32_t* first, int n, size_t tiles = 4) {
  for (int i = 0; i < n; ++i, *first += 1000) {
    uint64_t seq = 0;
    if (absl::Status st = Prefill(s, Prompt(*first, tiles), &seq).status(); !st.ok()) return st;
    const uint64_t ids[] = {seq};
    if (absl::Status st = s.Release(ids); !st.ok()) return st;
  }
  return absl::OkStatus();
}

std::string DiskPath(const std::string& dir, const BlockHash& h) {
  const std::string hex = HashToHex(h);
  return dir + "/" + hex.substr(0, 2) + "/" + hex + ".kvb";
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << "writing " << path;
}

// A valid record of another pool (same secret, another model id: only its fingerprint differs)
// for block `index` of a chain, with `payload` as its bytes.
std::string ForeignRecord(const Session& s, const std::vector<BlockHash>& hashes, size_t index,
                          const std::string& payload) {
  const Layout l = SmallLayout();
  ModelConfig other;
  other.model_id = "another-model";
  other.num_layers = l.num_layers;
  other.num_kv_heads = l.num_kv_heads;
  other.head_dim = l.head_dim;
  other.preset = l.preset;
  other.sink_tokens = l.sink_tokens;
  const TierIdentity id = MakeTierIdentity(other, kTile, s.block_layout().quant_block_bytes(),
                                           s.block_layout().fp16_block_bytes(), kSecret);
  RecordMeta meta;
  meta.hash = hashes[index];
  meta.parent = index == 0 ? kRootHash : hashes[index - 1];
  meta.cls = index == 0 ? BlockClass::kSink : BlockClass::kQuant;
  meta.tile_index = static_cast<uint32_t>(index);
  std::string record = NewRecord(id, meta.cls);
  EXPECT_EQ(record.size(), kRecordHeaderBytes + payload.size());
  std::memcpy(record.data() + kRecordHeaderBytes, payload.data(), std::min(payload.size(), record.size() - kRecordHeaderBytes));
  SealRecord(id, meta, record);
  return record;
}

class TiersTest : public IntegrationTest {
 protected:
  // Three memcached servers, started from this (the test's main) thread.
  void StartMemcached(int count = 3) {
    MemcachedServerOptions o;
    o.count = count;
    auto s = MemcachedServers::Start(o);
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
  std::string Key(const BlockHash& h) const { return MemcachedKey(kKeyPrefix, h); }

  std::unique_ptr<MemcachedServers> memcached_;
};

// 1. A prompt prefilled on node 1 is a memcached hit on node 2, onboarded byte-identical;
//    the /metrics series of both nodes say so.
TEST_F(TiersTest, PromptPrefilledOnOneNodeIsOnboardedByAnotherWithIdenticalBytes) {
  ASSERT_NO_FATAL_FAILURE(StartMemcached());
  Node n1, n2;
  ASSERT_NO_FATAL_FAILURE(StartNode(n1, "team-t"));
  ASSERT_NO_FATAL_FAILURE(StartNode(n2, "team-t"));

  constexpr size_t kTiles = 6;  // the sink and 5 quantized blocks
  const std::vector<uint32_t> prompt = Prompt(40000, kTiles);
  IT_ASSIGN_OR_FAIL(t1, Prefill(*n1.session, prompt));
  ASSERT_TRUE(t1.has_sink);
  ASSERT_EQ(t1.quant_blocks.size(), kTiles - 1);
  const std::vector<std::string> bytes1 = BlockBytes(*n1.session, t1);
  IT_ASSERT_OK(AwaitWritten(*n1.session, "memcached", kTiles));
  const v1::StatsResponse::Tier w1 = TierStats(*n1.session, "memcached");
  EXPECT_EQ(w1.written_blocks(), kTiles);
  EXPECT_EQ(w1.spilled_blocks(), kTiles);
  EXPECT_EQ(w1.write(), "seal");
  // Every block is on exactly one of the servers, under its key.
  const std::vector<BlockHash> hashes = Hashes(*n1.session, prompt);
  ASSERT_EQ(hashes.size(), kTiles);
  for (const BlockHash& h : hashes) {
    IT_ASSIGN_OR_FAIL(server, McFind(*memcached_, Key(h)));
    EXPECT_GE(server, 0) << Key(h) << " is on no server";
  }

  // Node 2's pool has none of it; the memcached tier continues the prefix to its end.
  IT_ASSIGN_OR_FAIL(look, n2.session->LookupTiers(prompt));
  EXPECT_EQ(look.pool_tokens(), 0u);
  EXPECT_EQ(TierTokens(look, "memcached"), kTiles * kTile);
  EXPECT_EQ(look.cached_tokens(), kTiles * kTile);

  IT_ASSIGN_OR_FAIL(q2, n2.session->CreateSequence(prompt));
  EXPECT_EQ(q2.cached_tokens, kTiles * kTile);
  ASSERT_TRUE(q2.table.has_sink);
  ASSERT_EQ(q2.table.quant_blocks.size(), kTiles - 1);
  const std::vector<std::string> bytes2 = BlockBytes(*n2.session, q2.table);
  ASSERT_EQ(bytes2.size(), bytes1.size());
  for (size_t i = 0; i < bytes1.size(); ++i) {
    EXPECT_TRUE(bytes2[i] == bytes1[i]) << "block " << i << " of the prefix differs between the nodes";
  }
  // Dequantized through node 2's mapping, a block reads as on node 1.
  for (size_t i = 0; i < t1.quant_blocks.size(); ++i) {
    IT_ASSIGN_OR_FAIL(d1, DigestQuantBlock(*n1.session, t1.quant_blocks[i]));
    IT_ASSIGN_OR_FAIL(d2, DigestQuantBlock(*n2.session, q2.table.quant_blocks[i]));
    EXPECT_EQ(d1.dequantized, d2.dequantized) << "quantized block " << i;
  }
  const v1::StatsResponse::Tier r2 = TierStats(*n2.session, "memcached");
  EXPECT_EQ(r2.onboarded_blocks(), kTiles);
  EXPECT_EQ(r2.hit_tokens(), kTiles * kTile);
  EXPECT_EQ(r2.hits(), kTiles);
  EXPECT_EQ(r2.onboard_failures(), 0u);
  EXPECT_EQ(r2.errors(), 0u);
  // Onboarded blocks are marked as in memcached: node 2 does not write them back.
  EXPECT_EQ(r2.spilled_blocks(), 0u);
  // Now in node 2's pool: a second lookup is all pool.
  IT_ASSIGN_OR_FAIL(look2, n2.session->LookupTiers(prompt));
  EXPECT_EQ(look2.pool_tokens(), kTiles * kTile);
  EXPECT_EQ(TierTokens(look2, "memcached"), 0u);

  // /metrics of node 2 (onboarded) and node 1 (written), promtool clean.
  const auto scrape = [](Daemon& d, const std::string& name, const std::string& labels, double want) {
    std::string text;
    const double t0 = NowMs();
    for (;;) {  // the exporter caches the core's figures for 100 ms
      auto body = HttpGet(d.metrics_port(), "/metrics");
      EXPECT_TRUE(body.ok()) << body.status();
      if (!body.ok()) return text;
      text = *body;
      if (MetricValue(text, name, labels) == want || NowMs() - t0 > 5000) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(MetricValue(text, name, labels), std::optional<double>(want)) << name << labels;
    return text;
  };
  const std::string m2 = scrape(*n2.daemon, "kvarn_tier_onboarded_blocks_total", "{tier=\"memcached\"}", kTiles);
  EXPECT_EQ(MetricValue(m2, "kvarn_tier_hit_tokens_total", "{tier=\"memcached\"}"), std::optional<double>(kTiles * kTile));
  EXPECT_EQ(MetricValue(m2, "kvarn_tier_lookups_total", "{tier=\"memcached\",result=\"hit\"}"), std::optional<double>(kTiles));
  EXPECT_EQ(MetricValue(m2, "kvarn_tier_rejected_blocks_total", "{tier=\"memcached\",reason=\"corrupt\"}"),
            std::optional<double>(0));
  EXPECT_EQ(MetricValue(m2, "kvarn_tier_onboard_seconds_per_block_count", "{tier=\"memcached\"}"),
            std::optional<double>(kTiles))
      << "one observation per onboarded block";
  IT_ASSIGN_OR_FAIL(check, RunWithInput(PromtoolBinary(), {"check", "metrics"}, m2));
  EXPECT_TRUE(WIFEXITED(check.first) && WEXITSTATUS(check.first) == 0) << check.second;
  EXPECT_EQ(check.second, "") << "promtool lint output";
  const std::string m1 = scrape(*n1.daemon, "kvarn_tier_written_blocks_total", "{tier=\"memcached\"}", kTiles);
  EXPECT_EQ(MetricValue(m1, "kvarn_tier_spilled_blocks_total", "{tier=\"memcached\"}"), std::optional<double>(kTiles));
  EXPECT_EQ(MetricValue(m1, "kvarn_tier_write_queue_blocks", "{tier=\"memcached\"}"), std::optional<double>(0));
  const double written_bytes = MetricValue(m1, "kvarn_tier_written_bytes_total", "{tier=\"memcached\"}").value_or(-1);
  const double record_bytes = static_cast<double>(kRecordHeaderBytes + n1.session->block_layout().fp16_block_bytes() +
                                                  (kTiles - 1) * (kRecordHeaderBytes + n1.session->block_layout().quant_block_bytes()));
  // Records plus at most a frame per value.
  EXPECT_GE(written_bytes, record_bytes);
  EXPECT_LE(written_bytes, record_bytes + kTiles * MemcachedTier::kFrameBytes);
  Report(absl::StrCat("memcached tier: ", kTiles, " blocks written by node 1 (", written_bytes,
                      " bytes), onboarded by node 2 byte-identical"));
}

// 2. A killed memcached server loses its share only: node 2's prefix ends at the first block
//    that server held; every call succeeds; the misses and errors are counted.
TEST_F(TiersTest, KilledServerCostsOnlyTheBlocksItHeld) {
  ASSERT_NO_FATAL_FAILURE(StartMemcached());
  Node n1, n2;
  ASSERT_NO_FATAL_FAILURE(StartNode(n1, "team-k"));
  ASSERT_NO_FATAL_FAILURE(StartNode(n2, "team-k"));
  constexpr size_t kTiles = 12;
  const std::vector<uint32_t> prompt = Prompt(50000, kTiles);
  IT_ASSIGN_OR_FAIL(t1, Prefill(*n1.session, prompt));
  ASSERT_EQ(t1.quant_blocks.size(), kTiles - 1);
  IT_ASSERT_OK(AwaitWritten(*n1.session, "memcached", kTiles));
  const std::vector<BlockHash> hashes = Hashes(*n1.session, prompt);
  std::vector<int> server(kTiles);
  for (size_t i = 0; i < kTiles; ++i) {
    IT_ASSIGN_OR_FAIL(s, McFind(*memcached_, Key(hashes[i])));
    ASSERT_GE(s, 0) << "block " << i << " is on no server";
    server[i] = s;
  }
  // The victim: the server of the first block not on block 0's server, so the prefix that
  // survives is known exactly and is neither empty nor whole.
  size_t first_lost = 0;
  for (size_t i = 1; i < kTiles && first_lost == 0; ++i) {
    if (server[i] != server[0]) first_lost = i;
  }
  ASSERT_GT(first_lost, 0u) << "all " << kTiles << " blocks on one server: ketama should spread them";
  const int victim = server[first_lost];
  size_t lost = 0;
  for (int s : server) lost += s == victim;
  memcached_->Kill(victim);

  IT_ASSIGN_OR_FAIL(look, n2.session->LookupTiers(prompt));
  EXPECT_EQ(look.pool_tokens(), 0u);
  EXPECT_EQ(TierTokens(look, "memcached"), first_lost * kTile);
  IT_ASSIGN_OR_FAIL(q2, n2.session->CreateSequence(prompt));
  EXPECT_EQ(q2.cached_tokens, first_lost * kTile) << "server " << victim << " held block " << first_lost;
  const std::vector<std::string> bytes1 = BlockBytes(*n1.session, t1);
  const std::vector<std::string> bytes2 = BlockBytes(*n2.session, q2.table);
  ASSERT_EQ(bytes2.size(), first_lost);
  for (size_t i = 0; i < first_lost; ++i) EXPECT_TRUE(bytes2[i] == bytes1[i]) << "block " << i;
  // Node 2 computes the rest itself: its appends succeed (writes to the dead server fail
  // inside the tier, not in the call).
  IT_ASSIGN_OR_FAIL(t2, AppendTokens(*n2.session, q2.id, prompt, q2.cached_tokens, prompt.size()));
  EXPECT_EQ(t2.tokens, prompt.size());
  EXPECT_TRUE(BlockBytes(*n2.session, t2) == bytes1) << "recomputed blocks differ from node 1's";
  const v1::StatsResponse::Tier r2 = TierStats(*n2.session, "memcached");
  EXPECT_EQ(r2.onboarded_blocks(), first_lost);
  EXPECT_GE(r2.misses(), 1u);
  EXPECT_GE(r2.errors(), 1u) << "the dead server's failure is counted";
  // Node 1 keeps serving too.
  const std::vector<uint32_t> other = Prompt(51000, 4);
  IT_ASSIGN_OR_FAIL(t1b, Prefill(*n1.session, other));
  EXPECT_EQ(t1b.tokens, other.size());
  Report(absl::StrCat("killed memcached server ", victim, " of 3 held ", lost, " of ", kTiles,
                      " blocks; node 2 adopted ", q2.cached_tokens, " tokens (prefix up to block ", first_lost,
                      "); node 2 misses ", r2.misses(), " errors ", r2.errors()));
}

// 3. A flipped byte, garbage, and another pool's valid record under a block's key are
//    refused by header or MAC, counted, deleted, and never adopted.
TEST_F(TiersTest, CorruptGarbageAndForeignValuesAreRejectedCountedAndDeleted) {
  ASSERT_NO_FATAL_FAILURE(StartMemcached());
  Node n1, n2;
  ASSERT_NO_FATAL_FAILURE(StartNode(n1, "team-c"));
  ASSERT_NO_FATAL_FAILURE(StartNode(n2, "team-c"));
  constexpr size_t kTiles = 4;
  const std::vector<uint32_t> p_flip = Prompt(60000, kTiles);
  const std::vector<uint32_t> p_garbage = Prompt(61000, kTiles);
  const std::vector<uint32_t> p_foreign = Prompt(62000, kTiles);
  IT_ASSIGN_OR_FAIL(t_flip, Prefill(*n1.session, p_flip));
  IT_ASSIGN_OR_FAIL(t_garbage, Prefill(*n1.session, p_garbage));
  IT_ASSIGN_OR_FAIL(t_foreign, Prefill(*n1.session, p_foreign));
  IT_ASSERT_OK(AwaitWritten(*n1.session, "memcached", 3 * kTiles));

  // Block 2 of p_flip: one payload byte flipped. Block 1 of p_garbage: bytes that are not a
  // value at all. Block 3 of p_foreign: a record of another model's pool with a valid MAC.
  struct Damage {
    const std::vector<uint32_t>* prompt;
    const SequenceTable* table;
    size_t block;
    std::string key;
    int server = -1;
  };
  std::vector<Damage> damage = {{&p_flip, &t_flip, 2, ""}, {&p_garbage, &t_garbage, 1, ""}, {&p_foreign, &t_foreign, 3, ""}};
  for (Damage& d : damage) {
    const std::vector<BlockHash> hashes = Hashes(*n1.session, *d.prompt);
    d.key = Key(hashes[d.block]);
    IT_ASSIGN_OR_FAIL(server, McFind(*memcached_, d.key));
    ASSERT_GE(server, 0);
    d.server = server;
    IT_ASSIGN_OR_FAIL(value, McGet(memcached_->port(server), d.key));
    ASSERT_TRUE(value.has_value());
    std::string v = *value;
    if (d.prompt == &p_flip) {
      ASSERT_GT(v.size(), MemcachedTier::kFrameBytes + kRecordHeaderBytes + 100);
      v[MemcachedTier::kFrameBytes + kRecordHeaderBytes + 100] ^= 0x20;
    } else if (d.prompt == &p_garbage) {
      v.assign(5000, '\0');
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<char>((i * 131 + 7) & 0xff);
    } else {
      const std::string payload = BlockBytes(*n1.session, *d.table)[d.block];
      const std::vector<std::string> values = MemcachedValues(ForeignRecord(*n1.session, hashes, d.block, payload), 512 * 1024);
      ASSERT_EQ(values.size(), 1u);
      v = values[0];
    }
    IT_ASSERT_OK(McSet(memcached_->port(server), d.key, v));
  }

  // Lookup only touches keys: it may count the damaged blocks. CreateSequence reads them.
  IT_ASSIGN_OR_FAIL(q_flip, n2.session->CreateSequence(p_flip));
  EXPECT_EQ(q_flip.cached_tokens, 2u * kTile) << "the prefix ends before the corrupt block";
  IT_ASSIGN_OR_FAIL(q_garbage, n2.session->CreateSequence(p_garbage));
  EXPECT_EQ(q_garbage.cached_tokens, 1u * kTile);
  IT_ASSIGN_OR_FAIL(q_foreign, n2.session->CreateSequence(p_foreign));
  EXPECT_EQ(q_foreign.cached_tokens, 3u * kTile);
  // What was adopted is node 1's bytes.
  std::vector<std::string> want = BlockBytes(*n1.session, t_foreign);
  want.resize(3);
  EXPECT_TRUE(BlockBytes(*n2.session, q_foreign.table) == want);
  const v1::StatsResponse::Tier r2 = TierStats(*n2.session, "memcached");
  EXPECT_EQ(Rejected(r2, "corrupt"), 2u) << r2.DebugString();
  EXPECT_EQ(Rejected(r2, "foreign"), 1u) << r2.DebugString();
  EXPECT_EQ(Rejected(r2, "truncated"), 0u);
  EXPECT_EQ(Rejected(r2, "wrong_key"), 0u);
  EXPECT_EQ(r2.onboarded_blocks(), 2u + 1u + 3u);
  EXPECT_EQ(r2.onboard_failures(), 0u) << "rejections are the tier's, not failed onboards";
  // Each damaged key is gone from every server.
  for (const Damage& d : damage) {
    IT_ASSIGN_OR_FAIL(where, McFind(*memcached_, d.key));
    EXPECT_EQ(where, -1) << d.key << " (block " << d.block << ") was not deleted";
  }
  // The damaged block is a plain miss now: node 2 finds the adopted part in its pool and
  // nothing more below it.
  IT_ASSIGN_OR_FAIL(look, n2.session->LookupTiers(p_flip));
  EXPECT_EQ(look.pool_tokens(), 2u * kTile);
  EXPECT_EQ(TierTokens(look, "memcached"), 0u);
  Report(absl::StrCat("memcached tier: rejected corrupt ", Rejected(r2, "corrupt"), " foreign ", Rejected(r2, "foreign"),
                      "; keys deleted; prefixes ended before them"));
}

// 4. Another tenant never finds tenant A's blocks in the shared tier.
TEST_F(TiersTest, AnotherTenantFindsNothingInTheSharedTier) {
  ASSERT_NO_FATAL_FAILURE(StartMemcached());
  Node n1, n2;
  ASSERT_NO_FATAL_FAILURE(StartNode(n1, "tenant-a"));
  ASSERT_NO_FATAL_FAILURE(StartNode(n2, "tenant-b"));
  constexpr size_t kTiles = 5;
  const std::vector<uint32_t> prompt = Prompt(70000, kTiles);
  ASSERT_TRUE(Prefill(*n1.session, prompt).ok());
  IT_ASSERT_OK(AwaitWritten(*n1.session, "memcached", kTiles));
  EXPECT_NE(n1.session->prefix_namespace(), n2.session->prefix_namespace());

  IT_ASSIGN_OR_FAIL(look, n2.session->LookupTiers(prompt));
  EXPECT_EQ(look.cached_tokens(), 0u);
  EXPECT_EQ(TierTokens(look, "memcached"), 0u);
  IT_ASSIGN_OR_FAIL(qb, n2.session->CreateSequence(prompt));
  EXPECT_EQ(qb.cached_tokens, 0u);
  const v1::StatsResponse::Tier rb = TierStats(*n2.session, "memcached");
  EXPECT_EQ(rb.hits(), 0u);
  EXPECT_EQ(rb.onboarded_blocks(), 0u);
  // Tenant A on the same node 2 does find them (the keys are there, B's are other keys).
  IT_ASSIGN_OR_FAIL(a2, Open(*n2.client, "tenant-a"));
  IT_ASSIGN_OR_FAIL(qa, a2->CreateSequence(prompt));
  EXPECT_EQ(qa.cached_tokens, kTiles * kTile);
}

// 5. Warm restart on the disk tier: the pool spilled on SIGTERM is found by the next kvarnd
//    (new epoch) and adopted byte-identical; damaged and foreign files are deleted at start,
//    counted and never served.
TEST_F(TiersTest, WarmRestartServesTheDiskTierAndRejectsDamagedFiles) {
  TempDir tier_dir, sock_dir;
  const std::string dir = tier_dir.path() + "/tier";
  const std::string instance = UniqueInstance();
  const std::string socket = sock_dir.path() + "/kvarnd.sock";
  const std::vector<std::string> flags = {"--disk_tier_dir=" + dir, absl::StrCat("--tenant_salt_secret=", kSecret)};
  Daemon* first = StartDaemon(flags, instance, socket);
  ASSERT_NE(first, nullptr);
  auto client = Connect(*first);
  ASSERT_NE(client, nullptr);
  IT_ASSIGN_OR_FAIL(old, Open(*client, "team-w"));
  constexpr size_t kTiles = 7;
  const std::vector<uint32_t> prompt = Prompt(80000, kTiles);
  IT_ASSIGN_OR_FAIL(t, Prefill(*old, prompt));
  ASSERT_EQ(t.quant_blocks.size(), kTiles - 1);
  const std::vector<std::string> before = BlockBytes(*old, t);
  const std::vector<BlockHash> hashes = Hashes(*old, prompt);
  const uint64_t old_epoch = old->epoch();
  // Evict-on-write: nothing on disk while the pool holds the blocks.
  EXPECT_EQ(TierStats(*old, "disk").written_blocks(), 0u);
  EXPECT_EQ(TierStats(*old, "disk").write(), "evict");
  StopCleanly(first);
  for (size_t i = 0; i < kTiles; ++i) {
    ASSERT_TRUE(std::filesystem::exists(DiskPath(dir, hashes[i]))) << "block " << i << " was not spilled on stop";
    const std::string rec = ReadFile(DiskPath(dir, hashes[i]));
    EXPECT_EQ(rec.size(), kRecordHeaderBytes + before[i].size());
    EXPECT_TRUE(rec.substr(kRecordHeaderBytes) == before[i]) << "file of block " << i << " holds other bytes";
  }

  // Block 4: one payload byte flipped; block 5: cut short; block 6: a valid record of
  // another pool. Plus a foreign record under a name of its own, and a stray file.
  {
    std::string rec = ReadFile(DiskPath(dir, hashes[4]));
    rec[kRecordHeaderBytes + 17] ^= 1;
    ASSERT_NO_FATAL_FAILURE(WriteFile(DiskPath(dir, hashes[4]), rec));
    std::filesystem::resize_file(DiskPath(dir, hashes[5]), kRecordHeaderBytes + 1000);
    ASSERT_NO_FATAL_FAILURE(WriteFile(DiskPath(dir, hashes[6]), ForeignRecord(*old, hashes, 6, before[6])));
    const std::vector<uint32_t> elsewhere = Prompt(81000, 2);
    const std::vector<BlockHash> eh = Hashes(*old, elsewhere);
    for (const BlockHash& h : eh) std::filesystem::create_directories(std::filesystem::path(DiskPath(dir, h)).parent_path());
    ASSERT_NO_FATAL_FAILURE(WriteFile(DiskPath(dir, eh[1]), ForeignRecord(*old, eh, 1, before[1])));
    ASSERT_NO_FATAL_FAILURE(WriteFile(DiskPath(dir, eh[0]), ReadFile(DiskPath(dir, hashes[0]))));  // wrong name
  }

  Daemon* second = StartDaemon(flags, instance, socket);
  ASSERT_NE(second, nullptr);
  ASSERT_NE(second->epoch(), old_epoch);
  auto client2 = Connect(*second);
  ASSERT_NE(client2, nullptr);
  IT_ASSIGN_OR_FAIL(fresh, Open(*client2, "team-w"));
  EXPECT_NE(fresh->epoch(), old_epoch);
  EXPECT_EQ(fresh->prefix_namespace(), old->prefix_namespace());
  const v1::StatsResponse::Tier d0 = TierStats(*fresh, "disk");
  EXPECT_EQ(Rejected(d0, "corrupt"), 1u) << d0.DebugString();
  EXPECT_EQ(Rejected(d0, "truncated"), 1u) << d0.DebugString();
  EXPECT_EQ(Rejected(d0, "foreign"), 2u) << d0.DebugString();
  EXPECT_EQ(Rejected(d0, "wrong_key"), 1u) << d0.DebugString();
  EXPECT_EQ(d0.blocks(), 4u) << "blocks 0-3 survive the scan";
  for (size_t i = 4; i < kTiles; ++i) {
    EXPECT_FALSE(std::filesystem::exists(DiskPath(dir, hashes[i]))) << "damaged file of block " << i << " kept";
  }

  IT_ASSIGN_OR_FAIL(look, fresh->LookupTiers(prompt));
  EXPECT_EQ(look.pool_tokens(), 0u);
  EXPECT_EQ(TierTokens(look, "disk"), 4u * kTile);
  IT_ASSIGN_OR_FAIL(q, fresh->CreateSequence(prompt));
  EXPECT_EQ(q.cached_tokens, 4u * kTile) << "the prefix ends before the corrupt block";
  const std::vector<std::string> after = BlockBytes(*fresh, q.table);
  ASSERT_EQ(after.size(), 4u);
  for (size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(after[i] == before[i]) << "block " << i << " changed across the restart";
  EXPECT_EQ(TierStats(*fresh, "disk").onboarded_blocks(), 4u);
  // The rest is computed again and yields the same bytes.
  IT_ASSIGN_OR_FAIL(t2, AppendTokens(*fresh, q.id, prompt, q.cached_tokens, prompt.size()));
  EXPECT_TRUE(BlockBytes(*fresh, t2) == before);

  // The old daemon's session is refused by the new one.
  const double t0 = NowMs();
  while (old->alive() && NowMs() - t0 < 10000) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(old->alive());
  EXPECT_EQ(old->Lookup(prompt).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(old->CreateSequence(prompt).status().code(), absl::StatusCode::kFailedPrecondition);
  Report(absl::StrCat("disk tier warm restart: epoch ", old_epoch, " -> ", fresh->epoch(), "; ", d0.blocks(),
                      " records kept, rejected corrupt 1 truncated 1 foreign 2 wrong_key 1; adopted ", q.cached_tokens,
                      " tokens byte-identical"));
}

// 6. Under eviction a small pool hands its blocks to the disk tier, from which a prompt that
//    left the pool is adopted again with the same bytes.
TEST_F(TiersTest, EvictedPromptComesBackFromTheDiskTier) {
  TempDir tier_dir;
  std::vector<std::string> flags = SmallPoolFlags();
  flags.push_back("--disk_tier_dir=" + tier_dir.path() + "/tier");
  Daemon* d = StartDaemon(flags);
  ASSERT_NE(d, nullptr);
  auto client = Connect(*d);
  ASSERT_NE(client, nullptr);
  IT_ASSIGN_OR_FAIL(s, Open(*client, "team-e", /*max_sequences=*/2));
  IT_ASSIGN_OR_FAIL(st0, s->Stats());
  ASSERT_EQ(st0.quant_blocks_total(), kQuant) << st0.DebugString();

  constexpr size_t kTiles = 4;  // the sink and 3 quantized blocks
  const std::vector<uint32_t> a = Prompt(90000, kTiles);
  uint64_t seq = 0;
  IT_ASSIGN_OR_FAIL(ta, Prefill(*s, a, &seq));
  const std::vector<std::string> bytes_a = BlockBytes(*s, ta);
  {
    const uint64_t ids[] = {seq};
    IT_ASSERT_OK(s->Release(ids));
  }
  // Other prompts until A has left the pool entirely (each prompt: 1 sink + 3 quantized).
  // At every step, what the pool let go of A is on disk: the pool and the disk together
  // always hold all of A's prefix.
  int others = 0;
  bool partly = false;  // seen A split between the pool and the disk
  for (; others < 12; ++others) {
    IT_ASSIGN_OR_FAIL(look, s->LookupTiers(a));
    EXPECT_EQ(look.pool_tokens() + TierTokens(look, "disk"), kTiles * kTile) << "after " << others << " other prompts";
    partly |= look.pool_tokens() > 0 && look.pool_tokens() < kTiles * kTile;
    if (look.pool_tokens() == 0) break;
    uint64_t other_seq = 0;
    const std::vector<uint32_t> o = Prompt(91000 + 1000 * others, kTiles);
    IT_ASSERT_OK(Prefill(*s, o, &other_seq).status());
    const uint64_t ids[] = {other_seq};
    IT_ASSERT_OK(s->Release(ids));
  }
  IT_ASSIGN_OR_FAIL(look, s->LookupTiers(a));
  EXPECT_EQ(look.pool_tokens(), 0u) << "A is still in the pool after " << others << " other prompts";
  EXPECT_EQ(TierTokens(look, "disk"), kTiles * kTile);
  EXPECT_TRUE(partly) << "quantized blocks were expected to go before A's sink";
  const v1::StatsResponse::Tier before = TierStats(*s, "disk");
  EXPECT_GE(before.spilled_blocks(), kTiles) << before.DebugString();
  EXPECT_EQ(before.spill_dropped(), 0u);

  IT_ASSIGN_OR_FAIL(q, s->CreateSequence(a));
  EXPECT_EQ(q.cached_tokens, kTiles * kTile);
  EXPECT_TRUE(BlockBytes(*s, q.table) == bytes_a) << "A's blocks came back from disk with other bytes";
  const v1::StatsResponse::Tier after = TierStats(*s, "disk");
  EXPECT_EQ(after.onboarded_blocks(), kTiles);
  EXPECT_EQ(after.hits(), kTiles);
  EXPECT_EQ(after.onboard_failures(), 0u);
  IT_ASSIGN_OR_FAIL(st, s->Stats());
  EXPECT_LE(st.quant_blocks_active() + st.quant_blocks_cached(), kQuant);
  Report(absl::StrCat("disk tier under eviction: A left a pool of ", kQuant, " quantized and ", kSinks, " sink blocks after ", others,
                      " other prompts; ", after.spilled_blocks(), " blocks spilled; A adopted again from disk, ",
                      q.cached_tokens, " tokens byte-identical"));
}

}  // namespace
}  // namespace kvarn::it

namespace kvarn::it {
namespace {

// 7. A block onboarded from the disk tier and later dropped by the disk tier's own LRU (while
//    the pool holds it) goes back to disk when the pool evicts it: the pool and the disk
//    together keep holding the prefix. (Before KvCore::OnTierEvent cleared the block's
//    in_tiers bit on the tier's removal, SpillBeforeEvict skipped the disk for it, and so
//    did SpillAll on stop: the most recently used prefix was lost from every tier.)
TEST_F(TiersTest, BlockDroppedByTheDiskLruGoesBackToDiskWhenThePoolEvictsIt) {
  TempDir tier_dir;
  const std::string dir = tier_dir.path() + "/tier";
  std::vector<std::string> flags = SmallPoolFlags();
  flags.push_back("--disk_tier_dir=" + dir);
  flags.push_back("--disk_tier_bytes=1MiB");  // about 10 prompts of the small layout
  Daemon* d = StartDaemon(flags);
  ASSERT_NE(d, nullptr);
  auto client = Connect(*d);
  ASSERT_NE(client, nullptr);
  IT_ASSIGN_OR_FAIL(s, Open(*client, "team-l", /*max_sequences=*/2));
  constexpr size_t kTiles = 4;
  const std::vector<uint32_t> x = Prompt(200000, kTiles);
  const std::vector<BlockHash> hx = Hashes(*s, x);
  uint32_t first = 300000;
  {
    uint64_t seq = 0;
    ASSERT_TRUE(Prefill(*s, x, &seq).ok());
    const uint64_t ids[] = {seq};
    IT_ASSERT_OK(s->Release(ids));
  }
  // X leaves the pool for the disk...
  for (int i = 0; i < 12; ++i) {
    IT_ASSIGN_OR_FAIL(look, s->LookupTiers(x));
    if (look.pool_tokens() == 0) break;
    IT_ASSERT_OK(Churn(*s, &first, 1));
  }
  IT_ASSIGN_OR_FAIL(look0, s->LookupTiers(x));
  ASSERT_EQ(TierTokens(look0, "disk"), kTiles * kTile);
  // ... comes back (onboarded, held) ...
  IT_ASSIGN_OR_FAIL(q, s->CreateSequence(x));
  ASSERT_EQ(q.cached_tokens, kTiles * kTile);
  // ... and while the pool holds it the disk tier's LRU drops its files (others pass through).
  int churned = 0;
  const auto files_left = [&] {
    int n = 0;
    for (const BlockHash& h : hx) n += std::filesystem::exists(DiskPath(dir, h));
    return n;
  };
  for (; churned < 60 && files_left() > 0; ++churned) IT_ASSERT_OK(Churn(*s, &first, 1));
  ASSERT_EQ(files_left(), 0) << "the disk tier kept X's files after " << churned << " prompts";
  EXPECT_GT(TierStats(*s, "disk").evicted_blocks(), 0u);
  // Now the pool lets X go: it must land on disk again.
  {
    const uint64_t ids[] = {q.id};
    IT_ASSERT_OK(s->Release(ids));
  }
  for (int i = 0; i < 12; ++i) {
    IT_ASSIGN_OR_FAIL(look, s->LookupTiers(x));
    EXPECT_EQ(look.pool_tokens() + TierTokens(look, "disk"), kTiles * kTile)
        << "X's blocks evicted from the pool did not go back to the disk tier (pool " << look.pool_tokens() << ", disk "
        << TierTokens(look, "disk") << " tokens)";
    if (look.pool_tokens() == 0) break;
    IT_ASSERT_OK(Churn(*s, &first, 1));
  }
}

}  // namespace
}  // namespace kvarn::it

namespace kvarn::it {
namespace {

// 8. A hung memcached server (SIGSTOP: the kernel accepts, nothing answers) is a miss within
//    the tier's timeout, never an error and never a call stuck on it.
TEST_F(TiersTest, HungServerIsAMissWithinTheTimeout) {
  ASSERT_NO_FATAL_FAILURE(StartMemcached());
  Node n1, n2;
  ASSERT_NO_FATAL_FAILURE(StartNode(n1, "team-h"));
  ASSERT_NO_FATAL_FAILURE(StartNode(n2, "team-h", {"--memcached_timeout_ms=250"}));
  constexpr size_t kTiles = 12;
  const std::vector<uint32_t> prompt = Prompt(110000, kTiles);
  ASSERT_TRUE(Prefill(*n1.session, prompt).ok());
  IT_ASSERT_OK(AwaitWritten(*n1.session, "memcached", kTiles));
  const std::vector<BlockHash> hashes = Hashes(*n1.session, prompt);
  std::vector<int> server(kTiles);
  for (size_t i = 0; i < kTiles; ++i) {
    IT_ASSIGN_OR_FAIL(s, McFind(*memcached_, Key(hashes[i])));
    ASSERT_GE(s, 0);
    server[i] = s;
  }
  size_t first_lost = 0;
  for (size_t i = 1; i < kTiles && first_lost == 0; ++i) {
    if (server[i] != server[0]) first_lost = i;
  }
  ASSERT_GT(first_lost, 0u);
  memcached_->Pause(server[first_lost]);
  double t0 = NowMs();
  IT_ASSIGN_OR_FAIL(look, n2.session->LookupTiers(prompt));
  const double lookup_ms = NowMs() - t0;
  t0 = NowMs();
  IT_ASSIGN_OR_FAIL(q, n2.session->CreateSequence(prompt));
  const double create_ms = NowMs() - t0;
  memcached_->Resume(server[first_lost]);
  EXPECT_EQ(TierTokens(look, "memcached"), first_lost * kTile);
  EXPECT_EQ(q.cached_tokens, first_lost * kTile);
  // One block on the hung server is asked for per call: a few poll timeouts at most.
  EXPECT_LT(lookup_ms, 2000) << "Lookup waited on the hung server";
  EXPECT_LT(create_ms, 2000) << "CreateSequence waited on the hung server";
  const v1::StatsResponse::Tier r2 = TierStats(*n2.session, "memcached");
  EXPECT_GE(r2.errors(), 1u);
  EXPECT_EQ(r2.onboarded_blocks(), first_lost);
  Report(absl::StrCat("hung memcached server: Lookup ", lookup_ms, " ms, CreateSequence ", create_ms,
                      " ms (timeout 250 ms), adopted ", q.cached_tokens, " tokens"));
}

// 9. With every memcached server dead, both nodes keep serving (writes dropped and counted,
//    reads miss) and a node still stops promptly: its tier does not hold the stop for
//    tier_stop_ms.
TEST_F(TiersTest, AllServersDeadCostOnlyMissesAndStopStaysPrompt) {
  ASSERT_NO_FATAL_FAILURE(StartMemcached());
  Node n1, n2;
  ASSERT_NO_FATAL_FAILURE(StartNode(n1, "team-d"));
  ASSERT_NO_FATAL_FAILURE(StartNode(n2, "team-d"));
  for (int i = 0; i < memcached_->size(); ++i) memcached_->Kill(i);
  constexpr size_t kTiles = 6;
  const std::vector<uint32_t> prompt = Prompt(120000, kTiles);
  IT_ASSIGN_OR_FAIL(t1, Prefill(*n1.session, prompt));
  EXPECT_EQ(t1.tokens, prompt.size());
  // The writes fail inside the tier: wait until it has given up on all of them.
  const double deadline = NowMs() + 20000;
  v1::StatsResponse::Tier w1;
  for (;;) {
    w1 = TierStats(*n1.session, "memcached");
    if (w1.queued_blocks() == 0 && w1.dropped_writes() + w1.written_blocks() >= kTiles) break;
    ASSERT_LT(NowMs(), deadline) << w1.DebugString();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(w1.written_blocks(), 0u);
  EXPECT_EQ(w1.dropped_writes(), kTiles);
  EXPECT_GE(w1.errors(), kTiles);
  IT_ASSIGN_OR_FAIL(look, n2.session->LookupTiers(prompt));
  EXPECT_EQ(look.cached_tokens(), 0u);
  IT_ASSIGN_OR_FAIL(q2, n2.session->CreateSequence(prompt));
  EXPECT_EQ(q2.cached_tokens, 0u);
  IT_ASSIGN_OR_FAIL(t2, AppendTokens(*n2.session, q2.id, prompt, 0, prompt.size()));
  EXPECT_EQ(t2.tokens, prompt.size());
  EXPECT_GE(TierStats(*n2.session, "memcached").errors(), 1u);
  // Sessions closed first, so the stop does not wait out drain_ms for them.
  n1.session.reset();
  const double t0 = NowMs();
  ASSERT_NO_FATAL_FAILURE(StopCleanly(n1.daemon));
  const double stop_ms = NowMs() - t0;
  EXPECT_LT(stop_ms, 5000) << "the stop waited on dead memcached servers";
  Report(absl::StrCat("all memcached servers dead: node 1 dropped ", w1.dropped_writes(), " writes (", w1.errors(),
                      " errors), node 2 adopted 0 tokens, every call succeeded; node 1 stopped in ", stop_ms, " ms"));
}

// 10. Two kvarnd never share a disk tier's directory: the second one refuses to start, naming
//     it, and the first keeps serving.
TEST_F(TiersTest, SecondDaemonOnTheSameDiskDirectoryRefusesToStart) {
  TempDir tier_dir;
  const std::string flag = "--disk_tier_dir=" + tier_dir.path() + "/tier";
  Daemon* first = StartDaemon({flag, absl::StrCat("--tenant_salt_secret=", kSecret)});
  ASSERT_NE(first, nullptr);
  DaemonOptions o;
  o.extra_flags = {flag, absl::StrCat("--tenant_salt_secret=", kSecret)};
  auto second = Daemon::Start(o);
  ASSERT_FALSE(second.ok()) << "a second kvarnd opened the same disk tier";
  EXPECT_THAT(std::string(second.status().message()), ::testing::HasSubstr("disk tier"));
  EXPECT_THAT(std::string(second.status().message()), ::testing::HasSubstr(tier_dir.path()));
  auto client = Connect(*first);
  ASSERT_NE(client, nullptr);
  IT_ASSIGN_OR_FAIL(s, Open(*client, "team-x"));
  IT_ASSIGN_OR_FAIL(t, Prefill(*s, Prompt(130000, 2)));
  EXPECT_EQ(t.quant_blocks.size(), 1u);
}

}  // namespace
}  // namespace kvarn::it
