// The disk tier: round trip, warm restart, bad files at Open and on Get, the LRU's byte bound,
// the queue's bound, write errors, and concurrent use.
#include "daemon/tiers/disk_tier.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace kvarn {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kQuantBytes = 256;
constexpr uint64_t kSinkBytes = 512;
constexpr uint64_t kRecordBytes = kRecordHeaderBytes + kQuantBytes;  // one quantized block's file
constexpr int kCorrupt = static_cast<int>(RecordFault::kCorrupt);
constexpr int kTruncated = static_cast<int>(RecordFault::kTruncated);
constexpr int kForeign = static_cast<int>(RecordFault::kForeign);
constexpr int kWrongKey = static_cast<int>(RecordFault::kWrongKey);

ModelConfig Model(std::string id = "llama-3-8b") {
  ModelConfig m;
  m.model_id = std::move(id);
  m.num_layers = 32;
  m.num_kv_heads = 8;
  return m;
}

TierIdentity Identity(std::string_view model = "llama-3-8b", std::string_view secret = "s3cret") {
  return MakeTierIdentity(Model(std::string(model)), 128, kQuantBytes, kSinkBytes, secret);
}

// A unique directory for one test, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base != nullptr ? base : "/tmp") + "/kvarn_disk_tier_XXXXXX";
    EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct Block {
  RecordMeta meta;
  std::shared_ptr<const std::string> record;
  const BlockHash& hash() const { return meta.hash; }
};

// Block `i` of a chain: distinct hashes (spread over the 2-hex folders), payload bytes that
// depend on `i`.
Block MakeBlock(const TierIdentity& id, uint32_t i, BlockClass cls = BlockClass::kQuant) {
  const uint32_t token[] = {i};
  Block b;
  b.meta.hash = ChainHash(kRootHash, BlockHash{}, token);
  if (i > 0) {
    const uint32_t prev[] = {i - 1};
    b.meta.parent = ChainHash(kRootHash, BlockHash{}, prev);
  }
  b.meta.cls = cls;
  b.meta.tile_index = i;
  std::string r = NewRecord(id, cls);
  for (size_t j = kRecordHeaderBytes; j < r.size(); ++j) r[j] = static_cast<char>(i * 31 + j);
  SealRecord(id, b.meta, r);
  b.record = std::make_shared<const std::string>(std::move(r));
  return b;
}

std::string FileOf(const std::string& dir, const BlockHash& h) {
  const std::string hex = HashToHex(h);
  return dir + "/" + hex.substr(0, 2) + "/" + hex + ".kvb";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// Regular files and symlinks under `dir`, LOCK excepted, and their bytes.
std::map<std::string, uint64_t> FilesUnder(const std::string& dir) {
  std::map<std::string, uint64_t> files;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       it != fs::recursive_directory_iterator(); ++it) {
    const std::string rel = fs::relative(it->path(), dir).string();
    if (rel == "LOCK" || (it->is_directory() && !it->is_symlink())) continue;
    files[rel] = it->is_symlink() ? 0 : it->file_size();
  }
  return files;
}

uint64_t DiskBytes(const std::string& dir) {
  uint64_t sum = 0;
  for (const auto& [path, bytes] : FilesUnder(dir)) sum += bytes;
  return sum;
}

struct Event {
  BlockHash hash;
  bool stored;
  uint32_t tenant;
};

// Records listener calls. With hold_first, the first call blocks the writer thread until
// Release(), so a test can look at a queue the writer is not draining.
class Recorder {
 public:
  explicit Recorder(bool hold_first = false) : hold_(hold_first) {}
  ~Recorder() { Release(); }
  BlockTier::Listener listener() {
    return [this](const BlockHash& h, bool stored, uint32_t tenant) {
      {
        MutexLock lock(&mu_);
        events_.push_back(Event{h, stored, tenant});
      }
      if (hold_.exchange(false)) {
        entered_.Notify();
        released_.WaitForNotificationWithTimeout(absl::Seconds(60));
      }
    };
  }
  bool WaitHeld() { return entered_.WaitForNotificationWithTimeout(absl::Seconds(30)); }
  void Release() {
    if (!released_.HasBeenNotified()) released_.Notify();
  }
  std::vector<Event> events() {
    MutexLock lock(&mu_);
    return events_;
  }
  int Count(const BlockHash& h, bool stored) {
    int n = 0;
    for (const Event& e : events()) n += e.hash == h && e.stored == stored;
    return n;
  }

