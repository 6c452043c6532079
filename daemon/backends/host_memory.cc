#include "daemon/backends/host_memory.h"

#include "absl/strings/str_cat.h"
#include "common/shared_memory.h"

namespace kvarn {
namespace {

const char* KindName(RegionKind k) {
  switch (k) {
    case RegionKind::kQuant: return "quant";
    case RegionKind::kSink: return "sink";
    case RegionKind::kTail: return "tail";
  }
  return "x";
}

class HostRegion final : public Region {
 public:
  explicit HostRegion(SharedMemory memory) : memory_(std::move(memory)) {}
  uint8_t* data() const override { return memory_.data(); }
  size_t size() const override { return memory_.size(); }
  SegmentInfo Describe() const override { return SegmentInfo{memory_.size(), "", -1, 0}; }
  int fd() const override { return memory_.fd(); }

 private:
  SharedMemory memory_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Region>> HostMemoryBackend::Create(RegionKind kind, size_t bytes) {
  const ClientAccess access = kind == RegionKind::kTail ? ClientAccess::kReadWrite : ClientAccess::kReadOnly;
  auto m = SharedMemory::Create(absl::StrCat("kvarnd.", instance_, ".", KindName(kind)), bytes, access);
  if (!m.ok()) return m.status();
  return std::unique_ptr<Region>(new HostRegion(std::move(*m)));
}

}  // namespace kvarn
