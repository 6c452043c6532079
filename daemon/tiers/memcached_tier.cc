#include "daemon/tiers/memcached_tier.h"

#include <libmemcached/memcached.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvarn {
namespace {

constexpr char kFrameMagic[4] = {'K', 'V', 'M', '1'};
// memcached's longest key (KEY_MAX_LENGTH).
constexpr size_t kMaxKeyBytes = 250;
// The longest chunk suffix: "." + up to three digits (kMaxChunks is 256).
constexpr size_t kMaxSuffixBytes = 4;
// memcached takes a larger exptime for an absolute Unix time.
constexpr uint32_t kMaxRelativeExpire = 30 * 24 * 3600;
// stored = false events waiting for the writer thread; beyond it they are not delivered (a
// listener that missed one only believes a rejected record is still there; its Get misses).
constexpr size_t kMaxEvents = 4096;

void PutU32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
void PutU64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

// The largest record a pool with `id` writes; no valid one is larger.
uint64_t MaxRecordBytes(const TierIdentity& id) {
  return kRecordHeaderBytes + std::max(id.quant_block_bytes, id.sink_block_bytes);
}

// How `record_bytes` split into chunks of at most chunk_bytes, the frame in chunk 0.
uint64_t FirstPieceBytes(uint64_t record_bytes, uint32_t chunk_bytes) {
  return std::min<uint64_t>(record_bytes, chunk_bytes - MemcachedTier::kFrameBytes);
}
uint64_t ChunkCount(uint64_t record_bytes, uint32_t chunk_bytes) {
  const uint64_t rest = record_bytes - FirstPieceBytes(record_bytes, chunk_bytes);
  return 1 + (rest + chunk_bytes - 1) / chunk_bytes;
}

// The frame and the record's pieces: chunk 0 is frame + pieces[0], chunk i is pieces[i].
struct Chunks {
  char frame[MemcachedTier::kFrameBytes];
  std::vector<std::string_view> pieces;
};
Chunks SplitRecord(std::string_view record, uint32_t chunk_bytes) {
  Chunks c;
  const uint64_t n = ChunkCount(record.size(), chunk_bytes);
  std::memcpy(c.frame, kFrameMagic, sizeof(kFrameMagic));
  PutU32(c.frame + 4, static_cast<uint32_t>(n));
  PutU64(c.frame + 8, record.size());
  const size_t first = FirstPieceBytes(record.size(), chunk_bytes);
  c.pieces.push_back(record.substr(0, first));
  for (size_t at = first; at < record.size(); at += chunk_bytes)
    c.pieces.push_back(record.substr(at, chunk_bytes));
  return c;
}

// The value of the main key: the frame, then the first piece.
std::string FirstValue(const Chunks& c) {
  std::string value(c.frame, sizeof(c.frame));
  value.append(c.pieces[0]);
  return value;
}

bool ParseServer(std::string_view s, std::string* host, in_port_t* port) {
  const size_t colon = s.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return false;
  uint32_t p = 0;
  const std::string_view digits = s.substr(colon + 1);
  if (!absl::SimpleAtoi(absl::string_view(digits.data(), digits.size()), &p) || p == 0 || p > 65535)
    return false;
  *host = std::string(s.substr(0, colon));
  *port = static_cast<in_port_t>(p);
  return true;
}

uint64_t WholeSeconds(absl::Duration d) {
  return static_cast<uint64_t>(std::max<int64_t>(1, absl::ToInt64Seconds(d)));
}

// One libmemcached handle with the tier's distribution, timeouts and failure handling.
absl::Status Configure(memcached_st* m, const MemcachedTierOptions& o) {
  const uint64_t timeout_ms =
      static_cast<uint64_t>(std::max<int64_t>(1, absl::ToInt64Milliseconds(o.timeout)));
  const struct {
    memcached_behavior_t behavior;
    uint64_t value;
  } settings[] = {
      // Ketama with MD5 for keys and continuum, all weights 1: libketama's mapping, the same
      // on every node whatever the order of its server list.
      {MEMCACHED_BEHAVIOR_KETAMA_WEIGHTED, 1},
      {MEMCACHED_BEHAVIOR_NO_BLOCK, 1},  // non-blocking sockets: every wait is a poll bounded below
      {MEMCACHED_BEHAVIOR_TCP_NODELAY, 1},
      {MEMCACHED_BEHAVIOR_CONNECT_TIMEOUT, timeout_ms},
      {MEMCACHED_BEHAVIOR_POLL_TIMEOUT, timeout_ms},
      {MEMCACHED_BEHAVIOR_SND_TIMEOUT, timeout_ms * 1000},  // microseconds
      {MEMCACHED_BEHAVIOR_RCV_TIMEOUT, timeout_ms * 1000},
      // A failed server is skipped (SERVER_TEMPORARILY_DISABLED at once) for retry_timeout;
      // after server_failure_limit failures it leaves the continuum for dead_timeout.
      {MEMCACHED_BEHAVIOR_SERVER_TIMEOUT_LIMIT, 0},  // the first timeout already counts
      {MEMCACHED_BEHAVIOR_RETRY_TIMEOUT, WholeSeconds(o.retry_timeout)},
      {MEMCACHED_BEHAVIOR_SERVER_FAILURE_LIMIT, std::max<uint64_t>(1, o.server_failure_limit)},
      {MEMCACHED_BEHAVIOR_DEAD_TIMEOUT, WholeSeconds(o.dead_timeout)},
      {MEMCACHED_BEHAVIOR_REMOVE_FAILED_SERVERS, 1},
  };
  for (const auto& s : settings) {
    const memcached_return_t rc = memcached_behavior_set(m, s.behavior, s.value);
    if (rc != MEMCACHED_SUCCESS) {
      return absl::InternalError(
          absl::StrCat("memcached_behavior_set(", s.behavior, "): ", memcached_strerror(m, rc)));
    }
  }
  for (const std::string& server : o.servers) {
    std::string host;
    in_port_t port = 0;
    ParseServer(server, &host, &port);  // checked by Open
    const memcached_return_t rc = memcached_server_add_with_weight(m, host.c_str(), port, 1);
    if (rc != MEMCACHED_SUCCESS) {
      return absl::InvalidArgumentError(
          absl::StrCat("memcached server ", server, ": ", memcached_strerror(m, rc)));
    }
  }
  return absl::OkStatus();
}

// A definitive answer from the server, as opposed to a server that failed.
bool Answered(memcached_return_t rc) {
  return rc == MEMCACHED_SUCCESS || rc == MEMCACHED_END || rc == MEMCACHED_NOTFOUND;
}

}  // namespace

