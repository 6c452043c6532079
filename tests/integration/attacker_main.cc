// kvarn_attacker: a second process on the daemon's machine playing the adversary of
// RELIABILITY.md promise 7. Each mode tries one family of attacks with everything a process
// of its uid can reach and reports every attempt as a line the test checks:
//   ATTACK name=<what> result=refused|SUCCEEDED detail=<errno or status code>
//   RESULT op=<rpc> id=<session> code=<grpc code>
//   SUMMARY ...
//
//   kvarn_attacker probe --target=T --session=S --epoch=E [--secret=HEX]
//       Every session RPC (and the descriptor channel) for session ids S-8..S+8, presenting
//       a zero secret, or HEX (a wrong or a leaked one).
//   kvarn_attacker keepalive --target=T --session=S --epoch=E
//       KeepAlive streams naming session S without its secret, a new one every 20 ms, until
//       stdin closes (playing a client that keeps a dead session's lease alive).
//   kvarn_attacker memory --target=T --tenant=X [--token=Y] --daemon-pid=P
//                         [--victim-session=S --victim-epoch=E --victim-secret=HEX]
//       Opens a session of its own, takes its segments, and tries to write the sealed
//       (quantized, sink) ones by every path; tries the daemon's /proc entries, ptrace and
//       process_vm_writev; with a leaked victim secret, tries to take the victim's tail from
//       the descriptor channel.
//   kvarn_attacker impersonate --target=T --tenant=X --token=Y
//       OpenSession as another tenant with a guessed token.
//   kvarn_attacker hoard --target=T --tenant=X [--token=Y] --slots=N
//       Sessions of N tail slots until refused; holds them until stdin closes.
//   kvarn_attacker ring --target=T --tenant=X [--token=Y]
//                       [--victim-session=S --victim-epoch=E --victim-secret=HEX]
//       Opens a mapped session of its own (4 sequences) and its commit ring; with a leaked
//       victim secret, tries to take the victim's ring. Prints READY, then until stdin closes
//       scribbles random bytes over its records, completions and tail slots, sets its CPU hint
//       to any CPU or junk, publishes whole rings of them (a quarter naming its own sequences)
//       and spams the doorbell; at stdin
//       EOF it moves its tail out of bounds and reports RINGSUMMARY rounds=.. doorbells=..
//       completed=.. broken=<the code the daemon closed the ring with>.
//       With --trickle, it instead keeps its tail one record ahead of `done` (a record the
//       ring refuses, then the doorbell, each time `done` catches up), so that the daemon's
//       drain thread nearly always finds it with more records; rounds= counts its records.
//   kvarn_attacker watchers --target=T --tenant=X [--token=Y] --n=N
//       N Watch streams on one session; reports how many the daemon refused; holds the rest
//       until stdin closes.
#include <errno.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/lib/client.h"
#include "client/lib/commit_ring.h"
#include "client/lib/descriptor_client.h"
#include "common/commit_ring.h"
#include "tests/integration/child_flags.h"
#include "tests/integration/harness.h"

