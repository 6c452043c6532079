#include "daemon/tiers/disk_tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "daemon/core/check.h"

namespace kvarn {
namespace {

constexpr char kRecordSuffix[] = ".kvb";
constexpr char kTempSuffix[] = ".tmp";
constexpr char kLockName[] = "LOCK";
constexpr uint64_t kProgressEvery = 256;  // files between progress calls

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;  // upper case too: HashToHex writes lower case, so only that names a record
}

bool ParseHex(std::string_view hex, uint8_t* out, size_t bytes) {
  if (hex.size() != 2 * bytes) return false;
  for (size_t i = 0; i < bytes; ++i) {
    const int hi = HexDigit(hex[2 * i]), lo = HexDigit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

// The hash a record file's name gives: "<64 hex>.kvb" inside the folder of its first byte.
bool HashFromName(std::string_view folder, std::string_view name, BlockHash* hash) {
  if (!name.ends_with(kRecordSuffix)) return false;
  name.remove_suffix(std::string_view(kRecordSuffix).size());
  return ParseHex(name, hash->data(), hash->size()) && name.substr(0, 2) == folder;
}

bool IsFolderName(std::string_view name) {
  uint8_t byte;
  return ParseHex(name, &byte, 1);
}

absl::Status ErrnoError(int err, const char* what, const std::string& path) {
  return absl::ErrnoToStatus(err, absl::StrCat("disk tier: ", what, " ", path));
}

// mkdir -p with mode 0700 for what it creates.
absl::Status MakeDirs(const std::string& dir) {
  for (size_t end = 1; end <= dir.size(); ++end) {
    if (end != dir.size() && dir[end] != '/') continue;
    const std::string prefix = dir.substr(0, end);
    if (::mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST)
      return ErrnoError(errno, "cannot create", prefix);
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return ErrnoError(errno, "cannot stat", dir);
  if (!S_ISDIR(st.st_mode))
    return absl::FailedPreconditionError(absl::StrCat("disk tier: ", dir, " is not a directory"));
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, uint64_t bytes, std::string* out) {
  out->resize(bytes);
  uint64_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(fd, out->data() + done, bytes - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::ErrnoToStatus(errno, "read");
    if (n == 0) break;  // shrank since fstat: what is there is the record
    done += static_cast<uint64_t>(n);
  }
  out->resize(done);
  return absl::OkStatus();
}

// Reads the file at `path` into `*bytes` and checks it (CheckRecord with `expect`). Never
// follows a symlink or blocks on a FIFO. The outcome is in the code: OK; DATA_LOSS, a bad
// record (*fault says why; anything but a regular file, or larger than any record, is
// corrupt); NOT_FOUND, no such file; UNAVAILABLE, an I/O error (the file may read next time).
// `touch`: a good file's mtime is set to now.
absl::StatusOr<RecordMeta> ReadRecordFile(const TierIdentity& id, const std::string& path,
                                          const BlockHash* expect, bool touch, std::string* bytes,
                                          RecordFault* fault) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (!fd.valid() && errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, " is gone"));
  if (!fd.valid() && errno == ELOOP) {  // O_NOFOLLOW met a symlink
    *fault = RecordFault::kCorrupt;
    return absl::DataLossError(absl::StrCat(path, " is a symlink"));
  }
  struct stat st;
  if (!fd.valid() || ::fstat(fd.get(), &st) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  const uint64_t max_bytes =
      kRecordHeaderBytes + std::max(id.quant_block_bytes, id.sink_block_bytes);
  if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) > max_bytes) {
    *fault = RecordFault::kCorrupt;
    return absl::DataLossError(absl::StrCat(
        "corrupt block record: ", path, " is not a regular file of at most ", max_bytes, " bytes"));
  }
  if (absl::Status s = ReadAll(fd.get(), static_cast<uint64_t>(st.st_size), bytes); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot read ", path, ": ", s.message()));
  }
  absl::StatusOr<RecordMeta> meta = CheckRecord(id, *bytes, expect, fault);
  if (meta.ok() && touch)
    ::futimens(fd.get(), nullptr);  // best effort: only the LRU order a restart sees
  return meta;
}

absl::Status WriteAll(int fd, std::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError(errno, "cannot write", path);
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

// Writes `bytes` to `tmp`, then renames it to `path`; on failure nothing is left at either.
// The folder is made if missing (someone removed it, or it is the first file in it).
absl::Status WriteFileAtomically(const std::string& folder, const std::string& tmp,
                                 const std::string& path, std::string_view bytes, bool sync) {
  const int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW;
  UniqueFd fd(::open(tmp.c_str(), flags, 0600));
  if (!fd.valid() && errno == ENOENT) {
    if (::mkdir(folder.c_str(), 0700) != 0 && errno != EEXIST)
      return ErrnoError(errno, "cannot create", folder);
    fd = UniqueFd(::open(tmp.c_str(), flags, 0600));
  }
  if (!fd.valid()) return ErrnoError(errno, "cannot create", tmp);
  absl::Status status = WriteAll(fd.get(), bytes, tmp);
  if (status.ok() && sync && ::fdatasync(fd.get()) != 0)
    status = ErrnoError(errno, "cannot sync", tmp);
  // close reports deferred write errors (NFS, quotas); the descriptor is gone either way.
  if (::close(fd.Release()) != 0 && status.ok()) status = ErrnoError(errno, "cannot close", tmp);
  if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0)
    status = ErrnoError(errno, "cannot rename", tmp);
  if (!status.ok()) ::unlink(tmp.c_str());
  return status;
}

bool Older(const timespec& a, const timespec& b) {
  return a.tv_sec != b.tv_sec ? a.tv_sec < b.tv_sec : a.tv_nsec < b.tv_nsec;
}

}  // namespace

