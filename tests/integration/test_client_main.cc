// kvarn_test_client: a separate client process the integration tests spawn, so that a
// client can really die (SIGKILL), hang (SIGSTOP) or map the pool from another address
// space. It talks to the test over stdio: it prints `KEY k=v ...` lines on stdout and waits
// for lines on stdin where the scenario needs a synchronization point.
//
//   kvarn_test_client share --target=T --tenant=X --first=F --len=N [--append]
//       Opens a session, creates a sequence with prompt tokens F..F+N-1 (printing the cached
//       tokens and the block table), appends the uncached rest when --append, then prints a
//       digest of every block of its table read in place, then READY; exits at stdin EOF.
//   kvarn_test_client hold --target=T --tenant=X --first=F --bases=B --tiles=K --forks=R
//       B sequences of one sink tile and K quantized tiles each, every one forked into R
//       sequences in all: prints READY refs=<quantized block references held>; then waits
//       (to be killed).
//   kvarn_test_client hung --target=T --tenant=X --first=F
//       One sequence of a sink tile, one quantized tile and 10 tail tokens; prints READY;
//       waits for GO on stdin (the test stops and resumes it meanwhile),
//       then tries every call on its old sequence and session, printing RESULT op=.. code=..,
//       scribbles over its tail slot, and prints DONE.
//   kvarn_test_client ringloop --target=T --tenant=X --seqs=N
//       N sequences committing one token each per step through the session's commit ring,
//       forever (to be killed mid-commit); prints READY, then STEP n=<steps done> every 16
//       steps.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/lib/client.h"
#include "client/lib/commit_ring.h"
#include "tests/integration/child_flags.h"
#include "tests/integration/harness.h"
#include "tests/integration/kv_data.h"

