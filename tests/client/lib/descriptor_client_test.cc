// The client side of the descriptor channel (client/lib/descriptor_client.h) against a fake
// daemon that answers one connection with a crafted reply: how replies map to statuses, how
// segments are paired with descriptors, and that no descriptor of a refused reply leaks.
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "client/lib/descriptor_client.h"
#include "common/fd_passing.h"
#include "tests/daemon/service/service_harness.h"

namespace kvarn::testing {
namespace {

// Serves one connection at `path`: reads the request, then sends `reply` with `fds` attached
// (or, with reply_ = nullopt, says nothing until destroyed).
class FakeDaemon {
 public:
  FakeDaemon(const std::string& path, std::optional<std::string> reply, std::vector<int> fds = {})
      : reply_(std::move(reply)), fds_(std::move(fds)) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    listener_ = UniqueFd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    ok_ = listener_.valid() && bind(listener_.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0 &&
          listen(listener_.get(), 4) == 0;
    if (ok_) thread_ = std::thread([this] { Serve(); });
  }
  ~FakeDaemon() { Stop(); }
  bool ok() const { return ok_; }
  // Ends the fake (closing its connection) and returns the request it received.
  std::string Stop() {
    if (!done_.HasBeenNotified()) done_.Notify();
    if (thread_.joinable()) thread_.join();
    return request_;
  }

 private:
  void Serve() {
    pollfd p{listener_.get(), POLLIN, 0};
    if (poll(&p, 1, 10000) != 1) return;
    UniqueFd conn(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn.valid()) return;
    auto msg = ReceiveWithFds(conn.get(), 4096, 0, absl::Seconds(10));
    if (msg.ok()) request_ = msg->bytes;
    if (reply_.has_value()) SendWithFds(conn.get(), *reply_, fds_).IgnoreError();
    done_.WaitForNotificationWithTimeout(absl::Seconds(30));
  }

  std::optional<std::string> reply_;
  std::vector<int> fds_;
  UniqueFd listener_;
  bool ok_ = false;
  std::string request_;
  Notification done_;
  std::thread thread_;
};

v1::SessionRef SomeRef() {
  v1::SessionRef r;
  r.set_session_id(42);
  r.set_epoch(7);
  r.set_secret(std::string(32, 's'));
  return r;
}

v1::DescriptorReply::Entry Entry(v1::DescriptorReply::Entry::Kind kind, uint64_t bytes, bool has_fd, bool writable) {
  v1::DescriptorReply::Entry e;
  e.set_kind(kind);
  e.set_bytes(bytes);
  e.set_has_fd(has_fd);
  e.set_writable(writable);
  return e;
}

UniqueFd Memfd(size_t bytes) {
  UniqueFd fd(memfd_create("descriptor-client-test", MFD_CLOEXEC));
  if (fd.valid() && ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) fd.Reset();
  return fd;
}

struct Pipe {
  UniqueFd read_end, write_end;
  Pipe() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) == 0) {
      read_end = UniqueFd(fds[0]);
      write_end = UniqueFd(fds[1]);
    }
  }
  // True when every copy of the write end is closed (the read end sees end-of-file).
  bool Eof() const {
    pollfd p{read_end.get(), POLLIN, 0};
    if (poll(&p, 1, 10000) != 1) return false;
    char c;
    return read(read_end.get(), &c, 1) == 0;
  }
};

class DescriptorClientTest : public ::testing::Test {
 protected:
  std::string Path() const { return dir_.File("fake.fd"); }
  TempDir dir_;
};

TEST_F(DescriptorClientTest, TheDaemonsRefusalComesBackWithItsCodeAndMessage) {
  for (absl::StatusCode code : {absl::StatusCode::kNotFound, absl::StatusCode::kPermissionDenied,
                                absl::StatusCode::kFailedPrecondition, absl::StatusCode::kInvalidArgument}) {
    TempDir dir;
    const std::string path = dir.File("fake.fd");
    v1::DescriptorReply reply;
    reply.set_code(static_cast<int>(code));
    reply.set_message("refused for the test");
    FakeDaemon daemon(path, reply.SerializeAsString());
    ASSERT_TRUE(daemon.ok());
    auto lent = FetchSessionMemory(path, SomeRef(), absl::Seconds(10));
    EXPECT_EQ(lent.status().code(), code);
    EXPECT_EQ(lent.status().message(), "refused for the test");
  }
}

