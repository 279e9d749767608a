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
  // home[b][j]: the home line of key start + j of the block in buffer b.
  // A block ahead is 32 to 64 keys ahead: as far as a lookup's miss needs
  // (Table's kPrefetchDistance is 16 keys of a slower loop).
  constexpr size_t kBlock = 32;
  size_t home[2][kBlock];
  auto hash_block = [&](size_t start, size_t* out) {
    const size_t end = std::min(n, start + kBlock);
    for (size_t i = start; i < end; ++i) {
      out[i - start] = HomeLine(keys[i]);
      __builtin_prefetch(&lines_[out[i - start]]);
    }
  };
  hash_block(0, home[0]);
  for (size_t start = 0, buf = 0; start < n; start += kBlock, buf ^= 1) {
    if (start + kBlock < n) hash_block(start + kBlock, home[buf ^ 1]);
    const size_t end = std::min(n, start + kBlock);
    for (size_t i = start; i < end; ++i) {
      const size_t b = home[buf][i - start];
      const Line& l = lines_[b];
      const uint32_t m = keys[i] != 0 ? MatchesNonZero(l, keys[i])
                                      : Matches(l, keys[i]);
      if (m != 0) {
        slots[i] = l.e[__builtin_ctz(m)].slot;
      } else if (!Full(l)) {
        slots[i] = none;
      } else {
        const Entry* e = FindEntryFrom((b + 1) & line_mask_, keys[i]);
        slots[i] = e == nullptr ? none : e->slot;
      }
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
