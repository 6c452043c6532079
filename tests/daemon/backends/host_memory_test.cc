// daemon/backends/host_memory.h: where huge_pages puts each region, what each mode does when the
// kernel's huge page pool has no room, and what the backend counts (kvarn_pool_huge_page_*).
#include "daemon/backends/host_memory.h"

#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "tests/common/huge_pages.h"

namespace kvarn {
namespace {

using kvarn::testing::ReadHugePagePool;

// The page size behind a region's descriptor (st_blksize: base page on tmpfs, huge page on
// hugetlbfs).
size_t PageOf(const Region& r) {
  struct stat st;
  return fstat(r.fd(), &st) == 0 ? static_cast<size_t>(st.st_blksize) : 0;
}

TEST(HostMemoryTest, OffNeverUsesHugePages) {
  HostMemoryBackend b("hm-off", HugePages::kOff);
  auto r = b.Create(RegionKind::kTail, 1 << 20);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(PageOf(**r), static_cast<size_t>(sysconf(_SC_PAGESIZE)));
  EXPECT_EQ(b.HugePageBytes(RegionKind::kTail), 0u);
  EXPECT_EQ(b.HugePageFallbacks(), 0u);
  EXPECT_TRUE((*r)->Pin().ok());
}

TEST(HostMemoryTest, OnRefusesARegionThePoolCannotHoldAndCountsNothing) {
  const auto pool = ReadHugePagePool();
  const size_t page = pool.page_bytes ? pool.page_bytes : 2u << 20;
  HostMemoryBackend b("hm-on", HugePages::kOn);
  auto r = b.Create(RegionKind::kTail, pool.Impossible() * page);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), pool.page_bytes ? absl::StatusCode::kResourceExhausted : absl::StatusCode::kFailedPrecondition)
      << r.status();
  EXPECT_NE(r.status().message().find("huge_pages = on"), std::string_view::npos) << r.status();
  EXPECT_EQ(b.HugePageBytes(RegionKind::kTail), 0u);
  EXPECT_EQ(b.HugePageFallbacks(), 0u);
}

TEST(HostMemoryTest, TryFallsBackToBasePagesAndCountsTheFallback) {
  const auto pool = ReadHugePagePool();
  const size_t page = pool.page_bytes ? pool.page_bytes : 2u << 20;
  HostMemoryBackend b("hm-try", HugePages::kTry);
  auto r = b.Create(RegionKind::kQuant, pool.Impossible() * page);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(PageOf(**r), static_cast<size_t>(sysconf(_SC_PAGESIZE)));
  EXPECT_EQ(b.HugePageFallbacks(), 1u);
  EXPECT_EQ(b.HugePageBytes(RegionKind::kQuant), 0u);
}

TEST(HostMemoryTest, TryPutsARegionOnHugePagesAndCountsItWhileItLives) {
  const auto pool = ReadHugePagePool();
  if (pool.page_bytes == 0 || pool.available() < 2) GTEST_SKIP() << "no 2 available huge pages here (vm.nr_hugepages)";
  HostMemoryBackend b("hm-huge", HugePages::kTry);
  {
    auto tail = b.Create(RegionKind::kTail, pool.page_bytes + 1);
    ASSERT_TRUE(tail.ok()) << tail.status();
    EXPECT_EQ(PageOf(**tail), pool.page_bytes);
    EXPECT_EQ((*tail)->size(), 2 * pool.page_bytes);
    EXPECT_EQ(b.HugePageBytes(RegionKind::kTail), 2 * pool.page_bytes);
    EXPECT_EQ(b.HugePageBytes(RegionKind::kQuant), 0u);
    EXPECT_TRUE((*tail)->Pin().ok());
    EXPECT_EQ(b.HugePageFallbacks(), 0u);
  }
  EXPECT_EQ(b.HugePageBytes(RegionKind::kTail), 0u) << "a destroyed region still counted";
}

}  // namespace
}  // namespace kvarn