struct DiskTier::Found {
  std::string path;
  bool named = false;  // the name is a record's name, and `hash` the one it gives
  BlockHash hash{};
  timespec mtime{};
};

DiskTier::DiskTier(const DiskTierOptions& options, const TierIdentity& identity, UniqueFd lock)
    : options_(options), identity_(identity), lock_(std::move(lock)) {
  stats_.capacity_bytes = options.capacity_bytes;
}

absl::StatusOr<std::unique_ptr<DiskTier>> DiskTier::Open(
    const DiskTierOptions& options, const TierIdentity& identity,
    std::function<void(uint64_t, uint64_t)> progress) {
  if (options.dir.empty()) return absl::InvalidArgumentError("disk tier: no directory given");
  if (options.capacity_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("disk tier ", options.dir, ": capacity_bytes must be > 0"));
  }
  DiskTierOptions opts = options;
  while (opts.dir.size() > 1 && opts.dir.back() == '/') opts.dir.pop_back();
  if (absl::Status s = MakeDirs(opts.dir); !s.ok()) return s;
  const std::string lock_path = absl::StrCat(opts.dir, "/", kLockName);
  UniqueFd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!lock.valid()) return ErrnoError(errno, "cannot create", lock_path);
  if (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat("disk tier: ", opts.dir, " is in use by another open tier"));
    }
    return ErrnoError(errno, "cannot lock", lock_path);
  }
  std::unique_ptr<DiskTier> tier(new DiskTier(opts, identity, std::move(lock)));
  if (absl::Status s = tier->Scan(progress); !s.ok()) return s;
  tier->writer_ = std::thread([t = tier.get()] { t->WriterLoop(); });
  return tier;
}

DiskTier::~DiskTier() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    work_cv_.Signal();
  }
  if (writer_.joinable()) writer_.join();
}

