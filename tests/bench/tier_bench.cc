// kvarn_tier_bench: the tiers below the pool at a realistic layout (default 32 layers x 8
// kv-heads x head_dim 128, kvarn_k4v2_g128, 128-token tiles), each figure beside what it is
// compared to:
//   - bytes moved per block: the record (header included; on memcached, frames and chunk
//     keys too) against the fp16 bytes of the same tokens (2 x layers x heads x tile x dim x 2);
//   - onboard latency per block (BlockTier::Get: read, reassemble, check header and MAC:
//     what CreateSequence's onboarding waits for per block) from the disk tier with the page
//     cache cold (files fsync'd, then dropped with POSIX_FADV_DONTNEED and checked with
//     mincore) and warm, and from memcached on loopback; p50/p90/p99 over --blocks blocks in
//     random order; beside them a memcpy of the payload (the import into the pool) and the
//     HMAC check alone;
//   - write throughput of each tier (Put to Flush, write-behind), beside a plain write() of
//     the same bytes into one file;
//   - a two-node hit rate: node 1 writes prompts to memcached servers smaller than the
//     working set, node 2 onboards them (block hits and prefix tokens).
// The tiers are the daemon's own (DiskTier, MemcachedTier), driven in-process; the memcached
// servers are real processes this binary starts (tests/common/memcached_servers.h). Every time
// is std::chrono::steady_clock wall time.
//
//   kvarn_tier_bench [--blocks=200] [--layers=32] [--heads=8] [--head_dim=128]
//                    [--preset=kvarn_k4v2_g128] [--dir=/var/tmp] [--chunk_kib=512,4096]
//                    [--parts=disk,memcached,two_nodes]
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/prefix_hash.h"
#include "daemon/core/block_record.h"
#include "daemon/core/tenants.h"
#include "daemon/tiers/disk_tier.h"
#include "daemon/tiers/memcached_tier.h"
#include "kernels/preset.h"
#include "tests/bench/flag_value.h"
#include "tests/common/memcached_servers.h"

namespace kvarn {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct Flags {
  int blocks = 200;
  int layers = 32, heads = 8, head_dim = 128;
  std::string preset = "kvarn_k4v2_g128";
  std::string dir = "/var/tmp";
  std::vector<uint32_t> chunk_kib = {512, 4096};
  std::string parts = "disk,memcached,two_nodes";  // which measurements run (sizes always)
  bool Runs(const char* part) const {
    return ("," + parts + ",").find(std::string(",") + part + ",") != std::string::npos;
  }
};

Flags Parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&](const char* prefix) { return bench::FlagValue(a, prefix); };
    if (const char* v = value("--blocks=")) {
      f.blocks = std::atoi(v);
    } else if (const char* v = value("--layers=")) {
      f.layers = std::atoi(v);
    } else if (const char* v = value("--heads=")) {
      f.heads = std::atoi(v);
    } else if (const char* v = value("--head_dim=")) {
      f.head_dim = std::atoi(v);
    } else if (const char* v = value("--preset=")) {
      f.preset = v;
    } else if (const char* v = value("--dir=")) {
      f.dir = v;
    } else if (const char* v = value("--parts=")) {
      f.parts = v;
    } else if (const char* v = value("--chunk_kib=")) {
      f.chunk_kib.clear();
      std::stringstream ss(v);
      for (std::string t; std::getline(ss, t, ',');)
        f.chunk_kib.push_back(static_cast<uint32_t>(std::atoi(t.c_str())));
    } else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      std::exit(2);
    }
  }
  if (f.blocks < 10) {
    std::fprintf(stderr, "--blocks must be at least 10\n");
    std::exit(2);
  }
  return f;
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "kvarn_tier_bench: %s\n", what.c_str());
  std::exit(1);
}

double Pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

std::string Quantiles(const std::vector<double>& ms) {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "p50 %.3f  p90 %.3f  p99 %.3f ms", Pct(ms, 50), Pct(ms, 90),
                Pct(ms, 99));
  return buf;
}

double MiB(double bytes) { return bytes / (1024.0 * 1024.0); }

// The blocks of the benchmark: one chain (tile i's parent is tile i - 1), quantized blocks
// with a pseudo-random payload (the bytes do not matter to a tier; the size does).
struct Workload {
  TierIdentity id;
  std::vector<BlockHash> hashes;
  std::string payload;
  uint64_t fp16_bytes = 0;

