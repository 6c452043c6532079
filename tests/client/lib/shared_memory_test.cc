// common/shared_memory.h: what the seals of kReadOnly and kReadWrite segments allow a holder
// of the descriptor, and what FdMapping refuses to map; segments on the kernel's huge pages.
#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/shared_memory.h"
#include "tests/common/huge_pages.h"

namespace kvarn {
namespace {

constexpr size_t kBytes = 16 << 10;

UniqueFd Dup(int fd) { return UniqueFd(fcntl(fd, F_DUPFD_CLOEXEC, 0)); }

TEST(SharedMemoryTest, AReadOnlySegmentRefusesEveryWritePathButTheOwnersMapping) {
  auto m = SharedMemory::Create("ro-test", kBytes, ClientAccess::kReadOnly);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->size(), kBytes);
  EXPECT_EQ(m->access(), ClientAccess::kReadOnly);
  // A second writable shared mapping is refused.
  void* w = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd(), 0);
  const int err = errno;
  EXPECT_EQ(w, MAP_FAILED);
  EXPECT_EQ(err, EPERM);
  if (w != MAP_FAILED) munmap(w, kBytes);
  // So are write(2) and resizing.
  const char byte = 'w';
  EXPECT_EQ(pwrite(m->fd(), &byte, 1, 0), -1);
  EXPECT_EQ(ftruncate(m->fd(), 0), -1);
  EXPECT_EQ(ftruncate(m->fd(), kBytes * 2), -1);
  // Also through a descriptor reopened by path, as another process could.
  const std::string proc = absl::StrCat("/proc/self/fd/", m->fd());
  UniqueFd reopened(open(proc.c_str(), O_RDWR | O_CLOEXEC));
  if (reopened.valid()) {
    void* w2 = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, reopened.get(), 0);
    EXPECT_EQ(w2, MAP_FAILED);
    if (w2 != MAP_FAILED) munmap(w2, kBytes);
    EXPECT_EQ(write(reopened.get(), &byte, 1), -1);
  }
  // The owner's mapping stays writable, and readers see its writes.
  m->data()[123] = 42;
  void* r = mmap(nullptr, kBytes, PROT_READ, MAP_SHARED, m->fd(), 0);
  ASSERT_NE(r, MAP_FAILED);
  EXPECT_EQ(static_cast<const uint8_t*>(r)[123], 42);
  m->data()[124] = 43;
  EXPECT_EQ(static_cast<const uint8_t*>(r)[124], 43);
  munmap(r, kBytes);
}

TEST(SharedMemoryTest, AReadWriteSegmentAllowsAWritableSecondMappingSharingItsPages) {
  auto m = SharedMemory::Create("rw-test", kBytes, ClientAccess::kReadWrite);
  ASSERT_TRUE(m.ok()) << m.status();
  void* w = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd(), 0);
  ASSERT_NE(w, MAP_FAILED) << strerror(errno);
  auto* second = static_cast<uint8_t*>(w);
  second[10] = 7;
  EXPECT_EQ(m->data()[10], 7);
  m->data()[kBytes - 1] = 9;
  EXPECT_EQ(second[kBytes - 1], 9);
  munmap(w, kBytes);
  // Still sealed against resizing.
  EXPECT_EQ(ftruncate(m->fd(), 0), -1);
  EXPECT_EQ(ftruncate(m->fd(), kBytes * 2), -1);
}

TEST(SharedMemoryTest, SegmentsAreSealedAgainstResizingAndFurtherSeals) {
  for (ClientAccess access : {ClientAccess::kReadOnly, ClientAccess::kReadWrite}) {
    auto m = SharedMemory::Create("seal-test", kBytes, access);
    ASSERT_TRUE(m.ok()) << m.status();
    const int seals = fcntl(m->fd(), F_GET_SEALS);
    ASSERT_GE(seals, 0);
    EXPECT_NE(seals & F_SEAL_SHRINK, 0);
    EXPECT_NE(seals & F_SEAL_GROW, 0);
    EXPECT_NE(seals & F_SEAL_SEAL, 0);
    EXPECT_EQ((seals & F_SEAL_FUTURE_WRITE) != 0, access == ClientAccess::kReadOnly);
    EXPECT_EQ(fcntl(m->fd(), F_ADD_SEALS, F_SEAL_WRITE), -1);
  }
}