std::vector<std::string> MemcachedValues(std::string_view record, uint32_t chunk_bytes) {
  const Chunks c = SplitRecord(record, chunk_bytes);
  std::vector<std::string> values;
  values.push_back(FirstValue(c));
  for (size_t i = 1; i < c.pieces.size(); ++i) values.emplace_back(c.pieces[i]);
  return values;
}

std::string MemcachedKey(std::string_view key_prefix, const BlockHash& hash) {
  std::string key(key_prefix);
  key += HashToHex(hash);
  return key;
}

std::string MemcachedChunkKey(std::string_view key, uint32_t chunk) {
  std::string chunk_key(key);
  if (chunk != 0) {
    chunk_key += '.';
    chunk_key += std::to_string(chunk);
  }
  return chunk_key;
}

void MemcachedTier::HandleDeleter::operator()(memcached_st* m) const { memcached_free(m); }

// A reader handle, taken from the idle ones for the lease's lifetime.
class MemcachedTier::ReadLease {
 public:
  explicit ReadLease(MemcachedTier* tier) : tier_(tier) {
    MutexLock lock(&tier_->mu_);
    while (tier_->idle_readers_.empty()) tier_->handle_cv_.Wait(&tier_->mu_);
    handle_ = std::move(tier_->idle_readers_.back());
    tier_->idle_readers_.pop_back();
  }
  ~ReadLease() {
    MutexLock lock(&tier_->mu_);
    tier_->idle_readers_.push_back(std::move(handle_));
    tier_->handle_cv_.Signal();
  }
  ReadLease(const ReadLease&) = delete;
  ReadLease& operator=(const ReadLease&) = delete;
  memcached_st* get() const { return handle_.get(); }

 private:
  MemcachedTier* const tier_;
  Handle handle_;
};

