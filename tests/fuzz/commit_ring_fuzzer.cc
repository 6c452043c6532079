// libFuzzer: a hostile client against the real commit ring server, in-process
// (docs/commit_ring.md, "What a client can do to its own ring, and what it cannot do to
// others"). One ServiceHarness with rings (host backend, check_commits on) serves the whole
// run; each input opens an attacker and a victim session in it, each holding its ring as a
// client process does (tests/daemon/service/raw_ring.h), and closes both at its end.
//
// The input drives the attacker's ring: records at any position, well-formed ones with fuzzed
// fields (its own sequence ids, the victim's, unknown ones; 0 to 2^32-1 tokens; any ids) and
// raw bytes over records and completions; any header word (tail, cpu, polling, done,
// drained_on, broken and its message, the words written once, the padding); its doorbell; its
// staged K/V (NaN, Inf); waits for the daemon to answer; and RPCs of its own. Interleaved, the
// victim commits through its ring and by AppendBatch as a well-behaved client.
//
// Checked after every step (a failure aborts; ASan and UBSan catch the daemon's memory
// errors): CheckInvariants(); every victim commit succeeds, its counts equal a model kept
// here, and its ring never breaks; no attacker count falls. At every wait (its doorbell, the
// drain thread having read it, and the daemon's head at the tail or the ring closed, within
// 10 s): each record the daemon took has its completion at its position; a code 0 adds exactly
// the record's tokens to its sequence (the attacker's own, 1..28 tokens) and the completion
// shows the model's count; a refused record changes nothing (beyond 28 tokens:
// INVALID_ARGUMENT; another session's or an unknown id: NOT_FOUND); the attacker's counts equal
// the model; a tail out of bounds breaks the ring with FAILED_PRECONDITION in its header, and
// nothing more is taken from it. The attacker's AppendBatch and ListSequences keep working,
// broken ring or not. After each input no session, sequence, tail slot, referenced block or
// ring is left.
//
// The daemon's head for the attacker's ring lives in the daemon: the fuzzer learns it from
// CommitRingServer::commits() less the victim's records, never from the ring (`done` is the
// attacker's to scribble). Records are checked from copies: before the attacker writes over a
// slot or publishes further, the records the daemon has answered by then are copied out with
// their completions. Not checked exactly: a slot written while the daemon may be copying that
// record or answering it, or a tail so far ahead that the daemon may take a slot twice between
// two looks. Which bytes it read, and whose completion is left, are then unknowable from
// outside; for such a stretch the fuzzer checks that no count fell and that they grew by at
// most 28 tokens per record taken, and adopts the core's counts ("unverified" at exit).
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/commit_ring.h"
#include "daemon/service/log.h"
#include "tests/daemon/service/raw_ring.h"
#include "tests/daemon/service/service_harness.h"
#include "tests/fuzz/commit_ring_fuzz_victim.h"

namespace kvarn::testing::ring_fuzz {

// The daemon, started once for the whole run (Daemon()), and stopped and removed (its socket
// directory too) at exit.
ServiceHarness* daemon = nullptr;

ServiceHarness& Daemon() {
  if (daemon != nullptr) return *daemon;
  SetLogLevel(LogLevel::kError);  // the daemon logs a warning for every ring it closes
  daemon = new ServiceHarness();
  ServiceHarness::Options o = ServiceHarness::WithRings();
  o.core.check_commits = true;
  if (absl::Status st = daemon->Start(o); !st.ok()) Fail(st.ToString());
  // Registered after the server started, so it runs before the static destructors of what
  // the server set up: the server's threads must not outlive them.
  std::atexit([] {
    PrintFigures();
    delete daemon;
    daemon = nullptr;
  });
  return *daemon;
}

// The attacker: up to three sequences and what the input does to its ring, with what the
// fuzzer knows of the daemon's view of that ring, and the model of its counts.
class Attacker {
 public:
  Attacker(ServiceHarness& h, FuzzedDataProvider& in, Victim& victim, uint64_t base_commits,
           uint64_t base_broken)
      : h_(h),
        in_(in),
        victim_(victim),
        base_commits_(base_commits),
        base_broken_(base_broken),
        slots_(in.PickValueInArray<uint32_t>({1, 2, 3, 4, 8})),
        s_(h, "attacker", slots_, &tail_memory_) {
    Check(cap() == std::bit_ceil(slots_), "a ring of ", cap(), " records for ", slots_,
          " tail slots");
    for (uint32_t i = 0; i < std::min<uint32_t>(slots_, 3); ++i) {
      seqs_.push_back(s_.NewSequence(h_));
      tokens_[seqs_.back()] = 0;
    }
  }

