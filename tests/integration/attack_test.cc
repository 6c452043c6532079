// An attacker in a second process on the daemon's machine (kvarn_attacker), of the daemon's
// own uid (when the tests run as root, daemon and attacker both run as nobody), against
// legitimate clients that must keep every promise of RELIABILITY.md: ids without the secret,
// a wrong or leaked secret, a foreign KeepAlive, a self-declared tenant, writes to every
// segment it can reach by every path, hoarding tail slots and Watch streams, a second daemon
// on the socket, and TCP without (or with the wrong) TLS.
#include <openssl/sha.h>
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <fstream>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_split.h"
#include "tests/integration/fixture.h"

namespace kvarn::it {
namespace {

using Code = absl::StatusCode;

std::string Sha256Hex(const std::string& token) {
  unsigned char h[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), h);
  return absl::BytesToHexString(std::string(reinterpret_cast<char*>(h), sizeof(h)));
}

constexpr char kVictimToken[] = "victim-token-7f3a";
constexpr char kMalloryToken[] = "mallory-token-0c1d";

class AttackTest : public IntegrationTest {
 protected:
  // A kvarnd running as the unprivileged user (when we are root), with `flags`.
  Daemon* StartAs(std::vector<std::string> flags) {
    flags.push_back(absl::StrCat("--admin_token=", kAdminToken));
    DaemonOptions o;
    o.extra_flags = std::move(flags);
    o.run_as = UnprivilegedUser();
    auto d = Daemon::Start(o);
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return nullptr;
    daemons_.push_back(std::move(*d));
    return daemons_.back().get();
  }

  // A tenants file the daemon's user owns, mode 0600: victim, mallory (small quotas), ops.
  std::string TenantsFile() {
    const std::string path = files_.path() + "/tenants";
    std::ofstream f(path);
    f << "# tenants of the attack tests\n"
      << "victim " << "token_sha256=" << Sha256Hex(kVictimToken) << " sessions=16 tail_slots=32\n"
      << "mallory token_sha256=" << Sha256Hex(kMalloryToken) << " sessions=4 tail_slots=8 watchers=8 cache=256KiB\n"
      << "ops token_sha256=" << Sha256Hex("ops-token") << "\n";
    f.close();
    chmod(path.c_str(), 0600);
    if (auto u = UnprivilegedUser()) {
      EXPECT_EQ(chown(path.c_str(), u->uid, u->gid), 0);
      EXPECT_EQ(chown(files_.path().c_str(), u->uid, u->gid), 0);
    }
    return path;
  }

  absl::StatusOr<std::unique_ptr<Session>> OpenAs(Client& c, const std::string& tenant, const std::string& token,
                                                  uint32_t slots = 2, bool admin = false) {
    SessionOptions o;
    o.tenant = tenant;
    o.tenant_token = token;
    o.layout = SmallLayout();
    o.max_sequences = slots;
    o.admin_token = admin ? kAdminToken : "";
    o.client_name = "legitimate";
    return c.OpenSession(o);
  }

  Child* Attacker(const std::vector<std::string>& args) {
    auto c = Child::Spawn(AttackerBinary(), args, UnprivilegedUser());
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return nullptr;
    child_pids_.push_back((*c)->pid());
    children_.push_back(std::move(*c));
    return children_.back().get();
  }

  // Reads the attacker's lines up to the one starting with `last`; returns all of them.
  std::vector<std::string> LinesUntil(Child* c, const std::string& last) {
    std::vector<std::string> lines;
    for (;;) {
      auto line = c->ReadLine(std::chrono::seconds(60));
      EXPECT_TRUE(line.ok()) << line.status() << "\n" << c->transcript();
      if (!line.ok()) break;
      lines.push_back(*line);
      if (line->rfind(last, 0) == 0) break;
    }
    return lines;
  }