TEST_F(DescriptorClientTest, AGoodReplyPairsEachAnnouncedSegmentWithItsDescriptor) {
  UniqueFd quant = Memfd(4096), tail = Memfd(8192);
  ASSERT_TRUE(quant.valid() && tail.valid());
  v1::DescriptorReply reply;
  *reply.add_segments() = Entry(v1::DescriptorReply::Entry::KIND_QUANT, 4096, true, false);
  *reply.add_segments() = Entry(v1::DescriptorReply::Entry::KIND_SINK, 0, false, false);  // no descriptor
  *reply.add_segments() = Entry(v1::DescriptorReply::Entry::KIND_TAIL, 8192, true, true);
  FakeDaemon daemon(Path(), reply.SerializeAsString(), {quant.get(), tail.get()});
  ASSERT_TRUE(daemon.ok());
  auto lent = FetchSessionMemory(Path(), SomeRef(), absl::Seconds(10));
  ASSERT_TRUE(lent.ok()) << lent.status();
  ASSERT_EQ(lent->segments.size(), 3u);
  struct stat st;
  ASSERT_TRUE(lent->segments[0].fd.valid());
  ASSERT_EQ(fstat(lent->segments[0].fd.get(), &st), 0);
  EXPECT_EQ(st.st_size, 4096);
  EXPECT_FALSE(lent->segments[1].fd.valid());
  ASSERT_TRUE(lent->segments[2].fd.valid());
  ASSERT_EQ(fstat(lent->segments[2].fd.get(), &st), 0);
  EXPECT_EQ(st.st_size, 8192);
  EXPECT_TRUE(lent->segments[2].entry.writable());
  EXPECT_NE(fcntl(lent->segments[0].fd.get(), F_GETFD) & FD_CLOEXEC, 0);
}

TEST_F(DescriptorClientTest, TheRequestNamesTheSession) {
  v1::DescriptorReply reply;
  reply.set_code(static_cast<int>(absl::StatusCode::kNotFound));
  FakeDaemon daemon(Path(), reply.SerializeAsString());
  ASSERT_TRUE(daemon.ok());
  EXPECT_EQ(FetchSessionMemory(Path(), SomeRef(), absl::Seconds(10)).status().code(), absl::StatusCode::kNotFound);
  v1::DescriptorRequest req;
  ASSERT_TRUE(req.ParseFromString(daemon.Stop()));
  EXPECT_EQ(req.session().session_id(), 42u);
  EXPECT_EQ(req.session().epoch(), 7u);
  EXPECT_EQ(req.session().secret(), std::string(32, 's'));
}

TEST_F(DescriptorClientTest, AReplyAnnouncingADescriptorItLacksIsInternal) {
  v1::DescriptorReply reply;
  *reply.add_segments() = Entry(v1::DescriptorReply::Entry::KIND_QUANT, 4096, true, false);
  FakeDaemon daemon(Path(), reply.SerializeAsString());
  ASSERT_TRUE(daemon.ok());
  EXPECT_EQ(FetchSessionMemory(Path(), SomeRef(), absl::Seconds(10)).status().code(), absl::StatusCode::kInternal);
}

TEST_F(DescriptorClientTest, AReplyWithDescriptorsItDoesNotDescribeIsInternalAndClosesThem) {
  Pipe pipe;
  ASSERT_TRUE(pipe.write_end.valid());
  v1::DescriptorReply reply;  // code OK, no segments
  {
    FakeDaemon daemon(Path(), reply.SerializeAsString(), {pipe.write_end.get()});
    ASSERT_TRUE(daemon.ok());
    EXPECT_EQ(FetchSessionMemory(Path(), SomeRef(), absl::Seconds(10)).status().code(), absl::StatusCode::kInternal);
  }
  pipe.write_end.Reset();
  EXPECT_TRUE(pipe.Eof()) << "the client kept the undescribed descriptor";
}

TEST_F(DescriptorClientTest, AReplyWithTooManyDescriptorsIsRefusedAndClosesThem) {
  Pipe pipe;
  ASSERT_TRUE(pipe.write_end.valid());
  v1::DescriptorReply reply;
  for (int i = 0; i < 9; ++i) *reply.add_segments() = Entry(v1::DescriptorReply::Entry::KIND_QUANT, 1, true, false);
  {
    FakeDaemon daemon(Path(), reply.SerializeAsString(), std::vector<int>(9, pipe.write_end.get()));
    ASSERT_TRUE(daemon.ok());
    EXPECT_EQ(FetchSessionMemory(Path(), SomeRef(), absl::Seconds(10)).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  pipe.write_end.Reset();
  EXPECT_TRUE(pipe.Eof()) << "a refused reply's descriptors leaked";
}

TEST_F(DescriptorClientTest, AReplyThatDoesNotParseIsInternal) {
  FakeDaemon daemon(Path(), std::string("\x0a\xff\xff", 3));
  ASSERT_TRUE(daemon.ok());
  EXPECT_EQ(FetchSessionMemory(Path(), SomeRef(), absl::Seconds(10)).status().code(), absl::StatusCode::kInternal);
}

TEST_F(DescriptorClientTest, ADaemonThatNeverAnswersIsDeadlineExceeded) {
  FakeDaemon daemon(Path(), std::nullopt);
  ASSERT_TRUE(daemon.ok());
  EXPECT_EQ(FetchSessionMemory(Path(), SomeRef(), absl::Milliseconds(50)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST_F(DescriptorClientTest, NoChannelIsUnavailableAndAPathTooLongIsInvalidArgument) {
  EXPECT_EQ(FetchSessionMemory(Path(), SomeRef(), absl::Seconds(1)).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(FetchSessionMemory("/tmp/" + std::string(200, 'p'), SomeRef(), absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvarn::testing