namespace kvarn::it {
namespace {

std::string Unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

void WaitForStdinEof() {
  std::string line;
  while (std::getline(std::cin, line)) {
  }
}

// One attempt that must fail: `ok` says whether the system let it through.
int g_succeeded = 0, g_refused = 0;
void Attack(const std::string& name, bool ok, const std::string& detail) {
  (ok ? g_succeeded : g_refused)++;
  Say(absl::StrCat("ATTACK name=", name, " result=", ok ? "SUCCEEDED" : "refused", " detail=", detail));
}
std::string Errno() { return absl::StrCat("errno_", errno, "_", strerror(errno)); }

v1::SessionRef Ref(uint64_t id, uint64_t epoch, const std::string& secret) {
  v1::SessionRef r;
  r.set_session_id(id);
  r.set_epoch(epoch);
  r.set_secret(secret);
  return r;
}

std::unique_ptr<grpc::ClientContext> Ctx() {
  auto c = std::make_unique<grpc::ClientContext>();
  c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return c;
}

// Every RPC that names a session, with `ref`. Returns how many were accepted.
int ProbeSession(v1::KvCache::Stub& stub, const v1::SessionRef& ref, const std::string& socket) {
  int accepted = 0;
  const auto report = [&](const char* op, const grpc::Status& s) {
    accepted += s.ok();
    Say(absl::StrCat("RESULT op=", op, " id=", ref.session_id(), " code=", static_cast<int>(s.error_code())));
  };
  {
    v1::ListSequencesRequest r;
    *r.mutable_session() = ref;
    v1::ListSequencesResponse o;
    report("ListSequences", stub.ListSequences(Ctx().get(), r, &o));
  }
  {
    v1::StatsRequest r;
    *r.mutable_session() = ref;
    v1::StatsResponse o;
    report("Stats", stub.Stats(Ctx().get(), r, &o));
  }
  {
    v1::LookupRequest r;
    *r.mutable_session() = ref;
    for (uint32_t t = 0; t < 200; ++t) r.add_prompt_tokens(t);
    v1::LookupResponse o;
    report("Lookup", stub.Lookup(Ctx().get(), r, &o));
  }
  for (uint64_t seq = 1; seq <= 4; ++seq) {
    {
      v1::ReadRequest r;
      *r.mutable_session() = ref;
      r.set_sequence_id(seq);
      r.set_count(1);
      v1::ReadResponse o;
      report("Read", stub.Read(Ctx().get(), r, &o));
    }
    {
      v1::AppendRequest r;
      *r.mutable_session() = ref;
      r.set_sequence_id(seq);
      r.add_token_ids(1);
      v1::AppendResponse o;
      report("Append", stub.Append(Ctx().get(), r, &o));
    }
    {
      v1::ForkRequest r;
      *r.mutable_session() = ref;
      r.set_sequence_id(seq);
      v1::ForkResponse o;
      report("Fork", stub.Fork(Ctx().get(), r, &o));
    }
    {
      v1::ReleaseRequest r;
      *r.mutable_session() = ref;
      r.add_sequence_ids(seq);
      v1::ReleaseResponse o;
      report("Release", stub.Release(Ctx().get(), r, &o));
    }
  }
  {
    v1::AppendBatchRequest r;
    *r.mutable_session() = ref;
    r.add_items()->set_sequence_id(1);
    v1::AppendBatchResponse o;
    report("AppendBatch", stub.AppendBatch(Ctx().get(), r, &o));
  }
  {
    v1::CreateSequenceRequest r;
    *r.mutable_session() = ref;
    v1::CreateSequenceResponse o;
    report("CreateSequence", stub.CreateSequence(Ctx().get(), r, &o));
  }
  {
    v1::EvictRequest r;
    *r.mutable_session() = ref;
    r.set_scope(v1::EvictRequest::SCOPE_TENANT);
    v1::EvictResponse o;
    report("Evict", stub.Evict(Ctx().get(), r, &o));
  }
  {
    v1::WatchRequest r;
    *r.mutable_session() = ref;
    // A refused Watch ends at once with its code; a granted one runs into the deadline.
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
    auto reader = stub.Watch(&ctx, r);
    v1::BlockEvent e;
    bool got_event = false;
    while (reader->Read(&e)) got_event = true;
    const grpc::Status s = reader->Finish();
    const bool granted = got_event || s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    report("Watch", granted ? grpc::Status::OK : s);
  }
  {
    auto ctx = Ctx();
    auto stream = stub.KeepAlive(ctx.get());
    v1::KeepAliveRequest r;
    *r.mutable_session() = ref;
    v1::KeepAliveResponse o;
    const bool answered = stream->Write(r) && stream->Read(&o);
    stream->WritesDone();
    const grpc::Status s = stream->Finish();
    report("KeepAlive", answered ? grpc::Status::OK : s);
  }
  {
    auto lent = FetchSessionMemory(socket + ".fd", ref);
    accepted += lent.ok();
    Say(absl::StrCat("RESULT op=Descriptors id=", ref.session_id(), " code=", static_cast<int>(lent.status().code())));
  }
  {
    v1::CloseSessionRequest r;
    *r.mutable_session() = ref;
    v1::CloseSessionResponse o;
    report("CloseSession", stub.CloseSession(Ctx().get(), r, &o));
  }
  return accepted;
}

int Probe(Client& client, const ChildFlags& f) {
  const uint64_t session = FlagU64(f, "session"), epoch = FlagU64(f, "epoch");
  const std::string secret = f.count("secret") ? Unhex(Flag(f, "secret")) : std::string(32, '\0');
  int accepted = 0, total = 0;
  for (uint64_t id = session > 8 ? session - 8 : 1; id <= session + 8; ++id) {
    accepted += ProbeSession(client.stub(), Ref(id, epoch, secret), client.socket_path());
    ++total;
  }
  Say(absl::StrCat("SUMMARY sessions_probed=", total, " accepted=", accepted));
  return 0;
}

int KeepAlive(Client& client, const ChildFlags& f) {
  const v1::SessionRef ref = Ref(FlagU64(f, "session"), FlagU64(f, "epoch"), std::string(32, '\0'));
  std::atomic<bool> stop{false};
  std::atomic<int> attempts{0}, answered{0};
  std::thread t([&] {
    while (!stop.load()) {
      auto ctx = Ctx();
      auto stream = client.stub().KeepAlive(ctx.get());
      v1::KeepAliveRequest r;
      *r.mutable_session() = ref;
      v1::KeepAliveResponse o;
      ++attempts;
      if (stream->Write(r) && stream->Read(&o)) ++answered;
      stream->WritesDone();
      stream->Finish();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  Say("STARTED");
  WaitForStdinEof();
  stop.store(true);
  t.join();
  Say(absl::StrCat("SUMMARY attempts=", attempts.load(), " answered=", answered.load()));
  return 0;
}

std::unique_ptr<Session> OpenOwn(Client& client, const ChildFlags& f, uint32_t slots) {
  auto d = client.Describe();
  if (!d.ok()) return nullptr;
  SessionOptions o;
  o.tenant = Flag(f, "tenant", "mallory");
  o.tenant_token = Flag(f, "token");
  o.layout = Client::LayoutOf(*d);
  o.max_sequences = slots;
  o.client_name = "kvarn_attacker";
  auto s = client.OpenSession(o);
  if (!s.ok()) {
    Say(absl::StrCat("ERROR OpenSession code=", static_cast<int>(s.status().code()), " msg=\"", s.status().message(), "\""));
    return nullptr;
  }
  return std::move(*s);
}

// Tries every way to write a segment the daemon sealed read-only.
void AttackSealed(const std::string& what, int fd, size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  Attack(what + "_mmap_shared_writable", p != MAP_FAILED, p == MAP_FAILED ? Errno() : "mapped");
  if (p != MAP_FAILED) munmap(p, bytes);
  // Reopen through /proc: a new open file description, read-write if the inode allows.
  const int again = open(absl::StrCat("/proc/self/fd/", fd).c_str(), O_RDWR);
  if (again >= 0) {
    void* q = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, again, 0);
    Attack(what + "_reopened_rw_mmap_shared_writable", q != MAP_FAILED, q == MAP_FAILED ? Errno() : "mapped");
    if (q != MAP_FAILED) munmap(q, bytes);
    const char byte = 0x5A;
    const ssize_t w = pwrite(again, &byte, 1, 0);
    Attack(what + "_reopened_rw_pwrite", w == 1, w == 1 ? "wrote" : Errno());
    close(again);
  } else {
    Attack(what + "_reopen_rw", false, Errno());
  }
  const char byte = 0x5A;
  const ssize_t w = pwrite(fd, &byte, 1, 0);
  Attack(what + "_pwrite", w == 1, w == 1 ? "wrote" : Errno());
  Attack(what + "_ftruncate_shrink", ftruncate(fd, 4096) == 0, Errno());
  Attack(what + "_ftruncate_grow", ftruncate(fd, static_cast<off_t>(bytes) * 2) == 0, Errno());
  Attack(what + "_punch_hole", fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096) == 0, Errno());
  Attack(what + "_remove_seals", fcntl(fd, F_ADD_SEALS, 0) == 0 && (fcntl(fd, F_GET_SEALS) & F_SEAL_FUTURE_WRITE) == 0, Errno());
  void* ro = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (ro != MAP_FAILED) {
    Attack(what + "_mprotect_writable", mprotect(ro, bytes, PROT_READ | PROT_WRITE) == 0, Errno());
    munmap(ro, bytes);
  }
  // A private copy-on-write mapping is allowed and harmless: it changes only this process's pages.
}

int Memory(Client& client, const ChildFlags& f) {
  std::unique_ptr<Session> own = OpenOwn(client, f, 1);
  if (own == nullptr) return 1;
  auto lent = FetchSessionMemory(client.socket_path() + ".fd", own->Ref());
  if (!lent.ok()) {
    Say(absl::StrCat("ERROR descriptors code=", static_cast<int>(lent.status().code())));
    return 1;
  }
  for (LentSegments::Segment& seg : lent->segments) {
    if (seg.entry.kind() == v1::DescriptorReply::Entry::KIND_QUANT) AttackSealed("quant", seg.fd.get(), seg.entry.bytes());
    if (seg.entry.kind() == v1::DescriptorReply::Entry::KIND_SINK) AttackSealed("sink", seg.fd.get(), seg.entry.bytes());
  }
  // The daemon's own descriptors, memory and address space.
  const pid_t daemon = static_cast<pid_t>(FlagU64(f, "daemon-pid"));
  if (daemon > 0) {
    const int dir = open(absl::StrCat("/proc/", daemon, "/fd").c_str(), O_RDONLY | O_DIRECTORY);
    Attack("daemon_proc_fd_list", dir >= 0, dir >= 0 ? "listed" : Errno());
    if (dir >= 0) close(dir);
    bool opened = false;
    std::string detail = "none";
    for (int n = 0; n < 64; ++n) {
      const int fd = open(absl::StrCat("/proc/", daemon, "/fd/", n).c_str(), O_RDWR);
      if (fd >= 0) {
        opened = true;
        detail = absl::StrCat("fd_", n);
        close(fd);
        break;
      }
      if (n == 0) detail = Errno();
    }
    Attack("daemon_proc_fd_open_rw", opened, detail);
    const int mem = open(absl::StrCat("/proc/", daemon, "/mem").c_str(), O_RDWR);
    Attack("daemon_proc_mem_open", mem >= 0, mem >= 0 ? "opened" : Errno());
    if (mem >= 0) close(mem);
    const int maps = open(absl::StrCat("/proc/", daemon, "/map_files").c_str(), O_RDONLY | O_DIRECTORY);
    Attack("daemon_map_files", maps >= 0, maps >= 0 ? "listed" : Errno());
    if (maps >= 0) close(maps);
    const long attached = ptrace(PTRACE_ATTACH, daemon, nullptr, nullptr);
    Attack("daemon_ptrace_attach", attached == 0, attached == 0 ? "attached" : Errno());
    if (attached == 0) {
      waitpid(daemon, nullptr, 0);
      ptrace(PTRACE_DETACH, daemon, nullptr, nullptr);
    }
    char byte = 0;
    iovec local{&byte, 1}, remote{reinterpret_cast<void*>(0x400000), 1};
    const ssize_t w = process_vm_writev(daemon, &local, 1, &remote, 1, 0);
    Attack("daemon_process_vm_writev", w == 1, w == 1 ? "wrote" : Errno());
    const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, daemon, 0));
    if (pidfd >= 0) {
      bool got = false;
      std::string why = "none";
      for (int n = 0; n < 64 && !got; ++n) {
        const int fd = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, n, 0));
        if (fd >= 0) {
          got = true;
          close(fd);
          why = absl::StrCat("fd_", n);
        } else if (n == 0) {
          why = Errno();
        }
      }
      Attack("daemon_pidfd_getfd", got, why);
      close(pidfd);
    }
  }
  // Another session's tail through the descriptor channel, with its id and a leaked secret.
  if (f.count("victim-session")) {
    const v1::SessionRef victim = Ref(FlagU64(f, "victim-session"), FlagU64(f, "victim-epoch"), Unhex(Flag(f, "victim-secret")));
    auto taken = FetchSessionMemory(client.socket_path() + ".fd", victim);
    Attack("victim_tail_by_descriptor_channel", taken.ok(), absl::StrCat("code_", static_cast<int>(taken.status().code())));
  }
  Say(absl::StrCat("SUMMARY succeeded=", g_succeeded, " refused=", g_refused));
  WaitForStdinEof();
  return 0;
}