  std::shared_ptr<const std::string> Record(size_t i) const {
    std::string r = NewRecord(id, BlockClass::kQuant);
    std::memcpy(r.data() + kRecordHeaderBytes, payload.data(), payload.size());
    // A few bytes of the payload differ per block, so no two records are equal.
    std::memcpy(r.data() + kRecordHeaderBytes, &i, sizeof(i));
    RecordMeta meta;
    meta.hash = hashes[i];
    meta.parent = i == 0 ? kRootHash : hashes[i - 1];
    meta.cls = BlockClass::kQuant;
    meta.tile_index = static_cast<uint32_t>(i);
    SealRecord(id, meta, r);
    return std::make_shared<const std::string>(std::move(r));
  }
  uint64_t record_bytes() const { return kRecordHeaderBytes + payload.size(); }
};

Workload MakeWorkload(const Flags& f, const Preset& p, size_t blocks, uint32_t salt) {
  Workload w;
  ModelConfig model;
  model.model_id = "bench-model";
  model.num_layers = static_cast<uint32_t>(f.layers);
  model.num_kv_heads = static_cast<uint32_t>(f.heads);
  model.head_dim = static_cast<uint32_t>(f.head_dim);
  model.preset = f.preset;
  model.sink_tokens = static_cast<uint32_t>(p.tile_tokens);
  const uint64_t qbytes = uint64_t(f.layers) * uint64_t(f.heads) * p.RecordBytes(f.head_dim);
  w.fp16_bytes = 2ull * uint64_t(f.layers) * uint64_t(f.heads) * uint64_t(p.tile_tokens) *
                 uint64_t(f.head_dim) * 2;
  w.id = MakeTierIdentity(model, static_cast<uint32_t>(p.tile_tokens), qbytes, w.fp16_bytes,
                          "bench-secret");
  w.payload.resize(qbytes);
  std::mt19937_64 rng(42);
  for (size_t i = 0; i + 8 <= w.payload.size(); i += 8) {
    const uint64_t x = rng();
    std::memcpy(w.payload.data() + i, &x, 8);
  }
  HashNamespaceInput ns_in = NamespaceBase(model, p);
  ns_in.tenant_salt = TenantSalt(absl::StrCat("bench-", salt), "bench-secret");
  const BlockHash ns = NamespaceDigest(ns_in);
  std::vector<uint32_t> tokens(static_cast<size_t>(p.tile_tokens));
  BlockHash parent = kRootHash;
  for (size_t i = 0; i < blocks; ++i) {
    for (size_t t = 0; t < tokens.size(); ++t)
      tokens[t] = static_cast<uint32_t>(i * tokens.size() + t);
    parent = ChainHash(parent, ns, tokens);
    w.hashes.push_back(parent);
  }
  return w;
}

// Puts every block (in batches the queue holds) and flushes; the wall time of it all.
double WriteAll(BlockTier& tier, const Workload& w, size_t count, uint64_t queue_bytes) {
  const size_t batch = std::max<size_t>(1, queue_bytes / w.record_bytes() / 2);
  // Records are built before the clock starts: the pool hands tiers sealed records.
  const Clock::time_point t0 = Clock::now();
  double building_ms = 0;
  for (size_t i = 0; i < count;) {
    std::vector<std::shared_ptr<const std::string>> records;
    const Clock::time_point b0 = Clock::now();
    for (size_t j = i; j < std::min(count, i + batch); ++j) records.push_back(w.Record(j));
    building_ms += MsSince(b0);
    for (size_t k = 0; k < records.size(); ++k) {
      if (!tier.Put(w.hashes[i + k], records[k], 0))
        Die(absl::StrCat(std::string(tier.name()), " dropped a Put"));
    }
    i += records.size();
    if (!tier.Flush(absl::Now() + absl::Seconds(120)))
      Die(absl::StrCat(std::string(tier.name()), " did not flush in 120 s"));
  }
  return MsSince(t0) - building_ms;
}