absl::StatusOr<std::unique_ptr<MemcachedTier>> MemcachedTier::Open(
    const MemcachedTierOptions& options, const TierIdentity& identity) {
  if (options.servers.empty()) return absl::InvalidArgumentError("memcached tier: no servers");
  for (const std::string& server : options.servers) {
    std::string host;
    in_port_t port = 0;
    if (!ParseServer(server, &host, &port)) {
      return absl::InvalidArgumentError(
          absl::StrCat("memcached tier: server '", server, "' is not host:port"));
    }
  }
  if (options.key_prefix.size() + 64 + kMaxSuffixBytes > kMaxKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("memcached tier: key prefix of ",
                                                   options.key_prefix.size(),
                                                   " bytes makes keys longer than ", kMaxKeyBytes));
  }
  for (const char ch : options.key_prefix) {
    if (ch <= ' ' || ch == 0x7f) {
      return absl::InvalidArgumentError(
          "memcached tier: key prefix holds a space or control character");
    }
  }
  if (options.chunk_bytes < 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("memcached tier: chunk_bytes ", options.chunk_bytes, " < 1024"));
  }
  const uint64_t max_record = MaxRecordBytes(identity);
  if (ChunkCount(max_record, options.chunk_bytes) > kMaxChunks) {
    return absl::InvalidArgumentError(absl::StrCat("memcached tier: ", max_record,
                                                   "-byte records need more than ", kMaxChunks,
                                                   " chunks of ", options.chunk_bytes, " bytes"));
  }
  if (options.expire_seconds > kMaxRelativeExpire) {
    return absl::InvalidArgumentError(
        absl::StrCat("memcached tier: expire_seconds ", options.expire_seconds,
                     " > 30 days, which memcached reads as a Unix time"));
  }
  if (options.read_handles == 0)
    return absl::InvalidArgumentError("memcached tier: read_handles is 0");
  if (options.timeout <= absl::ZeroDuration())
    return absl::InvalidArgumentError("memcached tier: timeout <= 0");

  auto make_handle = [&]() -> absl::StatusOr<Handle> {
    Handle h(memcached_create(nullptr));
    if (h == nullptr) return absl::ResourceExhaustedError("memcached_create failed");
    if (absl::Status s = Configure(h.get(), options); !s.ok()) return s;
    return h;
  };
  absl::StatusOr<Handle> writer = make_handle();
  if (!writer.ok()) return writer.status();
  std::vector<Handle> readers;
  for (uint32_t i = 0; i < options.read_handles; ++i) {
    absl::StatusOr<Handle> r = make_handle();
    if (!r.ok()) return r.status();
    readers.push_back(std::move(*r));
  }
  return std::unique_ptr<MemcachedTier>(
      new MemcachedTier(options, identity, std::move(*writer), std::move(readers)));
}

MemcachedTier::MemcachedTier(const MemcachedTierOptions& options, const TierIdentity& identity,
                             Handle writer, std::vector<Handle> readers)
    : options_(options),
      identity_(identity),
      expected_chunks_(
          static_cast<uint32_t>(ChunkCount(MaxRecordBytes(identity), options.chunk_bytes))),
      max_record_bytes_(MaxRecordBytes(identity)),
      writer_handle_(std::move(writer)) {
  {
    MutexLock lock(&mu_);
    idle_readers_ = std::move(readers);
  }
  writer_ = std::thread([this] { WriterLoop(); });
}

MemcachedTier::~MemcachedTier() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    work_cv_.Signal();
  }
  writer_.join();
}

bool MemcachedTier::Put(const BlockHash& hash, std::shared_ptr<const std::string> record,
                        uint32_t tenant) {
  MutexLock lock(&mu_);
  // A record larger than this pool's records cannot pass CheckRecord on any reader.
  if (record == nullptr || stopping_ || record->size() > max_record_bytes_ ||
      queued_bytes_ + record->size() > options_.queue_bytes) {
    ++stats_.dropped_writes;
    return false;
  }
  queued_bytes_ += record->size();
  queue_.push_back(Write{hash, std::move(record), tenant});
  work_cv_.Signal();
  return true;
}

bool MemcachedTier::Flush(absl::Time deadline) {
  MutexLock lock(&mu_);
  while (!queue_.empty() || in_flight_) {
    if (drained_cv_.WaitUntil(&mu_, deadline)) return queue_.empty() && !in_flight_;
  }
  return true;
}

TierStats MemcachedTier::Stats() const {
  MutexLock lock(&mu_);
  TierStats s = stats_;
  s.queued_blocks = queue_.size() + (in_flight_ ? 1 : 0);
  s.queued_bytes = queued_bytes_;
  return s;
}

void MemcachedTier::SetListener(Listener listener) {
  MutexLock lock(&mu_);
  listener_ = std::move(listener);
}

