#include "daemon/core/memory.h"

#include <cstdlib>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvarn {
namespace {

class HeapRegion final : public Region {
 public:
  HeapRegion(uint8_t* data, size_t size) : data_(data), size_(size) {}
  ~HeapRegion() override { std::free(data_); }
  uint8_t* data() const override { return data_; }
  size_t size() const override { return size_; }
  SegmentInfo Describe() const override { return SegmentInfo{size_, "", -1, 0}; }

 private:
  uint8_t* data_;
  size_t size_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Region>> HeapBackend::Create(RegionKind, size_t bytes) {
  const size_t rounded = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (p == nullptr) return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
  std::memset(p, 0, rounded);
  return std::unique_ptr<Region>(new HeapRegion(static_cast<uint8_t*>(p), bytes));
}

}  // namespace kvarn
