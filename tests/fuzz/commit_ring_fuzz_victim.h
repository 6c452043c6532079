// The pieces of commit_ring_fuzzer.cc that are not the attacker: the checks and the run's
// figures, waiting on the daemon with a deadline, a session that holds its memory and ring
// as a client process does, and the well-behaved client (Victim) whose commits must all
// succeed. Included by commit_ring_fuzzer.cc only.
#ifndef KVARN_TESTS_FUZZ_COMMIT_RING_FUZZ_VICTIM_H_
#define KVARN_TESTS_FUZZ_COMMIT_RING_FUZZ_VICTIM_H_

#include <fuzzer/FuzzedDataProvider.h>
#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "client/lib/descriptor_client.h"
#include "common/commit_ring.h"
#include "common/shared_memory.h"
#include "tests/daemon/service/raw_ring.h"
#include "tests/daemon/service/service_harness.h"
#include "tests/fuzz/fuzz_check.h"

namespace kvarn::testing::ring_fuzz {

using Code = absl::StatusCode;

using fuzz::Check;
using fuzz::Fail;

// Figures over the whole run, printed at exit, so that a run shows what it exercised.
struct Figures {
  uint64_t inputs = 0, steps = 0, waits = 0;
  uint64_t accepted = 0, refused = 0;                 // attacker records checked one by one
  uint64_t unverified = 0, unverified_stretches = 0;  // records taken in stretches that were not
  uint64_t broken = 0;                                // attacker rings the daemon closed
  uint64_t victim_ring = 0, victim_rpc = 0, attacker_rpc = 0;
};
inline Figures g;

inline void PrintFigures() {
  const auto u = [](uint64_t v) { return static_cast<unsigned long long>(v); };
  std::fprintf(stderr,
               "commit_ring_fuzzer: %llu steps in %llu inputs, invariants and models checked after "
               "each; %llu waits for the daemon; attacker records %llu accepted and %llu refused "
               "(each checked), %llu taken in %llu unverified stretches; %llu attacker rings "
               "broken; victim commits %llu by ring and %llu by AppendBatch; %llu attacker RPCs\n",
               u(g.steps), u(g.inputs), u(g.waits), u(g.accepted), u(g.refused), u(g.unverified),
               u(g.unverified_stretches), u(g.broken), u(g.victim_ring), u(g.victim_rpc),
               u(g.attacker_rpc));
}

constexpr absl::Duration kDeadline = absl::Seconds(10);
constexpr uint32_t kTile = 64;  // SmallModel()'s tile: a commit never crosses one
constexpr int kMaxSteps = 128;
// A victim sequence this long is released and replaced; the fuzzer writes no well-formed
// record for an attacker sequence this long (others, from raw bytes or in flight when it is
// reached, add at most 56 tokens a step). An input then references far fewer blocks than
// SmallCoreConfig()'s pool holds (409 quantized, 8 sink: at most 5 live sequences have one),
// so no victim seal meets a pool full of referenced blocks, which promise 3 would rightly
// refuse: that would be exhaustion, not a ring's doing.
constexpr uint64_t kVictimTokens = 4 * kTile;
constexpr uint64_t kAttackerTokens = 8 * kTile;
constexpr uint32_t kBehind = 1u << 31;  // a distance between positions this large is backwards

// Waits until `done` holds or kDeadline passes: yields first (the drain thread may share this
// CPU), then sleeps on `word` when given (a ring's `done`, which the drain thread wakes after
// every batch and when it breaks the ring) or for 20 us. Returns `done`'s last value. Not
// WaitFor (tests/common/wait_for.h): its 1 ms polls would make each input last seconds.
inline bool Await(std::atomic<uint32_t>* word, const std::function<bool()>& done) {
  const absl::Time deadline = absl::Now() + kDeadline;
  for (int i = 0; !done(); ++i) {
    if (absl::Now() >= deadline) return done();
    if (i < 64) {
      sched_yield();
    } else if (word != nullptr) {
      ring::FutexWait(word, word->load(), absl::Microseconds(200));
    } else {
      absl::SleepFor(absl::Microseconds(20));
    }
  }
  return true;
}

// A ring's `broken` message (NUL-terminated only when shorter than its field).
inline absl::string_view BrokenMessage(const ring::Header& h) {
  return absl::string_view(h.broken_message, strnlen(h.broken_message, ring::kMessageBytes));
}

// The `cpu` hint a client publishing from this thread's CPU stores.
inline uint32_t CpuHint() {
  const int cpu = sched_getcpu();
  return cpu >= 0 ? static_cast<uint32_t>(cpu) + 1 : 0;
}

inline bool WriteDoorbell(const RawRing& r, uint64_t value = 1) {
  return write(r.doorbell.get(), &value, sizeof(value)) == sizeof(value);
}

// Whether the drain thread has read everything written to this doorbell (an eventfd is
// readable while its count is not zero). It reads doorbells between its rounds only: once one
// is read, every batch begun before has ended, and every later one reads the tail as it is.
inline bool DoorbellRead(const RawRing& r) {
  pollfd p{r.doorbell.get(), POLLIN, 0};
  return poll(&p, 1, 0) == 0;
}

using Items = std::vector<std::pair<uint64_t, std::vector<uint32_t>>>;  // (sequence, ids)

inline grpc::Status AppendBatch(ServiceHarness& h, const v1::SessionRef& ref, const Items& items,
                                v1::AppendBatchResponse* resp) {
  v1::AppendBatchRequest req;
  *req.mutable_session() = ref;
  for (const auto& [seq, ids] : items) {
    auto* item = req.add_items();
    item->set_sequence_id(seq);
    for (uint32_t id : ids) item->add_token_ids(id);
  }
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  return h.stub().AppendBatch(&ctx, req, resp);
}

// Token ids for n tokens after `have`: a sequence's own positions.
inline std::vector<uint32_t> Ids(uint64_t have, uint32_t n) {
  return TokenIds(static_cast<uint32_t>(have), static_cast<int>(n));
}

// A session of `slots` tail slots whose memory this process took (its tail mapped into *tail
// when given), and its ring.
struct Session {
  v1::SessionRef ref;
  SessionRef core_ref;
  RawRing ring;