std::vector<double> ReadAll(BlockTier& tier, const Workload& w, size_t count, uint64_t* misses) {
  std::vector<size_t> order(count);
  for (size_t i = 0; i < count; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  std::vector<double> ms;
  *misses = 0;
  for (size_t i : order) {
    const Clock::time_point t0 = Clock::now();
    absl::StatusOr<std::string> r = tier.Get(w.hashes[i]);
    ms.push_back(MsSince(t0));
    if (!r.ok()) ++*misses;
  }
  return ms;
}

// Files under `dir`, fsync'd and dropped from the page cache; the pages still resident after.
uint64_t DropPageCache(const std::string& dir, uint64_t* total_pages) {
  uint64_t resident = 0;
  *total_pages = 0;
  const long page = sysconf(_SC_PAGESIZE);
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file() || e.path().extension() != ".kvb") continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::fsync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    struct stat st {};
    ::fstat(fd, &st);
    const size_t pages = (static_cast<size_t>(st.st_size) + page - 1) / page;
    if (pages > 0) {
      void* m = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
      if (m != MAP_FAILED) {
        std::vector<unsigned char> vec(pages);
        if (::mincore(m, static_cast<size_t>(st.st_size), vec.data()) == 0) {
          for (unsigned char v : vec) resident += v & 1;
        }
        ::munmap(m, static_cast<size_t>(st.st_size));
      }
    }
    *total_pages += pages;
    ::close(fd);
  }
  return resident;
}

// Busy and total jiffies of all CPUs (/proc/stat's first line), to show time taken by other
// processes on a shared machine.
std::pair<uint64_t, uint64_t> CpuJiffies() {
  std::FILE* f = std::fopen("/proc/stat", "r");
  if (f == nullptr) return {0, 0};
  unsigned long long v[10] = {};
  const int n = std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0],
                            &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9]);
  std::fclose(f);
  if (n < 4) return {0, 0};
  uint64_t total = 0;
  for (int i = 0; i < n; ++i) total += v[i];
  return {total - v[3] - (n > 4 ? v[4] : 0), total};  // busy = all but idle and iowait
}

// This process's CPU time (user + system), seconds.
double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// A plain write() of `count` records into one file (then fdatasync if `sync`): the reference
// for the disk tier's write throughput. Distinct records built in batches as WriteAll builds
// them, so the source bytes come from memory as the tier's do; only the writes are timed.
double PlainWriteMs(const std::string& dir, const Workload& w, size_t count, bool sync) {
  const std::string path = dir + "/plain.bin";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) Die("open " + path);
  const size_t batch = std::max<size_t>(1, (256ull << 20) / w.record_bytes() / 2);
  ::sync();  // every write phase starts with no dirty pages of an earlier one
  double ms = 0;
  for (size_t i = 0; i < count;) {
    std::vector<std::shared_ptr<const std::string>> records;
    for (size_t j = i; j < std::min(count, i + batch); ++j) records.push_back(w.Record(j));
    i += records.size();
    const Clock::time_point t0 = Clock::now();
    for (const auto& rec : records) {
      size_t done = 0;
      while (done < rec->size()) {
        const ssize_t n = ::write(fd, rec->data() + done, rec->size() - done);
        if (n <= 0) Die("write " + path);
        done += static_cast<size_t>(n);
      }
    }
    if (sync && i == count) ::fdatasync(fd);
    ms += MsSince(t0);
  }
  ::close(fd);
  ::unlink(path.c_str());
  return ms;
}

void PrintSizes(const Workload& w, const Flags& f, const Preset& p) {
  const double rec = static_cast<double>(w.record_bytes());
  std::printf(
      "== bytes moved per block (layout %d layers x %d kv-heads x head_dim %d, %s, %d-token "
      "tiles)\n",
      f.layers, f.heads, f.head_dim, f.preset.c_str(), p.tile_tokens);
  std::printf(
      "  fp16 K+V of the tile's tokens      %10llu bytes (%.3f MiB)   = 2 x %d x %d x %d x %d x "
      "2\n",
      static_cast<unsigned long long>(w.fp16_bytes), MiB(static_cast<double>(w.fp16_bytes)),
      f.layers, f.heads, p.tile_tokens, f.head_dim);
  std::printf("  quantized payload                  %10zu bytes (%.3f MiB)   %.4f x fp16\n",
              w.payload.size(), MiB(static_cast<double>(w.payload.size())),
              static_cast<double>(w.payload.size()) / static_cast<double>(w.fp16_bytes));
  std::printf(
      "  disk record (header %zu B + payload) %8.0f bytes               %.4f x fp16 (header %.4f%% "
      "of it)\n",
      kRecordHeaderBytes, rec, rec / static_cast<double>(w.fp16_bytes),
      100.0 * static_cast<double>(kRecordHeaderBytes) / rec);
  for (uint32_t kib : f.chunk_kib) {
    const uint64_t chunk = uint64_t{kib} * 1024;
    const auto values =
        MemcachedValues(std::string(w.record_bytes(), '\0'), static_cast<uint32_t>(chunk));
    uint64_t bytes = 0;
    for (const auto& v : values) bytes += v.size();
    const uint64_t key_bytes =
        values.size() * (7 + 64) + (values.size() - 1) * 4;  // "kvarn1:" + hex (+ ".i")
    std::printf(
        "  memcached, chunk %5u KiB: %3zu values, %10llu value bytes + ~%llu key bytes  %.4f x "
        "fp16\n",
        kib, values.size(), static_cast<unsigned long long>(bytes),
        static_cast<unsigned long long>(key_bytes),
        static_cast<double>(bytes + key_bytes) / static_cast<double>(w.fp16_bytes));
  }
}

