// The descriptor channel (daemon/service/descriptor_server.h) with a real KvCore on the host
// backend: what it lends and how, what it refuses, and that bad or silent peers never stop
// it serving the next good request.
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "client/lib/descriptor_client.h"
#include "common/fd_passing.h"
#include "common/shared_memory.h"
#include "tests/daemon/service/service_harness.h"

namespace kvarn::testing {
namespace {

UniqueFd ConnectSeqpacket(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return fd;
  if (connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) return UniqueFd();
  return fd;
}

DescriptorServer::Options At(const std::string& path) {
  DescriptorServer::Options o;
  o.path = path;
  return o;
}

// Whether the read end of a pipe sees end-of-file within the deadline: every copy of its
// write end is closed.
bool PipeReachesEof(int read_end, absl::Duration timeout = absl::Seconds(10)) {
  pollfd p{read_end, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) != 1) return false;
  char c;
  return read(read_end, &c, 1) == 0;
}

class DescriptorServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServiceHarness::Options o;
    o.descriptors = true;
    o.descriptor_options.request_timeout = absl::Seconds(60);  // silent peers stay connected
    Start(o);
  }
  void TearDown() override {
    if (h_ != nullptr && h_->started()) {
      EXPECT_TRUE(h_->core().CheckInvariants().ok()) << h_->core().CheckInvariants();
    }
  }
  void Start(const ServiceHarness::Options& o) {
    h_.reset();
    h_ = std::make_unique<ServiceHarness>();
    const absl::Status s = h_->Start(o);
    ASSERT_TRUE(s.ok()) << s;
  }

  KvCore& core() { return h_->core(); }
  DescriptorServer& server() { return *h_->descriptors(); }

  struct Opened {
    v1::SessionRef ref;
    OpenResult open;
  };
  Opened Open(const std::string& tenant = "tenant-a", bool observer = false) {
    OpenParams p;
    p.tenant = tenant;
    p.layout = SmallModel();
    p.max_sequences = 2;
    p.observer = observer;
    auto r = core().OpenSession(p);
    EXPECT_TRUE(r.ok()) << r.status();
    Opened o;
    if (!r.ok()) return o;
    o.open = *r;
    o.ref.set_session_id(r->session);
    o.ref.set_epoch(core().epoch());
    o.ref.set_secret(std::string(r->secret.begin(), r->secret.end()));
    return o;
  }

  absl::StatusOr<LentSegments> Fetch(const v1::SessionRef& ref) {
    return FetchSessionMemory(h_->descriptor_socket(), ref, absl::Seconds(10));
  }

  // The daemon's answer to whatever was sent on `fd`: its code, or -1 when it closed the
  // connection without one.
  static int AnswerCode(int fd) {
    auto msg = ReceiveWithFds(fd, 64 * 1024, 8, absl::Seconds(10));
    if (!msg.ok()) return absl::IsUnavailable(msg.status()) ? -1 : -2;
    v1::DescriptorReply reply;
    if (!reply.ParseFromString(msg->bytes)) return -3;
    return reply.code();
  }

  // A good request still gets the session's memory.
  void ExpectStillServing() {
    const Opened o = Open("tenant-check");
    auto lent = Fetch(o.ref);
    EXPECT_TRUE(lent.ok()) << lent.status();
  }

  std::unique_ptr<ServiceHarness> h_;
};

TEST_F(DescriptorServerTest, LendsQuantAndSinkReadOnlyAndTheTailWritable) {
  const Opened o = Open();
  auto lent = Fetch(o.ref);
  ASSERT_TRUE(lent.ok()) << lent.status();
  ASSERT_EQ(lent->segments.size(), 3u);
  const auto& quant = lent->segments[0];
  const auto& sink = lent->segments[1];
  const auto& tail = lent->segments[2];
  EXPECT_EQ(quant.entry.kind(), v1::DescriptorReply::Entry::KIND_QUANT);
  EXPECT_EQ(sink.entry.kind(), v1::DescriptorReply::Entry::KIND_SINK);
  EXPECT_EQ(tail.entry.kind(), v1::DescriptorReply::Entry::KIND_TAIL);
  EXPECT_FALSE(quant.entry.writable());
  EXPECT_FALSE(sink.entry.writable());
  EXPECT_TRUE(tail.entry.writable());
  for (const auto& seg : lent->segments) {
    EXPECT_TRUE(seg.entry.has_fd());
    ASSERT_TRUE(seg.fd.valid());
    const int flags = fcntl(seg.fd.get(), F_GETFD);
    EXPECT_NE(flags & FD_CLOEXEC, 0) << "lent descriptors arrive close-on-exec";
  }
  EXPECT_EQ(quant.entry.bytes(), o.open.pool.quant_bytes);
  EXPECT_EQ(sink.entry.bytes(), o.open.pool.sink_bytes);
  EXPECT_EQ(tail.entry.bytes(), o.open.pool.tail_bytes);
  EXPECT_EQ(tail.entry.bytes(), 2 * core().layout().fp16_block_bytes());
  // Counted after the reply is sent, so possibly after the client has it.
  EXPECT_TRUE(WaitFor([&] { return server().lent() == 1; })) << server().lent();
}