int Impersonate(Client& client, const ChildFlags& f) {
  auto d = client.Describe();
  if (!d.ok()) return 1;
  SessionOptions o;
  o.tenant = Flag(f, "tenant");
  o.tenant_token = Flag(f, "token");
  o.layout = Client::LayoutOf(*d);
  auto s = client.OpenSession(o);
  Say(absl::StrCat("RESULT op=OpenSession code=", static_cast<int>(s.status().code())));
  return 0;
}

int Hoard(Client& client, const ChildFlags& f) {
  const uint32_t slots = static_cast<uint32_t>(FlagU64(f, "slots", 8));
  std::vector<std::unique_ptr<Session>> held;
  absl::Status last;
  for (int i = 0; i < 10000; ++i) {
    auto d = client.Describe();
    if (!d.ok()) return 1;
    SessionOptions o;
    o.tenant = Flag(f, "tenant");
    o.tenant_token = Flag(f, "token");
    o.layout = Client::LayoutOf(*d);
    o.max_sequences = slots;
    auto s = client.OpenSession(o);
    if (!s.ok()) {
      last = s.status();
      break;
    }
    held.push_back(std::move(*s));
  }
  Say(absl::StrCat("HOARD sessions=", held.size(), " slots=", held.size() * slots, " code=", static_cast<int>(last.code()),
                   " msg=\"", last.message(), "\""));
  WaitForStdinEof();
  return 0;
}