// The floor of an onboard: the import of the payload into the pool (one memcpy), and the MAC
// check a tier's Get does (CheckRecord on an in-memory record).
void PrintFloors(const Workload& w) {
  const std::shared_ptr<const std::string> rec = w.Record(3);
  std::vector<char> dst(w.payload.size());
  std::vector<double> copy_ms, mac_ms;
  for (int i = 0; i < 50; ++i) {
    // A fresh source each time would be fairer to caches; the payload (MiBs) exceeds L2 anyway.
    Clock::time_point t0 = Clock::now();
    std::memcpy(dst.data(), rec->data() + kRecordHeaderBytes, w.payload.size());
    copy_ms.push_back(MsSince(t0));
    RecordFault fault;
    t0 = Clock::now();
    const bool ok = CheckRecord(w.id, *rec, &w.hashes[3], &fault).ok();
    mac_ms.push_back(MsSince(t0));
    if (!ok) Die("CheckRecord refused a good record");
  }
  std::printf("== references per block (in memory, 50 repeats)\n");
  std::printf(
      "  memcpy of the payload (import)     %s   (%.2f GiB/s)\n", Quantiles(copy_ms).c_str(),
      static_cast<double>(w.payload.size()) / (Pct(copy_ms, 50) / 1e3) / (1024.0 * 1024 * 1024));
  std::printf(
      "  CheckRecord (header + HMAC-SHA256) %s   (%.2f GiB/s)\n", Quantiles(mac_ms).c_str(),
      static_cast<double>(w.record_bytes()) / (Pct(mac_ms, 50) / 1e3) / (1024.0 * 1024 * 1024));
}

void BenchDisk(const Flags& f, const Workload& w) {
  char tmpl[4096];
  std::snprintf(tmpl, sizeof(tmpl), "%s/kvarn-tier-bench.XXXXXX", f.dir.c_str());
  if (::mkdtemp(tmpl) == nullptr)
    Die(std::string("mkdtemp under ") + f.dir + ": " + std::strerror(errno));
  const std::string root = tmpl;
  const size_t n = static_cast<size_t>(f.blocks);
  const double bytes = static_cast<double>(n * w.record_bytes());
  std::printf("== disk tier (%s, %d blocks, %.0f MiB)\n", root.c_str(), f.blocks, MiB(bytes));
  // The references, best of 3 (the first write of a run pays for the page cache's growth).
  double plain_ms = 1e300, plain_sync_ms = 1e300;
  for (int r = 0; r < 3; ++r) {
    plain_ms = std::min(plain_ms, PlainWriteMs(root, w, n, /*sync=*/false));
    plain_sync_ms = std::min(plain_sync_ms, PlainWriteMs(root, w, n, /*sync=*/true));
  }
  for (bool fsync : {false, true}) {
    const std::string dir = root + (fsync ? "/fsync" : "/nofsync");
    DiskTierOptions o;
    o.dir = dir;
    o.capacity_bytes = 4 * n * w.record_bytes();
    o.fsync = fsync;
    auto tier = DiskTier::Open(o, w.id);
    if (!tier.ok()) Die(tier.status().ToString());
    ::sync();
    const double ms = WriteAll(**tier, w, n, o.queue_bytes);
    std::printf(
        "  write, fsync %-5s  %8.1f MiB/s  %7.1f blocks/s   vs plain write() of the same bytes%s "
        "%8.1f MiB/s\n",
        fsync ? "on" : "off", MiB(bytes) / (ms / 1e3), static_cast<double>(n) / (ms / 1e3),
        fsync ? " + fdatasync" : "            ",
        MiB(bytes) / ((fsync ? plain_sync_ms : plain_ms) / 1e3));
    if (!fsync) {
      uint64_t pages = 0;
      const uint64_t resident = DropPageCache(dir, &pages);
      uint64_t misses = 0;
      const std::vector<double> cold = ReadAll(**tier, w, n, &misses);
      std::printf(
          "  onboard Get, page cache cold (%llu of %llu pages resident after the drop): %s  (%.1f "
          "MiB/s at p50)%s\n",
          static_cast<unsigned long long>(resident), static_cast<unsigned long long>(pages),
          Quantiles(cold).c_str(),
          MiB(static_cast<double>(w.record_bytes())) / (Pct(cold, 50) / 1e3),
          misses ? absl::StrCat(" MISSES ", misses).c_str() : "");
      const std::vector<double> warm = ReadAll(**tier, w, n, &misses);
      std::printf(
          "  onboard Get, page cache warm:                                  %s  (%.1f MiB/s at "
          "p50)%s\n",
          Quantiles(warm).c_str(),
          MiB(static_cast<double>(w.record_bytes())) / (Pct(warm, 50) / 1e3),
          misses ? absl::StrCat(" MISSES ", misses).c_str() : "");
    }
    tier->reset();
  }
  std::error_code ec;
  std::filesystem::remove_all(root, ec);
}