TEST_F(DescriptorServerTest, TheQuantAndSinkSegmentsCannotBeMappedWritable) {
  const Opened o = Open();
  auto lent = Fetch(o.ref);
  ASSERT_TRUE(lent.ok()) << lent.status();
  ASSERT_EQ(lent->segments.size(), 3u);
  for (int i = 0; i < 2; ++i) {
    auto& seg = lent->segments[static_cast<size_t>(i)];
    UniqueFd copy(fcntl(seg.fd.get(), F_DUPFD_CLOEXEC, 0));
    auto writable = FdMapping::Map(std::move(copy), seg.entry.bytes(), /*writable=*/true);
    EXPECT_EQ(writable.status().code(), absl::StatusCode::kPermissionDenied) << writable.status();
    // Nor by write(2) or truncation on the descriptor itself.
    const char byte = 1;
    EXPECT_EQ(pwrite(seg.fd.get(), &byte, 1, 0), -1);
    EXPECT_NE(ftruncate(seg.fd.get(), 0), 0);
    auto readable = FdMapping::Map(std::move(seg.fd), seg.entry.bytes(), /*writable=*/false);
    EXPECT_TRUE(readable.ok()) << readable.status();
  }
  auto tail = FdMapping::Map(std::move(lent->segments[2].fd), lent->segments[2].entry.bytes(), /*writable=*/true);
  ASSERT_TRUE(tail.ok()) << tail.status();
  tail->data()[0] = 1;
}

TEST_F(DescriptorServerTest, TheLentSegmentsAreTheDaemonsOwnMemory) {
  const Opened o = Open();
  auto seq = core().CreateSequence(CoreRef(o.ref), {});
  ASSERT_TRUE(seq.ok()) << seq.status();
  auto lent = Fetch(o.ref);
  ASSERT_TRUE(lent.ok()) << lent.status();
  ASSERT_EQ(lent->segments.size(), 3u);
  auto sink = FdMapping::Map(std::move(lent->segments[1].fd), lent->segments[1].entry.bytes(), false);
  auto tail = FdMapping::Map(std::move(lent->segments[2].fd), lent->segments[2].entry.bytes(), true);
  ASSERT_TRUE(sink.ok()) << sink.status();
  ASSERT_TRUE(tail.ok()) << tail.status();
  const size_t slot_bytes = core().layout().fp16_block_bytes();
  uint8_t* slot = tail->data() + size_t{seq->table.tail_slot} * slot_bytes;

  // What the client writes into its tail is what the daemon checks at commit: fp16 NaNs are
  // refused...
  auto* halves = reinterpret_cast<uint16_t*>(slot);
  for (size_t i = 0; i < slot_bytes / 2; ++i) halves[i] = 0x7E00;
  auto refused = core().Append(CoreRef(o.ref), seq->sequence, TokenIds(1, 64));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  // ... finite values seal, and the sealed sink block reads back through the read-only
  // mapping byte for byte.
  for (size_t i = 0; i < slot_bytes / 2; ++i) halves[i] = static_cast<uint16_t>((i * 7) & 0x3BFF);
  auto sealed = core().Append(CoreRef(o.ref), seq->sequence, TokenIds(1, 64));
  ASSERT_TRUE(sealed.ok()) << sealed.status();
  ASSERT_TRUE(sealed->table.has_sink);
  const uint8_t* block = sink->data() + size_t{sealed->table.sink_block} * slot_bytes;
  EXPECT_EQ(std::memcmp(block, slot, slot_bytes), 0);
}

TEST_F(DescriptorServerTest, AnObserverSessionGetsNoTail) {
  const Opened o = Open("tenant-a", /*observer=*/true);
  auto lent = Fetch(o.ref);
  ASSERT_TRUE(lent.ok()) << lent.status();
  ASSERT_EQ(lent->segments.size(), 2u);
  EXPECT_EQ(lent->segments[0].entry.kind(), v1::DescriptorReply::Entry::KIND_QUANT);
  EXPECT_EQ(lent->segments[1].entry.kind(), v1::DescriptorReply::Entry::KIND_SINK);
}