  const Session& session() const { return s_; }

  // One write of the attacker's, by `what` (0..10).
  void Write(int what) {
    static constexpr void (Attacker::*kWrites[])() = {
        &Attacker::WriteRecord,     &Attacker::WriteRecord,       &Attacker::WriteRecord,
        &Attacker::WriteRawBytes,   &Attacker::Publish,           &Attacker::Publish,
        &Attacker::WriteHeaderWord, &Attacker::WriteNamedWord,    &Attacker::Doorbell,
        &Attacker::Commit,          &Attacker::ScribbleTailMemory};
    (this->*kWrites[what])();
  }

  // Waits for the daemon to answer: rings the doorbell, waits until the drain thread read it
  // (every batch begun before has then ended, the victim's too) and its head reached the tail,
  // or until the ring is closed; then checks what it took against the model.
  void Settle() {
    ++g.waits;
    if (!broken_) {
      Check(Await(nullptr,
                  [&] {
                    if (WriteDoorbell(s_.ring)) return true;
                    Check(errno == EAGAIN, "the attacker's doorbell: ", strerror(errno));
                    return RingBroke();  // a full count: the daemon reads it, or broke the ring
                  }),
            "the attacker's doorbell stayed full for 10 s");
      Check(Await(nullptr, [&] { return DoorbellRead(s_.ring) || RingBroke(); }),
            "the daemon did not read the attacker's doorbell within 10 s");
      if (DoorbellRead(s_.ring)) victim_.BarrierPassed();
    }
    victim_.Barrier();
    Check(Await(&h()->done, [&] { return DaemonHead() == TailWord() || RingBroke(); }),
          "the daemon did not answer the attacker's doorbell within 10 s (head ", DaemonHead(),
          ", tail ", TailWord(), ")");
    Harvest();  // exact now: every record the daemon took
    const uint32_t taken = Answered();
    Check(DaemonHead() - head_ == taken, "the daemon's head moved by ", DaemonHead() - head_, ", ",
          taken, " records taken");
    if (broken_) {
      Check(taken == 0, "the daemon took ", taken, " records from a broken ring");
    } else if (!racy_) {
      CheckTaken();
    } else {
      AdoptTaken();
    }
    head_ += taken;
    reach_ = 0;
    answered_.clear();
    racy_ = false;
    if (!broken_ && RingBroke()) CheckBreak();
    broken_written_ = false;
    for (const auto& [seq, tokens] : tokens_) {
      const uint64_t now = s_.Tokens(h_, seq);
      Check(now == tokens, "attacker sequence ", seq, " holds ", now, " tokens, the model ",
            tokens);
    }
  }

  // The attacker's own RPCs still work whatever it did to its ring: with nothing in flight and
  // its staged K/V zeroed again, one token appended to one of its sequences, and the listing of
  // its sequences, agree with the model.
  void Rpcs() {
    Settle();
    std::memset(tail_memory_.data(), 0, tail_memory_.size());
    const uint64_t seq = seqs_[in_.ConsumeIntegralInRange<size_t>(0, seqs_.size() - 1)];
    v1::AppendBatchResponse resp;
    const grpc::Status st = AppendBatch(h_, s_.ref, {{seq, Ids(tokens_[seq], 1)}}, &resp);
    Check(st.ok() && resp.items_size() == 1, "the attacker's AppendBatch: ", st.error_message());
    Check(resp.items(0).code() == 0,
          "the attacker's AppendBatch item refused: ", resp.items(0).message());
    const uint64_t want = ++tokens_[seq];
    Check(resp.items(0).result().table().tokens() == want, "the attacker's AppendBatch left ",
          resp.items(0).result().table().tokens(), " tokens, the model ", want);
    v1::ListSequencesRequest req;
    *req.mutable_session() = s_.ref;
    v1::ListSequencesResponse list;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    const grpc::Status listed = h_.stub().ListSequences(&ctx, req, &list);
    Check(listed.ok(), "the attacker's ListSequences: ", listed.error_message());
    Check(list.sequences_size() == static_cast<int>(tokens_.size()), "ListSequences gave ",
          list.sequences_size(), " sequences");
    for (const auto& s : list.sequences()) {
      const auto it = tokens_.find(s.sequence_id());
      Check(it != tokens_.end() && it->second == s.tokens(), "ListSequences: sequence ",
            s.sequence_id(), " with ", s.tokens(), " tokens");
    }
    ++g.attacker_rpc;
  }