  Session(ServiceHarness& h, const std::string& tenant, uint32_t slots, FdMapping* tail) {
    grpc::Status st;
    ref = ServiceHarness::RefOf(h.Open(tenant, slots, "", "", &st));
    Check(st.ok(), "OpenSession: ", st.error_message());
    core_ref = CoreRef(ref);
    auto mem = FetchSessionMemory(h.descriptor_socket(), ref);
    if (!mem.ok()) Fail(absl::StrCat("FetchSessionMemory: ", mem.status().ToString()));
    for (auto& seg : mem->segments) {
      if (tail == nullptr || seg.entry.kind() != v1::DescriptorReply::Entry::KIND_TAIL) continue;
      auto m = FdMapping::Map(std::move(seg.fd), seg.entry.bytes(), true);
      if (!m.ok()) Fail(absl::StrCat("mapping the tail: ", m.status().ToString()));
      *tail = std::move(*m);
    }
    Check(tail == nullptr || tail->data() != nullptr, "no tail segment lent");
    auto r = TakeRing(h.descriptor_socket(), ref);
    if (!r.ok()) Fail(absl::StrCat("TakeRing: ", r.status().ToString()));
    ring = std::move(*r);
  }
  uint64_t NewSequence(ServiceHarness& h) const {
    const uint64_t seq = h.CreateSequence(ref);
    Check(seq != 0, "CreateSequence failed");
    return seq;
  }
  uint64_t Tokens(ServiceHarness& h, uint64_t seq) const {
    auto t = h.core().Table(core_ref, seq);
    if (!t.ok()) Fail(absl::StrCat("sequence ", seq, ": ", t.status().ToString()));
    return t->tokens;
  }
};

// The well-behaved client: two sequences, commits through its ring (one record per sequence,
// each within its tail) and by AppendBatch; every one must succeed and leave the model's
// counts. A sequence that grew long is released and replaced.
class Victim {
 public:
  Victim(ServiceHarness& h, FuzzedDataProvider& in) : h_(h), in_(in), s_(h, "victim", 2, nullptr) {
    for (int i = 0; i < 2; ++i) tokens_[s_.NewSequence(h_)] = 0;
  }

  const Session& session() const { return s_; }
  const std::map<uint64_t, uint64_t>& tokens() const { return tokens_; }
  // Records of the victim's ring batches: the part of CommitRingServer::commits() that is not
  // the attacker's.
  uint64_t ring_records() const { return ring_records_; }

  void RingCommit() {
    const Items items = Pick(ring::kRecordTokens);
    ring::Header* h = s_.ring.h();
    for (size_t i = 0; i < items.size(); ++i) {
      *s_.ring.record(tail_ + static_cast<uint32_t>(i)) = Rec(items[i].first, items[i].second);
    }
    h->cpu.store(in_.PickValueInArray<uint32_t>({0, CpuHint(), CpuHint() | ring::kCpuPipelined}));
    const uint32_t target = tail_ + static_cast<uint32_t>(items.size());
    h->tail.store(target, std::memory_order_release);
    Check(WriteDoorbell(s_.ring), "the victim's doorbell failed");
    Check(Await(&h->done,
                [&] {
                  return h->done.load(std::memory_order_acquire) == target || h->broken.load() != 0;
                }),
          "the victim's ring commit was not answered within 10 s");
    Check(h->broken.load() == 0, "the victim's ring broke: ", BrokenMessage(*h));
    for (size_t i = 0; i < items.size(); ++i) {
      const ring::Completion& c = *s_.ring.completion(tail_ + static_cast<uint32_t>(i));
      if (c.code != 0)
        Fail(absl::StrCat("a victim ring commit refused (", c.code, "): ", Message(c)));
      Applied(items[i], c.tokens);
    }
    tail_ = target;
    ring_records_ += items.size();
    barrier_ = true;
    ++g.victim_ring;
    ReplaceLong();
  }

