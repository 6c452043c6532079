// tier_record_fuzzer's spec of a block record and its figures: what block_record.h's layout and
// docs/tiers.md's table of faults say of any bytes, written here without calling the daemon's
// code, so that CheckRecord and the tiers can be held to it; the HMAC the harness re-seals
// records with; the files it plants in the disk tier's folder; the figures printed at exit.
// Functions inline, in namespace kvarn::testing::tier_fuzz (tier_record_fuzzer.cc).
#ifndef KVARN_TESTS_FUZZ_TIER_RECORD_FUZZ_SPEC_H_
#define KVARN_TESTS_FUZZ_TIER_RECORD_FUZZ_SPEC_H_

#include <fcntl.h>
#include <ftw.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "daemon/core/block_record.h"
#include "daemon/core/memory.h"
#include "tests/fuzz/fuzz_check.h"

namespace kvarn::testing::tier_fuzz {

using fuzz::Check;
using fuzz::Fail;

constexpr size_t kTiles = 5;  // the prompt's blocks: an fp16 sink, then 4 quantized
constexpr size_t kDisk = 0, kMap = 1, kTiers = 2;

// Header offsets (block_record.h).
constexpr size_t kVersionAt = 8, kHeaderBytesAt = 12, kFingerprintAt = 16, kHashAt = 48,
                 kParentAt = 80, kClassAt = 112, kTileAt = 116, kPayloadAt = 120, kNsAt = 128,
                 kMacAt = 160;

inline uint64_t GetLe(std::string_view r, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(r[at + i]);
  return v;
}
inline void PutLe(std::string& r, size_t at, int bytes, uint64_t v) {
  for (int i = 0; i < bytes; ++i) r[at + i] = static_cast<char>(v >> (8 * i));
}
inline BlockHash HashAt(std::string_view r, size_t at) {
  BlockHash h;
  std::memcpy(h.data(), r.data() + at, h.size());
  return h;
}
inline void PutHash(std::string& r, size_t at, const BlockHash& h) {
  std::memcpy(r.data() + at, h.data(), h.size());
}
inline unsigned Bit(RecordFault f) { return 1u << static_cast<int>(f); }

// HMAC-SHA256 over the header before the MAC field, then everything after the header
// (OpenSSL's one-shot HMAC, not the daemon's code).
inline BlockHash Mac(const BlockHash& key, std::string_view r) {
  std::string msg(r.substr(0, kMacAt));
  msg.append(r.substr(kRecordHeaderBytes));
  BlockHash out{};
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out.data(),
           &len) == nullptr ||
      len != out.size()) {
    Fail("HMAC failed");
  }
  return out;
}
inline bool MacMatches(const BlockHash& key, std::string_view r) {
  return r.size() >= kRecordHeaderBytes && HashAt(r, kMacAt) == Mac(key, r);
}
inline void Remac(const BlockHash& key, std::string& r) { PutHash(r, kMacAt, Mac(key, r)); }

// The faults of `r` by the spec, as bits of RecordFault; 0: it is served. truncated: shorter
// than a header, or than its header says; corrupt: bad magic, version or sizes, or the MAC
// (judged before any field it covers is believed); foreign: another pool's fingerprint or
// block size; wrong_key: a valid record of another block than `expect`. Several faults at
// once may be reported as any of them.
inline unsigned SpecFaults(const TierIdentity& id, std::string_view r, const BlockHash* expect,
                           bool mac_ok) {
  if (r.size() < kRecordHeaderBytes) return Bit(RecordFault::kTruncated);
  unsigned f = 0;
  const uint64_t cls = GetLe(r, kClassAt, 4), payload = GetLe(r, kPayloadAt, 8);
  const uint64_t have = r.size() - kRecordHeaderBytes;
  if (r.substr(0, 8) != "KVARNBLK" || GetLe(r, kVersionAt, 4) != 1 ||
      GetLe(r, kHeaderBytesAt, 4) != kRecordHeaderBytes || cls > 1) {
    f |= Bit(RecordFault::kCorrupt);
  }
  if (payload > have) f |= Bit(RecordFault::kTruncated);
  if (payload < have) f |= Bit(RecordFault::kCorrupt);
  if (f != 0) return f;
  if (!mac_ok) return Bit(RecordFault::kCorrupt);
  if (HashAt(r, kFingerprintAt) != id.fingerprint ||
      payload != id.payload_bytes(static_cast<BlockClass>(cls))) {
    f |= Bit(RecordFault::kForeign);
  }
  if (expect != nullptr && HashAt(r, kHashAt) != *expect) f |= Bit(RecordFault::kWrongKey);
  return f;
}

// Whether an fp16 payload holds a NaN or an infinity (every exponent bit set).
inline bool HasNonFiniteHalf(std::string_view payload) {
  for (size_t i = 0; i + 1 < payload.size(); i += 2) {
    if ((static_cast<uint8_t>(payload[i + 1]) & 0x7C) == 0x7C) return true;
  }
  return false;
}

inline std::string ReadFile(const std::string& path) {
  std::string out;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  Check(fd >= 0, "cannot open ", path, ": ", std::strerror(errno));
  char buf[65536];
  for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}