int Watchers(Client& client, const ChildFlags& f) {
  std::unique_ptr<Session> own = OpenOwn(client, f, 1);
  if (own == nullptr) return 1;
  const int n = static_cast<int>(FlagU64(f, "n", 100));
  grpc::CompletionQueue cq;
  struct Stream {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientAsyncReader<v1::BlockEvent>> reader;
    grpc::Status status;
  };
  std::vector<std::unique_ptr<Stream>> streams(n);
  v1::WatchRequest req;
  *req.mutable_session() = own->Ref();
  for (int i = 0; i < n; ++i) {
    streams[i] = std::make_unique<Stream>();
    streams[i]->reader = client.stub().AsyncWatch(&streams[i]->ctx, req, &cq, reinterpret_cast<void*>(static_cast<intptr_t>(2 * i)));
  }
  // Each stream: its start completes, then Finish is queued; refused ones finish soon.
  int started = 0, refused = 0, other = 0;
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(30);
  while (started < n) {
    void* tag;
    bool ok;
    if (cq.AsyncNext(&tag, &ok, deadline) != grpc::CompletionQueue::GOT_EVENT) break;
    const intptr_t t = reinterpret_cast<intptr_t>(tag);
    if (t % 2 == 0) {
      ++started;
      Stream& s = *streams[t / 2];
      s.reader->Finish(&s.status, reinterpret_cast<void*>(t + 1));
    } else {
      const grpc::Status& st = streams[(t - 1) / 2]->status;
      st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ? ++refused : ++other;
    }
  }
  // Refusals arrive promptly; wait until the count stops growing for a second.
  for (;;) {
    void* tag;
    bool ok;
    const auto r = cq.AsyncNext(&tag, &ok, std::chrono::system_clock::now() + std::chrono::seconds(1));
    if (r != grpc::CompletionQueue::GOT_EVENT) break;
    const intptr_t t = reinterpret_cast<intptr_t>(tag);
    if (t % 2 == 1) {
      const grpc::Status& st = streams[(t - 1) / 2]->status;
      st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ? ++refused : ++other;
    }
  }
  Say(absl::StrCat("WATCHERS asked=", n, " refused=", refused, " ended_otherwise=", other, " open=", n - refused - other));
  WaitForStdinEof();
  for (auto& s : streams) s->ctx.TryCancel();
  for (;;) {
    void* tag;
    bool ok;
    if (cq.AsyncNext(&tag, &ok, std::chrono::system_clock::now() + std::chrono::seconds(5)) != grpc::CompletionQueue::GOT_EVENT) break;
  }
  cq.Shutdown();
  return 0;
}