absl::Status DiskTier::Scan(const std::function<void(uint64_t, uint64_t)>& progress) {
  // First the listing (cheap), so progress can say how many files there are; then each file
  // is read and checked.
  std::vector<Found> found;
  std::vector<std::string> folders;
  {
    DIR* top = ::opendir(options_.dir.c_str());
    if (top == nullptr) return ErrnoError(errno, "cannot read", options_.dir);
    while (const dirent* e = ::readdir(top)) {
      const std::string_view name = e->d_name;
      if (name == "." || name == ".." || name == kLockName) continue;
      const std::string path = absl::StrCat(options_.dir, "/", std::string(name));
      struct stat st;
      if (::lstat(path.c_str(), &st) != 0) continue;  // gone meanwhile
      if (S_ISDIR(st.st_mode)) {
        if (IsFolderName(name)) folders.push_back(std::string(name));
        continue;  // not the tier's folder: left alone
      }
      if (name.ends_with(kTempSuffix)) {
        ::unlink(path.c_str());
        continue;
      }
      found.push_back(Found{path, false, {}, st.st_mtim});
    }
    ::closedir(top);
  }
  for (const std::string& folder : folders) {
    const std::string dir = absl::StrCat(options_.dir, "/", folder);
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return ErrnoError(errno, "cannot read", dir);
    while (const dirent* e = ::readdir(d)) {
      const std::string_view name = e->d_name;
      if (name == "." || name == "..") continue;
      const std::string path = absl::StrCat(dir, "/", std::string(name));
      struct stat st;
      if (::lstat(path.c_str(), &st) != 0 || S_ISDIR(st.st_mode)) continue;
      if (name.ends_with(kTempSuffix)) {
        ::unlink(path.c_str());
        continue;
      }
      Found f{path, false, {}, st.st_mtim};
      f.named = HashFromName(folder, name, &f.hash);
      found.push_back(std::move(f));
    }
    ::closedir(d);
  }

  struct Good {
    RecordMeta meta;
    uint64_t bytes;
    timespec mtime;
  };
  std::vector<Good> good;
  const uint64_t total = found.size();
  for (uint64_t i = 0; i < total; ++i) {
    RecordMeta meta;
    if (CheckFound(found[i], &meta)) {
      good.push_back(
          Good{meta, kRecordHeaderBytes + identity_.payload_bytes(meta.cls), found[i].mtime});
    }
    if (progress && (i + 1) % kProgressEvery == 0 && i + 1 < total) progress(i + 1, total);
  }
  if (progress) progress(total, total);

  std::stable_sort(good.begin(), good.end(),
                   [](const Good& a, const Good& b) { return Older(a.mtime, b.mtime); });
  std::vector<BlockHash> trimmed;
  {
    MutexLock lock(&mu_);
    for (const Good& g : good) {
      Entry& e = entries_[g.meta.hash];
      e.meta = g.meta;
      e.bytes = g.bytes;
      e.generation = next_generation_++;
      e.lru = lru_.insert(lru_.end(), g.meta.hash);
      bytes_ += g.bytes;
    }
    while (bytes_ > options_.capacity_bytes) {
      trimmed.push_back(lru_.front());
      EraseEntry(entries_.find(lru_.front()));
      ++stats_.evicted_blocks;
    }
  }
  for (const BlockHash& h : trimmed) ::unlink(PathOf(h).c_str());
  return absl::OkStatus();
}

bool DiskTier::CheckFound(const Found& f, RecordMeta* meta) {
  std::string bytes;
  RecordFault fault = RecordFault::kCorrupt;
  absl::StatusOr<RecordMeta> checked = ReadRecordFile(
      identity_, f.path, f.named ? &f.hash : nullptr, /*touch=*/false, &bytes, &fault);
  if (checked.ok() && f.named) {
    *meta = *checked;
    return true;
  }
  if (checked.ok())
    fault = RecordFault::kWrongKey;  // a good record under a name that is not its key
  if (absl::IsNotFound(checked.status())) return false;     // gone meanwhile
  const bool bad = !absl::IsUnavailable(checked.status());  // else a read error: kept, it may pass
  if (bad) ::unlink(f.path.c_str());
  MutexLock lock(&mu_);
  if (bad) {
    ++stats_.rejected[static_cast<int>(fault)];
  } else {
    ++stats_.errors;
  }
  return false;
}

bool DiskTier::Put(const BlockHash& hash, std::shared_ptr<const std::string> record,
                   uint32_t tenant) {
  MutexLock lock(&mu_);
  if (record == nullptr) {
    ++stats_.dropped_writes;
    return false;
  }
  if (auto it = entries_.find(hash); it != entries_.end()) {
    lru_.splice(lru_.end(), lru_, it->second.lru);
    return true;
  }
  if (pending_.contains(hash)) return true;
  if (pending_bytes_ + record->size() > options_.queue_bytes) {
    ++stats_.dropped_writes;
    return false;
  }
  pending_bytes_ += record->size();
  pending_.emplace(hash, record);
  queue_.push_back(Pending{hash, std::move(record), tenant});
  work_cv_.Signal();
  return true;
}