namespace kvarn::it {
namespace {

int Fail(const std::string& what, const absl::Status& s) {
  Say(absl::StrCat("ERROR ", what, " code=", static_cast<int>(s.code()), " msg=\"", s.message(), "\""));
  return 1;
}

void WaitForStdinLine(const std::string& want) {
  std::string line;
  while (std::getline(std::cin, line)) {
    if (want.empty() || line == want) return;
  }
}

std::string TableText(const SequenceTable& t) {
  std::string s = absl::StrCat("tokens=", t.tokens, " has_sink=", t.has_sink ? 1 : 0, " sink=", t.sink_block,
                               " tail_slot=", t.tail_slot, " tail_tokens=", t.tail_tokens, " quant=");
  for (size_t i = 0; i < t.quant_blocks.size(); ++i) absl::StrAppend(&s, i ? "," : "", t.quant_blocks[i]);
  if (t.quant_blocks.empty()) s += "-";
  return s;
}

int Share(Session& session, const ChildFlags& f) {
  const uint32_t first = static_cast<uint32_t>(FlagU64(f, "first", 0));
  const size_t len = FlagU64(f, "len", 0);
  const std::vector<uint32_t> prompt = Tokens(first, len);
  auto seq = session.CreateSequence(prompt);
  if (!seq.ok()) return Fail("CreateSequence", seq.status());
  Say(absl::StrCat("CREATED seq=", seq->id, " cached=", seq->cached_tokens, " ", TableText(seq->table)));
  SequenceTable table = seq->table;
  if (f.count("append")) {
    auto t = AppendTokens(session, seq->id, prompt, seq->cached_tokens, len);
    if (!t.ok()) return Fail("Append", t.status());
    table = *t;
    Say(absl::StrCat("APPENDED ", TableText(table)));
  }
  if (table.has_sink) Say(absl::StrCat("SINK id=", table.sink_block, " raw=", Hex64(DigestSinkBlock(session, table.sink_block))));
  for (size_t i = 0; i < table.quant_blocks.size(); ++i) {
    auto d = DigestQuantBlock(session, table.quant_blocks[i]);
    if (!d.ok()) return Fail("DequantizeBlock", d.status());
    Say(absl::StrCat("QUANT idx=", i, " id=", table.quant_blocks[i], " raw=", Hex64(d->raw), " deq=", Hex64(d->dequantized)));
  }
  Say(absl::StrCat("READY session=", session.id()));
  WaitForStdinLine("");
  return 0;
}

int Hold(Session& session, const ChildFlags& f) {
  const uint32_t first = static_cast<uint32_t>(FlagU64(f, "first", 0));
  const uint64_t bases = FlagU64(f, "bases", 1), tiles = FlagU64(f, "tiles", 1), forks = FlagU64(f, "forks", 1);
  uint64_t refs = 0, seqs = 0, sink_refs = 0;
  for (uint64_t b = 0; b < bases; ++b) {
    const std::vector<uint32_t> prompt = Tokens(first + static_cast<uint32_t>(b) * 1000000u, (1 + tiles) * kTile);
    auto seq = session.CreateSequence(prompt);
    if (!seq.ok()) return Fail("CreateSequence", seq.status());
    auto t = AppendTokens(session, seq->id, prompt, seq->cached_tokens, prompt.size(), /*mixed=*/true);
    if (!t.ok()) return Fail("Append", t.status());
    refs += t->quant_blocks.size();
    sink_refs += t->has_sink;
    ++seqs;
    for (uint64_t r = 1; r < forks; ++r) {
      auto child = session.Fork(seq->id);
      if (!child.ok()) return Fail("Fork", child.status());
      refs += child->table.quant_blocks.size();
      sink_refs += child->table.has_sink;
      ++seqs;
    }
  }
  Say(absl::StrCat("READY session=", session.id(), " refs=", refs, " sink_refs=", sink_refs, " seqs=", seqs,
                   " distinct=", bases * tiles));
  WaitForStdinLine("");
  return 0;
}

int Hung(Session& session, const ChildFlags& f) {
  const uint32_t first = static_cast<uint32_t>(FlagU64(f, "first", 0));
  const std::vector<uint32_t> prompt = Tokens(first, 2 * kTile + 10);
  auto seq = session.CreateSequence(prompt);
  if (!seq.ok()) return Fail("CreateSequence", seq.status());
  auto t = AppendTokens(session, seq->id, prompt, 0, prompt.size());
  if (!t.ok()) return Fail("Append", t.status());
  Say(absl::StrCat("READY session=", session.id(), " seq=", seq->id, " ", TableText(*t)));
  WaitForStdinLine("GO");
  const auto report = [](const std::string& op, const absl::Status& s) {
    Say(absl::StrCat("RESULT op=", op, " code=", static_cast<int>(s.code())));
  };
  const std::vector<uint32_t> more = Tokens(first + 1000, 4);
  const KvData kv = MakeKv(more, SmallLayout(), 7);
  // Stage only writes this process's own mapping of its ended session's tail, which the
  // daemon has let go of; the commit must fail.
  const absl::Status staged = session.Stage(seq->id, 4, kv.keys.data(), kv.values.data(), DType::kF16);
  Say(absl::StrCat("LOCAL op=Stage code=", static_cast<int>(staged.code())));
  report("Commit", session.Commit(seq->id, more).status());
  report("AppendInline", session.AppendInline(seq->id, more, kv.keys.data(), kv.values.data(), DType::kF16).status());
  std::vector<float> k, v;
  report("Read", session.Read(seq->id, 0, 0, 1, &k, &v));
  report("Fork", session.Fork(seq->id).status());
  const uint64_t ids[] = {seq->id};
  report("Release", session.Release(ids));
  report("CreateSequence", session.CreateSequence(prompt).status());
  report("Lookup", session.Lookup(prompt).status());
  report("Stats", session.Stats().status());
  report("ListSequences", session.ListSequences().status());
  report("Evict", session.Evict(v1::EvictRequest::SCOPE_TENANT).status());
  // A rogue worker writing its whole tail slot after its lease ended.
  if (auto slot = session.TailSlot(seq->id); slot.ok()) {
    std::memset(slot->first, 0x5A, session.block_layout().fp16_block_bytes());
    Say("SCRIBBLED");
  }
  // The keep-alive thread finds the lease gone within a keep-alive interval or two.
  for (int i = 0; i < 300 && session.alive(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  Say(absl::StrCat("DONE alive=", session.alive() ? 1 : 0));
  WaitForStdinLine("");
  return 0;
}

int RingLoop(Session& session, const ChildFlags& f) {
  const int n = static_cast<int>(FlagU64(f, "seqs", 8));
  auto ring = session.OpenCommitRing();
  if (!ring.ok()) return Fail("OpenCommitRing", ring.status());
  std::vector<uint64_t> seqs;
  for (int i = 0; i < n; ++i) {
    auto q = session.CreateSequence({});
    if (!q.ok()) return Fail("CreateSequence", q.status());
    seqs.push_back(q->id);
  }
  Say("READY");
  std::vector<std::pair<uint64_t, std::vector<uint32_t>>> items;
  for (uint64_t q : seqs) items.push_back({q, {0}});
  for (uint32_t step = 0;; ++step) {
    const std::vector<uint32_t> ids = {step};
    const KvData kv = MakeKv(ids, SmallLayout(), getpid());
    for (auto& [q, tok] : items) {
      if (absl::Status st = session.Stage(q, 1, kv.keys.data(), kv.values.data(), DType::kF16); !st.ok()) return Fail("Stage", st);
      tok[0] = step;
    }
    auto r = (*ring)->Commit(items);
    if (!r.ok()) return Fail("Commit", r.status());
    for (const auto& it : *r) {
      if (!it.ok()) return Fail("Commit item", it.status());
    }
    if (step % 16 == 15) Say(absl::StrCat("STEP n=", step + 1));
  }
}

int Main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: kvarn_test_client share|hold|hung --target=... --tenant=...\n");
    return 2;
  }
  const std::string mode = argv[1];
  const ChildFlags f = ParseChildFlags(argc, argv, 2);
  ClientOptions co;
  co.rpc_timeout = absl::Seconds(20);
  auto client = Client::Connect(Flag(f, "target"), co, absl::Seconds(10));
  if (!client.ok()) return Fail("Connect", client.status());
  SessionOptions so;
  so.tenant = Flag(f, "tenant", "tenant-a");
  so.tenant_token = Flag(f, "token");
  so.layout = SmallLayout();
  so.max_sequences = static_cast<uint32_t>(FlagU64(f, "max_sequences", 0));
  so.client_name = absl::StrCat("kvarn_test_client-", mode, "-", getpid());
  auto session = (*client)->OpenSession(so);
  if (!session.ok()) return Fail("OpenSession", session.status());
  Say(absl::StrCat("OPEN session=", (*session)->id(), " pid=", getpid(), " epoch=", (*session)->epoch()));
  if (mode == "share") return Share(**session, f);
  if (mode == "hold") return Hold(**session, f);
  if (mode == "hung") return Hung(**session, f);
  if (mode == "ringloop") return RingLoop(**session, f);
  Say("ERROR unknown mode");
  return 2;
}

}  // namespace
}  // namespace kvarn::it

int main(int argc, char** argv) { return kvarn::it::Main(argc, argv); }
