#include "daemon/backends/slab_retention.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kvarn {
namespace {

// Processes by pid: alive with an identity (start time), or absent.
class FakeProbe final : public ProcessProbe {
 public:
  std::optional<uint64_t> Identity(int pid) const override {
    auto it = alive_.find(pid);
    if (it == alive_.end()) return std::nullopt;
    return it->second;
  }
  void Start(int pid, uint64_t identity) { alive_[pid] = identity; }
  void Exit(int pid) { alive_.erase(pid); }

 private:
  std::map<int, uint64_t> alive_;
};

// A stand-in for a device slab: counts its destructions (the memory being freed).
struct FakeSlab {
  explicit FakeSlab(int* freed, int id = 0) : freed(freed), id(id) {}
  FakeSlab(FakeSlab&& o) noexcept : freed(std::exchange(o.freed, nullptr)), id(o.id) {}
  FakeSlab& operator=(FakeSlab&& o) noexcept {
    std::swap(freed, o.freed);
    id = o.id;
    return *this;
  }
  ~FakeSlab() {
    if (freed != nullptr) ++*freed;
  }
  int* freed;
  int id;
};

constexpr int kSelf = 100;

class RetentionTest : public ::testing::Test {
 protected:
  RetentionTest() : list_(&probe_, kSelf) {
    probe_.Start(kSelf, 1);
    probe_.Start(200, 2000);
    probe_.Start(300, 3000);
  }
  FakeProbe probe_;
  RetentionList<FakeSlab> list_;
  int freed_ = 0;
};

TEST_F(RetentionTest, OwnerIsALiveOtherProcessOnly) {
  EXPECT_FALSE(list_.OwnerOf(0).has_value());
  EXPECT_FALSE(list_.OwnerOf(-5).has_value());
  EXPECT_FALSE(list_.OwnerOf(kSelf).has_value()) << "the daemon's own process is never an owner";
  EXPECT_FALSE(list_.OwnerOf(999).has_value()) << "a pid that is not running";
  const std::optional<ProcessOwner> o = list_.OwnerOf(200);
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->pid, 200);
  EXPECT_EQ(o->identity, 2000u);
}

TEST_F(RetentionTest, KeepsASlabWhileItsOwnerRunsAndFreesItOnceGone) {
  const ProcessOwner owner = *list_.OwnerOf(200);
  list_.Retain(owner, 1 << 20, FakeSlab(&freed_));
  EXPECT_EQ(freed_, 0);
  EXPECT_EQ(list_.Sweep(), uint64_t{1} << 20);
  EXPECT_EQ(list_.Sweep(), uint64_t{1} << 20) << "sweeping again changes nothing while the owner runs";
  EXPECT_EQ(list_.size(), 1u);
  EXPECT_EQ(freed_, 0);
  probe_.Exit(200);
  EXPECT_EQ(list_.bytes(), uint64_t{1} << 20) << "only a sweep frees";
  EXPECT_EQ(list_.Sweep(), 0u);
  EXPECT_EQ(freed_, 1);
  EXPECT_EQ(list_.size(), 0u);
}

TEST_F(RetentionTest, FreesAtOnceWhenTheOwnerIsAlreadyGone) {
  const ProcessOwner owner = *list_.OwnerOf(300);
  probe_.Exit(300);
  list_.Retain(owner, 4096, FakeSlab(&freed_));
  EXPECT_EQ(freed_, 1);
  EXPECT_EQ(list_.size(), 0u);
  EXPECT_EQ(list_.Sweep(), 0u);
}

TEST_F(RetentionTest, ARecycledPidIsNotTheOwner) {
  const ProcessOwner owner = *list_.OwnerOf(200);
  list_.Retain(owner, 4096, FakeSlab(&freed_));
  probe_.Exit(200);
  probe_.Start(200, 2001);  // another process got the pid
  EXPECT_EQ(list_.Sweep(), 0u);
  EXPECT_EQ(freed_, 1);
}

TEST_F(RetentionTest, SweepFreesOnlyTheGoneOwnersSlabs) {
  list_.Retain(*list_.OwnerOf(200), 100, FakeSlab(&freed_, 1));
  list_.Retain(*list_.OwnerOf(300), 1000, FakeSlab(&freed_, 2));
  list_.Retain(*list_.OwnerOf(200), 10, FakeSlab(&freed_, 3));
  EXPECT_EQ(list_.Sweep(), 1110u);
  probe_.Exit(200);
  EXPECT_EQ(list_.Sweep(), 1000u);
  EXPECT_EQ(freed_, 2);
  EXPECT_EQ(list_.size(), 1u);
}

TEST_F(RetentionTest, TakeHandsBackOnlyTheSameOwnersSlabOfTheSameSize) {
  const ProcessOwner a = *list_.OwnerOf(200), b = *list_.OwnerOf(300);
  list_.Retain(a, 4096, FakeSlab(&freed_, 7));
  EXPECT_FALSE(list_.Take(b, 4096).has_value()) << "another process must never get it";
  EXPECT_FALSE(list_.Take(a, 8192).has_value());
  EXPECT_FALSE(list_.Take(ProcessOwner{200, 2001}, 4096).has_value()) << "a recycled pid is someone else";
  std::optional<FakeSlab> got = list_.Take(a, 4096);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->id, 7);
  EXPECT_EQ(list_.size(), 0u);
  EXPECT_EQ(freed_, 0);
}

TEST_F(RetentionTest, ConcurrentRetainsAndSweepsLoseNothing) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        list_.Retain(*list_.OwnerOf(t % 2 == 0 ? 200 : 300), 1, FakeSlab(&freed_));
        list_.Sweep();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  // freed_ is only touched by destructors, which run with no owner gone: still zero.
  EXPECT_EQ(freed_, 0);
  EXPECT_EQ(list_.Sweep(), 800u);
  probe_.Exit(200);
  probe_.Exit(300);
  EXPECT_EQ(list_.Sweep(), 0u);
  EXPECT_EQ(freed_, 800);
}

TEST(SystemProbeTest, SeesALiveChildThenItsDeathIncludingAsAZombie) {
  const ProcessProbe* probe = ProcessProbe::System();
  ASSERT_TRUE(probe->Identity(static_cast<int>(getpid())).has_value());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    for (;;) pause();
  }
  const std::optional<uint64_t> id = probe->Identity(child);
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(probe->Identity(child), id) << "the identity is stable";
  ASSERT_EQ(kill(child, SIGKILL), 0);
  // Not reaped yet: a zombie, which holds no mappings any more.
  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {
    gone = !probe->Identity(child).has_value();
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(gone) << "a killed, unreaped child still looks alive";
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_FALSE(probe->Identity(child).has_value());
  EXPECT_FALSE(probe->Identity(0).has_value());
  EXPECT_FALSE(probe->Identity(-1).has_value());
}

}  // namespace
}  // namespace kvarn
