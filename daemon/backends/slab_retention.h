// Keeping memory that another process may still write until that process is gone.
//
// With CUDA IPC a client maps a slab of the daemon's device memory, and nothing tells the
// daemon when the client unmaps it: a hung client whose lease expired may still write
// through its mapping. If the daemon freed the slab, the driver could hand the memory to the
// next allocation (another tenant's blocks). So a slab lent to one client process (its tail
// slots) is not freed when its session ends but kept here until the process has exited,
// which releases every mapping it held. Plain C++ (no CUDA), so it is tested on any machine.
//
// Processes are identified by pid and start time, so a recycled pid is not mistaken for the
// owner; a zombie counts as gone (its mappings died with its address space).
#ifndef KVARN_DAEMON_BACKENDS_SLAB_RETENTION_H_
#define KVARN_DAEMON_BACKENDS_SLAB_RETENTION_H_

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"

namespace kvarn {

// Liveness of processes; injected so the bookkeeping is testable without processes.
class ProcessProbe {
 public:
  virtual ~ProcessProbe() = default;
  // A value identifying the process now running as `pid` (its start time), or nullopt when
  // no live process has that pid.
  virtual std::optional<uint64_t> Identity(int pid) const = 0;
  // /proc/<pid>/stat (state and start time); kill(pid, 0) where /proc is unreadable.
  static const ProcessProbe* System();
};

// A process that owns retained memory.
struct ProcessOwner {
  int pid = 0;
  uint64_t identity = 0;
  friend bool operator==(const ProcessOwner&, const ProcessOwner&) = default;
};

// Items (move-only owners of memory, e.g. device slabs) kept until their owner process is
// gone. Destroying an item frees its memory; that happens outside the lock.
// Thread safety: all methods may be called concurrently.
template <typename T>
class RetentionList {
 public:
  // self_pid: this process; memory it lends itself is never retained (an in-process client
  // uses the daemon's own pointers, and outliving the daemon is moot).
  RetentionList(const ProcessProbe* probe, int self_pid) : probe_(probe), self_pid_(self_pid) {}

  // Whom to retain memory lent to `pid` for: nullopt for no process (0), this process, or
  // a pid that is not running (where retaining would only leak).
  std::optional<ProcessOwner> OwnerOf(int pid) const {
    if (pid <= 0 || pid == self_pid_) return std::nullopt;
    const std::optional<uint64_t> id = probe_->Identity(pid);
    if (!id.has_value()) return std::nullopt;
    return ProcessOwner{pid, *id};
  }

  // Keeps `item` (`bytes` of memory) while `owner` runs; destroys it at once otherwise.
  void Retain(const ProcessOwner& owner, uint64_t bytes, T item) ABSL_LOCKS_EXCLUDED(mu_) {
    if (!Alive(owner)) return;  // `item` is destroyed on return
    MutexLock lock(&mu_);
    entries_.push_back(Entry{owner, bytes, std::move(item)});
  }

  // Destroys the items of owners that are gone; returns the bytes still retained.
  uint64_t Sweep() ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<Entry> gone;
    uint64_t kept = 0;
    {
      MutexLock lock(&mu_);
      std::vector<Entry> live;
      for (Entry& e : entries_) {
        if (Alive(e.owner)) {
          kept += e.bytes;
          live.push_back(std::move(e));
        } else {
          gone.push_back(std::move(e));
        }
      }
      entries_ = std::move(live);
    }
    return kept;  // `gone` is destroyed here, outside the lock
  }

  // Hands back a retained item of `owner` of exactly `bytes` for reuse by the same process
  // (which may still have it mapped, so no one else may get it); nullopt when none.
  std::optional<T> Take(const ProcessOwner& owner, uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->owner == owner && it->bytes == bytes) {
        std::optional<T> item(std::move(it->item));
        entries_.erase(it);
        return item;
      }
    }
    return std::nullopt;
  }

  uint64_t bytes() const ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    uint64_t b = 0;
    for (const Entry& e : entries_) b += e.bytes;
    return b;
  }
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    return entries_.size();
  }

 private:
  struct Entry {
    ProcessOwner owner;
    uint64_t bytes = 0;
    T item;
  };
  bool Alive(const ProcessOwner& owner) const {
    const std::optional<uint64_t> id = probe_->Identity(owner.pid);
    return id.has_value() && *id == owner.identity;
  }

  const ProcessProbe* const probe_;
  const int self_pid_;
  mutable Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_BACKENDS_SLAB_RETENTION_H_