TEST(SharedMemoryTest, ZeroBytesIsInvalidArgument) {
  EXPECT_EQ(SharedMemory::Create("empty", 0, ClientAccess::kReadOnly).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SharedMemoryTest, PagesAreAllocatedOnlyWhenTouched) {
  auto m = SharedMemory::Create("resident-test", 1 << 20, ClientAccess::kReadOnly);
  ASSERT_TRUE(m.ok()) << m.status();
  const uint64_t before = m->ResidentBytes();
  EXPECT_LT(before, uint64_t{1} << 20);
  const long page = sysconf(_SC_PAGESIZE);
  for (int i = 0; i < 3; ++i) m->data()[static_cast<size_t>(i * page)] = 1;
  EXPECT_GE(m->ResidentBytes(), before + 3 * static_cast<uint64_t>(page));
  auto map = FdMapping::Map(Dup(m->fd()), m->size(), false);
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->AllocatedBytes(), m->ResidentBytes());
}

TEST(SharedMemoryTest, AMovedSegmentKeepsItsMemory) {
  auto m = SharedMemory::Create("move-test", kBytes, ClientAccess::kReadWrite);
  ASSERT_TRUE(m.ok()) << m.status();
  m->data()[5] = 55;
  SharedMemory moved = std::move(*m);
  EXPECT_EQ(moved.data()[5], 55);
  EXPECT_EQ(moved.size(), kBytes);
  EXPECT_EQ(m->data(), nullptr);
  EXPECT_EQ(m->fd(), -1);
}

// ---- FdMapping ----

TEST(FdMappingTest, MapsAReadOnlySegmentReadableAndRefusesItWritable) {
  auto m = SharedMemory::Create("map-ro", kBytes, ClientAccess::kReadOnly);
  ASSERT_TRUE(m.ok()) << m.status();
  m->data()[100] = 77;
  auto w = FdMapping::Map(Dup(m->fd()), kBytes, /*writable=*/true);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kPermissionDenied) << w.status();
  auto r = FdMapping::Map(Dup(m->fd()), kBytes, /*writable=*/false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->size(), kBytes);
  EXPECT_EQ(r->data()[100], 77);
  m->data()[101] = 78;
  EXPECT_EQ(r->data()[101], 78);
}

TEST(FdMappingTest, MapsAReadWriteSegmentWritable) {
  auto m = SharedMemory::Create("map-rw", kBytes, ClientAccess::kReadWrite);
  ASSERT_TRUE(m.ok()) << m.status();
  auto w = FdMapping::Map(Dup(m->fd()), kBytes, /*writable=*/true);
  ASSERT_TRUE(w.ok()) << w.status();
  w->data()[9] = 99;
  EXPECT_EQ(m->data()[9], 99);
}

