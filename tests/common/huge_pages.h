// What the kernel's huge page pool offers now (/proc/meminfo), for tests that put segments on
// it. CI reserves some (vm.nr_hugepages in .ci/run); a machine without any runs only the
// tests that check the refusals.
#ifndef KVARN_TESTS_COMMON_HUGE_PAGES_H_
#define KVARN_TESTS_COMMON_HUGE_PAGES_H_

#include <cstdint>
#include <fstream>
#include <string>

namespace kvarn::testing {

struct HugePagePool {
  uint64_t page_bytes = 0;  // Hugepagesize; 0 when the kernel has no huge pages
  uint64_t free_pages = 0;  // HugePages_Free
};

inline HugePagePool ReadHugePagePool() {
  HugePagePool pool;
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t value = 0;
  while (in >> key >> value) {
    if (key == "HugePages_Free:") pool.free_pages = value;
    if (key == "Hugepagesize:") pool.page_bytes = value << 10;  // in kB
    in.ignore(256, '\n');
  }
  return pool;
}

}  // namespace kvarn::testing

#endif  // KVARN_TESTS_COMMON_HUGE_PAGES_H_