 private:
  std::atomic<bool> hold_;
  Notification entered_, released_;
  Mutex mu_;
  std::vector<Event> events_ ABSL_GUARDED_BY(mu_);
};

class DiskTierTest : public ::testing::Test {
 protected:
  DiskTierOptions Options(uint64_t capacity_blocks = 100) const {
    DiskTierOptions o;
    o.dir = dir_.path() + "/tier";
    o.capacity_bytes = capacity_blocks * kRecordBytes;
    return o;
  }
  std::unique_ptr<DiskTier> OpenTier(const DiskTierOptions& o) {
    absl::StatusOr<std::unique_ptr<DiskTier>> t = DiskTier::Open(o, id_, nullptr);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? std::move(*t) : nullptr;
  }
  static bool Flush(DiskTier& t) { return t.Flush(absl::Now() + absl::Seconds(30)); }
  // Writes `blocks` through a tier, then closes it.
  void Populate(const std::vector<Block>& blocks) {
    std::unique_ptr<DiskTier> t = OpenTier(Options(/*capacity_blocks=*/1000));
    ASSERT_NE(t, nullptr);
    for (const Block& b : blocks) ASSERT_TRUE(t->Put(b.hash(), b.record, 1));
    ASSERT_TRUE(Flush(*t));
  }
  std::vector<Block> Blocks(uint32_t n) const {
    std::vector<Block> v;
    for (uint32_t i = 0; i < n; ++i) v.push_back(MakeBlock(id_, i));
    return v;
  }

  TempDir dir_;
  const TierIdentity id_ = Identity();
};

TEST_F(DiskTierTest, PutThenGetReturnsIdenticalBytes) {
  std::unique_ptr<DiskTier> t = OpenTier(Options());
  ASSERT_NE(t, nullptr);
  Recorder rec;
  t->SetListener(rec.listener());
  const Block quant = MakeBlock(id_, 1), sink = MakeBlock(id_, 0, BlockClass::kSink);
  ASSERT_TRUE(t->Put(quant.hash(), quant.record, 7));
  ASSERT_TRUE(t->Put(sink.hash(), sink.record, 8));
  EXPECT_TRUE(t->Contains(quant.hash()));  // queued or written: either way contained
  ASSERT_TRUE(Flush(*t));

  for (const Block* b : {&quant, &sink}) {
    absl::StatusOr<std::string> got = t->Get(b->hash());
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, *b->record);
    EXPECT_EQ(ReadFile(FileOf(Options().dir, b->hash())), *b->record);  // the documented layout
  }
  EXPECT_FALSE(t->Contains(MakeBlock(id_, 2).hash()));
  EXPECT_TRUE(absl::IsNotFound(t->Get(MakeBlock(id_, 2).hash()).status()));

  const TierStats s = t->Stats();
  EXPECT_EQ(s.blocks, 2u);
  EXPECT_EQ(s.bytes, quant.record->size() + sink.record->size());
  EXPECT_EQ(s.capacity_bytes, Options().capacity_bytes);
  EXPECT_EQ(s.written_blocks, 2u);
  EXPECT_EQ(s.written_bytes, s.bytes);
  EXPECT_EQ(s.hits, 2u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.read_bytes, s.bytes);
  EXPECT_EQ(s.queued_blocks, 0u);
  EXPECT_EQ(s.queued_bytes, 0u);
  EXPECT_EQ(s.errors, 0u);
  EXPECT_EQ(rec.Count(quant.hash(), true), 1);
  EXPECT_EQ(rec.Count(sink.hash(), true), 1);
  ASSERT_EQ(rec.events().size(), 2u);
  EXPECT_EQ(rec.events()[0].tenant, 7u);
  EXPECT_EQ(rec.events()[1].tenant, 8u);
  EXPECT_EQ(FilesUnder(Options().dir).size(), 2u);  // no temp file left behind
  EXPECT_EQ(t->name(), "disk");
  EXPECT_EQ(t->write_policy(), TierWrite::kOnEvict);
}