int Ring(const ChildFlags& f) {
  ClientOptions co;
  co.rpc_timeout = absl::Seconds(20);
  auto mapped = Client::Connect(Flag(f, "target"), co, absl::Seconds(10));
  if (!mapped.ok()) return 1;
  std::unique_ptr<Session> own = OpenOwn(**mapped, f, 4);
  if (own == nullptr) return 1;
  if (f.count("victim-session") != 0) {
    v1::SessionRef victim;
    victim.set_session_id(FlagU64(f, "victim-session"));
    victim.set_epoch(FlagU64(f, "victim-epoch"));
    victim.set_secret(Unhex(Flag(f, "victim-secret")));
    auto r = FetchCommitRing((*mapped)->socket_path() + ".fd", victim);
    Attack("victim_commit_ring", r.ok(), absl::StrCat("code_", static_cast<int>(r.status().code())));
  }
  std::vector<uint64_t> seqs;
  for (int i = 0; i < 4; ++i) seqs.push_back(own->CreateSequence({})->id);
  auto ring = own->OpenCommitRing();
  if (!ring.ok()) {
    Say(absl::StrCat("ERROR OpenCommitRing code=", static_cast<int>(ring.status().code())));
    return 1;
  }
  auto* h = reinterpret_cast<ring::Header*>((*ring)->raw_memory());
  const uint32_t cap = (*ring)->capacity();
  auto* records = reinterpret_cast<ring::Record*>((*ring)->raw_memory() + ring::RecordsOffset());
  uint8_t* completions = (*ring)->raw_memory() + ring::CompletionsOffset(cap);
  uint8_t* tail = own->TailSlot(seqs[0]).value().first;
  const size_t tail_bytes = own->block_layout().fp16_block_bytes() * 4;
  std::atomic<bool> stop{false};
  std::thread eof([&] {
    WaitForStdinEof();
    stop.store(true);
  });
  Say(absl::StrCat("READY capacity=", cap));
  std::mt19937_64 rng(getpid());
  uint64_t rounds = 0, doorbells = 0;
  const uint64_t one = 1;
  const auto bell = [&] {
    if (write((*ring)->doorbell_fd(), &one, sizeof(one)) == sizeof(one)) ++doorbells;
  };
  const bool trickle = f.count("trickle") != 0;
  if (trickle) h->cpu.store(0, std::memory_order_relaxed);  // a plain client: never watched
  while (trickle && !stop.load(std::memory_order_relaxed) && h->broken.load() == 0) {
    // As fast as the drain thread: the next record right after `done` reaches the tail, before
    // Drain's last look at it.
    const uint32_t t = h->tail.load(std::memory_order_relaxed);
    if (h->done.load(std::memory_order_acquire) != t) {
      ring::CpuRelax();
      continue;
    }
    ring::Record junk{};
    junk.sequence = seqs[0];
    junk.tokens = ring::kRecordTokens + 1;  // refused by the ring alone
    records[t & (cap - 1)] = junk;
    h->tail.store(t + 1, std::memory_order_release);
    bell();
    ++rounds;
  }
  while (!trickle && !stop.load()) {
    for (uint32_t i = 0; i < cap; ++i) {
      auto* w = reinterpret_cast<uint64_t*>(&records[i]);
      for (size_t k = 0; k < sizeof(ring::Record) / 8; ++k) w[k] = rng();
      if (i % 4 == 0) {
        records[i].sequence = seqs[rng() % seqs.size()];
        records[i].tokens = static_cast<uint32_t>(rng() % (ring::kRecordTokens + 2));
      }
    }
    for (size_t k = 0; k < cap * sizeof(ring::Completion); k += 8) reinterpret_cast<uint64_t*>(completions + k)[0] = rng();
    for (int k = 0; k < 64; ++k) reinterpret_cast<uint64_t*>(tail)[rng() % (tail_bytes / 8)] = rng();
    // A whole ring of garbage once the daemon has taken the last one (within bounds: the
    // ring stays open, so the daemon keeps reading what this process writes).
    const uint32_t done = h->done.load(std::memory_order_acquire);
    // The CPU hint: any CPU (moving the daemon's drain thread for this ring's batches) or junk.
    h->cpu.store(rng() % 4 == 0 ? static_cast<uint32_t>(rng()) : static_cast<uint32_t>(rng() % 8), std::memory_order_relaxed);
    h->tail.store(done + cap, std::memory_order_release);
    for (int k = 0; k < 50; ++k) bell();
    for (int spin = 0; spin < 100000 && h->done.load() != done + cap && h->broken.load() == 0; ++spin) bell();
    ++rounds;
    if (h->broken.load() != 0) break;
  }
  const uint64_t completed = h->done.load();
  h->tail.store(h->done.load() + cap + 1, std::memory_order_release);
  bell();
  for (int i = 0; i < 5000 && h->broken.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  Say(absl::StrCat("RINGSUMMARY rounds=", rounds, " doorbells=", doorbells, " completed=", completed,
                   " broken=", h->broken.load()));
  eof.join();
  return 0;
}

int Main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: kvarn_attacker probe|keepalive|memory|impersonate|hoard|watchers --target=...\n");
    return 2;
  }
  const std::string mode = argv[1];
  const ChildFlags f = ParseChildFlags(argc, argv, 2);
  ClientOptions co;
  co.rpc_timeout = absl::Seconds(20);
  co.map_pool = false;  // the attacker takes its segments by hand
  auto client = Client::Connect(Flag(f, "target"), co, absl::Seconds(10));
  if (!client.ok()) {
    Say(absl::StrCat("ERROR Connect ", client.status().message()));
    return 1;
  }
  Say(absl::StrCat("OPEN pid=", getpid(), " uid=", getuid()));
  if (mode == "probe") return Probe(**client, f);
  if (mode == "keepalive") return KeepAlive(**client, f);
  if (mode == "memory") return Memory(**client, f);
  if (mode == "impersonate") return Impersonate(**client, f);
  if (mode == "hoard") return Hoard(**client, f);
  if (mode == "watchers") return Watchers(**client, f);
  if (mode == "ring") return Ring(f);
  Say("ERROR unknown mode");
  return 2;
}

}  // namespace
}  // namespace kvarn::it

int main(int argc, char** argv) { return kvarn::it::Main(argc, argv); }
