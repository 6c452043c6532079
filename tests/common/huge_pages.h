// What the kernel's huge page pool offers now (/proc/meminfo), for tests that put segments on
// it. deploy/test.sh reserves some for the test run (as root); without any, only the tests of
// the refusals and the fallback run.
#ifndef KVARN_TESTS_COMMON_HUGE_PAGES_H_
#define KVARN_TESTS_COMMON_HUGE_PAGES_H_

#include <cstdint>
#include <fstream>
#include <string>

namespace kvarn::testing {

struct HugePagePool {
  uint64_t page_bytes = 0;   // Hugepagesize; 0 when the kernel has no huge pages
  uint64_t total = 0;        // HugePages_Total
  uint64_t free_pages = 0;   // HugePages_Free: not in use, but some may be reserved
  uint64_t reserved = 0;     // HugePages_Rsvd: reserved by mappings, not yet in use
  uint64_t overcommit = 0;   // vm.nr_overcommit_hugepages: surplus pages the kernel may add

  // Pages a new segment can still reserve (surplus pages aside).
  uint64_t available() const { return free_pages > reserved ? free_pages - reserved : 0; }
  // Huge pages a segment of `bytes` takes (rounded up to whole pages).
  uint64_t PagesFor(uint64_t bytes) const { return page_bytes ? (bytes + page_bytes - 1) / page_bytes : 0; }
  // More pages than the pool could ever give one segment.
  uint64_t Impossible() const { return total + overcommit + 1; }
};

inline HugePagePool ReadHugePagePool() {
  HugePagePool pool;
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t value = 0;
  while (in >> key >> value) {
    if (key == "HugePages_Total:") pool.total = value;
    if (key == "HugePages_Free:") pool.free_pages = value;
    if (key == "HugePages_Rsvd:") pool.reserved = value;
    if (key == "Hugepagesize:") pool.page_bytes = value << 10;  // in kB
    in.ignore(256, '\n');
  }
  std::ifstream("/proc/sys/vm/nr_overcommit_hugepages") >> pool.overcommit;
  return pool;
}

}  // namespace kvarn::testing

#endif  // KVARN_TESTS_COMMON_HUGE_PAGES_H_