void BenchMemcached(const Flags& f, const Workload& w, uint32_t chunk_kib) {
  const size_t n = static_cast<size_t>(f.blocks);
  const double bytes = static_cast<double>(n * w.record_bytes());
  testing::MemcachedServerOptions so;
  so.count = 3;
  // Room for every block with slab slack; -I above the chunk when it passes memcached's 1 MiB.
  so.memory_mb = static_cast<uint32_t>(std::max(64.0, 2.0 * MiB(bytes) / so.count));
  if (chunk_kib * 1024ull + 4096 > (1u << 20))
    so.item_max = absl::StrCat((chunk_kib + 1023) / 1024 * 2, "m");
  auto servers = testing::MemcachedServers::Start(so);
  if (!servers.ok()) Die(servers.status().ToString());
  MemcachedTierOptions o;
  o.servers = (*servers)->addresses();
  o.chunk_bytes = chunk_kib * 1024;
  if (chunk_kib * 1024ull + 4096 > (1u << 20))
    o.chunk_bytes -= 4096;  // below -I, item header included
  o.timeout = absl::Seconds(2);
  auto tier = MemcachedTier::Open(o, w.id);
  if (!tier.ok()) Die(tier.status().ToString());
  std::printf(
      "== memcached tier, chunk_bytes %u (3 servers on loopback, -m %u%s, %d blocks, %.0f MiB)\n",
      o.chunk_bytes, so.memory_mb, so.item_max.empty() ? "" : (" -I " + so.item_max).c_str(),
      f.blocks, MiB(bytes));
  const double ms = WriteAll(**tier, w, n, o.queue_bytes);
  const TierStats st = (*tier)->Stats();
  std::printf(
      "  write          %8.1f MiB/s  %7.1f blocks/s   (%llu written, %llu dropped, %llu errors)\n",
      MiB(bytes) / (ms / 1e3), static_cast<double>(n) / (ms / 1e3),
      static_cast<unsigned long long>(st.written_blocks),
      static_cast<unsigned long long>(st.dropped_writes),
      static_cast<unsigned long long>(st.errors));
  uint64_t misses = 0;
  const std::vector<double> lat = ReadAll(**tier, w, n, &misses);
  std::printf("  onboard Get    %s  (%.1f MiB/s at p50)  misses %llu of %zu\n",
              Quantiles(lat).c_str(),
              MiB(static_cast<double>(w.record_bytes())) / (Pct(lat, 50) / 1e3),
              static_cast<unsigned long long>(misses), n);
}