  // Between waits the daemon may be applying records: counts only grow.
  void CheckModel(int op) const {
    for (const auto& [seq, tokens] : tokens_) {
      const uint64_t now = s_.Tokens(h_, seq);
      Check(now >= tokens, "after op ", op, " attacker sequence ", seq, " fell from ", tokens,
            " to ", now);
    }
  }

 private:
  ring::Header* h() const { return s_.ring.h(); }
  uint32_t cap() const { return s_.ring.capacity; }
  uint32_t TailWord() const { return h()->tail.load(std::memory_order_relaxed); }
  bool RingBroke() const { return h_.rings()->broken() != base_broken_; }  // only this one can
  // The daemon's head for this ring: every record it took, less the victim's. A lower bound
  // until the victim's last batch is counted (Victim::Barrier).
  uint32_t DaemonHead() const {
    return static_cast<uint32_t>(h_.rings()->commits() - base_commits_ - victim_.ring_records());
  }

  // Captures the records the daemon has answered since the last capture, as far as
  // DaemonHead() says now, with their completions, before the attacker writes over a slot or
  // publishes further.
  void Harvest() {
    const uint32_t upto = DaemonHead() - head_;
    if (upto >= kBehind) return;  // the victim's last batch is not counted yet
    Check(upto <= reach_, "the daemon took ", upto, " records past its head; ", reach_,
          " were published");
    for (uint32_t i = Answered(); i < upto; ++i) {
      auto& [r, c] = answered_.emplace_back();
      ring::CopyOut(&r, s_.ring.record(head_ + i), sizeof(r));
      ring::CopyOut(&c, s_.ring.completion(head_ + i), sizeof(c));
    }
  }
  // Positions past head_: answered as far as known; published and maybe not answered yet;
  // up to which records may be published without taking the slot of one maybe unanswered;
  // the tail; published since the last wait or now.
  uint32_t Answered() const { return static_cast<uint32_t>(answered_.size()); }
  uint32_t InFlight() const { return reach_ - Answered(); }
  uint32_t Limit() const { return Answered() + cap(); }
  uint32_t Ahead() const { return TailWord() - head_; }
  uint32_t Used() const { return Ahead() < kBehind ? std::max(reach_, Ahead()) : reach_; }

  void StoreTail(uint32_t tail) {
    Harvest();
    const uint32_t from_head = tail - head_, from_answered = tail - head_ - Answered();
    // Past the ring's end as the daemon's head may stand: the daemon breaks the ring, or, its
    // head further than known, takes records whose slots others in flight use.
    if (from_answered > cap() && from_answered < kBehind && InFlight() > 0) racy_ = true;
    if (from_head < kBehind) reach_ = std::max(reach_, from_head);
    h()->tail.store(tail, std::memory_order_release);
  }

  // Before the attacker writes record or completion slot `slot`: racy when a record the daemon
  // may be copying or answering uses it.
  void NoteSlotWrite(uint32_t slot) {
    Harvest();
    const uint32_t first = head_ + Answered();
    if (InFlight() >= cap() || ((slot - first) & (cap() - 1)) < InFlight()) racy_ = true;
  }