  void RpcCommit() {
    const Items items = Pick(kTile);
    v1::AppendBatchResponse resp;
    const grpc::Status st = AppendBatch(h_, s_.ref, items, &resp);
    Check(st.ok(), "the victim's AppendBatch: ", st.error_message());
    Check(resp.items_size() == static_cast<int>(items.size()), "AppendBatch answered ",
          resp.items_size(), " items");
    for (size_t i = 0; i < items.size(); ++i) {
      const auto& item = resp.items(static_cast<int>(i));
      Check(item.code() == 0, "a victim AppendBatch item refused (", item.code(),
            "): ", item.message());
      Applied(items[i], item.result().table().tokens());
    }
    ++g.victim_rpc;
    ReplaceLong();
  }

  // The drain thread adds a batch to commits() after it stores `done`: the victim, woken by
  // `done`, may look before. Once an empty doorbell of the victim's is read, the thread is past
  // that batch (DoorbellRead).
  void Barrier() {
    if (!barrier_) return;
    Check(WriteDoorbell(s_.ring), "the victim's doorbell failed");
    Check(Await(nullptr, [&] { return DoorbellRead(s_.ring); }),
          "the daemon did not read the victim's doorbell within 10 s");
    barrier_ = false;
  }
  // Another doorbell was read after the victim's last batch: that batch is counted.
  void BarrierPassed() { barrier_ = false; }

  void CheckModel(int op) const {
    if (s_.ring.h()->broken.load() != 0) {
      Fail(
          absl::StrCat("the victim's ring broke after op ", op, ": ", BrokenMessage(*s_.ring.h())));
    }
    for (const auto& [seq, tokens] : tokens_) {
      const uint64_t now = s_.Tokens(h_, seq);
      Check(now == tokens, "after op ", op, " the victim's sequence ", seq, " holds ", now,
            " tokens, the model ", tokens);
    }
  }

 private:
  // The first sequence and maybe the other, each with 1..`limit` tokens within its tail.
  Items Pick(uint32_t limit) {
    Items items;
    for (const auto& [seq, tokens] : tokens_) {
      if (!items.empty() && !in_.ConsumeBool()) continue;
      const uint32_t room = kTile - static_cast<uint32_t>(tokens % kTile);
      items.emplace_back(
          seq, Ids(tokens, in_.ConsumeIntegralInRange<uint32_t>(1, std::min(room, limit))));
    }
    return items;
  }

  // A commit of `item` succeeded, leaving its sequence `tokens` long.
  void Applied(const Items::value_type& item, uint64_t tokens) {
    uint64_t& model = tokens_[item.first];
    model += item.second.size();
    Check(tokens == model, "a victim commit left ", tokens, " tokens, the model ", model);
  }

  void ReplaceLong() {
    for (auto it = tokens_.begin(); it != tokens_.end();) {
      if (it->second < kVictimTokens) {
        ++it;
        continue;
      }
      v1::ReleaseRequest req;
      *req.mutable_session() = s_.ref;
      req.add_sequence_ids(it->first);
      v1::ReleaseResponse resp;
      grpc::ClientContext ctx;
      SetDeadline(&ctx);
      const grpc::Status st = h_.stub().Release(&ctx, req, &resp);
      Check(st.ok() && resp.released() == 1, "the victim's Release: ", st.error_message());
      it = tokens_.erase(it);
      tokens_[s_.NewSequence(h_)] = 0;  // a larger id: visited later in this loop, at 0
    }
  }

  ServiceHarness& h_;
  FuzzedDataProvider& in_;
  Session s_;
  std::map<uint64_t, uint64_t> tokens_;  // sequence -> the model's count
  uint32_t tail_ = 0;                    // records published, all answered
  uint64_t ring_records_ = 0;
  bool barrier_ = false;  // a ring batch since the last Barrier
};

}  // namespace kvarn::testing::ring_fuzz

#endif  // KVARN_TESTS_FUZZ_COMMIT_RING_FUZZ_VICTIM_H_