bool DiskTier::Contains(const BlockHash& hash) {
  MutexLock lock(&mu_);
  return entries_.contains(hash) || pending_.contains(hash);
}

absl::StatusOr<std::string> DiskTier::Get(const BlockHash& hash) {
  std::shared_ptr<const std::string> queued;
  uint64_t generation = 0;
  {
    MutexLock lock(&mu_);
    if (auto p = pending_.find(hash); p != pending_.end()) {
      queued = p->second;
    } else if (auto it = entries_.find(hash); it != entries_.end()) {
      generation = it->second.generation;
    } else {
      ++stats_.misses;
      return absl::NotFoundError("not in the disk tier");
    }
  }
  RecordFault fault = RecordFault::kCorrupt;
  if (queued != nullptr) {
    // Not counted as rejected here: the writer counts it once, when it refuses to write it.
    absl::StatusOr<RecordMeta> meta = CheckRecord(identity_, *queued, &hash, &fault, /*verify_mac=*/false);
    std::string bytes = meta.ok() ? *queued : std::string();
    MutexLock lock(&mu_);
    if (!meta.ok()) {
      ++stats_.misses;
      return absl::NotFoundError(
          absl::StrCat("disk tier, queued record: ", meta.status().message()));
    }
    ++stats_.hits;
    stats_.read_bytes += bytes.size();
    return bytes;
  }

  // The file is read outside the lock. Renames are atomic, so it is the whole file of this
  // entry, or the whole file of a later one under the same hash, or gone (evicted meanwhile).
  std::string bytes;
  absl::StatusOr<RecordMeta> meta =
      ReadRecordFile(identity_, PathOf(hash), &hash, /*touch=*/true, &bytes, &fault);
  MutexLock lock(&mu_);
  Entry* entry = Current(hash, generation);
  if (meta.ok()) {
    if (entry != nullptr) lru_.splice(lru_.end(), lru_, entry->lru);
    ++stats_.hits;
    stats_.read_bytes += bytes.size();
    return bytes;
  }
  ++stats_.misses;
  if (absl::IsUnavailable(meta.status())) {
    ++stats_.errors;  // EIO and the like: the file stays, it may read next time
    return absl::NotFoundError(absl::StrCat("disk tier: ", meta.status().message()));
  }
  const bool bad = absl::IsDataLoss(meta.status());  // else the file is gone
  if (entry != nullptr) {
    // Out of the index now; the writer deletes the file, in order with its own writes, so a
    // newer file under this name is never the one deleted. (No entry: evicted or replaced
    // while it was read, and that file is not this one's to judge.)
    if (bad) ++stats_.rejected[static_cast<int>(fault)];
    removals_.push_back(Removal{hash, entry->tenant, bad});
    EraseEntry(entries_.find(hash));
    work_cv_.Signal();
  }
  return absl::NotFoundError(absl::StrCat("disk tier: ", meta.status().message()));
}

bool DiskTier::Flush(absl::Time deadline) {
  MutexLock lock(&mu_);
  while (busy_ || !queue_.empty() || !removals_.empty()) {
    if (idle_cv_.WaitUntil(&mu_, deadline)) return !busy_ && queue_.empty() && removals_.empty();
  }
  return true;
}

TierStats DiskTier::Stats() const {
  MutexLock lock(&mu_);
  TierStats s = stats_;
  s.blocks = entries_.size();
  s.bytes = bytes_;
  s.queued_blocks = pending_.size();
  s.queued_bytes = pending_bytes_;
  return s;
}

void DiskTier::SetListener(Listener listener) {
  auto shared = listener ? std::make_shared<const Listener>(std::move(listener)) : nullptr;
  MutexLock lock(&mu_);
  listener_ = std::move(shared);
}

std::vector<RecordMeta> DiskTier::Index() const {
  MutexLock lock(&mu_);
  std::vector<RecordMeta> out;
  out.reserve(lru_.size());
  for (const BlockHash& h : lru_) out.push_back(entries_.at(h).meta);
  return out;
}