TEST_F(DiskTierTest, SyncedWritesRoundTrip) {
  DiskTierOptions o = Options();
  o.fsync = true;
  o.write = TierWrite::kOnSeal;
  std::unique_ptr<DiskTier> t = OpenTier(o);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->write_policy(), TierWrite::kOnSeal);
  const Block b = MakeBlock(id_, 1);
  ASSERT_TRUE(t->Put(b.hash(), b.record, 1));
  ASSERT_TRUE(Flush(*t));
  absl::StatusOr<std::string> got = t->Get(b.hash());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, *b.record);
}

TEST_F(DiskTierTest, ReopenedDirServesIndexAndGet) {
  const std::vector<Block> blocks = Blocks(600);  // more than one progress step
  Populate(blocks);
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  absl::StatusOr<std::unique_ptr<DiskTier>> t = DiskTier::Open(
      Options(1000), id_, [&](uint64_t done, uint64_t total) { calls.emplace_back(done, total); });
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_GE(calls.size(), 3u);
  for (size_t i = 1; i < calls.size(); ++i) EXPECT_GT(calls[i].first, calls[i - 1].first);
  EXPECT_EQ(calls.back(), std::make_pair(uint64_t{600}, uint64_t{600}));

  const std::vector<RecordMeta> index = (*t)->Index();
  ASSERT_EQ(index.size(), blocks.size());
  std::map<BlockHash, RecordMeta> by_hash;
  for (const RecordMeta& m : index) by_hash[m.hash] = m;
  for (const Block& b : blocks) {
    ASSERT_TRUE(by_hash.contains(b.hash()));
    EXPECT_EQ(by_hash[b.hash()].parent, b.meta.parent);
    EXPECT_EQ(by_hash[b.hash()].tile_index, b.meta.tile_index);
    EXPECT_EQ(by_hash[b.hash()].cls, b.meta.cls);
    EXPECT_TRUE((*t)->Contains(b.hash()));
  }
  absl::StatusOr<std::string> got = (*t)->Get(blocks[17].hash());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, *blocks[17].record);
  EXPECT_EQ((*t)->Stats().blocks, 600u);
  EXPECT_EQ((*t)->Stats().bytes, 600 * kRecordBytes);

  // Written since Open: in the index too.
  const Block more = MakeBlock(id_, 1000);
  ASSERT_TRUE((*t)->Put(more.hash(), more.record, 1));
  ASSERT_TRUE(Flush(**t));
  EXPECT_EQ((*t)->Index().size(), 601u);
  EXPECT_EQ((*t)->Index().back().hash, more.hash());  // most recently used last
}