TEST(FdMappingTest, RefusesAMemfdNotSealedAgainstShrinking) {
  UniqueFd plain(memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_TRUE(plain.valid());
  ASSERT_EQ(ftruncate(plain.get(), kBytes), 0);
  EXPECT_EQ(FdMapping::Map(Dup(plain.get()), kBytes, false).status().code(), absl::StatusCode::kFailedPrecondition);
  // Sealed against growing only: still shrinkable, still refused.
  ASSERT_EQ(fcntl(plain.get(), F_ADD_SEALS, F_SEAL_GROW), 0);
  EXPECT_EQ(FdMapping::Map(Dup(plain.get()), kBytes, false).status().code(), absl::StatusCode::kFailedPrecondition);
  // Once it cannot shrink it maps.
  ASSERT_EQ(fcntl(plain.get(), F_ADD_SEALS, F_SEAL_SHRINK), 0);
  EXPECT_TRUE(FdMapping::Map(Dup(plain.get()), kBytes, false).ok());
  // A memfd that cannot be sealed at all is refused too.
  UniqueFd unsealable(memfd_create("unsealable", MFD_CLOEXEC));
  ASSERT_TRUE(unsealable.valid());
  ASSERT_EQ(ftruncate(unsealable.get(), kBytes), 0);
  EXPECT_EQ(FdMapping::Map(std::move(unsealable), kBytes, false).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(FdMappingTest, RefusesASegmentSmallerThanAnnounced) {
  auto m = SharedMemory::Create("small", kBytes, ClientAccess::kReadOnly);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(FdMapping::Map(Dup(m->fd()), kBytes + 1, false).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(FdMapping::Map(Dup(m->fd()), kBytes - 1, false).ok());
}

TEST(FdMappingTest, RefusesNoDescriptorOrZeroBytes) {
  EXPECT_EQ(FdMapping::Map(UniqueFd(), kBytes, false).status().code(), absl::StatusCode::kInvalidArgument);
  auto m = SharedMemory::Create("zero", kBytes, ClientAccess::kReadOnly);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(FdMapping::Map(Dup(m->fd()), 0, false).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(FdMappingTest, ClosesItsDescriptorWhenDestroyed) {
  auto m = SharedMemory::Create("close", kBytes, ClientAccess::kReadOnly);
  ASSERT_TRUE(m.ok()) << m.status();
  UniqueFd copy = Dup(m->fd());
  const int number = copy.get();
  {
    auto map = FdMapping::Map(std::move(copy), kBytes, false);
    ASSERT_TRUE(map.ok()) << map.status();
    EXPECT_NE(fcntl(number, F_GETFD), -1);
    FdMapping moved = std::move(*map);
    EXPECT_EQ(map->data(), nullptr);
    EXPECT_NE(moved.data(), nullptr);
  }
  const int flags = fcntl(number, F_GETFD);
  const int err = errno;
  EXPECT_EQ(flags, -1);
  EXPECT_EQ(err, EBADF);
}

// ---- Huge pages ----

using kvarn::testing::ReadHugePagePool;

// Whether [p, p + 1) is mapped in this process: msync fails with ENOMEM on an unmapped page.
bool Mapped(const void* p) {
  const uintptr_t page = reinterpret_cast<uintptr_t>(p) & ~static_cast<uintptr_t>(sysconf(_SC_PAGESIZE) - 1);
  return msync(reinterpret_cast<void*>(page), 1, MS_ASYNC) == 0;
}

TEST(HugePagesTest, MoreThanThePoolCouldGiveIsRefusedNamingIt) {
  const auto pool = ReadHugePagePool();
  const size_t page = pool.page_bytes ? pool.page_bytes : 2u << 20;
  auto m = SharedMemory::CreateOnHugePages("huge-too-many", pool.Impossible() * page, ClientAccess::kReadWrite);
  ASSERT_FALSE(m.ok()) << "reserved " << pool.Impossible() << " huge pages of a pool of " << pool.total;
  if (pool.page_bytes) {
    EXPECT_EQ(m.status().code(), absl::StatusCode::kResourceExhausted) << m.status();
    EXPECT_THAT(std::string(m.status().message()), ::testing::HasSubstr("HugePages_Rsvd")) << m.status();
  } else {
    EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition) << m.status();  // no hugetlbfs
  }
}

TEST(HugePagesTest, ASegmentIsWholeHugePagesAllAllocatedSealedAsOnBasePagesAndMappedWhole) {
  const auto pool = ReadHugePagePool();
  if (pool.page_bytes == 0 || pool.available() < 2) GTEST_SKIP() << "no 2 available huge pages here (vm.nr_hugepages)";
  const size_t page = pool.page_bytes;
  auto m = SharedMemory::CreateOnHugePages("huge-ro", page + 1, ClientAccess::kReadOnly);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->size(), 2 * page) << "rounded up to whole huge pages";
  EXPECT_EQ(m->page_bytes(), page);
  const int seals = fcntl(m->fd(), F_GET_SEALS);
  EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL),
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL);
  EXPECT_EQ(FdMapping::Map(Dup(m->fd()), page + 1, /*writable=*/true).status().code(), absl::StatusCode::kPermissionDenied);
  // Allocated at creation (a cgroup limit fails there, not on a touch), and nobody can take a
  // page away: a read-only segment cannot be punched.
  EXPECT_EQ(m->ResidentBytes(), 2 * page);
  EXPECT_EQ(fallocate(m->fd(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(page)), -1);
  EXPECT_TRUE(m->Pin().ok()) << "nothing to pin";
  m->data()[page + 100] = 42;
  const uint8_t* seen = nullptr;
  {
    // A client announces the bytes it needs; the mapping covers whole huge pages.
    auto r = FdMapping::Map(Dup(m->fd()), page + 1, /*writable=*/false);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->size(), page + 1);
    EXPECT_EQ(r->page_bytes(), page);
    EXPECT_EQ(r->data()[page + 100], 42);
    EXPECT_EQ(r->AllocatedBytes(), 2 * page);
    seen = r->data();
    ASSERT_TRUE(Mapped(seen + page + 100));
  }
  // Unmapped on destruction: a huge page mapping unmapped by a length that is not whole huge
  // pages would fail (EINVAL) and stay.
  EXPECT_FALSE(Mapped(seen)) << "the client's mapping of a huge page segment outlived it";
  EXPECT_FALSE(Mapped(seen + page));
}

// A writable segment on huge pages can be punched by whoever holds its descriptor until Pin
// seals it; Pin then says whether a page went.
TEST(HugePagesTest, AWritableSegmentIsPinnedBeforeUseAndPinTellsAPunchedOne) {
  const auto pool = ReadHugePagePool();
  if (pool.page_bytes == 0 || pool.available() < 4) GTEST_SKIP() << "no 4 available huge pages here (vm.nr_hugepages)";
  const size_t page = pool.page_bytes;
  for (const bool punch : {false, true}) {
    auto m = SharedMemory::CreateOnHugePages("huge-pin", 2 * page, ClientAccess::kReadWrite);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->ResidentBytes(), 2 * page);
    auto w = FdMapping::Map(Dup(m->fd()), 2 * page, /*writable=*/true);  // the client maps first
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(fcntl(m->fd(), F_GET_SEALS) & (F_SEAL_FUTURE_WRITE | F_SEAL_SEAL), 0) << "sealed for good before Pin";
    if (punch) {
      // Through the client's mapping, as a client would.
      ASSERT_EQ(madvise(w->data() + page, page, MADV_REMOVE), 0) << strerror(errno);
    }
    const absl::Status pinned = m->Pin();
    if (punch) {
      EXPECT_EQ(pinned.code(), absl::StatusCode::kFailedPrecondition) << pinned;
      EXPECT_THAT(std::string(pinned.message()), ::testing::HasSubstr("removed")) << pinned;
      EXPECT_EQ(m->Pin().code(), absl::StatusCode::kFailedPrecondition) << "still a page short";
      // Sealed by the failed Pin: no new hole; the writer's touch brings the page back.
      EXPECT_EQ(madvise(w->data(), page, MADV_REMOVE), -1);
      w->data()[page] = 1;
      EXPECT_TRUE(m->Pin().ok());
      continue;
    }
    ASSERT_TRUE(pinned.ok()) << pinned;
    EXPECT_TRUE(m->Pin().ok());
    // Pinned: no hole can be punched any more, by the descriptor or through the mapping, and
    // the mapping made before stays writable; a new writable one is refused.
    EXPECT_EQ(fallocate(m->fd(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(page)), -1);
    EXPECT_EQ(madvise(w->data(), page, MADV_REMOVE), -1);
    w->data()[5] = 6;
    EXPECT_EQ(m->data()[5], 6);
    EXPECT_EQ(FdMapping::Map(Dup(m->fd()), page, /*writable=*/true).status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_EQ(m->ResidentBytes(), 2 * page);
  }
}

// A writer who seals the segment against further seals before Pin (so that Pin could not
// keep it from punching) gets a segment that Pin refuses for good.
TEST(HugePagesTest, AWritableSegmentSealedByItsWriterBeforePinIsNeverPinned) {
  const auto pool = ReadHugePagePool();
  if (pool.page_bytes == 0 || pool.available() < 1) GTEST_SKIP() << "no available huge page here (vm.nr_hugepages)";
  auto m = SharedMemory::CreateOnHugePages("huge-sealed-first", pool.page_bytes, ClientAccess::kReadWrite);
  ASSERT_TRUE(m.ok()) << m.status();
  UniqueFd writer = Dup(m->fd());
  ASSERT_EQ(fcntl(writer.get(), F_ADD_SEALS, F_SEAL_SEAL), 0) << strerror(errno);
  const absl::Status pinned = m->Pin();
  EXPECT_EQ(pinned.code(), absl::StatusCode::kFailedPrecondition) << pinned;
  EXPECT_THAT(std::string(pinned.message()), ::testing::HasSubstr("hole punching")) << pinned;
  EXPECT_EQ(m->Pin().code(), absl::StatusCode::kFailedPrecondition) << "pinned after all";
  // And it can still be punched, which is why it must never be touched.
  EXPECT_EQ(fallocate(writer.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(pool.page_bytes)), 0);
}

TEST(HugePagesTest, AReadWriteSegmentSharesItsHugePagesWithAWritableMapping) {
  const auto pool = ReadHugePagePool();
  if (pool.page_bytes == 0 || pool.available() < 1) GTEST_SKIP() << "no available huge page here (vm.nr_hugepages)";
  auto m = SharedMemory::CreateOnHugePages("huge-rw", kBytes, ClientAccess::kReadWrite);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->size(), pool.page_bytes);
  auto w = FdMapping::Map(Dup(m->fd()), kBytes, /*writable=*/true);
  ASSERT_TRUE(w.ok()) << w.status();
  w->data()[kBytes - 1] = 7;
  EXPECT_EQ(m->data()[kBytes - 1], 7);
  m->data()[3] = 9;
  EXPECT_EQ(w->data()[3], 9);
  // A moved mapping keeps the whole-page length it unmaps with.
  const uint8_t* p = w->data();
  {
    FdMapping moved = std::move(*w);
    EXPECT_EQ(moved.page_bytes(), pool.page_bytes);
    EXPECT_EQ(w->page_bytes(), 0u) << "a moved-from mapping maps nothing";
    EXPECT_TRUE(Mapped(p));
  }
  EXPECT_FALSE(Mapped(p));
}

TEST(HugePagesTest, BasePageSegmentsAndMappingsSayTheirPageSize) {
  const size_t base = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  auto m = SharedMemory::Create("base-pages", kBytes, ClientAccess::kReadWrite);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->page_bytes(), base);
  auto r = FdMapping::Map(Dup(m->fd()), kBytes - 1, false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->page_bytes(), base);
  EXPECT_EQ(r->size(), kBytes - 1);
}

}  // namespace
}  // namespace kvarn