inline void WriteFile(const std::string& path, std::string_view bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  Check(fd >= 0, "cannot create ", path, ": ", std::strerror(errno));
  Check(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()),
        "short write of ", path);
  ::close(fd);
}
// Whatever is at `path` (a file, a symlink, a FIFO, an empty folder) is removed.
inline void RemovePath(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return;
  const int rc = S_ISDIR(st.st_mode) ? ::rmdir(path.c_str()) : ::unlink(path.c_str());
  Check(rc == 0, "cannot remove ", path, ": ", std::strerror(errno));
}
inline void RemoveTree(const std::string& dir) {
  ::nftw(
      dir.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); },
      16, FTW_DEPTH | FTW_PHYS);
}

// Heap memory that remembers the pool's regions, so adopted blocks can be compared byte by byte.
class PoolBackend final : public MemoryBackend {
 public:
  absl::StatusOr<std::unique_ptr<Region>> Create(RegionKind kind, size_t bytes) override {
    auto r = heap_.Create(kind, bytes);
    if (r.ok() && kind == RegionKind::kQuant) quant = (*r)->data();
    if (r.ok() && kind == RegionKind::kSink) sink = (*r)->data();
    return r;
  }
  const char* name() const override { return "heap"; }
  bool host_accessible() const override { return true; }
  const uint8_t* quant = nullptr;
  const uint8_t* sink = nullptr;

 private:
  HeapBackend heap_;
};

// What a tier holds for one key.
enum class Kind : uint8_t {
  kValid,
  kAbsent,
  kGarbage,
  kTruncated,
  kExtended,
  kFlipped,
  kSwapped,
  kReMaced,
  kOtherSecret,
  kOtherPool,
  kPoisonedSink,
  kSymlink,  // the disk only from here on: files, not values
  kFolder,
  kFifo,
};
constexpr int kKinds = 14, kMapKinds = 11;
constexpr const char* kKindNames[kKinds] = {
    "valid",    "absent",       "garbage",    "truncated",     "extended", "flipped", "swapped",
    "re-MACed", "other secret", "other pool", "poisoned sink", "symlink",  "folder",  "fifo"};

// What came of one tier's Get for one key, as the model predicts it.
enum class Outcome : uint8_t { kMiss, kRejected, kOutOfPlace, kImportRefused, kGood };
constexpr int kOutcomes = 5;

// Figures over the whole run, printed at exit: per kind of record, what the core asked the tiers
// for and what came of it (each one matched against the core's and the tiers' counters).
struct Figures {
  uint64_t inputs = 0, gets = 0, direct_checks = 0, adopted_blocks = 0;
  std::array<uint64_t, kTiles + 1> prefixes{};  // inputs by the prefix they adopted, in blocks
  uint64_t built[kKinds] = {}, adopted[kKinds] = {};
  uint64_t outcome[kKinds][kOutcomes] = {};
  uint64_t fault[kKinds][kRecordFaults] = {};  // rejected: by the fault counted
};
inline Figures g;

inline void PrintFigures() {
  const auto u = [](uint64_t v) { return static_cast<unsigned long long>(v); };
  std::fprintf(stderr,
               "tier_record_fuzzer: %llu records in %llu inputs, %llu CheckRecord calls checked "
               "against the spec, %llu tier Gets modelled (every counter matched); %llu blocks "
               "adopted, each byte-identical; inputs by blocks adopted 0..5: %llu %llu %llu %llu "
               "%llu %llu\n",
               u(g.inputs * kTiles * kTiers), u(g.inputs), u(g.direct_checks), u(g.gets),
               u(g.adopted_blocks), u(g.prefixes[0]), u(g.prefixes[1]), u(g.prefixes[2]),
               u(g.prefixes[3]), u(g.prefixes[4]), u(g.prefixes[5]));
  std::fprintf(stderr, "tier_record_fuzzer: %-13s %8s %8s %8s %7s %9s %8s %8s %9s %8s %7s\n",
               "record", "built", "asked", "adopted", "missed", "truncated", "corrupt", "foreign",
               "wrong_key", "misplaced", "import");
  for (int k = 0; k < kKinds; ++k) {
    const uint64_t* o = g.outcome[k];
    const uint64_t* f = g.fault[k];
    const uint64_t asked = o[0] + o[1] + o[2] + o[3] + o[4];
    std::fprintf(stderr,
                 "tier_record_fuzzer: %-13s %8llu %8llu %8llu %7llu %9llu %8llu %8llu %9llu %8llu "
                 "%7llu\n",
                 kKindNames[k], u(g.built[k]), u(asked), u(g.adopted[k]),
                 u(o[static_cast<int>(Outcome::kMiss)]), u(f[0]), u(f[1]), u(f[2]), u(f[3]),
                 u(o[static_cast<int>(Outcome::kOutOfPlace)]),
                 u(o[static_cast<int>(Outcome::kImportRefused)]));
  }
}

}  // namespace kvarn::testing::tier_fuzz

#endif  // KVARN_TESTS_FUZZ_TIER_RECORD_FUZZ_SPEC_H_
