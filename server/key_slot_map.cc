#include "server/key_slot_map.h"

#include <algorithm>
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

void KeySlotMap::FindMany(const uint64_t* keys, size_t n, uint32_t* slots,
                          uint32_t none) const {
  if (size_ == 0) {
    std::fill(slots, slots + n, none);
    return;
  }
  // home[i % kAhead]: the home line of key i, hashed and loaded kAhead
  // keys before it is read (one prefetch per lookup: a burst of them
  // waited on the load queue).
  constexpr size_t kAhead = 16;
  static_assert((kAhead & (kAhead - 1)) == 0);
  size_t home[kAhead];
  for (size_t i = 0; i < std::min(n, kAhead); ++i) {
    home[i] = HomeLine(keys[i]);
    __builtin_prefetch(&lines_[home[i]]);
  }
  for (size_t i = 0; i < n; ++i) {
    const size_t b = home[i % kAhead];
    if (i + kAhead < n) {
      const size_t later = HomeLine(keys[i + kAhead]);
      home[i % kAhead] = later;
      __builtin_prefetch(&lines_[later]);
    }
    const Line& l = lines_[b];
    if (const uint32_t m = Matches(l, keys[i]); m != 0) {
      slots[i] = l.e[__builtin_ctz(m)].slot;
    } else if (!Full(l)) {
      slots[i] = none;
    } else {
      const Entry* e = FindEntryFrom((b + 1) & line_mask_, keys[i]);
      slots[i] = e == nullptr ? none : e->slot;
    }
  }
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