  // A victim sequence with a sink, two quantized tiles and a partial tail, and its digests.
  struct Victim {
    uint64_t seq = 0;
    SequenceTable table;
    uint64_t sink_digest = 0;
    std::vector<uint64_t> quant_digests;
    uint64_t tail_digest = 0;
    std::vector<float> keys, values;
  };
  Victim MakeVictim(Session& s, uint32_t first) {
    Victim v;
    const std::vector<uint32_t> prompt = Tokens(first, 3 * kTile + 9);
    auto q = s.CreateSequence(prompt);
    EXPECT_TRUE(q.ok()) << q.status();
    if (!q.ok()) return v;
    v.seq = q->id;
    auto t = AppendTokens(s, q->id, prompt, 0, prompt.size());
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) return v;
    v.table = *t;
    Digest(s, &v);
    EXPECT_TRUE(s.Read(v.seq, 1, 0, static_cast<uint32_t>(prompt.size()), &v.keys, &v.values).ok());
    return v;
  }
  void Digest(const Session& s, Victim* v) {
    const BlockLayout& bl = s.block_layout();
    v->sink_digest = DigestSinkBlock(s, v->table.sink_block);
    v->quant_digests.clear();
    for (uint32_t b : v->table.quant_blocks) v->quant_digests.push_back(Fnv64(s.QuantBlock(b), bl.quant_block_bytes()));
    auto slot = s.TailSlot(v->seq);
    v->tail_digest = slot.ok() ? Fnv64(slot->first, bl.fp16_block_bytes()) : 0;
  }
  // The victim's sequence is exactly as it was: table, bytes in place, Read.
  void ExpectIntact(Session& s, const Victim& before) {
    auto t = s.Table(before.seq);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->tokens, before.table.tokens);
    EXPECT_EQ(t->quant_blocks, before.table.quant_blocks);
    Victim now = before;
    Digest(s, &now);
    EXPECT_EQ(now.sink_digest, before.sink_digest) << "the victim's sink block changed";
    EXPECT_EQ(now.quant_digests, before.quant_digests) << "a victim's quantized block changed";
    EXPECT_EQ(now.tail_digest, before.tail_digest) << "the victim's tail changed";
    std::vector<float> k, v;
    ASSERT_TRUE(s.Read(before.seq, 1, 0, static_cast<uint32_t>(before.table.tokens), &k, &v).ok());
    EXPECT_EQ(k, before.keys);
    EXPECT_EQ(v, before.values);
    EXPECT_TRUE(s.alive());
  }

  TempDir files_;
};

TEST_F(AttackTest, IdsWithoutTheSecretAndWrongSecretsGrantNothing) {
  Daemon* d = StartAs({});
  ASSERT_NE(d, nullptr);
  auto client = Connect(*d);
  ASSERT_NE(client, nullptr);
  IT_ASSIGN_OR_FAIL(victim, OpenAs(*client, "victim", ""));
  const Victim before = MakeVictim(*victim, 1000);
  // A zero secret, then a wrong one of the right length, on every id around the victim's.
  for (const std::string& secret :
       {std::string(), absl::BytesToHexString(std::string(32, '\x5a'))}) {
    std::vector<std::string> args = {"probe", "--target=" + d->target(), absl::StrCat("--session=", victim->id()),
                                     absl::StrCat("--epoch=", victim->epoch())};
    if (!secret.empty()) args.push_back("--secret=" + secret);
    Child* a = Attacker(args);
    ASSERT_NE(a, nullptr);
    const std::vector<std::string> lines = LinesUntil(a, "SUMMARY");
    int results = 0;
    for (const std::string& line : lines) {
      if (line.rfind("RESULT", 0) != 0) continue;
      ++results;
      EXPECT_EQ(ParseFields(line)["code"], absl::StrCat(static_cast<int>(Code::kNotFound))) << line;
    }
    ASSERT_FALSE(lines.empty());
    const auto summary = ParseFields(lines.back());
    EXPECT_GE(FieldU64(summary, "sessions_probed"), 9u);
    EXPECT_EQ(static_cast<uint64_t>(results), FieldU64(summary, "sessions_probed") * 26) << a->transcript();  // 26 calls per id
    EXPECT_EQ(summary.at("accepted"), "0") << lines.back();
  }
  ExpectIntact(*victim, before);
  IT_ASSIGN_OR_FAIL(st, victim->Stats());
  EXPECT_EQ(st.sessions(), 1u) << "the probes closed or opened something";
}

