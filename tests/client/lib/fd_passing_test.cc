// common/fd_passing.h on socketpairs: bytes and descriptors round trip, descriptors of a
// refused message are closed, and the timeout, peer-close and full-socket answers.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <string>
#include <vector>

#include "common/fd_passing.h"
#include "common/unique_fd.h"

namespace kvarn {
namespace {

struct SocketPair {
  UniqueFd a, b;
  SocketPair() {
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) == 0) {
      a = UniqueFd(fds[0]);
      b = UniqueFd(fds[1]);
    }
  }
};

struct Pipe {
  UniqueFd read_end, write_end;
  Pipe() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) == 0) {
      read_end = UniqueFd(fds[0]);
      write_end = UniqueFd(fds[1]);
    }
  }
  // True when every copy of the write end is closed: the read end sees end-of-file.
  bool Eof() const {
    pollfd p{read_end.get(), POLLIN, 0};
    if (poll(&p, 1, 10000) != 1) return false;
    char c;
    return read(read_end.get(), &c, 1) == 0;
  }
};

bool Closed(int fd) { return fcntl(fd, F_GETFD) == -1 && errno == EBADF; }

// The n lowest descriptor numbers not in use now: where the next n received ones will go
// (the kernel always picks the lowest free number; the test opens nothing meanwhile).
std::vector<int> NextFreeFds(int n) {
  std::vector<int> fds;
  for (int i = 0; i < n; ++i) fds.push_back(dup(STDERR_FILENO));
  for (int fd : fds) close(fd);
  return fds;
}

TEST(FdPassingTest, BytesAndDescriptorsRoundTrip) {
  SocketPair s;
  Pipe p1, p2;
  ASSERT_TRUE(s.a.valid() && p1.write_end.valid() && p2.write_end.valid());
  const int fds[] = {p1.write_end.get(), p2.write_end.get()};
  ASSERT_TRUE(SendWithFds(s.a.get(), "hello, daemon", fds).ok());
  auto msg = ReceiveWithFds(s.b.get(), 1024, 4, absl::Seconds(10));
  ASSERT_TRUE(msg.ok()) << msg.status();
  EXPECT_EQ(msg->bytes, "hello, daemon");
  ASSERT_EQ(msg->fds.size(), 2u);
  // They are working duplicates, in order: what goes in through each reaches its pipe.
  ASSERT_EQ(write(msg->fds[0].get(), "1", 1), 1);
  ASSERT_EQ(write(msg->fds[1].get(), "2", 1), 1);
  char c = 0;
  ASSERT_EQ(read(p1.read_end.get(), &c, 1), 1);
  EXPECT_EQ(c, '1');
  ASSERT_EQ(read(p2.read_end.get(), &c, 1), 1);
  EXPECT_EQ(c, '2');
  // The sender kept its own copies.
  EXPECT_FALSE(Closed(p1.write_end.get()));
}

TEST(FdPassingTest, ReceivedDescriptorsAreCloseOnExec) {
  SocketPair s;
  Pipe p;
  const int fds[] = {p.write_end.get()};
  // The sent copy is not close-on-exec; the received one must be anyway.
  UniqueFd inheritable(fcntl(p.write_end.get(), F_DUPFD, 0));
  ASSERT_EQ(fcntl(inheritable.get(), F_GETFD) & FD_CLOEXEC, 0);
  const int sent[] = {inheritable.get()};
  ASSERT_TRUE(SendWithFds(s.a.get(), "x", sent).ok());
  ASSERT_TRUE(SendWithFds(s.a.get(), "y", fds).ok());
  for (int i = 0; i < 2; ++i) {
    auto msg = ReceiveWithFds(s.b.get(), 16, 1, absl::Seconds(10));
    ASSERT_TRUE(msg.ok()) << msg.status();
    ASSERT_EQ(msg->fds.size(), 1u);
    EXPECT_NE(fcntl(msg->fds[0].get(), F_GETFD) & FD_CLOEXEC, 0);
  }
}