  // Stores a tail: mostly one that publishes more records, within the ring as far as the
  // daemon is known to have gone; else one behind, one just too far, or anything.
  void Publish() { StoreTail(PickTail()); }
  uint32_t PickTail() {
    Harvest();
    const uint32_t t = TailWord(), ahead = Ahead();
    switch (in_.ConsumeIntegralInRange<int>(0, 31)) {
      case 28:
        return head_ + in_.ConsumeIntegralInRange<uint32_t>(0, Limit() + 2);
      case 29:
        return t - in_.ConsumeIntegralInRange<uint32_t>(1, 3);  // behind
      case 30:
        return head_ + Limit() + 1;  // just too far
      case 31:
        return in_.ConsumeIntegral<uint32_t>();
      default:
        return ahead < Limit() ? t + in_.ConsumeIntegralInRange<uint32_t>(1, Limit() - ahead) : t;
    }
  }

  // A position for a record: mostly one the daemon cannot be reading now (past the tail and
  // past what was published since the last wait, within the ring as far as the daemon is known
  // to have gone; with none left, after a wait, as a client waits for its completions), else
  // anywhere, which may race with the daemon's copy (what CopyOut is for).
  uint32_t PickPosition() {
    if (in_.ConsumeIntegralInRange<int>(0, 7) == 0) return in_.ConsumeIntegral<uint32_t>();
    Harvest();
    if (Used() >= Limit()) Settle();
    if (Used() >= Limit()) return in_.ConsumeIntegral<uint32_t>();  // a broken ring's tail
    return head_ + Used() + in_.ConsumeIntegralInRange<uint32_t>(0, Limit() - 1 - Used());
  }

  // A sequence id for a record: mostly its own, else the victim's or unknown.
  uint64_t PickSequence() {
    switch (in_.ConsumeIntegralInRange<int>(0, 7)) {
      case 0:
        return std::next(victim_.tokens().begin(), in_.ConsumeIntegralInRange<size_t>(0, 1))->first;
      case 1:
        return seqs_.back() + in_.ConsumeIntegralInRange<uint64_t>(1, 3);
      case 2:
        return in_.PickValueInArray<uint64_t>({0, ~uint64_t{0}, uint64_t{1} << 63});
      case 3:
        return in_.ConsumeIntegral<uint64_t>();
      default: {
        const uint64_t own = seqs_[in_.ConsumeIntegralInRange<size_t>(0, seqs_.size() - 1)];
        return tokens_[own] < kAttackerTokens ? own : own + 1000;
      }
    }
  }

  // A record's token count: mostly 1..28, else none, one too many, far too many.
  uint32_t PickTokenCount() {
    if (in_.ConsumeIntegralInRange<int>(0, 9) >= 4) {
      return in_.ConsumeIntegralInRange<uint32_t>(1, ring::kRecordTokens);
    }
    return in_.ConsumeBool()
               ? in_.ConsumeIntegral<uint32_t>()
               : in_.PickValueInArray<uint32_t>({0, ring::kRecordTokens + 1, 1000, 1u << 31, ~0u});
  }

  void PutRecord(uint32_t pos, const ring::Record& r) {
    NoteSlotWrite(pos & (cap() - 1));
    *s_.ring.record(pos) = r;
  }

  // A record with fuzzed fields.
  void WriteRecord() {
    const uint32_t pos = PickPosition();
    ring::Record r{};
    r.sequence = PickSequence();
    r.tokens = PickTokenCount();
    r.reserved = in_.ConsumeBool() ? 0 : in_.ConsumeIntegral<uint32_t>();
    const uint32_t id = in_.ConsumeIntegral<uint32_t>();
    for (uint32_t i = 0; i < ring::kRecordTokens; ++i) r.ids[i] = id + i;
    PutRecord(pos, r);
  }