TEST_F(DiskTierTest, BadFilesAreRejectedAndDeletedAtOpen) {
  std::vector<Block> blocks = Blocks(7);
  Populate(blocks);
  const std::string dir = Options().dir;
  auto file = [&](int i) { return FileOf(dir, blocks[i].hash()); };
  // 0: one flipped byte in the header's reserved field.
  std::string bytes = ReadFile(file(0));
  bytes[130] ^= 1;
  WriteFile(file(0), bytes);
  // 1: truncated.
  fs::resize_file(file(1), 100);
  // 2: another pool's record under its own name.
  WriteFile(file(2), *MakeBlock(Identity("other-model"), 2).record);
  // 3: renamed to the name of a block the tier never held.
  const Block absent = MakeBlock(id_, 99);
  fs::create_directories(fs::path(FileOf(dir, absent.hash())).parent_path());
  fs::rename(file(3), FileOf(dir, absent.hash()));
  // 4: sealed with another secret.
  WriteFile(file(4), *MakeBlock(Identity("llama-3-8b", "other"), 4).record);
  // Garbage: random bytes under a name that is no record's, text at the top, a good record
  // under a wrong name, a symlink to a good record outside, a stale temp file.
  const std::string folder = fs::path(file(5)).parent_path().string();
  WriteFile(folder + "/garbage.bin", std::string(300, '\x5a'));
  WriteFile(dir + "/notes.txt", "hello");
  WriteFile(folder + "/copy.kvb", *blocks[5].record);
  const std::string outside = dir_.path() + "/outside.kvb";
  WriteFile(outside, *MakeBlock(id_, 50).record);
  const Block linked = MakeBlock(id_, 50);
  fs::create_directories(fs::path(FileOf(dir, linked.hash())).parent_path());
  fs::create_symlink(outside, FileOf(dir, linked.hash()));
  WriteFile(file(6) + ".tmp", *blocks[6].record);
  // A folder the tier did not make: left alone.
  fs::create_directories(dir + "/keep");
  WriteFile(dir + "/keep/mine", "x");

  std::unique_ptr<DiskTier> t = OpenTier(Options());
  ASSERT_NE(t, nullptr);
  const TierStats s = t->Stats();
  EXPECT_EQ(s.rejected[kCorrupt], 4u);    // 0, 4, garbage.bin, the symlink
  EXPECT_EQ(s.rejected[kTruncated], 2u);  // 1, notes.txt
  EXPECT_EQ(s.rejected[kForeign], 1u);    // 2
  EXPECT_EQ(s.rejected[kWrongKey], 2u);   // 3 under another name, copy.kvb
  EXPECT_EQ(s.errors, 0u);
  EXPECT_EQ(s.blocks, 2u);
  std::map<std::string, uint64_t> expected = {
      {fs::relative(file(5), dir).string(), kRecordBytes},
      {fs::relative(file(6), dir).string(), kRecordBytes},
      {"keep/mine", 1},
  };
  EXPECT_EQ(FilesUnder(dir), expected);
  EXPECT_TRUE(fs::exists(outside));  // the link was deleted, not its target
  std::vector<BlockHash> indexed;
  for (const RecordMeta& m : t->Index()) indexed.push_back(m.hash);
  EXPECT_EQ(indexed.size(), 2u);
  EXPECT_NE(std::find(indexed.begin(), indexed.end(), blocks[5].hash()), indexed.end());
  EXPECT_NE(std::find(indexed.begin(), indexed.end(), blocks[6].hash()), indexed.end());
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(absl::IsNotFound(t->Get(blocks[i].hash()).status())) << i;
  EXPECT_TRUE(absl::IsNotFound(t->Get(absent.hash()).status()));
  EXPECT_TRUE(t->Get(blocks[6].hash()).ok());
}

TEST_F(DiskTierTest, BadFilesAreRejectedAndDeletedOnGet) {
  const std::vector<Block> blocks = Blocks(6);
  std::unique_ptr<DiskTier> t = OpenTier(Options());
  ASSERT_NE(t, nullptr);
  Recorder rec;
  t->SetListener(rec.listener());
  for (uint32_t i = 0; i < blocks.size(); ++i)
    ASSERT_TRUE(t->Put(blocks[i].hash(), blocks[i].record, 10 + i));
  ASSERT_TRUE(Flush(*t));
  const std::string dir = Options().dir;
  auto file = [&](int i) { return FileOf(dir, blocks[i].hash()); };
  std::string bytes = ReadFile(file(0));
  bytes[kRecordHeaderBytes + 10] ^= 0x40;  // payload
  WriteFile(file(0), bytes);
  fs::resize_file(file(1), kRecordHeaderBytes + 3);
  WriteFile(file(2), *MakeBlock(Identity("other-model"), 2).record);
  fs::copy_file(file(3), file(4),
                fs::copy_options::overwrite_existing);  // 3's record under 4's name
  WriteFile(file(5), std::string(kRecordBytes, '\0'));

  const std::pair<int, const char*> cases[] = {
      {0, "corrupt"}, {1, "truncated"}, {2, "foreign"}, {4, "wrong_key"}, {5, "corrupt"}};
  for (const auto& [i, fault] : cases) {
    absl::StatusOr<std::string> got = t->Get(blocks[i].hash());
    ASSERT_TRUE(absl::IsNotFound(got.status())) << i << " " << got.status();
    EXPECT_NE(got.status().message().find(fault), absl::string_view::npos) << got.status();
    EXPECT_FALSE(t->Contains(blocks[i].hash()));
  }
  ASSERT_TRUE(Flush(*t));  // the writer deletes the files and tells the listener
  TierStats s = t->Stats();
  EXPECT_EQ(s.rejected[kCorrupt], 2u);
  EXPECT_EQ(s.rejected[kTruncated], 1u);
  EXPECT_EQ(s.rejected[kForeign], 1u);
  EXPECT_EQ(s.rejected[kWrongKey], 1u);
  EXPECT_EQ(s.misses, 5u);
  EXPECT_EQ(s.blocks, 1u);
  EXPECT_EQ(s.bytes, kRecordBytes);
  for (const auto& [i, fault] : cases) {
    EXPECT_FALSE(fs::exists(file(i))) << i;
    ASSERT_EQ(rec.Count(blocks[i].hash(), false), 1) << i;
  }
  for (const Event& e : rec.events()) {
    EXPECT_GE(e.tenant, 10u);  // the cookie Put gave, for both kinds of call
  }
  absl::StatusOr<std::string> good = t->Get(blocks[3].hash());
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(*good, *blocks[3].record);
  // A rejected block can be written again.
  ASSERT_TRUE(t->Put(blocks[0].hash(), blocks[0].record, 1));
  ASSERT_TRUE(Flush(*t));
  EXPECT_TRUE(t->Get(blocks[0].hash()).ok());
}

