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
  for (size_t b = 0; b < lines(); ++b) {
    for (size_t j = 0; j < kPerLine; ++j) {
      const Entry& e = lines_[b].e[j];
      if (e.used == 0) continue;
      const size_t probes =
          ((b - HomeLine(e.key)) & line_mask_) * kPerLine + j + 1;
      if (probes > longest) longest = probes;
    }
  }
  return longest;
}

void KeySlotMap::Grow() {
  const size_t old_lines = lines();
  const size_t n = old_lines == 0 ? kMinLines : old_lines * 2;
  std::unique_ptr<Line[]> old = std::move(lines_);
  lines_ = std::make_unique<Line[]>(n);  // zeroed: all empty
  line_mask_ = n - 1;
  for (size_t b = 0; b < old_lines; ++b) {
    for (const Entry& e : old[b].e) {
      if (e.used != 0) FreeEntry(e.key) = e;
    }
  }
}

}  // namespace ps