void DiskTier::WriterLoop() {
  while (true) {
    std::vector<Removal> removals;
    std::optional<Pending> job;
    {
      MutexLock lock(&mu_);
      while (!stop_ && queue_.empty() && removals_.empty()) work_cv_.Wait(&mu_);
      if (queue_.empty() && removals_.empty()) return;  // stopped, and everything queued is written
      removals.swap(removals_);
      if (!queue_.empty()) {
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      busy_ = true;
    }
    // Get's removals first: a file it found bad goes before a newer one under its name lands.
    DeleteFiles(removals);
    bool stored = false;
    if (job) WriteOne(*job, removals, &stored);

    std::shared_ptr<const Listener> listener;
    {
      MutexLock lock(&mu_);
      listener = listener_;
    }
    if (listener != nullptr) {
      for (const Removal& r : removals) (*listener)(r.hash, false, r.tenant);
      if (stored) (*listener)(job->hash, true, job->tenant);
    }
    MutexLock lock(&mu_);
    busy_ = false;
    if (queue_.empty() && removals_.empty()) idle_cv_.SignalAll();
  }
}

void DiskTier::WriteOne(const Pending& job, std::vector<Removal>& removals, bool* stored) {
  const std::string& record = *job.record;
  const uint64_t size = record.size();
  RecordFault fault = RecordFault::kCorrupt;
  // Checked here, off the caller's thread, all but the MAC: the record was sealed by this
  // process and never left its memory (a MAC pass would cost as much as the write), and the
  // header gives the Index() entry. What comes back from the disk is checked whole.
  absl::StatusOr<RecordMeta> meta = CheckRecord(identity_, record, &job.hash, &fault, /*verify_mac=*/false);
  std::vector<Removal> evicted;
  {
    MutexLock lock(&mu_);
    KVARN_CHECK(!entries_.contains(job.hash), "a queued hash is never indexed");
    if (!meta.ok() || size > options_.capacity_bytes) {
      if (!meta.ok()) ++stats_.rejected[static_cast<int>(fault)];
      ++stats_.dropped_writes;
      pending_.erase(job.hash);
      pending_bytes_ -= size;
      return;
    }
    while (bytes_ + size > options_.capacity_bytes) {
      auto victim = entries_.find(lru_.front());
      evicted.push_back(Removal{victim->first, victim->second.tenant, true});
      EraseEntry(victim);
      ++stats_.evicted_blocks;
    }
  }
  DeleteFiles(evicted);
  removals.insert(removals.end(), evicted.begin(), evicted.end());

  const std::string path = PathOf(job.hash);
  const absl::Status written = WriteFileAtomically(
      FolderOf(job.hash), absl::StrCat(path, kTempSuffix), path, record, options_.fsync);
  MutexLock lock(&mu_);
  pending_.erase(job.hash);
  pending_bytes_ -= size;
  if (!written.ok()) {
    ++stats_.errors;
    ++stats_.dropped_writes;
    return;
  }
  Entry& e = entries_[job.hash];
  e.meta = *meta;
  e.bytes = size;
  e.tenant = job.tenant;
  e.generation = next_generation_++;
  e.lru = lru_.insert(lru_.end(), job.hash);
  bytes_ += size;
  ++stats_.written_blocks;
  stats_.written_bytes += size;
  *stored = true;
}

void DiskTier::DeleteFiles(const std::vector<Removal>& removals) {
  for (const Removal& r : removals) {
    if (!r.unlink) continue;
    if (::unlink(PathOf(r.hash).c_str()) != 0 && errno != ENOENT) {
      // Left on disk, out of the index: the next Open finds it again.
      MutexLock lock(&mu_);
      ++stats_.errors;
    }
  }
}

void DiskTier::EraseEntry(absl::flat_hash_map<BlockHash, Entry>::iterator it) {
  bytes_ -= it->second.bytes;
  lru_.erase(it->second.lru);
  entries_.erase(it);
}

DiskTier::Entry* DiskTier::Current(const BlockHash& hash, uint64_t generation) {
  auto it = entries_.find(hash);
  return it != entries_.end() && it->second.generation == generation ? &it->second : nullptr;
}

std::string DiskTier::FolderOf(const BlockHash& hash) const {
  return absl::StrCat(options_.dir, "/", HashToHex(hash).substr(0, 2));
}

std::string DiskTier::PathOf(const BlockHash& hash) const {
  return absl::StrCat(FolderOf(hash), "/", HashToHex(hash), kRecordSuffix);
}

}  // namespace kvarn