TEST_F(DiskTierTest, FileRemovedBehindItsBackIsAMissAndLeavesTheIndex) {
  const Block b = MakeBlock(id_, 3);
  std::unique_ptr<DiskTier> t = OpenTier(Options());
  ASSERT_NE(t, nullptr);
  Recorder rec;
  t->SetListener(rec.listener());
  ASSERT_TRUE(t->Put(b.hash(), b.record, 4));
  ASSERT_TRUE(Flush(*t));
  fs::remove(FileOf(Options().dir, b.hash()));
  EXPECT_TRUE(absl::IsNotFound(t->Get(b.hash()).status()));
  ASSERT_TRUE(Flush(*t));
  EXPECT_FALSE(t->Contains(b.hash()));
  EXPECT_EQ(t->Stats().blocks, 0u);
  EXPECT_EQ(t->Stats().errors, 0u);
  EXPECT_EQ(rec.Count(b.hash(), false), 1);
}

TEST_F(DiskTierTest, EvictsLeastRecentlyUsedBeyondCapacity) {
  const std::vector<Block> b = Blocks(6);
  std::unique_ptr<DiskTier> t = OpenTier(Options(/*capacity_blocks=*/3));
  ASSERT_NE(t, nullptr);
  Recorder rec;
  t->SetListener(rec.listener());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(t->Put(b[i].hash(), b[i].record, 1));
  ASSERT_TRUE(Flush(*t));
  ASSERT_TRUE(t->Get(b[0].hash()).ok());             // 0 used: 1 is now the oldest
  ASSERT_TRUE(t->Put(b[2].hash(), b[2].record, 1));  // held already: refreshed, not rewritten
  ASSERT_TRUE(t->Put(b[3].hash(), b[3].record, 1));
  ASSERT_TRUE(Flush(*t));
  EXPECT_FALSE(t->Contains(b[1].hash()));
  EXPECT_FALSE(fs::exists(FileOf(Options().dir, b[1].hash())));
  EXPECT_EQ(rec.Count(b[1].hash(), false), 1);
  ASSERT_TRUE(t->Put(b[4].hash(), b[4].record, 1));
  ASSERT_TRUE(Flush(*t));
  EXPECT_FALSE(t->Contains(b[0].hash()));  // then 0, used before 2 was refreshed
  EXPECT_TRUE(t->Contains(b[2].hash()));
  EXPECT_TRUE(t->Contains(b[3].hash()));
  EXPECT_TRUE(t->Contains(b[4].hash()));
  const TierStats s = t->Stats();
  EXPECT_EQ(s.evicted_blocks, 2u);
  EXPECT_EQ(s.written_blocks, 5u);  // 2's second Put wrote nothing
  EXPECT_EQ(s.blocks, 3u);
  std::vector<BlockHash> order;
  for (const RecordMeta& m : t->Index()) order.push_back(m.hash);
  EXPECT_EQ(order, (std::vector<BlockHash>{b[2].hash(), b[3].hash(), b[4].hash()}));
}