TEST_F(DescriptorServerTest, AWrongSecretGetsNotFound) {
  const Opened o = Open();
  v1::SessionRef wrong = o.ref;
  std::string secret = wrong.secret();
  secret[0] = static_cast<char>(secret[0] ^ 0x80);
  wrong.set_secret(secret);
  EXPECT_EQ(Fetch(wrong).status().code(), absl::StatusCode::kNotFound);
  wrong.set_secret("");
  EXPECT_EQ(Fetch(wrong).status().code(), absl::StatusCode::kNotFound);
  v1::SessionRef unknown = o.ref;
  unknown.set_session_id(o.ref.session_id() + 77);
  EXPECT_EQ(Fetch(unknown).status().code(), absl::StatusCode::kNotFound);
  v1::SessionRef stale = o.ref;
  stale.set_epoch(o.ref.epoch() + 1);
  EXPECT_EQ(Fetch(stale).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(server().lent(), 0u);
  EXPECT_EQ(server().refused(), 4u);
  // The refusals did not bind the session to anyone: its owner still gets its memory.
  EXPECT_TRUE(Fetch(o.ref).ok());
}

TEST_F(DescriptorServerTest, AClosedSessionGetsNotFound) {
  const Opened o = Open();
  ASSERT_TRUE(core().CloseSession(CoreRef(o.ref)).ok());
  EXPECT_EQ(Fetch(o.ref).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(DescriptorServerTest, GarbageBytesAreRefusedAndTheServerKeepsServing) {
  for (const std::string& garbage : {std::string("\x0a\xff", 2), std::string("not a protobuf \xff\xff\xff"),
                                     std::string(1, '\0')}) {
    UniqueFd fd = ConnectSeqpacket(h_->descriptor_socket());
    ASSERT_TRUE(fd.valid());
    ASSERT_TRUE(SendWithFds(fd.get(), garbage, {}).ok());
    const int code = AnswerCode(fd.get());
    EXPECT_TRUE(code == static_cast<int>(absl::StatusCode::kInvalidArgument) || code == -1) << code;
  }
  // A message that parses (an unknown field) but names no session is refused too.
  {
    UniqueFd fd = ConnectSeqpacket(h_->descriptor_socket());
    ASSERT_TRUE(fd.valid());
    ASSERT_TRUE(SendWithFds(fd.get(), std::string("\x10\x01", 2), {}).ok());
    EXPECT_EQ(AnswerCode(fd.get()), static_cast<int>(absl::StatusCode::kInvalidArgument));
  }
  EXPECT_EQ(server().lent(), 0u);
  ExpectStillServing();
}

TEST_F(DescriptorServerTest, AnOversizeMessageIsRefusedAndTheServerKeepsServing) {
  const Opened o = Open();
  v1::DescriptorRequest req;
  *req.mutable_session() = o.ref;
  std::string bytes = req.SerializeAsString();
  bytes.resize(8192, '\0');  // a valid request padded past the 4 KiB limit
  UniqueFd fd = ConnectSeqpacket(h_->descriptor_socket());
  ASSERT_TRUE(fd.valid());
  ASSERT_TRUE(SendWithFds(fd.get(), bytes, {}).ok());
  const int code = AnswerCode(fd.get());
  EXPECT_TRUE(code == static_cast<int>(absl::StatusCode::kInvalidArgument) || code == -1) << code;
  EXPECT_EQ(server().lent(), 0u);
  ExpectStillServing();
}

TEST_F(DescriptorServerTest, AMessageCarryingADescriptorIsRefusedAndTheDescriptorClosed) {
  const Opened o = Open();
  v1::DescriptorRequest req;
  *req.mutable_session() = o.ref;  // otherwise a good request
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  UniqueFd read_end(pipe_fds[0]), write_end(pipe_fds[1]);
  UniqueFd fd = ConnectSeqpacket(h_->descriptor_socket());
  ASSERT_TRUE(fd.valid());
  const int attached[] = {write_end.get()};
  ASSERT_TRUE(SendWithFds(fd.get(), req.SerializeAsString(), attached).ok());
  const int code = AnswerCode(fd.get());
  EXPECT_TRUE(code == static_cast<int>(absl::StatusCode::kInvalidArgument) || code == -1) << code;
  EXPECT_EQ(server().lent(), 0u);
  EXPECT_GE(server().refused(), 1u);
  // The daemon (this process) kept no copy of the descriptor it was sent.
  write_end.Reset();
  EXPECT_TRUE(PipeReachesEof(read_end.get()));
  // The request itself changed nothing: the session is not bound and gets its memory.
  EXPECT_TRUE(Fetch(o.ref).ok());
}

TEST_F(DescriptorServerTest, AConnectionThatSendsNothingDoesNotBlockALaterRequest) {
  UniqueFd silent = ConnectSeqpacket(h_->descriptor_socket());
  ASSERT_TRUE(silent.valid());
  const Opened o = Open();
  auto lent = Fetch(o.ref);  // request_timeout is 60 s: the silent one is still waiting
  EXPECT_TRUE(lent.ok()) << lent.status();
  // It is still connected and may still ask.
  v1::DescriptorRequest req;
  *req.mutable_session() = Open("tenant-b").ref;
  ASSERT_TRUE(SendWithFds(silent.get(), req.SerializeAsString(), {}).ok());
  EXPECT_EQ(AnswerCode(silent.get()), 0);
}

TEST_F(DescriptorServerTest, SilentConnectionsBeyondTheSlotsMakeRoomForNewOnes) {
  ServiceHarness::Options opts;
  opts.descriptors = true;
  opts.descriptor_options.max_connections = 2;
  opts.descriptor_options.request_timeout = absl::Seconds(60);
  Start(opts);
  std::vector<UniqueFd> silent;
  for (int i = 0; i < 5; ++i) {
    silent.push_back(ConnectSeqpacket(h_->descriptor_socket()));
    ASSERT_TRUE(silent.back().valid());
  }
  const Opened o = Open();
  auto lent = Fetch(o.ref);
  EXPECT_TRUE(lent.ok()) << lent.status();
  // The oldest waiting connections were dropped to make room (closed by the daemon).
  EXPECT_EQ(AnswerCode(silent[0].get()), -1);
  EXPECT_GE(server().refused(), 3u);
}

TEST_F(DescriptorServerTest, ASilentConnectionIsClosedAfterTheRequestTimeout) {
  ServiceHarness::Options opts;
  opts.descriptors = true;
  opts.descriptor_options.request_timeout = absl::Milliseconds(20);
  Start(opts);
  UniqueFd silent = ConnectSeqpacket(h_->descriptor_socket());
  ASSERT_TRUE(silent.valid());
  EXPECT_EQ(AnswerCode(silent.get()), -1);  // closed, within the 10 s the helper waits
  EXPECT_TRUE(WaitFor([&] { return server().refused() == 1; }));
  ExpectStillServing();
}

TEST_F(DescriptorServerTest, ASecondLendForTheSameSessionFromTheSameProcessWorks) {
  const Opened o = Open();
  auto first = Fetch(o.ref);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = Fetch(o.ref);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->segments.size(), 3u);
  EXPECT_TRUE(WaitFor([&] { return server().lent() == 2; })) << server().lent();
}

TEST_F(DescriptorServerTest, LendMemoryToAProcessOtherThanTheBoundOneIsPermissionDenied) {
  const Opened o = Open();
  const int me = static_cast<int>(getpid());
  auto first = core().LendMemory(CoreRef(o.ref), me);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(core().LendMemory(CoreRef(o.ref), me).ok());
  EXPECT_EQ(core().LendMemory(CoreRef(o.ref), me + 1).status().code(), absl::StatusCode::kPermissionDenied);
  // Once bound to another process, this one is refused on the channel as well.
  const Opened other = Open("tenant-b");
  ASSERT_TRUE(core().LendMemory(CoreRef(other.ref), me + 1).ok());
  EXPECT_EQ(Fetch(other.ref).status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(DescriptorServerTest, TheSocketHasTheConfiguredModeAndStopRemovesIt) {
  struct stat st;
  ASSERT_EQ(stat(h_->descriptor_socket().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  server().Stop();
  EXPECT_NE(stat(h_->descriptor_socket().c_str(), &st), 0);
  EXPECT_EQ(errno, ENOENT);
  server().Stop();  // idempotent
}

TEST_F(DescriptorServerTest, StartReplacesALeftoverSocketFileAndRefusesBadPaths) {
  const std::string path = h_->dir().File("other.fd");
  {
    auto first = DescriptorServer::Start(&core(), At(path));
    ASSERT_TRUE(first.ok()) << first.status();
    // A second server on the same path replaces the socket file (the instance lock, not this
    // server, keeps two daemons apart).
    auto second = DescriptorServer::Start(&core(), At(path));
    ASSERT_TRUE(second.ok()) << second.status();
    const Opened o = Open();
    EXPECT_TRUE(FetchSessionMemory(path, o.ref, absl::Seconds(10)).ok());
  }
  EXPECT_EQ(DescriptorServer::Start(&core(), At("")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DescriptorServer::Start(&core(), At("/tmp/" + std::string(200, 'x')))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(DescriptorServerTest, AnUnreachableChannelIsUnavailable) {
  const Opened o = Open();
  EXPECT_EQ(FetchSessionMemory(h_->dir().File("nobody.fd"), o.ref, absl::Seconds(10)).status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace kvarn::testing
