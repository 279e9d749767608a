#include "server/key_slot_map.h"

#include <random>

namespace ps {

uint64_t KeySlotMap::Seed() {
  static const uint64_t seed = [] {
    std::random_device rd;
    return (uint64_t{rd()} << 32) ^ rd();
  }();
  return seed;
}

size_t KeySlotMap::LongestProbe() const {
  size_t longest = 0;
  for (size_t i = 0; i < capacity(); ++i) {
    if (entries_[i].used == 0) continue;
    const size_t probes = ((i - Home(entries_[i].key)) & mask_) + 1;
    if (probes > longest) longest = probes;
  }
  return longest;
}

void KeySlotMap::Grow() {
  const size_t old_capacity = capacity();
  const size_t capacity = old_capacity == 0 ? kMinCapacity : old_capacity * 2;
  std::unique_ptr<Entry[]> old = std::move(entries_);
  entries_ = std::make_unique<Entry[]>(capacity);  // zeroed: all empty
  mask_ = capacity - 1;
  for (size_t j = 0; j < old_capacity; ++j) {
    const Entry& e = old[j];
    if (e.used == 0) continue;
    size_t i = Home(e.key);
    while (entries_[i].used != 0) i = (i + 1) & mask_;
    entries_[i] = e;
  }
}

}  // namespace ps