  // Input bytes over records (from a position PickPosition gives) or completions (anywhere).
  void WriteRawBytes() {
    const bool records = in_.ConsumeBool();
    const size_t begin = records ? ring::RecordsOffset() : ring::CompletionsOffset(cap());
    const size_t slot_bytes = records ? sizeof(ring::Record) : sizeof(ring::Completion);
    const size_t region = size_t{cap()} * slot_bytes;
    const size_t off = records ? size_t{PickPosition() & (cap() - 1)} * slot_bytes +
                                     in_.ConsumeIntegralInRange<size_t>(0, slot_bytes - 1)
                               : in_.ConsumeIntegralInRange<size_t>(0, region - 1);
    const std::string bytes = in_.ConsumeBytesAsString(
        in_.ConsumeIntegralInRange<size_t>(1, std::min<size_t>(256, region - off)));
    if (bytes.empty()) return;  // the input ran out
    for (size_t s = off / slot_bytes; s <= (off + bytes.size() - 1) / slot_bytes; ++s) {
      NoteSlotWrite(static_cast<uint32_t>(s));
    }
    std::memcpy(s_.ring.memory.data() + begin + off, bytes.data(), bytes.size());
  }

  // Any 32-bit word of the 4 KiB header (the words the daemon wrote once, the padding, the
  // message), with any value or one near the daemon's head.
  void WriteHeaderWord() {
    const size_t off = 4 * in_.ConsumeIntegralInRange<size_t>(0, ring::kHeaderBytes / 4 - 1);
    StoreWord(off, in_.ConsumeBool() ? in_.ConsumeIntegral<uint32_t>()
                                     : head_ + in_.ConsumeIntegralInRange<uint32_t>(0, cap() + 1));
  }

  // The words the daemon and the client exchange (but the tail: PickTail), with any value or
  // one that means something to them: a CPU (with the pipelined bit or not), a count, a code.
  void WriteNamedWord() {
    static constexpr size_t kWords[] = {
        offsetof(ring::Header, cpu), offsetof(ring::Header, polling), offsetof(ring::Header, done),
        offsetof(ring::Header, drained_on), offsetof(ring::Header, broken)};
    const size_t off = in_.PickValueInArray(kWords);
    uint32_t value = in_.ConsumeBool()
                         ? in_.ConsumeIntegral<uint32_t>()
                         : in_.PickValueInArray<uint32_t>({0, 1, 2, 9, CpuHint(), TailWord(), head_,
                                                           CPU_SETSIZE, CPU_SETSIZE + 1, ~0u});
    if (in_.ConsumeBool()) value |= ring::kCpuPipelined;
    StoreWord(off, value);
  }

  // Stores one header word as the other process would (an atomic store: the daemon may read
  // it now), keeping the bookkeeping of the tail and of the broken word.
  void StoreWord(size_t off, uint32_t value) {
    if (off == offsetof(ring::Header, tail)) {
      StoreTail(value);
      return;
    }
    if (off >= offsetof(ring::Header, broken) &&
        off < offsetof(ring::Header, broken_message) + ring::kMessageBytes) {
      broken_written_ = true;
    }
    __atomic_store_n(reinterpret_cast<uint32_t*>(s_.ring.memory.data() + off), value,
                     __ATOMIC_RELAXED);
  }

  // A doorbell of any value (its count may be full: the write then fails, as it would).
  void Doorbell() {
    WriteDoorbell(s_.ring, in_.ConsumeBool() ? 1
                                             : in_.PickValueInArray<uint64_t>(
                                                   {0, 2, ~uint64_t{0} - 1, ~uint64_t{0}}));
  }

  // What a real client does: well-formed records for some of its sequences (each within its
  // tail by the model), its CPU hint, the tail, the doorbell; sometimes a wait. A ring full as
  // far as the fuzzer knows is waited for first, as a client waits for its completions.
  void Commit() {
    Harvest();
    if (Ahead() >= Limit()) Settle();
    const uint32_t first = TailWord(), ahead = Ahead();
    const uint32_t free = ahead < Limit() ? Limit() - ahead : 0;
    uint32_t n = 0;
    for (uint64_t seq : seqs_) {
      if (n == free || !in_.ConsumeBool() || tokens_[seq] >= kAttackerTokens) continue;
      const uint32_t room = kTile - static_cast<uint32_t>(tokens_[seq] % kTile);
      const uint32_t k =
          in_.ConsumeIntegralInRange<uint32_t>(1, std::min(room, ring::kRecordTokens));
      PutRecord(first + n++, Rec(seq, Ids(tokens_[seq], k)));
    }
    if (n == 0) return;
    StoreWord(offsetof(ring::Header, cpu),
              in_.ConsumeBool() ? CpuHint() : CpuHint() | ring::kCpuPipelined);
    StoreTail(first + n);
    WriteDoorbell(s_.ring);
    if (in_.ConsumeBool()) Settle();
  }