TEST_F(DiskTierTest, BytesNeverExceedCapacity) {
  // Mixed sizes (sink files are larger) filling the tier three times over.
  const DiskTierOptions o = Options(/*capacity_blocks=*/10);
  std::unique_ptr<DiskTier> t = OpenTier(o);
  ASSERT_NE(t, nullptr);
  Recorder rec;
  t->SetListener(rec.listener());
  int stored = 0;
  for (uint32_t i = 0; i < 30; ++i) {
    const Block b = MakeBlock(id_, i, i % 3 == 0 ? BlockClass::kSink : BlockClass::kQuant);
    ASSERT_TRUE(t->Put(b.hash(), b.record, 1));
    ASSERT_TRUE(Flush(*t));
    ++stored;
    const TierStats s = t->Stats();
    ASSERT_LE(s.bytes, o.capacity_bytes) << i;
    ASSERT_LE(DiskBytes(o.dir), o.capacity_bytes) << i;
    ASSERT_EQ(FilesUnder(o.dir).size(), s.blocks) << i;
  }
  const TierStats s = t->Stats();
  EXPECT_GT(s.evicted_blocks, 0u);
  EXPECT_EQ(s.blocks, stored - s.evicted_blocks);
  int net = 0;
  for (const Event& e : rec.events()) net += e.stored ? 1 : -1;
  EXPECT_EQ(net, static_cast<int>(s.blocks));
}

TEST_F(DiskTierTest, OpenTrimsOldestFilesBeyondCapacity) {
  const std::vector<Block> b = Blocks(4);
  Populate(b);
  // mtimes, oldest first: 2, 0, 3, 1.
  const int age_order[] = {2, 0, 3, 1};
  for (int rank = 0; rank < 4; ++rank) {
    const timespec times[2] = {{1000 + rank, 0}, {1000 + rank, 0}};
    ASSERT_EQ(
        ::utimensat(AT_FDCWD, FileOf(Options().dir, b[age_order[rank]].hash()).c_str(), times, 0),
        0);
  }
  std::unique_ptr<DiskTier> t = OpenTier(Options(/*capacity_blocks=*/2));
  ASSERT_NE(t, nullptr);
  std::vector<BlockHash> order;
  for (const RecordMeta& m : t->Index()) order.push_back(m.hash);
  EXPECT_EQ(order, (std::vector<BlockHash>{b[3].hash(), b[1].hash()}));
  EXPECT_EQ(t->Stats().evicted_blocks, 2u);
  EXPECT_EQ(FilesUnder(Options().dir).size(), 2u);
}

TEST_F(DiskTierTest, HitsSurviveARestartInTheLruOrder) {
  const std::vector<Block> b = Blocks(3);
  Populate(b);
  for (int i = 0; i < 3; ++i) {
    const timespec times[2] = {{1000 + i, 0}, {1000 + i, 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, FileOf(Options().dir, b[i].hash()).c_str(), times, 0), 0);
  }
  {
    std::unique_ptr<DiskTier> t = OpenTier(Options());
    ASSERT_NE(t, nullptr);
    ASSERT_TRUE(t->Get(b[0].hash()).ok());  // 0 becomes the most recent, on disk too
  }
  std::unique_ptr<DiskTier> t = OpenTier(Options(/*capacity_blocks=*/2));
  ASSERT_NE(t, nullptr);
  std::vector<BlockHash> order;
  for (const RecordMeta& m : t->Index()) order.push_back(m.hash);
  EXPECT_EQ(order, (std::vector<BlockHash>{b[2].hash(), b[0].hash()}));
}

