#include "client/lib/commit_ring.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/lib/descriptor_client.h"

namespace kvarn {
namespace {

// How long a commit waits for kvarnd's verdict once its session is seen ended: kvarnd's ring
// thread answers within its poll period (or at once, when it takes the records).
constexpr absl::Duration kEndedSessionGrace = absl::Seconds(2);

inline void Pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

absl::StatusOr<std::unique_ptr<CommitRing>> Session::OpenCommitRing() { return CommitRing::Open(this); }

absl::StatusOr<std::unique_ptr<CommitRing>> CommitRing::Open(Session* session) {
  if (absl::Status m = session->CheckMapped(); !m.ok()) return m;
  auto lent = FetchCommitRing(session->client_->socket_path() + ".fd", session->Ref());
  if (!lent.ok()) return lent.status();
  UniqueFd memory_fd, doorbell_fd;
  uint64_t bytes = 0;
  uint32_t capacity = 0;
  for (LentSegments::Segment& seg : lent->segments) {
    if (seg.entry.kind() == v1::DescriptorReply::Entry::KIND_COMMIT_RING) {
      memory_fd = std::move(seg.fd);
      bytes = seg.entry.bytes();
      capacity = seg.entry.ring_records();
    } else if (seg.entry.kind() == v1::DescriptorReply::Entry::KIND_DOORBELL) {
      doorbell_fd = std::move(seg.fd);
    }
  }
  if (!memory_fd.valid() || !doorbell_fd.valid() || capacity == 0 || capacity > ring::kMaxCapacity ||
      (capacity & (capacity - 1)) != 0 || bytes != ring::SegmentBytes(capacity)) {
    return absl::InternalError("kvarnd's commit ring reply does not describe a ring");
  }
  auto m = FdMapping::Map(std::move(memory_fd), bytes, /*writable=*/true);
  if (!m.ok()) return m.status();
  const auto* h = reinterpret_cast<const ring::Header*>(m->data());
  if (h->magic != ring::kMagic || h->version != ring::kVersion || h->capacity != capacity ||
      h->record_bytes != sizeof(ring::Record) || h->completion_bytes != sizeof(ring::Completion)) {
    return absl::FailedPreconditionError("kvarnd's commit ring has another layout (a different version?)");
  }
  return std::unique_ptr<CommitRing>(new CommitRing(session, std::move(*m), std::move(doorbell_fd), capacity));
}

absl::Status CommitRing::WaitFor(uint32_t target) {
  ring::Header* h = header();
  const auto done = [&] { return h->done.load(std::memory_order_acquire) == target; };
  const auto spin_until = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(spin_);
  while (spin_ > absl::ZeroDuration() && !done() && h->broken.load(std::memory_order_acquire) == 0) {
    for (int i = 0; i < 64; ++i) Pause();
    if (std::chrono::steady_clock::now() >= spin_until) break;
  }
  absl::Time deadline = absl::Now() + session_->client_->options().rpc_timeout;
  bool ended = false;
  for (;;) {
    const uint32_t seen = h->done.load(std::memory_order_acquire);
    if (seen == target) return absl::OkStatus();
    if (const uint32_t code = h->broken.load(std::memory_order_acquire); code != 0) {
      char msg[ring::kMessageBytes + 1] = {};
      ring::CopyOut(msg, h->broken_message, ring::kMessageBytes);
      // The daemon's code (FAILED_PRECONDITION, NOT_FOUND, UNAVAILABLE); anything else is
      // this process's own scribbling.
      const absl::StatusCode c = code <= 16 ? static_cast<absl::StatusCode>(code) : absl::StatusCode::kFailedPrecondition;
      return absl::Status(c, absl::StrCat("the commit ring is closed: ", msg));
    }
    const absl::Time now = absl::Now();
    if (!ended && !session_->alive()) {
      // The session ended while the records were in flight: kvarnd still answers them (with
      // CommitBatch's NOT_FOUND, or their results if it took them first); wait for that
      // verdict a short while rather than guess it.
      ended = true;
      deadline = std::min(deadline, now + kEndedSessionGrace);
    }
    if (now >= deadline) {
      if (ended) return absl::NotFoundError("the session ended; kvarnd gave no verdict on the ring's last commits");
      return absl::DeadlineExceededError("kvarnd did not complete the ring's commits in time; their outcome is unknown");
    }
    ring::FutexWait(&h->done, seen, std::min(deadline - now, absl::Milliseconds(20)));
  }
}

absl::StatusOr<std::vector<absl::StatusOr<AppendInfo>>> CommitRing::Commit(
    const std::vector<std::pair<uint64_t, std::vector<uint32_t>>>& items) {
  std::vector<absl::StatusOr<AppendInfo>> out(items.size(), absl::UnknownError("not sent"));
  std::vector<size_t> sent;  // items in the ring, by their index in `items`
  MutexLock lock(&mu_);
  if (!unusable_.ok()) return unusable_;
  {
    MutexLock s(&session_->mu_);
    for (size_t i = 0; i < items.size(); ++i) {
      const auto& [seq, ids] = items[i];
      auto it = session_->seqs_.find(seq);
      if (it == session_->seqs_.end()) {
        out[i] = absl::NotFoundError(absl::StrCat("no sequence ", seq, " in this session"));
        continue;
      }
      if (static_cast<int>(ids.size()) != it->second.staged) {
        out[i] = absl::InvalidArgumentError(absl::StrCat(ids.size(), " token ids for ", it->second.staged, " staged tokens"));
        continue;
      }
      if (ids.size() > ring::kRecordTokens) {
        out[i] = absl::InvalidArgumentError(absl::StrCat("a ring commit carries at most ", ring::kRecordTokens,
                                                         " tokens, not ", ids.size(), ": use CommitBatch"));
        continue;
      }
      sent.push_back(i);
    }
  }
  if (sent.empty()) return out;
  if (sent.size() > capacity_) {
    return absl::ResourceExhaustedError(absl::StrCat("a batch of ", sent.size(), " commits exceeds the ring's ", capacity_,
                                                     " records: split it or use CommitBatch"));
  }
  ring::Header* h = header();
  uint8_t* records = memory_.data() + ring::RecordsOffset();
  for (size_t k = 0; k < sent.size(); ++k) {
    const auto& [seq, ids] = items[sent[k]];
    ring::Record r{};
    r.sequence = seq;
    r.tokens = static_cast<uint32_t>(ids.size());
    std::copy(ids.begin(), ids.end(), r.ids);
    std::memcpy(records + size_t{(tail_ + k) & (capacity_ - 1)} * sizeof(ring::Record), &r, sizeof(r));
  }
  const uint32_t first = tail_;
  const uint32_t target = tail_ + static_cast<uint32_t>(sent.size());
  tail_ = target;
  const int cpu = sched_getcpu();
  h->cpu.store(cpu >= 0 ? static_cast<uint32_t>(cpu) + 1 : 0, std::memory_order_relaxed);
  h->tail.store(target, std::memory_order_release);
  const uint64_t one = 1;
  if (write(doorbell_.get(), &one, sizeof(one)) != sizeof(one)) {
    unusable_ = absl::InternalError(absl::StrCat("the ring's doorbell failed: ", strerror(errno)));
    return unusable_;
  }
  if (absl::Status w = WaitFor(target); !w.ok()) {
    unusable_ = w;
    return w;
  }
  const uint8_t* completions = memory_.data() + ring::CompletionsOffset(capacity_);
  for (size_t k = 0; k < sent.size(); ++k) {
    const uint32_t pos = first + static_cast<uint32_t>(k);
    ring::Completion c;
    ring::CopyOut(&c, completions + size_t{pos & (capacity_ - 1)} * sizeof(ring::Completion), sizeof(c));
    const size_t i = sent[k];
    if (c.position != pos || c.message_bytes > ring::kMessageBytes) {
      out[i] = absl::InternalError("kvarnd's ring completion does not answer this commit");
      continue;
    }
    if (c.code != 0 && c.call != 0) {
      // The session's own error: the call's status, as CommitBatch gives it.
      return absl::Status(static_cast<absl::StatusCode>(c.code), std::string(c.message, c.message_bytes));
    }
    if (c.code != 0) {
      out[i] = absl::Status(static_cast<absl::StatusCode>(c.code), std::string(c.message, c.message_bytes));
      continue;
    }
    auto table = session_->RememberCommit(items[i].first, c);
    if (!table.ok()) {
      out[i] = table.status();
      continue;
    }
    out[i] = AppendInfo{std::move(*table), c.sealed != 0};
  }
  return out;
}

}  // namespace kvarn