  // Bits in its own staged K/V (fp16 rows): NaN, Inf, anything, or all zeros again.
  void ScribbleTailMemory() {
    if (in_.ConsumeIntegralInRange<int>(0, 3) == 0) {
      std::memset(tail_memory_.data(), 0, tail_memory_.size());
      return;
    }
    const size_t off = 2 * in_.ConsumeIntegralInRange<size_t>(0, tail_memory_.size() / 2 - 1);
    const uint16_t bits = in_.PickValueInArray<uint16_t>(
        {0x7e00, 0x7c00, 0xfc00, 0x7bff, in_.ConsumeIntegral<uint16_t>()});
    std::memcpy(tail_memory_.data() + off, &bits, sizeof(bits));
  }

  // The records the daemon took since the last wait, as it read them, and its answers.
  void CheckTaken() {
    for (uint32_t i = 0; i < Answered(); ++i) {
      const uint32_t pos = head_ + i;
      const auto& [r, c] = answered_[i];
      Check(c.position == pos, "completion of record ", pos, " says position ", c.position);
      Check(c.call == 0, "record ", pos, ": a call error (", c.code, ") while the session lives");
      Check(c.message_bytes <= ring::kMessageBytes, "a message of ", c.message_bytes, " bytes");
      const auto own = tokens_.find(r.sequence);
      if (c.code == 0) {
        ++g.accepted;
        Check(r.tokens >= 1 && r.tokens <= ring::kRecordTokens, "record ", pos, " of ", r.tokens,
              " tokens accepted");
        Check(own != tokens_.end(), "record ", pos, " for sequence ", r.sequence,
              ", not the attacker's, accepted");
        own->second += r.tokens;
        Check(c.tokens == own->second, "record ", pos, ": the completion says ", c.tokens,
              " tokens, the model ", own->second);
        continue;
      }
      ++g.refused;
      if (r.tokens > ring::kRecordTokens) {
        Check(c.code == static_cast<int>(Code::kInvalidArgument), "record ", pos, " of ", r.tokens,
              " tokens refused with code ", c.code);
      } else if (r.tokens >= 1 && own == tokens_.end()) {
        Check(c.code == static_cast<int>(Code::kNotFound), "record ", pos, " for sequence ",
              r.sequence, ", not the attacker's, refused with code ", c.code);
      }
    }
  }

  // Records the fuzzer cannot tell apart from its own writes: no count fell, none grew by more
  // than the records taken could carry; the core's counts become the model.
  void AdoptTaken() {
    ++g.unverified_stretches;
    g.unverified += Answered();
    uint64_t grown = 0;
    for (auto& [seq, tokens] : tokens_) {
      const uint64_t now = s_.Tokens(h_, seq);
      Check(now >= tokens, "attacker sequence ", seq, " fell from ", tokens, " to ", now,
            " tokens");
      grown += now - tokens;
      tokens = now;
    }
    Check(grown <= uint64_t{Answered()} * ring::kRecordTokens, "attacker sequences grew by ", grown,
          " tokens from ", Answered(), " records");
  }

  // The daemon closed the ring: only a tail out of bounds can do that while the session lives.
  // It says so in the header (unless the attacker wrote over that since the last wait; it may
  // have written it before, and the daemon stores both after the count this fuzzer watches:
  // wait for the daemon's own).
  void CheckBreak() {
    broken_ = true;
    ++g.broken;
    if (broken_written_) return;
    Check(Await(&h()->done,
                [&] {
                  return h()->broken.load(std::memory_order_acquire) ==
                             static_cast<uint32_t>(Code::kFailedPrecondition) &&
                         BrokenMessage(*h()).find("past the daemon's head") !=
                             absl::string_view::npos;
                }),
          "a ring broken by its tail does not say so within 10 s: code ", h()->broken.load(),
          ", message \"", BrokenMessage(*h()), "\"");
  }