void MemcachedTier::WriterLoop() {
  absl::Time give_up = absl::InfiniteFuture();  // set once stopping: close_timeout from then
  for (;;) {
    std::deque<Event> events;
    Listener listener;
    Write write;
    bool have_write = false;
    {
      MutexLock lock(&mu_);
      while (queue_.empty() && events_.empty() && !stopping_) work_cv_.Wait(&mu_);
      if (stopping_ && queue_.empty() && events_.empty()) return;
      if (stopping_ && give_up == absl::InfiniteFuture())
        give_up = absl::Now() + options_.close_timeout;
      if (stopping_ && absl::Now() >= give_up) {
        stats_.dropped_writes += queue_.size();
        queue_.clear();
        queued_bytes_ = 0;
        drained_cv_.SignalAll();
      }
      events.swap(events_);
      if (!queue_.empty()) {
        write = std::move(queue_.front());
        queue_.pop_front();
        in_flight_ = true;
        have_write = true;
      }
      listener = listener_;
    }
    if (listener) {
      for (const Event& e : events) listener(e.hash, e.stored, e.tenant);
    }
    if (!have_write) continue;
    const bool ok = WriteRecord(writer_handle_.get(), write);
    {
      MutexLock lock(&mu_);
      if (ok) {
        ++stats_.written_blocks;
        stats_.written_bytes += write.record->size();
        ++stats_.blocks;
        stats_.bytes += write.record->size();
      } else {
        ++stats_.dropped_writes;
        ++stats_.errors;
      }
      listener = listener_;
    }
    if (ok && listener) listener(write.hash, true, write.tenant);
    // Still in flight while the listener runs: a Flush that returns has seen it told.
    MutexLock lock(&mu_);
    in_flight_ = false;
    queued_bytes_ -= write.record->size();
    if (queue_.empty()) drained_cv_.SignalAll();
  }
}

bool MemcachedTier::WriteRecord(memcached_st* m, const Write& w) {
  const std::string key = MemcachedKey(options_.key_prefix, w.hash);
  const Chunks chunks = SplitRecord(*w.record, options_.chunk_bytes);
  // The later chunks first: a reader that finds the main key finds them.
  for (size_t i = chunks.pieces.size(); i-- > 0;) {
    const std::string chunk_key = MemcachedChunkKey(key, static_cast<uint32_t>(i));
    const std::string first = i == 0 ? FirstValue(chunks) : std::string();
    const std::string_view value = i == 0 ? std::string_view(first) : chunks.pieces[i];
    const memcached_return_t rc =
        memcached_set_by_key(m, key.data(), key.size(), chunk_key.data(), chunk_key.size(),
                             value.data(), value.size(), options_.expire_seconds, 0);
    if (rc != MEMCACHED_SUCCESS) return false;  // the main key is not written: no partial record
  }
  return true;
}

bool MemcachedTier::Contains(const BlockHash& hash) {
  const std::string key = MemcachedKey(options_.key_prefix, hash);
  ReadLease handle(this);
  const memcached_return_t rc = memcached_touch_by_key(
      handle.get(), key.data(), key.size(), key.data(), key.size(), options_.expire_seconds);
  if (rc == MEMCACHED_SUCCESS) return true;
  if (!Answered(rc)) {
    MutexLock lock(&mu_);
    ++stats_.errors;
  }
  return false;
}

bool MemcachedTier::FetchChunks(memcached_st* m, const std::string& group,
                                const std::vector<std::string>& keys,
                                std::vector<std::string>& values, std::vector<bool>& found) {
  std::vector<const char*> key_ptrs;
  std::vector<size_t> key_lens;
  for (const std::string& k : keys) {
    key_ptrs.push_back(k.data());
    key_lens.push_back(k.size());
  }
  values.assign(keys.size(), std::string());
  found.assign(keys.size(), false);
  memcached_return_t rc = memcached_mget_by_key(m, group.data(), group.size(), key_ptrs.data(),
                                                key_lens.data(), keys.size());
  if (rc != MEMCACHED_SUCCESS) return false;
  memcached_result_st result;
  memcached_result_create(m, &result);
  // Read to the end whatever comes: an unread reply would be taken for the next one's.
  while (memcached_fetch_result(m, &result, &rc) != nullptr) {
    const std::string_view got(memcached_result_key_value(&result),
                               memcached_result_key_length(&result));
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!found[i] && keys[i] == got) {
        values[i].assign(memcached_result_value(&result), memcached_result_length(&result));
        found[i] = true;
        break;
      }
    }
  }
  memcached_result_free(&result);
  return Answered(rc);
}

void MemcachedTier::Reject(const BlockHash& hash, const std::string& key, uint32_t chunks,
                           RecordFault fault) {
  bool failed = false;
  {
    ReadLease handle(this);
    // The main key first: once it is gone, no reader assembles the rest.
    for (uint32_t i = 0; i < chunks; ++i) {
      const std::string chunk_key = MemcachedChunkKey(key, i);
      const memcached_return_t rc = memcached_delete_by_key(handle.get(), key.data(), key.size(),
                                                            chunk_key.data(), chunk_key.size(), 0);
      failed |= !Answered(rc);
    }
  }
  MutexLock lock(&mu_);
  ++stats_.rejected[static_cast<int>(fault)];
  ++stats_.misses;
  if (failed) ++stats_.errors;
  if (events_.size() < kMaxEvents) {
    events_.push_back(Event{hash, false, 0});
    work_cv_.Signal();
  }
}

