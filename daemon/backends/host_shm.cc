#include "daemon/backends/host_shm.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvarn {
namespace bip = boost::interprocess;
namespace {

const char* KindName(RegionKind k) {
  switch (k) {
    case RegionKind::kQuant: return "quant";
    case RegionKind::kSink: return "sink";
    case RegionKind::kTail: return "tail";
  }
  return "x";
}

std::string RandomHex() {
  std::random_device rd;
  const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 0; i < 16; ++i) s[i] = kHex[(r >> (4 * i)) & 15];
  return s;
}

bool ValidInstance(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s) {
    if (!(isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_')) return false;
  }
  return true;
}

// A live process that is a kvarnd (pid reuse by another program does not count).
bool KvarndAlive(pid_t pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream comm(absl::StrCat("/proc/", pid, "/comm"));
  std::string name;
  if (!(comm >> name)) return true;  // cannot tell: keep it
  return absl::StartsWith(name, "kvarnd");
}

class ShmRegion final : public Region {
 public:
  ShmRegion(std::string name, bip::mapped_region region, size_t size)
      : name_(std::move(name)), region_(std::move(region)), size_(size) {}
  ~ShmRegion() override { bip::shared_memory_object::remove(name_.c_str()); }

  uint8_t* data() const override { return static_cast<uint8_t*>(region_.get_address()); }
  size_t size() const override { return size_; }
  void Discard(size_t offset, size_t len) override {
    // Frees the tmpfs pages behind the range; later reads see zeros.
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t lo = (offset + page - 1) / page * page, hi = (offset + len) / page * page;
    if (hi > lo) madvise(data() + lo, hi - lo, MADV_REMOVE);
  }
  SegmentInfo Describe() const override { return SegmentInfo{name_, size_, "", -1}; }

 private:
  std::string name_;
  bip::mapped_region region_;
  size_t size_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<HostShmBackend>> HostShmBackend::Create(const std::string& instance) {
  if (!ValidInstance(instance)) {
    return absl::InvalidArgumentError("instance name must be 1..64 letters, digits, '-' or '_'");
  }
  return std::unique_ptr<HostShmBackend>(new HostShmBackend(instance));
}

absl::StatusOr<std::unique_ptr<Region>> HostShmBackend::Create(RegionKind kind, size_t bytes, int) {
  // Shared memory needs no retention: unlinking removes the name, and a client's existing
  // mapping keeps its own pages, which are never handed to anyone else.
  const std::string name = absl::StrCat("kvarnd.", instance_, ".", getpid(), ".", RandomHex(), ".", KindName(kind));
  try {
    bip::permissions perm(0600);
    bip::shared_memory_object shm(bip::create_only, name.c_str(), bip::read_write, perm);
    shm.truncate(static_cast<bip::offset_t>(bytes == 0 ? 1 : bytes));
    bip::mapped_region region(shm, bip::read_write, 0, bytes == 0 ? 1 : bytes);
    return std::unique_ptr<Region>(new ShmRegion(name, std::move(region), bytes));
  } catch (const bip::interprocess_exception& e) {
    bip::shared_memory_object::remove(name.c_str());
    return absl::ResourceExhaustedError(absl::StrCat("cannot create shared memory ", name, " of ", bytes, " bytes: ", e.what()));
  }
}

std::vector<std::string> HostShmBackend::RemoveStaleSegments(const std::string& instance) {
  std::vector<std::string> removed;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return removed;
  const std::string prefix = absl::StrCat("kvarnd.", instance, ".");
  while (dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (!absl::StartsWith(name, prefix)) continue;
    const std::vector<std::string> parts = absl::StrSplit(name.substr(prefix.size()), '.');
    int pid = 0;
    if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &pid)) continue;
    if (pid == getpid() || KvarndAlive(pid)) continue;
    if (bip::shared_memory_object::remove(name.c_str())) removed.push_back(name);
  }
  closedir(dir);
  return removed;
}

}  // namespace kvarn
