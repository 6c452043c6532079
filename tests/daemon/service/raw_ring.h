// Test helpers for the commit ring server (daemon/service/commit_ring_server.h): a ring as a
// client process holds it, written by hand (records, the doorbell, completions), and a
// session of a ServiceHarness whose memory and ring this process took.
#ifndef KVARN_TESTS_DAEMON_SERVICE_RAW_RING_H_
#define KVARN_TESTS_DAEMON_SERVICE_RAW_RING_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/lib/descriptor_client.h"
#include "common/commit_ring.h"
#include "common/shared_memory.h"
#include "tests/daemon/service/service_harness.h"

namespace kvarn::testing {

// A ring as a client process holds it, written by hand.
struct RawRing {
  FdMapping memory;
  UniqueFd doorbell;
  uint32_t capacity = 0;

  ring::Header* h() const { return reinterpret_cast<ring::Header*>(memory.data()); }
  ring::Record* record(uint32_t pos) const {
    return reinterpret_cast<ring::Record*>(memory.data() + ring::RecordsOffset()) +
           (pos & (capacity - 1));
  }
  const ring::Completion* completion(uint32_t pos) const {
    return reinterpret_cast<const ring::Completion*>(memory.data() +
                                                     ring::CompletionsOffset(capacity)) +
           (pos & (capacity - 1));
  }
  void Ring() const {
    const uint64_t one = 1;
    ASSERT_EQ(write(doorbell.get(), &one, sizeof(one)), 8);
  }
  // Publishes `records` after what the daemon completed, rings, and waits (with a deadline)
  // for their completions; an empty result when they did not come.
  std::vector<ring::Completion> Commit(const std::vector<ring::Record>& records) const {
    const uint32_t first = h()->done.load();
    for (size_t i = 0; i < records.size(); ++i)
      *record(first + static_cast<uint32_t>(i)) = records[i];
    const uint32_t target = first + static_cast<uint32_t>(records.size());
    h()->tail.store(target, std::memory_order_release);
    Ring();
    if (!WaitFor([&] { return h()->done.load(std::memory_order_acquire) == target; })) return {};
    std::vector<ring::Completion> out;
    for (uint32_t p = first; p != target; ++p) out.push_back(*completion(p));
    return out;
  }
};

// The ring lent for `ref` on the descriptor channel at `socket`, mapped as the client holds it.
inline absl::StatusOr<RawRing> TakeRing(const std::string& socket, const v1::SessionRef& ref) {
  auto lent = FetchCommitRing(socket, ref);
  if (!lent.ok()) return lent.status();
  RawRing r;
  for (auto& seg : lent->segments) {
    if (seg.entry.kind() == v1::DescriptorReply::Entry::KIND_COMMIT_RING) {
      r.capacity = seg.entry.ring_records();
      auto m = FdMapping::Map(std::move(seg.fd), seg.entry.bytes(), true);
      if (!m.ok()) return m.status();
      r.memory = std::move(*m);
    } else if (seg.entry.kind() == v1::DescriptorReply::Entry::KIND_DOORBELL) {
      r.doorbell = std::move(seg.fd);
    }
  }
  if (r.capacity == 0 || !r.doorbell.valid()) return absl::InternalError("no ring in the reply");
  return r;
}

inline ring::Record Rec(uint64_t seq, const std::vector<uint32_t>& ids) {
  ring::Record r{};
  r.sequence = seq;
  r.tokens = static_cast<uint32_t>(ids.size());
  std::copy(ids.begin(), ids.end(), r.ids);
  return r;
}

inline std::string Message(const ring::Completion& c) {
  return std::string(c.message, c.message_bytes);
}

// A session (2 tail slots) whose memory and ring this process took, and one sequence of it.
struct Mapped {
  v1::SessionRef ref;
  RawRing ring;
  uint64_t seq = 0;
};

inline absl::StatusOr<Mapped> OpenMapped(ServiceHarness& h, const std::string& tenant) {
  Mapped m;
  m.ref = ServiceHarness::RefOf(h.Open(tenant, 2));
  auto mem = FetchSessionMemory(h.descriptor_socket(), m.ref);
  if (!mem.ok()) return mem.status();
  auto r = TakeRing(h.descriptor_socket(), m.ref);
  if (!r.ok()) return r.status();
  m.ring = std::move(*r);
  m.seq = h.CreateSequence(m.ref);
  if (m.seq == 0) return absl::InternalError("CreateSequence failed");
  return m;
}

// Commits token `id` to m's sequence with the doorbell, under CPU hint `hint`; the
// completion's code, -1 when none came.
inline int CommitOne(const Mapped& m, uint32_t hint, uint32_t id) {
  m.ring.h()->cpu.store(hint);
  const auto got = m.ring.Commit({Rec(m.seq, {id})});
  return got.size() == 1 ? got[0].code : -1;
}

// Publishes `r` at the ring's next position without ringing the doorbell; the position.
inline uint32_t PublishQuietly(const RawRing& ring, const ring::Record& r) {
  const uint32_t pos = ring.h()->tail.load();
  *ring.record(pos) = r;
  ring.h()->tail.store(pos + 1, std::memory_order_release);
  return pos;
}

// Publishes token `id` to m's sequence without the doorbell and waits (with a deadline) for
// it to be committed as the sequence's `id`th token.
inline ::testing::AssertionResult CommitQuietly(const Mapped& m, uint32_t id) {
  const uint32_t pos = PublishQuietly(m.ring, Rec(m.seq, {id}));
  if (!WaitFor([&] { return m.ring.h()->done.load() == pos + 1; })) {
    return ::testing::AssertionFailure()
           << "record " << pos << " (token " << id << ", no doorbell) was never drained";
  }
  const ring::Completion& c = *m.ring.completion(pos);
  if (c.code != 0 || c.tokens != id) {
    return ::testing::AssertionFailure() << "token " << id << ": code " << c.code << " ("
                                         << Message(c) << "), " << c.tokens << " tokens";
  }
  return ::testing::AssertionSuccess();
}

inline bool Polling(const Mapped& m) { return m.ring.h()->polling.load() != 0; }

}  // namespace kvarn::testing

#endif  // KVARN_TESTS_DAEMON_SERVICE_RAW_RING_H_