MemcachedTier::Fetched MemcachedTier::FetchRecord(memcached_st* m, const std::string& key) {
  Fetched f;
  std::vector<std::string> keys;
  for (uint32_t i = 0; i < expected_chunks_; ++i) keys.push_back(MemcachedChunkKey(key, i));
  std::vector<std::string> values;
  std::vector<bool> found;
  if (!FetchChunks(m, key, keys, values, found)) {
    f.outcome = Fetched::kServerFailed;
    return f;
  }
  if (!found[0]) {
    f.outcome = Fetched::kAbsent;
    return f;
  }
  // The frame: how many chunks, how many bytes. A bad one's count is not believed.
  const std::string head = std::move(values[0]);  // `values` grows below
  f.outcome = Fetched::kBad;
  f.fault = RecordFault::kCorrupt;
  f.chunks = expected_chunks_;
  if (head.size() < kFrameBytes || std::memcmp(head.data(), kFrameMagic, sizeof(kFrameMagic)) != 0)
    return f;
  const uint32_t chunks = GetU32(head.data() + 4);
  const uint64_t total = GetU64(head.data() + 8);
  if (chunks == 0 || chunks > kMaxChunks || total > max_record_bytes_) return f;
  f.chunks = chunks;
  if (chunks > keys.size()) {
    // Written with a smaller chunk_bytes than ours: the rest in a second round trip.
    std::vector<std::string> more_keys;
    for (uint32_t i = static_cast<uint32_t>(keys.size()); i < chunks; ++i)
      more_keys.push_back(MemcachedChunkKey(key, i));
    std::vector<std::string> more_values;
    std::vector<bool> more_found;
    if (!FetchChunks(m, key, more_keys, more_values, more_found)) {
      f.outcome = Fetched::kServerFailed;
      return f;
    }
    values.insert(values.end(), std::make_move_iterator(more_values.begin()),
                  std::make_move_iterator(more_values.end()));
    found.insert(found.end(), more_found.begin(), more_found.end());
  }
  f.record.reserve(total);
  f.record.append(head, kFrameBytes);
  for (uint32_t i = 1; i < chunks; ++i) {
    if (!found[i]) {
      f.fault = RecordFault::kTruncated;  // a chunk evicted, or never written
      return f;
    }
    f.record.append(values[i]);
  }
  if (f.record.size() != total) {
    // Short: a value cut; long: chunks of another write.
    f.fault = f.record.size() < total ? RecordFault::kTruncated : RecordFault::kCorrupt;
    return f;
  }
  f.outcome = Fetched::kAssembled;
  return f;
}

absl::StatusOr<std::string> MemcachedTier::Get(const BlockHash& hash) {
  const std::string key = MemcachedKey(options_.key_prefix, hash);
  Fetched f;
  {
    ReadLease handle(this);
    f = FetchRecord(handle.get(), key);
  }
  switch (f.outcome) {
    case Fetched::kServerFailed: {
      MutexLock lock(&mu_);
      ++stats_.errors;
      ++stats_.misses;
      return absl::NotFoundError("not in the memcached tier (its server did not answer)");
    }
    case Fetched::kAbsent: {
      MutexLock lock(&mu_);
      ++stats_.misses;
      return absl::NotFoundError("not in the memcached tier");
    }
    case Fetched::kBad:
      Reject(hash, key, f.chunks, f.fault);
      return absl::NotFoundError(absl::StrCat("not in the memcached tier (a ",
                                              RecordFaultName(f.fault), " value, deleted)"));
    case Fetched::kAssembled:
      break;
  }
  // The MAC is checked with no handle held.
  RecordFault fault = RecordFault::kCorrupt;
  if (absl::StatusOr<RecordMeta> meta = CheckRecord(identity_, f.record, &hash, &fault);
      !meta.ok()) {
    Reject(hash, key, f.chunks, fault);
    return absl::NotFoundError(
        absl::StrCat("not in the memcached tier (", meta.status().message(), "; deleted)"));
  }
  MutexLock lock(&mu_);
  ++stats_.hits;
  stats_.read_bytes += f.record.size();
  return std::move(f.record);
}

}  // namespace kvarn
