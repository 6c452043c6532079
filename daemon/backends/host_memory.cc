#include "daemon/backends/host_memory.h"

#include "absl/strings/str_cat.h"
#include "common/shared_memory.h"

namespace kvarn {

class HostMemoryBackend::HostRegion final : public Region {
 public:
  // `huge_bytes`: the counter this region's bytes are added to while it lives, or null.
  HostRegion(SharedMemory memory, std::shared_ptr<std::array<std::atomic<uint64_t>, kRegionKinds>> huge_bytes, RegionKind kind)
      : memory_(std::move(memory)), huge_bytes_(std::move(huge_bytes)), kind_(kind) {
    if (huge_bytes_) (*huge_bytes_)[static_cast<int>(kind_)].fetch_add(memory_.size(), std::memory_order_relaxed);
  }
  ~HostRegion() override {
    if (huge_bytes_) (*huge_bytes_)[static_cast<int>(kind_)].fetch_sub(memory_.size(), std::memory_order_relaxed);
  }
  uint8_t* data() const override { return memory_.data(); }
  size_t size() const override { return memory_.size(); }
  SegmentInfo Describe() const override { return SegmentInfo{memory_.size(), "", -1, 0}; }
  int fd() const override { return memory_.fd(); }
  absl::Status Pin() override { return memory_.Pin(); }

 private:
  SharedMemory memory_;
  std::shared_ptr<std::array<std::atomic<uint64_t>, kRegionKinds>> huge_bytes_;
  RegionKind kind_;
};

absl::StatusOr<std::unique_ptr<Region>> HostMemoryBackend::Create(RegionKind kind, size_t bytes) {
  const ClientAccess access = kind == RegionKind::kTail ? ClientAccess::kReadWrite : ClientAccess::kReadOnly;
  const std::string name = absl::StrCat("kvarnd.", instance_, ".", RegionKindName(kind));
  if (huge_pages_ != HugePages::kOff) {
    auto m = SharedMemory::CreateOnHugePages(name, bytes, access);
    if (m.ok()) return std::unique_ptr<Region>(new HostRegion(std::move(*m), huge_bytes_, kind));
    const bool unavailable = absl::IsResourceExhausted(m.status()) || absl::IsFailedPrecondition(m.status());
    if (huge_pages_ == HugePages::kOn || !unavailable) {
      return absl::Status(m.status().code(),
                          absl::StrCat(m.status().message(), " (huge_pages = ", huge_pages_ == HugePages::kOn ? "on" : "try", ")"));
    }
  }
  auto m = SharedMemory::Create(name, bytes, access);
  if (!m.ok()) return m.status();
  if (huge_pages_ != HugePages::kOff) fallbacks_.fetch_add(1, std::memory_order_relaxed);  // try, and no room
  return std::unique_ptr<Region>(new HostRegion(std::move(*m), nullptr, kind));
}

uint64_t HostMemoryBackend::HugePageBytes(RegionKind kind) const {
  return (*huge_bytes_)[static_cast<int>(kind)].load(std::memory_order_relaxed);
}

}  // namespace kvarn
