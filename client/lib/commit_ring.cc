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

CommitRing::~CommitRing() {
  // Publishes not yet collected: wait for their outcome (up to the client's rpc_timeout), so
  // that their sequences' tables are kvarnd's and they are free again (or, when the ring
  // fails first, blocked as of unknown outcome).
  bool pending = false;
  {
    MutexLock lock(&mu_);
    pending = !published_.empty();
  }
  if (pending) (void)Collect();
}

absl::Status CommitRing::Unusable() const {
  return absl::FailedPreconditionError(
      absl::StrCat("the commit ring is unusable (", absl::StatusCodeToString(unusable_.code()),
                   ": ", unusable_.message(), "): use Session::CommitBatch, or a new session"));
}

absl::Status CommitRing::WaitFor(uint32_t target) {
  ring::Header* h = header();
  const auto done = [&] { return h->done.load(std::memory_order_acquire) == target; };
  // Where kvarnd drained the last batch is where it will drain this one: on this CPU (it
  // follows a plain commit's hint), spinning would only hold the CPU the commit is to run on.
  const int cpu = sched_getcpu();
  const bool drained_here =
      cpu >= 0 && h->drained_on.load(std::memory_order_relaxed) == static_cast<uint32_t>(cpu) + 1;
  const absl::Duration spin = drained_here ? absl::ZeroDuration() : spin_;
  const auto spin_until = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(spin);
  while (spin > absl::ZeroDuration() && !done() && h->broken.load(std::memory_order_acquire) == 0) {
    for (int i = 0; i < 64; ++i) ring::CpuRelax();
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

void CommitRing::WriteRecord(uint64_t sequence, std::span<const uint32_t> ids) {
  ring::Record r{};
  r.sequence = sequence;
  r.tokens = static_cast<uint32_t>(ids.size());
  uint8_t* dst = memory_.data() + ring::RecordsOffset() +
                 size_t{tail_ & (capacity_ - 1)} * sizeof(ring::Record);
  // The head and the ids in use: the daemon reads no more.
  std::memcpy(dst, &r, ring::kRecordHeadBytes);
  std::memcpy(dst + ring::kRecordHeadBytes, ids.data(), ids.size_bytes());
  ++tail_;
  // The next record's line was last read by the daemon: ask for it now, so that the next
  // Publish's fence does not wait for it.
  __builtin_prefetch(memory_.data() + ring::RecordsOffset() +
                         size_t{tail_ & (capacity_ - 1)} * sizeof(ring::Record),
                     1);
}

absl::Status CommitRing::PublishTail(uint32_t cpu_hint, bool always_ring) {
  ring::Header* h = header();
  if (cpu_hint != hint_) {
    h->cpu.store(cpu_hint, std::memory_order_relaxed);
    hint_ = cpu_hint;
  }
  h->tail.store(tail_, std::memory_order_release);
  if (!always_ring) {
    // No doorbell is needed while the drain thread is sure to look at the tail again: while
    // it watches the ring (`polling` set), and while it has not completed the records of the
    // last doorbell (after completing a batch it looks at the tail once more). The fence pairs
    // with the thread's between clearing `polling` (or storing `done`) and that look: it sees
    // this tail, or this sees `polling` cleared (`done` stored) and rings.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (h->polling.load(std::memory_order_relaxed) != 0) return absl::OkStatus();
    if (static_cast<int32_t>(rung_at_ - h->done.load(std::memory_order_relaxed)) > 0)
      return absl::OkStatus();
  }
  rung_at_ = tail_;
  const uint64_t one = 1;
  if (write(doorbell_.get(), &one, sizeof(one)) != sizeof(one)) {
    unusable_ = absl::InternalError(absl::StrCat("the ring's doorbell failed (", strerror(errno),
                                                 "); what it published has an unknown outcome"));
    return unusable_;
  }
  doorbells_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status CommitRing::Await(uint32_t first, std::span<const uint64_t> seqs,
                               std::span<const size_t> index,
                               std::vector<absl::StatusOr<AppendInfo>>* out) {
  const uint32_t target = first + static_cast<uint32_t>(seqs.size());
  size_t answered = seqs.size();  // records kvarnd completed
  absl::Status call;  // the session's own error when kvarnd gave one, else the wait's failure
  bool verdict = false;  // kvarnd closed the ring: it applies nothing after `done`
  if (absl::Status w = WaitFor(target); !w.ok()) {
    // The ring is unusable from here on. The records kvarnd completed before it failed have
    // their answers. The others were not applied when kvarnd gave its verdict (it sets
    // `broken` once it applies no more, after storing `done` for all it applied; read in
    // that order); after a timeout their outcome is unknown (it may still apply them).
    unusable_ = w;
    call = w;
    verdict = header()->broken.load(std::memory_order_acquire) != 0;
    const int32_t done =
        static_cast<int32_t>(header()->done.load(std::memory_order_acquire) - first);
    answered = static_cast<size_t>(std::clamp<int32_t>(done, 0, static_cast<int32_t>(seqs.size())));
  } else {
    // Every doorbell's records are done: keeps `rung_at_ - done` within the ring however long
    // the drain thread watches (and no doorbell rings).
    rung_at_ = target;
  }
  const uint8_t* completions = memory_.data() + ring::CompletionsOffset(capacity_);
  // The daemon's core wrote these lines: request them all before reading any.
  for (size_t k = 0; k < answered; ++k) {
    __builtin_prefetch(completions +
                       size_t{(first + k) & (capacity_ - 1)} * sizeof(ring::Completion));
  }
  MutexLock lock(&session_->mu_);  // one lock for the batch's tables
  for (size_t k = answered; k < seqs.size(); ++k) {
    (*out)[index[k]] = call;
    session_->EndRingFlightLocked(seqs[k], /*unknown=*/!verdict);
  }
  for (size_t k = 0; k < answered; ++k) {
    const uint32_t pos = first + static_cast<uint32_t>(k);
    absl::StatusOr<AppendInfo>& result = (*out)[index[k]];
    ring::Completion c;
    const uint8_t* src = completions + size_t{pos & (capacity_ - 1)} * sizeof(ring::Completion);
    ring::CopyOut(&c, src, ring::kCompletionHeadBytes);  // the message only for an error, below
    if (c.code != 0 && c.message_bytes <= ring::kMessageBytes) {
      ring::CopyOut(c.message, src + ring::kCompletionHeadBytes, c.message_bytes);
    }
    if (c.position != pos || c.message_bytes > ring::kMessageBytes) {
      // Not kvarnd's answer (this process wrote over it): the commit may have been applied.
      result = absl::InternalError("kvarnd's ring completion does not answer this commit");
      session_->EndRingFlightLocked(seqs[k], /*unknown=*/true);
      continue;
    } else if (c.code != 0) {
      result = absl::Status(static_cast<absl::StatusCode>(c.code),
                            std::string(c.message, c.message_bytes));
      if (c.call != 0 && call.ok()) call = result.status();  // as CommitBatch's outer status
    } else {
      auto table = session_->RememberCommitLocked(seqs[k], c);
      if (table.ok()) {
        result = AppendInfo{std::move(*table), c.sealed != 0};
      } else {
        result = table.status();
      }
      continue;  // the flight ended there
    }
    session_->EndRingFlightLocked(seqs[k], /*unknown=*/false);  // refused: nothing changed
  }
  return call;
}

absl::StatusOr<Session::SeqState*> CommitRing::CheckItem(uint64_t seq,
                                                         std::span<const uint32_t> ids) {
  auto it = session_->seqs_.find(seq);
  if (it == session_->seqs_.end()) {
    return absl::NotFoundError(absl::StrCat("no sequence ", seq, " in this session"));
  }
  if (absl::Status f = Session::CheckIdle(seq, it->second); !f.ok()) return f;
  if (static_cast<int>(ids.size()) != it->second.staged) {
    return absl::InvalidArgumentError(
        absl::StrCat(ids.size(), " token ids for ", it->second.staged, " staged tokens"));
  }
  if (ids.size() > ring::kRecordTokens) {
    return absl::InvalidArgumentError(absl::StrCat("a ring commit carries at most ",
                                                   ring::kRecordTokens, " tokens, not ", ids.size(),
                                                   ": use CommitBatch"));
  }
  return &it->second;
}

absl::StatusOr<std::vector<absl::StatusOr<AppendInfo>>> CommitRing::Commit(
    const std::vector<std::pair<uint64_t, std::vector<uint32_t>>>& items) {
  // Every entry of `out` is set below: a refused item's error here, a sent one's in Await.
  std::vector<absl::StatusOr<AppendInfo>> out(items.size());
  std::vector<size_t> sent;  // items in the ring, by their index in `items`
  std::vector<Session::SeqState*> states;  // theirs (no insert or erase under the session lock)
  std::vector<uint64_t> seqs;
  sent.reserve(items.size());
  states.reserve(items.size());
  seqs.reserve(items.size());
  MutexLock lock(&mu_);
  if (!unusable_.ok()) return Unusable();
  if (!published_.empty()) {
    return absl::FailedPreconditionError(
        "published ring commits await Collect: Collect them before Commit");
  }
  const uint32_t first = tail_;
  {
    MutexLock s(&session_->mu_);
    for (size_t i = 0; i < items.size(); ++i) {
      auto st = CheckItem(items[i].first, items[i].second);
      if (!st.ok()) {
        out[i] = st.status();
        continue;
      }
      sent.push_back(i);
      states.push_back(*st);
    }
    if (sent.empty()) return out;
    if (sent.size() > capacity_) {
      return absl::ResourceExhaustedError(absl::StrCat("a batch of ", sent.size(),
                                                       " commits exceeds the ring's ", capacity_,
                                                       " records: split it or use CommitBatch"));
    }
    for (size_t k = 0; k < sent.size(); ++k) {
      const auto& [seq, ids] = items[sent[k]];
      WriteRecord(seq, ids);
      states[k]->in_ring = true;
      seqs.push_back(seq);
    }
  }
  const int cpu = sched_getcpu();
  if (absl::Status p =
          PublishTail(cpu >= 0 ? static_cast<uint32_t>(cpu) + 1 : 0, /*always_ring=*/true);
      !p.ok()) {
    // The records are published: kvarnd may apply them without the doorbell (it watches the
    // ring, or looks when another doorbell rings).
    session_->EndRingFlight(seqs, /*unknown=*/true);
    return p;
  }
  if (absl::Status a = Await(first, seqs, sent, &out); !a.ok()) return a;
  return out;
}

absl::Status CommitRing::Publish(uint64_t sequence, std::span<const uint32_t> ids) {
  MutexLock lock(&mu_);
  absl::Status refused = unusable_.ok() ? absl::OkStatus() : Unusable();
  if (refused.ok()) {
    MutexLock s(&session_->mu_);
    auto st = CheckItem(sequence, ids);
    if (!st.ok()) {
      refused = st.status();
    } else if (in_ring_ == capacity_) {
      refused = absl::ResourceExhaustedError(absl::StrCat(
          "the ring's ", capacity_, " records all await Collect: Collect before publishing more"));
    } else {
      WriteRecord(sequence, ids);
      (*st)->in_ring = true;
    }
  }
  published_.push_back({sequence, refused});
  if (!refused.ok()) return refused;
  ++in_ring_;
  const int cpu = sched_getcpu();
  return PublishTail((cpu >= 0 ? static_cast<uint32_t>(cpu) + 1 : 0) | ring::kCpuPipelined,
                     /*always_ring=*/false);
}

absl::StatusOr<std::vector<absl::StatusOr<AppendInfo>>> CommitRing::Collect() {
  MutexLock lock(&mu_);
  std::vector<absl::StatusOr<AppendInfo>> out;
  out.reserve(published_.size());
  std::vector<uint64_t> seqs;  // the published ones, in order
  std::vector<size_t> index;   // their entries in `out`
  for (Published& p : published_) {
    if (p.refused.ok()) {
      seqs.push_back(p.sequence);
      index.push_back(out.size());
      // Await's to fill; no message, no allocation.
      out.emplace_back(absl::Status(absl::StatusCode::kUnknown, ""));
    } else {
      out.emplace_back(std::move(p.refused));
    }
  }
  published_.clear();  // keeps its capacity for the next step
  const uint32_t first = tail_ - in_ring_;
  in_ring_ = 0;
  if (!unusable_.ok()) {
    // A doorbell failed after its record went in (Publish said so): kvarnd may still apply
    // the published records, so their outcome is unknown.
    session_->EndRingFlight(seqs, /*unknown=*/true);
    return Unusable();
  }
  if (seqs.empty()) return out;
  if (absl::Status a = Await(first, seqs, index, &out); !a.ok()) return a;
  return out;
}

}  // namespace kvarn