TEST_F(DiskTierTest, QueuedRecordsAreContainedServedAndBounded) {
  const std::vector<Block> b = Blocks(5);
  DiskTierOptions o = Options();
  o.queue_bytes = 2 * kRecordBytes;
  Recorder held(/*hold_first=*/true);  // outlives the tier: the writer may be inside it
  std::unique_ptr<DiskTier> t = OpenTier(o);
  ASSERT_NE(t, nullptr);
  t->SetListener(held.listener());
  ASSERT_TRUE(t->Put(b[0].hash(), b[0].record, 1));
  ASSERT_TRUE(held.WaitHeld());  // the writer is stuck telling the listener about 0
  ASSERT_TRUE(t->Put(b[1].hash(), b[1].record, 1));
  ASSERT_TRUE(t->Put(b[2].hash(), b[2].record, 1));
  ASSERT_TRUE(t->Put(b[2].hash(), b[2].record, 1));   // queued already: not queued twice
  EXPECT_FALSE(t->Put(b[3].hash(), b[3].record, 1));  // past queue_bytes
  EXPECT_TRUE(t->Contains(b[1].hash()));
  EXPECT_FALSE(t->Contains(b[3].hash()));
  absl::StatusOr<std::string> got = t->Get(b[1].hash());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, *b[1].record);
  TierStats s = t->Stats();
  EXPECT_EQ(s.queued_blocks, 2u);
  EXPECT_EQ(s.queued_bytes, 2 * kRecordBytes);
  EXPECT_EQ(s.dropped_writes, 1u);
  EXPECT_EQ(s.hits, 1u);
  EXPECT_FALSE(t->Flush(absl::Now() + absl::Milliseconds(20)));

  held.Release();
  ASSERT_TRUE(Flush(*t));
  s = t->Stats();
  EXPECT_EQ(s.queued_blocks, 0u);
  EXPECT_EQ(s.queued_bytes, 0u);
  EXPECT_EQ(s.written_blocks, 3u);
  EXPECT_TRUE(t->Put(b[4].hash(), b[4].record, 1));  // room again
  ASSERT_TRUE(Flush(*t));
  EXPECT_EQ(ReadFile(FileOf(o.dir, b[1].hash())), *b[1].record);
}

TEST_F(DiskTierTest, DestructorWritesWhatIsQueued) {
  const std::vector<Block> b = Blocks(4);
  Recorder held(/*hold_first=*/true);
  std::unique_ptr<DiskTier> t = OpenTier(Options());
  ASSERT_NE(t, nullptr);
  t->SetListener(held.listener());
  ASSERT_TRUE(t->Put(b[0].hash(), b[0].record, 1));
  ASSERT_TRUE(held.WaitHeld());
  for (int i = 1; i < 4; ++i) ASSERT_TRUE(t->Put(b[i].hash(), b[i].record, 1));
  held.Release();
  t.reset();
  t = OpenTier(Options());
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->Index().size(), 4u);
}

TEST_F(DiskTierTest, WriteErrorIsCountedAndDropped) {
  const Block x = MakeBlock(id_, 1);
  Block y = MakeBlock(id_, 2);
  for (uint32_t i = 3; HashToHex(y.hash()).substr(0, 2) == HashToHex(x.hash()).substr(0, 2); ++i) {
    y = MakeBlock(id_, i);
  }
  const DiskTierOptions o = Options();
  std::unique_ptr<DiskTier> t = OpenTier(o);
  ASSERT_NE(t, nullptr);
  // A file where x's folder belongs: creating x's file fails (ENOTDIR).
  WriteFile(fs::path(FileOf(o.dir, x.hash())).parent_path().string(), "in the way");
  ASSERT_TRUE(t->Put(x.hash(), x.record, 1));
  ASSERT_TRUE(t->Put(y.hash(), y.record, 1));
  ASSERT_TRUE(Flush(*t));
  const TierStats s = t->Stats();
  EXPECT_EQ(s.errors, 1u);
  EXPECT_EQ(s.dropped_writes, 1u);
  EXPECT_EQ(s.written_blocks, 1u);
  EXPECT_FALSE(t->Contains(x.hash()));
  EXPECT_TRUE(absl::IsNotFound(t->Get(x.hash()).status()));
  EXPECT_TRUE(t->Get(y.hash()).ok());  // the tier keeps serving
}