TEST_F(AttackTest, AForeignKeepAliveCannotHoldADeadClientsLease) {
  Daemon* d = StartAs({"--grace_ms=300", "--lease_ttl_ms=2000", "--keepalive_ms=100"});
  ASSERT_NE(d, nullptr);
  auto client = Connect(*d);
  ASSERT_NE(client, nullptr);
  IT_ASSIGN_OR_FAIL(admin, Open(*client, "ops", 1, /*admin=*/true, "observer"));
  Child* holder = SpawnClient({"hold", "--target=" + d->target(), "--tenant=victim", "--first=5000", "--bases=1",
                               "--tiles=2", "--forks=1"});
  ASSERT_NE(holder, nullptr);
  IT_ASSIGN_OR_FAIL(ready, holder->WaitFor("READY", std::chrono::seconds(20)));
  const uint64_t victim_session = FieldU64(ParseFields(ready), "session");
  Child* a = Attacker({"keepalive", "--target=" + d->target(), absl::StrCat("--session=", victim_session),
                       absl::StrCat("--epoch=", d->epoch())});
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(a->WaitFor("STARTED", std::chrono::seconds(20)).ok());
  ASSERT_TRUE(holder->Signal(SIGKILL));
  // The victim's session must end on its own lease rules while the attacker keeps streaming.
  bool gone = false;
  for (const double t0 = NowMs(); !gone && NowMs() - t0 < 20000;) {
    IT_ASSIGN_OR_FAIL(st, admin->Stats());
    gone = true;
    for (const auto& si : st.session_info()) gone &= si.session_id() != victim_session;
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(gone) << "a foreign KeepAlive held the dead client's session";
  a->CloseStdin();
  IT_ASSIGN_OR_FAIL(summary, a->WaitFor("SUMMARY", std::chrono::seconds(20)));
  const auto f = ParseFields(summary);
  EXPECT_GT(FieldU64(f, "attempts"), 0u);
  EXPECT_EQ(FieldU64(f, "answered"), 0u) << "the daemon answered a KeepAlive without the secret";
}

TEST_F(AttackTest, SelfDeclaredTenantsAreRefusedAndSeeNoOnesPrefixes) {
  Daemon* d = StartAs({"--tenants_file=" + TenantsFile()});
  ASSERT_NE(d, nullptr);
  auto client = Connect(*d);
  ASSERT_NE(client, nullptr);
  IT_ASSIGN_OR_FAIL(describe, client->Describe());
  EXPECT_TRUE(describe.tenants_authenticated());
  IT_ASSIGN_OR_FAIL(victim, OpenAs(*client, "victim", kVictimToken));
  const Victim before = MakeVictim(*victim, 2000);
  const struct {
    const char* tenant;
    const char* token;
  } tries[] = {{"victim", "guess"}, {"victim", ""}, {"victim", kMalloryToken}, {"nobody-here", kVictimToken}, {"mallory", ""}};
  for (const auto& t : tries) {
    Child* a = Attacker({"impersonate", "--target=" + d->target(), std::string("--tenant=") + t.tenant,
                         std::string("--token=") + t.token});
    ASSERT_NE(a, nullptr);
    IT_ASSIGN_OR_FAIL(line, a->WaitFor("RESULT", std::chrono::seconds(20)));
    EXPECT_EQ(ParseFields(line)["code"], absl::StrCat(static_cast<int>(Code::kUnauthenticated))) << t.tenant << "/" << t.token;
  }
  // Mallory with her own credential: the victim's prompt is not a hit for her.
  IT_ASSIGN_OR_FAIL(mallory, OpenAs(*client, "mallory", kMalloryToken));
  IT_ASSIGN_OR_FAIL(hit, mallory->Lookup(Tokens(2000, 3 * kTile + 9)));
  EXPECT_EQ(hit, 0u);
  IT_ASSIGN_OR_FAIL(own, victim->Lookup(Tokens(2000, 3 * kTile + 9)));
  EXPECT_EQ(own, 3u * kTile);
  EXPECT_EQ(mallory->Evict(v1::EvictRequest::SCOPE_TENANT, 0, "victim").status().code(), Code::kPermissionDenied);
  ExpectIntact(*victim, before);
}

TEST_F(AttackTest, SealedSegmentsTheDaemonAndOtherTailsCannotBeWritten) {
  Daemon* d = StartAs({});
  ASSERT_NE(d, nullptr);
  auto client = Connect(*d);
  ASSERT_NE(client, nullptr);
  IT_ASSIGN_OR_FAIL(victim, OpenAs(*client, "victim", ""));
  const Victim before = MakeVictim(*victim, 3000);
  // Even a leaked secret does not take the victim's tail: its memory went to this process.
  Child* a = Attacker({"memory", "--target=" + d->target(), "--tenant=mallory", absl::StrCat("--daemon-pid=", d->pid()),
                       absl::StrCat("--victim-session=", victim->id()), absl::StrCat("--victim-epoch=", victim->epoch()),
                       "--victim-secret=" + absl::BytesToHexString(victim->Ref().secret())});
  ASSERT_NE(a, nullptr);
  const std::vector<std::string> lines = LinesUntil(a, "SUMMARY");
  int attacks = 0;
  for (const std::string& line : lines) {
    if (line.rfind("ATTACK", 0) != 0) continue;
    ++attacks;
    EXPECT_EQ(ParseFields(line)["result"], "refused") << line;
  }
  EXPECT_GE(attacks, 2 * 8 + 7) << a->transcript();  // 8-9 per sealed segment, 7-8 on the daemon and the victim's tail
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(ParseFields(lines.back())["succeeded"], "0") << a->transcript();
  ExpectIntact(*victim, before);
  // The daemon kept serving the victim.
  std::vector<uint32_t> more = Tokens(3000 + 3 * kTile + 9, 5);
  IT_ASSERT_OK(AppendTokens(*victim, before.seq, more, 0, more.size(), /*mixed=*/false).status());
}

TEST_F(AttackTest, HoardingTailSlotsStopsAtTheQuotaAndOthersStillOpen) {
  Daemon* d = StartAs({"--tenants_file=" + TenantsFile()});
  ASSERT_NE(d, nullptr);
  Child* a = Attacker({"hoard", "--target=" + d->target(), "--tenant=mallory", std::string("--token=") + kMalloryToken,
                       "--slots=3"});
  ASSERT_NE(a, nullptr);
  IT_ASSIGN_OR_FAIL(line, a->WaitFor("HOARD", std::chrono::seconds(30)));
  auto f = ParseFields(line);
  EXPECT_EQ(FieldU64(f, "sessions"), 2u) << line;  // 2 x 3 = 6 <= 8 < 9
  EXPECT_EQ(f["code"], absl::StrCat(static_cast<int>(Code::kResourceExhausted))) << line;
  EXPECT_NE(line.find("tail_slots quota"), std::string::npos) << line;
  // The victim tenant still gets its share, while the hoarder holds its sessions.
  auto client = Connect(*d);
  ASSERT_NE(client, nullptr);
  std::vector<std::unique_ptr<Session>> victims;
  for (int i = 0; i < 4; ++i) {
    IT_ASSIGN_OR_FAIL(v, OpenAs(*client, "victim", kVictimToken, 8));
    victims.push_back(std::move(v));
  }
  const Victim before = MakeVictim(*victims[0], 4000);
  ExpectIntact(*victims[0], before);
  a->CloseStdin();
}

TEST_F(AttackTest, AThousandWatchersAreCappedAndLegitimateWatchersStillWork) {
  Daemon* d = StartAs({"--tenants_file=" + TenantsFile(), "--max_watchers=64"});
  ASSERT_NE(d, nullptr);
  Child* a = Attacker({"watchers", "--target=" + d->target(), "--tenant=mallory", std::string("--token=") + kMalloryToken,
                       "--n=1000"});
  ASSERT_NE(a, nullptr);
  IT_ASSIGN_OR_FAIL(line, a->WaitFor("WATCHERS", std::chrono::seconds(60)));
  auto f = ParseFields(line);
  EXPECT_EQ(FieldU64(f, "open"), 8u) << line;  // mallory's watchers quota
  EXPECT_EQ(FieldU64(f, "refused"), 992u) << line;
  // A legitimate watcher still sees its own tenant's events, and the daemon still serves.
  auto client = Connect(*d);
  ASSERT_NE(client, nullptr);
  IT_ASSIGN_OR_FAIL(victim, OpenAs(*client, "victim", kVictimToken));
  std::atomic<int> stored{0};
  std::thread watcher([&] {
    victim->Watch([&](const v1::BlockEvent& e) {
      if (e.kind() == v1::BlockEvent::KIND_STORED && e.tenant() == "victim") ++stored;
      return stored.load() < 3;
    }).IgnoreError();
  });
  // Seal tiles until the watcher has seen three of them (its stream may start after the first).
  bool seen = false;
  for (int i = 0; i < 50 && !seen; ++i) {
    const std::vector<uint32_t> p = Tokens(600000 + i * 1000, kTile + 1);
    IT_ASSIGN_OR_FAIL(q, victim->CreateSequence(p));
    IT_ASSERT_OK(AppendTokens(*victim, q.id, p, 0, kTile, false).status());
    const uint64_t ids[] = {q.id};
    IT_ASSERT_OK(victim->Release(ids));
    for (const double t0 = NowMs(); stored.load() < 3 && NowMs() - t0 < 200;) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    seen = stored.load() >= 3;
  }
  EXPECT_TRUE(seen) << "the legitimate Watch stream saw " << stored.load() << " events";
  if (!seen) {
    // End the session on the daemon so its Watch stream ends and the thread returns.
    v1::CloseSessionRequest req;
    *req.mutable_session() = victim->Ref();
    v1::CloseSessionResponse resp;
    grpc::ClientContext ctx;
    client->stub().CloseSession(&ctx, req, &resp);
  }
  watcher.join();
  a->CloseStdin();
}

TEST_F(AttackTest, ASecondDaemonOnALiveSocketExitsNonZeroAndTheFirstKeepsServing) {
  Daemon* d = StartAs({});
  ASSERT_NE(d, nullptr);
  const Layout l = SmallLayout();
  auto second = Child::Spawn(KvarndBinary(), {"--listen=" + d->socket_path(), "--metrics=", "--instance=intruder",
                                              absl::StrCat("--num_layers=", l.num_layers),
                                              absl::StrCat("--num_kv_heads=", l.num_kv_heads),
                                              absl::StrCat("--head_dim=", l.head_dim), "--preset=" + l.preset,
                                              absl::StrCat("--sink_tokens=", l.sink_tokens), "--capacity=16MiB"},
                             UnprivilegedUser());
  ASSERT_TRUE(second.ok()) << second.status();
  IT_ASSIGN_OR_FAIL(status, (*second)->Wait(std::chrono::seconds(20)));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << "second kvarnd status " << status;
  // The first one serves on: a new client connects, opens a session, maps its memory.
  auto client = Connect(*d);
  ASSERT_NE(client, nullptr);
  IT_ASSIGN_OR_FAIL(s, OpenAs(*client, "victim", ""));
  const Victim v = MakeVictim(*s, 5000);
  ExpectIntact(*s, v);
}

TEST_F(AttackTest, NonLoopbackTcpWithoutTlsIsRefusedUnlessExplicitlyAllowed) {
  const Layout l = SmallLayout();
  TempDir dir;
  const std::vector<std::string> base = {"--metrics=", absl::StrCat("--num_layers=", l.num_layers),
                                         absl::StrCat("--num_kv_heads=", l.num_kv_heads), absl::StrCat("--head_dim=", l.head_dim),
                                         "--preset=" + l.preset, absl::StrCat("--sink_tokens=", l.sink_tokens), "--capacity=16MiB"};
  std::vector<std::string> refused = base;
  refused.push_back("--listen=" + dir.path() + "/a.sock");
  refused.push_back("--tcp=0.0.0.0:0");
  IT_ASSIGN_OR_FAIL(r, RunWithInput(KvarndBinary(), refused, ""));
  EXPECT_TRUE(WIFEXITED(r.first) && WEXITSTATUS(r.first) != 0) << r.second;
  EXPECT_NE(r.second.find("not a loopback address and no TLS"), std::string::npos) << r.second;
  Daemon* d = StartDaemon({"--tcp=0.0.0.0:0", "--allow_insecure_tcp=true"});
  ASSERT_NE(d, nullptr);
  EXPECT_NE(d->Log().find("event=insecure_tcp"), std::string::npos) << d->Log();
}

// openssl req / x509 into `dir`: a CA, a server certificate for 127.0.0.1 and a client one.
absl::Status MakeCertificates(const std::string& dir) {
  const std::string cmd = absl::StrCat(
      "cd ", dir, " && ",
      "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=kvarn-test-ca -keyout ca.key -out ca.pem && ",
      "openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout server.key -out server.csr && ",
      "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > san.ext && ",
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile san.ext -out server.pem && ",
      "openssl req -newkey rsa:2048 -nodes -subj /CN=worker -keyout client.key -out client.csr && ",
      "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -out client.pem",
      " > openssl.log 2>&1");
  if (std::system(cmd.c_str()) != 0) return absl::InternalError(absl::StrCat("openssl failed (", dir, "/openssl.log)"));
  return absl::OkStatus();
}

std::string Slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST_F(AttackTest, MutualTlsServesOnlyClientsWithACertificateOfItsCa) {
  TempDir certs;
  IT_ASSERT_OK(MakeCertificates(certs.path()));
  const std::string p = certs.path() + "/";
  Daemon* d = StartDaemon({"--tcp=127.0.0.1:0", "--tls_cert=" + p + "server.pem", "--tls_key=" + p + "server.key",
                           "--tls_client_ca=" + p + "ca.pem"});
  ASSERT_NE(d, nullptr);
  ASSERT_GT(d->tcp_port(), 0);
  const std::string target = absl::StrCat("127.0.0.1:", d->tcp_port());
  ClientOptions good;
  good.tls = true;
  good.tls_root_certs = Slurp(p + "ca.pem");
  good.tls_cert_chain = Slurp(p + "client.pem");
  good.tls_private_key = Slurp(p + "client.key");
  IT_ASSIGN_OR_FAIL(remote, Client::Connect(target, good, absl::Seconds(10)));
  IT_ASSIGN_OR_FAIL(s, OpenAs(*remote, "remote", ""));
  EXPECT_FALSE(s->mapped()) << "a TCP client has no shared memory";
  const std::vector<uint32_t> ids = Tokens(1, 10);
  IT_ASSIGN_OR_FAIL(q, s->CreateSequence(ids));
  const KvData kv = MakeKv(ids, SmallLayout());
  EXPECT_EQ(s->Stage(q.id, 10, kv.keys.data(), kv.values.data(), DType::kF16).code(), Code::kFailedPrecondition);
  IT_ASSERT_OK(s->AppendInline(q.id, ids, kv.keys.data(), kv.values.data(), DType::kF16).status());
  std::vector<float> k, v;
  IT_ASSERT_OK(s->Read(q.id, 0, 0, 10, &k, &v));
  EXPECT_EQ(k.size(), 10u * SmallLayout().num_kv_heads * SmallLayout().head_dim);
  // No client certificate, or none at all: no connection.
  ClientOptions no_cert = good;
  no_cert.tls_cert_chain.clear();
  no_cert.tls_private_key.clear();
  EXPECT_FALSE(Client::Connect(target, no_cert, absl::Seconds(3)).ok());
  EXPECT_FALSE(Client::Connect(target, ClientOptions{}, absl::Seconds(3)).ok());
}

}  // namespace
}  // namespace kvarn::it