// Node 1 writes `prompts` prompts of `tiles` blocks each to servers whose memory holds about
// half of them; node 2 (its own tier instance, the same identity) onboards each prompt's
// prefix as CreateSequence would (block by block until the first miss).
void BenchTwoNodes(const Flags& f, const Workload& w) {
  constexpr size_t kTiles = 8;
  const size_t prompts = static_cast<size_t>(f.blocks) / kTiles;
  const size_t n = prompts * kTiles;
  const double bytes = static_cast<double>(n * w.record_bytes());
  testing::MemcachedServerOptions so;
  so.count = 3;
  so.memory_mb = static_cast<uint32_t>(std::max(8.0, MiB(bytes) / 2 / so.count));
  auto servers = testing::MemcachedServers::Start(so);
  if (!servers.ok()) Die(servers.status().ToString());
  MemcachedTierOptions o;
  o.servers = (*servers)->addresses();
  o.timeout = absl::Seconds(2);
  auto node1 = MemcachedTier::Open(o, w.id);
  auto node2 = MemcachedTier::Open(o, w.id);
  if (!node1.ok() || !node2.ok()) Die("memcached tier open");
  // The workload's chain, cut into prompts: prompt p is blocks [p * kTiles, (p + 1) * kTiles),
  // each with its own chain (the bench's records carry the workload's tile index; the tier does
  // not check chains, the core does).
  WriteAll(**node1, w, n, o.queue_bytes);
  uint64_t block_hits = 0, asked_blocks = 0;
  std::vector<double> per_block_ms;
  for (size_t p = 0; p < prompts; ++p) {
    for (size_t i = 0; i < kTiles; ++i) {
      ++asked_blocks;
      const Clock::time_point t0 = Clock::now();
      const bool hit = (*node2)->Get(w.hashes[p * kTiles + i]).ok();
      per_block_ms.push_back(MsSince(t0));
      if (!hit) break;
      ++block_hits;  // still in the prefix: every block before it hit
    }
  }
  const TierStats st = (*node2)->Stats();
  std::printf(
      "== two nodes, one memcached tier smaller than the working set (3 servers x -m %u = %u MiB, "
      "node 1 wrote %zu "
      "prompts x %zu blocks = %.0f MiB)\n",
      so.memory_mb, 3 * so.memory_mb, prompts, kTiles, MiB(bytes));
  std::printf(
      "  node 2 prefix hit rate  %.1f%% of prompt blocks (%llu of %zu)   vs memcached memory / "
      "working set %.1f%%\n",
      100.0 * static_cast<double>(block_hits) / static_cast<double>(n),
      static_cast<unsigned long long>(block_hits), n, 100.0 * 3.0 * so.memory_mb / MiB(bytes));
  std::printf(
      "  node 2 block hit rate   %.1f%% of the blocks it asked for (%llu of %llu; a prefix stops "
      "at its first miss)\n",
      100.0 * static_cast<double>(block_hits) / static_cast<double>(asked_blocks),
      static_cast<unsigned long long>(block_hits), static_cast<unsigned long long>(asked_blocks));
  std::printf(
      "  node 2 Get per block    %s   (tier counted hits %llu misses %llu rejected truncated "
      "%llu)\n",
      Quantiles(per_block_ms).c_str(), static_cast<unsigned long long>(st.hits),
      static_cast<unsigned long long>(st.misses),
      static_cast<unsigned long long>(st.rejected[static_cast<int>(RecordFault::kTruncated)]));
}

}  // namespace
}  // namespace kvarn

int main(int argc, char** argv) {
  using namespace kvarn;
  const Flags f = Parse(argc, argv);
  Preset p;
  if (!ParsePreset(f.preset, &p).ok()) Die("unknown preset " + f.preset);
  std::printf(
      "kvarn_tier_bench: clock std::chrono::steady_clock (wall time); %d blocks; %ld CPUs online\n",
      f.blocks, sysconf(_SC_NPROCESSORS_ONLN));
  const auto jiffies0 = CpuJiffies();
  const Clock::time_point start = Clock::now();
  const double cpu0 = ProcessCpuSeconds();
  const Workload w = MakeWorkload(f, p, static_cast<size_t>(f.blocks), 1);
  PrintSizes(w, f, p);
  PrintFloors(w);
  if (f.Runs("disk")) BenchDisk(f, w);
  if (f.Runs("memcached")) {
    for (uint32_t kib : f.chunk_kib) BenchMemcached(f, w, kib);
  }
  if (f.Runs("two_nodes")) BenchTwoNodes(f, MakeWorkload(f, p, static_cast<size_t>(f.blocks), 2));
  const auto jiffies1 = CpuJiffies();
  const double wall_s = MsSince(start) / 1e3;
  const double busy = jiffies1.second > jiffies0.second
                          ? static_cast<double>(jiffies1.first - jiffies0.first) /
                                static_cast<double>(jiffies1.second - jiffies0.second)
                          : 0;
  const double mine =
      (ProcessCpuSeconds() - cpu0) / wall_s / static_cast<double>(sysconf(_SC_NPROCESSORS_ONLN));
  std::printf(
      "== machine: CPUs busy %.0f%% of the %.1f s run, this process (its threads; not the "
      "memcached servers) %.0f%%: "
      "figures under a shared load are noisier than the rest\n",
      100 * busy, wall_s, 100 * mine);
  return 0;
}