TEST_F(DiskTierTest, UnwritableRecordsAreDropped) {
  // A record that fails its check, and one larger than the whole tier: neither is written.
  std::unique_ptr<DiskTier> t = OpenTier(Options(/*capacity_blocks=*/1));
  ASSERT_NE(t, nullptr);
  const Block quant = MakeBlock(id_, 1), sink = MakeBlock(id_, 2, BlockClass::kSink);
  ASSERT_TRUE(t->Put(MakeBlock(id_, 9).hash(), quant.record, 1));  // under another block's key
  ASSERT_TRUE(t->Put(sink.hash(), sink.record, 1));
  EXPECT_FALSE(t->Put(quant.hash(), nullptr, 1));
  ASSERT_TRUE(Flush(*t));
  const TierStats s = t->Stats();
  EXPECT_EQ(s.rejected[kWrongKey], 1u);
  EXPECT_EQ(s.dropped_writes, 3u);
  EXPECT_EQ(s.written_blocks, 0u);
  EXPECT_EQ(s.blocks, 0u);
  EXPECT_TRUE(FilesUnder(Options().dir).empty());
}

TEST_F(DiskTierTest, OpenErrorsNameThePath) {
  WriteFile(dir_.path() + "/file", "x");
  DiskTierOptions o = Options();
  o.dir = dir_.path() + "/file/tier";
  absl::StatusOr<std::unique_ptr<DiskTier>> t = DiskTier::Open(o, id_);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find(o.dir), absl::string_view::npos) << t.status();

  o.dir = dir_.path() + "/file";  // there, but not a directory
  t = DiskTier::Open(o, id_);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find(o.dir), absl::string_view::npos) << t.status();

  o = Options();
  o.capacity_bytes = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(DiskTier::Open(o, id_).status()));
  o.dir.clear();
  o.capacity_bytes = 1;
  EXPECT_TRUE(absl::IsInvalidArgument(DiskTier::Open(o, id_).status()));
}

TEST_F(DiskTierTest, SecondOpenOfTheSameDirFails) {
  std::unique_ptr<DiskTier> t = OpenTier(Options());
  ASSERT_NE(t, nullptr);
  EXPECT_TRUE(absl::IsFailedPrecondition(DiskTier::Open(Options(), id_).status()));
  t.reset();
  EXPECT_TRUE(DiskTier::Open(Options(), id_).ok());  // released with the tier
}

TEST_F(DiskTierTest, ConcurrentPutGetContains) {
  const std::vector<Block> blocks = Blocks(64);
  const DiskTierOptions o = Options(/*capacity_blocks=*/16);  // evicting all the time
  std::unique_ptr<DiskTier> t = OpenTier(o);
  ASSERT_NE(t, nullptr);
  Recorder rec;
  t->SetListener(rec.listener());
  constexpr int kThreads = 4, kSteps = 400;
  std::atomic<int> gets{0}, mismatches{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      uint32_t x = 12345u + th;
      for (int step = 0; step < kSteps; ++step) {
        x = x * 1664525u + 1013904223u;
        const Block& b = blocks[(x >> 8) % blocks.size()];
        switch ((x >> 20) % 3) {
          case 0:
            t->Put(b.hash(), b.record, th);
            break;
          case 1:
            t->Contains(b.hash());
            break;
          default: {
            ++gets;
            absl::StatusOr<std::string> got = t->Get(b.hash());
            if (got.ok() ? *got != *b.record : !absl::IsNotFound(got.status())) ++mismatches;
          }
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  ASSERT_TRUE(Flush(*t));
  EXPECT_EQ(mismatches.load(), 0);
  const TierStats s = t->Stats();
  EXPECT_EQ(s.hits + s.misses, static_cast<uint64_t>(gets.load()));
  EXPECT_LE(s.bytes, o.capacity_bytes);
  EXPECT_EQ(s.errors, 0u);
  for (uint64_t r : s.rejected) EXPECT_EQ(r, 0u);
  EXPECT_EQ(t->Index().size(), s.blocks);
  EXPECT_EQ(FilesUnder(o.dir).size(), s.blocks);
  int net = 0;
  for (const Event& e : rec.events()) net += e.stored ? 1 : -1;
  EXPECT_EQ(net, static_cast<int>(s.blocks));
  for (const RecordMeta& m : t->Index()) EXPECT_TRUE(t->Get(m.hash).ok());
}

}  // namespace
}  // namespace kvarn
