// Helpers of the tiers' integration tests (tier_fixture.h).
#include "tests/integration/tier_fixture.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "common/unique_fd.h"
#include "kernels/preset.h"

namespace kvarn::it {

using ::kvarn::testing::MemcachedServers;

namespace {

absl::StatusOr<UniqueFd> McConnect(int port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("connect to memcached :", port, ": ", std::strerror(errno)));
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
absl::Status McReadUntil(int fd, std::string& buf,
                         const std::function<bool(const std::string&)>& complete) {
  const double deadline = NowMs() + 5000;
  char chunk[65536];
  while (!complete(buf)) {
    const int left = static_cast<int>(deadline - NowMs());
    pollfd p{fd, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, left) <= 0)
      return absl::DeadlineExceededError("memcached did not answer");
    const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::UnavailableError("memcached closed the connection");
    buf.append(chunk, static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace

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
  if (buf.rfind("VALUE ", 0) != 0)
    return absl::InternalError("memcached get: " + buf.substr(0, 80));
  const size_t eol = buf.find("\r\n");
  const size_t sp = buf.rfind(' ', eol);
  const size_t bytes = std::stoull(buf.substr(sp + 1, eol - sp - 1));
  return std::optional<std::string>(buf.substr(eol + 2, bytes));
}

absl::Status McSet(int port, const std::string& key, const std::string& value) {
  auto fd = McConnect(port);
  if (!fd.ok()) return fd.status();
  if (absl::Status s = McSend(
          fd->get(), absl::StrCat("set ", key, " 0 0 ", value.size(), "\r\n", value, "\r\n"));
      !s.ok()) {
    return s;
  }
  std::string buf;
  if (absl::Status s = McReadUntil(
          fd->get(), buf, [](const std::string& b) { return b.find("\r\n") != std::string::npos; });
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
      if (found >= 0)
        return absl::InternalError(absl::StrCat(key, " on two servers: ", found, " and ", i));
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
  std::memcpy(ns.data(), s.prefix_namespace().data(),
              std::min(ns.size(), s.prefix_namespace().size()));
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
    out.emplace_back(reinterpret_cast<const char*>(s.SinkBlock(t.sink_block)),
                     s.block_layout().fp16_block_bytes());
  }
  for (uint32_t b : t.quant_blocks) {
    out.emplace_back(reinterpret_cast<const char*>(s.QuantBlock(b)),
                     s.block_layout().quant_block_bytes());
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
  for (auto backoff = std::chrono::milliseconds(1);;
       backoff = std::min(backoff * 2, std::chrono::milliseconds(50))) {
    t = TierStats(s, tier);
    if (t.queued_blocks() == 0 && t.written_blocks() >= blocks) return absl::OkStatus();
    if (NowMs() > deadline) break;
    std::this_thread::sleep_for(backoff);
  }
  return absl::DeadlineExceededError(absl::StrCat(tier, " wrote ", t.written_blocks(), " of ",
                                                  blocks, " blocks in 20 s; queued ",
                                                  t.queued_blocks()));
}

// Creates a sequence for `prompt` and appends all of it (the tiles past what was adopted are
// sealed); the sequence's final table.
absl::StatusOr<SequenceTable> Prefill(Session& s, std::span<const uint32_t> prompt, uint64_t* seq) {
  auto q = s.CreateSequence(prompt);
  if (!q.ok()) return q.status();
  if (seq != nullptr) *seq = q->id;
  return AppendTokens(s, q->id, prompt, q->cached_tokens, prompt.size());
}

absl::Status PrefillAndRelease(Session& s, std::span<const uint32_t> prompt,
                               std::vector<std::string>* bytes) {
  uint64_t seq = 0;
  auto t = Prefill(s, prompt, &seq);
  if (!t.ok()) return t.status();
  if (bytes != nullptr) *bytes = BlockBytes(s, *t);
  const uint64_t ids[] = {seq};
  return s.Release(ids);
}

// The adoptable tiles of a prompt of `tiles` full tiles and 10 more tokens: all `tiles`.
std::vector<uint32_t> Prompt(uint32_t first, size_t tiles) {
  return Tokens(first, tiles * kTile + 10);
}

std::vector<std::string> SmallPoolFlags() {
  Preset p;
  EXPECT_TRUE(ParsePreset(SmallLayout().preset, &p).ok());
  const Layout l = SmallLayout();
  const uint64_t qbytes =
      uint64_t{l.num_layers} * l.num_kv_heads * p.RecordBytes(static_cast<int>(l.head_dim));
  const uint64_t fbytes = uint64_t{l.num_layers} * l.num_kv_heads * 2 * kTile * l.head_dim * 2;
  const uint64_t capacity = kQuant * qbytes + kFp16 * fbytes;
  char share[64], sink_share[64];
  std::snprintf(share, sizeof(share), "%.12f",
                (static_cast<double>(kFp16 * fbytes) + 0.5) / static_cast<double>(capacity));
  std::snprintf(sink_share, sizeof(sink_share), "%.12f", (kSinks + 0.5) / kFp16);
  return {absl::StrCat("--capacity=", capacity), absl::StrCat("--fp16_share=", share),
          absl::StrCat("--sink_share=", sink_share),
          absl::StrCat("--tenant_salt_secret=", kSecret)};
}

// Prefills and releases `n` prompts of `tiles` tiles (tokens from `*first` on, which it
// advances): churn that makes a small pool evict.
absl::Status Churn(Session& s, uint32_t* first, int n, size_t tiles) {
  for (int i = 0; i < n; ++i, *first += 1000) {
    if (absl::Status st = PrefillAndRelease(s, Prompt(*first, tiles)); !st.ok()) return st;
  }
  return absl::OkStatus();
}

std::string DiskPath(const std::string& dir, const BlockHash& h) {
  const std::string hex = HashToHex(h);
  return dir + "/" + hex.substr(0, 2) + "/" + hex + ".kvb";
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
  std::memcpy(record.data() + kRecordHeaderBytes, payload.data(),
              std::min(payload.size(), record.size() - kRecordHeaderBytes));
  SealRecord(id, meta, record);
  return record;
}

}  // namespace kvarn::it