  ServiceHarness& h_;
  FuzzedDataProvider& in_;
  Victim& victim_;
  const uint64_t base_commits_, base_broken_;  // the daemon's counts before this input
  const uint32_t slots_;
  FdMapping tail_memory_;  // the session's staged K/V, writable as the client's
  Session s_;
  std::vector<uint64_t> seqs_;
  std::map<uint64_t, uint64_t> tokens_;  // sequence -> the model's count
  // What the fuzzer knows of the daemon's view of this ring. head_: the daemon's head at the
  // last wait. reach_: how far past head_ the tails stored since went (a tail behind head_
  // takes nothing: the daemon's next look breaks the ring). answered_: the records the daemon
  // took since, each as it read it with its completion, captured before the attacker wrote
  // over their slots (Harvest). racy_: the attacker wrote the slot of a record the daemon may
  // have been copying or answering right then, or published so far that the daemon may take
  // a slot twice: what the ring holds no longer says what the daemon read. broken_: the
  // daemon closed the ring. broken_written_: the attacker wrote the `broken` word or message
  // since the last wait.
  uint32_t head_ = 0;
  uint32_t reach_ = 0;
  std::vector<std::pair<ring::Record, ring::Completion>> answered_;
  bool racy_ = false;
  bool broken_ = false;
  bool broken_written_ = false;
};

// One input: both sessions opened, the steps, each followed by the checks, a last wait, and
// both sessions closed, after which nothing of the input may be left.
void RunInput(ServiceHarness& h, FuzzedDataProvider& in) {
  ++g.inputs;
  CommitRingServer& rings = *h.rings();
  Check(rings.rings() == 0, "rings of an earlier input are still served");
  Victim victim(h, in);
  Attacker attacker(h, in, victim, rings.commits(), rings.broken());
  Check(rings.rings() == 2, "two sessions, ", rings.rings(), " rings");
  for (int step = 0; step < kMaxSteps && in.remaining_bytes() > 0; ++step) {
    const int op = in.ConsumeIntegralInRange<int>(0, 15);
    if (op <= 10) {
      attacker.Write(op);
    } else if (op == 11) {
      attacker.Settle();
    } else if (op <= 13) {
      victim.RingCommit();
    } else if (op == 14) {
      victim.RpcCommit();
    } else {
      attacker.Rpcs();
    }
    ++g.steps;
    if (absl::Status inv = h.core().CheckInvariants(); !inv.ok()) {
      Fail(absl::StrCat("invariants after op ", op, ": ", inv.ToString()));
    }
    victim.CheckModel(op);
    attacker.CheckModel(op);
  }
  attacker.Settle();  // every record published is answered, and checked
  for (const Session* s : {&attacker.session(), &victim.session()}) {
    const grpc::Status st = h.CloseSession(s->ref);
    Check(st.ok(), "CloseSession: ", st.error_message());
  }
  // The drain thread drops the rings of ended sessions after its next round: wake it.
  Check(WriteDoorbell(victim.session().ring), "the victim's doorbell failed");
  Check(Await(nullptr, [&] { return rings.rings() == 0; }),
        "the rings of closed sessions were not dropped within 10 s");
  auto stats = h.core().Stats(std::nullopt);
  Check(stats.ok(), "Stats failed");
  Check(stats->sessions == 0 && stats->sequences == 0 && stats->tail_slots_reserved == 0,
        "left after the input: ", stats->sessions, " sessions, ", stats->sequences, " sequences, ",
        stats->tail_slots_reserved, " tail slots");
  Check(stats->quant_active + stats->sink_active == 0,
        "blocks still referenced after the input: ", stats->quant_active, " quantized, ",
        stats->sink_active, " sink");
  if (absl::Status inv = h.core().CheckInvariants(); !inv.ok()) Fail(inv.ToString());
}

}  // namespace kvarn::testing::ring_fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  kvarn::testing::ring_fuzz::RunInput(kvarn::testing::ring_fuzz::Daemon(), in);
  return 0;
}