TEST(FdPassingTest, AMessageWithMoreDescriptorsThanAllowedIsRefusedAndTheyAreClosed) {
  SocketPair s;
  Pipe p;
  const int fds[] = {p.write_end.get(), p.write_end.get(), p.write_end.get()};
  ASSERT_TRUE(SendWithFds(s.a.get(), "three", fds).ok());
  const std::vector<int> landing = NextFreeFds(3);
  auto msg = ReceiveWithFds(s.b.get(), 1024, 2, absl::Seconds(10));
  EXPECT_EQ(msg.status().code(), absl::StatusCode::kInvalidArgument) << msg.status();
  for (int fd : landing) EXPECT_TRUE(Closed(fd)) << "descriptor " << fd << " still open";
  p.write_end.Reset();
  EXPECT_TRUE(p.Eof()) << "a copy of the write end leaked";
}

TEST(FdPassingTest, AMessageLongerThanAllowedIsRefusedAndItsDescriptorsClosed) {
  SocketPair s;
  Pipe p;
  const int fds[] = {p.write_end.get()};
  ASSERT_TRUE(SendWithFds(s.a.get(), std::string(100, 'z'), fds).ok());
  const std::vector<int> landing = NextFreeFds(1);
  auto msg = ReceiveWithFds(s.b.get(), 10, 4, absl::Seconds(10));
  EXPECT_EQ(msg.status().code(), absl::StatusCode::kInvalidArgument) << msg.status();
  EXPECT_TRUE(Closed(landing[0]));
  p.write_end.Reset();
  EXPECT_TRUE(p.Eof());
  // Exactly max_bytes is fine.
  ASSERT_TRUE(SendWithFds(s.a.get(), std::string(10, 'z'), {}).ok());
  auto exact = ReceiveWithFds(s.b.get(), 10, 0, absl::Seconds(10));
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_EQ(exact->bytes, std::string(10, 'z'));
}

TEST(FdPassingTest, AnyDescriptorIsTooManyWhenNoneAreAllowed) {
  SocketPair s;
  Pipe p;
  const int fds[] = {p.write_end.get()};
  ASSERT_TRUE(SendWithFds(s.a.get(), "request", fds).ok());
  EXPECT_EQ(ReceiveWithFds(s.b.get(), 1024, 0, absl::Seconds(10)).status().code(), absl::StatusCode::kInvalidArgument);
  p.write_end.Reset();
  EXPECT_TRUE(p.Eof());
}

TEST(FdPassingTest, SendRefusesOver16DescriptorsOrOver64KiB) {
  SocketPair s;
  Pipe p;
  std::vector<int> seventeen(17, p.write_end.get());
  EXPECT_EQ(SendWithFds(s.a.get(), "x", seventeen).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SendWithFds(s.a.get(), std::string((64 << 10) + 1, 'x'), {}).code(), absl::StatusCode::kInvalidArgument);
  std::vector<int> sixteen(16, p.write_end.get());
  EXPECT_TRUE(SendWithFds(s.a.get(), "x", sixteen).ok());
  auto msg = ReceiveWithFds(s.b.get(), 16, 16, absl::Seconds(10));
  ASSERT_TRUE(msg.ok()) << msg.status();
  EXPECT_EQ(msg->fds.size(), 16u);
}

TEST(FdPassingTest, NothingInTimeIsDeadlineExceeded) {
  SocketPair s;
  EXPECT_EQ(ReceiveWithFds(s.b.get(), 16, 1, absl::Milliseconds(10)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(ReceiveWithFds(s.b.get(), 16, 1, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(FdPassingTest, APeerThatClosedIsUnavailable) {
  SocketPair s;
  s.a.Reset();
  EXPECT_EQ(ReceiveWithFds(s.b.get(), 16, 1, absl::Seconds(10)).status().code(), absl::StatusCode::kUnavailable);
}

TEST(FdPassingTest, SendOnAFullSocketIsUnavailableRatherThanBlocking) {
  SocketPair s;
  const std::string chunk(60 << 10, 'f');
  absl::Status last;
  for (int i = 0; i < 10000 && last.ok(); ++i) last = SendWithFds(s.a.get(), chunk, {});
  EXPECT_EQ(last.code(), absl::StatusCode::kUnavailable) << last;
}

TEST(FdPassingTest, PeerOfASocketpairIsThisProcess) {
  SocketPair s;
  auto peer = PeerOf(s.a.get());
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_EQ(peer->pid, getpid());
  EXPECT_EQ(peer->uid, getuid());
  EXPECT_EQ(peer->gid, getgid());
  EXPECT_FALSE(PeerOf(-1).ok());
}

}  // namespace
}  // namespace kvarn
