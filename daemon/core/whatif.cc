#include "daemon/core/whatif.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kvarn {

GhostLru::GhostLru(size_t capacity) : capacity_(capacity) {
  nodes_.reserve(std::min<size_t>(capacity, 1 << 16));
}

void GhostLru::Unlink(uint32_t i) {
  Node& n = nodes_[i];
  if (n.prev != kNone) nodes_[n.prev].next = n.next; else head_ = n.next;
  if (n.next != kNone) nodes_[n.next].prev = n.prev; else tail_ = n.prev;
  n.prev = n.next = kNone;
}

void GhostLru::PushFront(uint32_t i) {
  Node& n = nodes_[i];
  n.prev = kNone;
  n.next = head_;
  if (head_ != kNone) nodes_[head_].prev = i;
  head_ = i;
  if (tail_ == kNone) tail_ = i;
}

bool GhostLru::Touch(uint64_t key) {
  auto it = map_.find(key);
  if (it == map_.end()) return false;
  if (it->second != head_) {
    Unlink(it->second);
    PushFront(it->second);
  }
  return true;
}

void GhostLru::Insert(uint64_t key) {
  if (capacity_ == 0 || Touch(key)) return;
  uint32_t i;
  if (map_.size() < capacity_) {
    i = static_cast<uint32_t>(nodes_.size());
    nodes_.push_back({key, kNone, kNone});
  } else {  // reuse the least recently used node
    i = tail_;
    Unlink(i);
    map_.erase(nodes_[i].key);
    nodes_[i].key = key;
  }
  map_.emplace(key, i);
  PushFront(i);
}

WhatIfCache::WhatIfCache(uint32_t quant_blocks, uint32_t sink_blocks) {
  for (double s : kWhatIfScales) {
    quant_.emplace_back(static_cast<size_t>(std::floor(s * quant_blocks)));
    sink_.emplace_back(static_cast<size_t>(std::floor(s * sink_blocks)));
  }
}

uint64_t WhatIfCache::Key(const BlockHash& h) {
  uint64_t k;  // SHA-256 output: any 8 bytes are as good as a 64-bit hash of the whole
  std::memcpy(&k, h.data(), sizeof(k));
  return k;
}

void WhatIfCache::Sealed(const BlockHash& hash, BlockClass c) {
  for (size_t s = 0; s < kWhatIfScales.size(); ++s) ghost(s, c).Insert(Key(hash));
}

}  // namespace kvarn
