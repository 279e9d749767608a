#include "server/key_slot_map.h"

#include <algorithm>
#include <cstddef>
#include <random>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/cpu_features.h"
#include "common/hash_avx2.h"

namespace ps {
namespace {

#if defined(__x86_64__)
const bool kVectorFindMany = CpuHasAvx512Dq();

// home[i % kRing ...] = the home lines (Mix64(key ^ seed) & mask) of
// keys[i, min(i + 8, n)), i a multiple of 8. Lanes past n hash 0 and are
// never read.
constexpr size_t kRing = 64;
__attribute__((target("avx512f,avx512dq"), always_inline)) inline void
HomeLines8(const uint64_t* keys, size_t i, size_t n, __m512i seed,
           __m512i mask, uint64_t* home) {
  const size_t left = n - i;
  const __mmask8 valid =
      left >= 8 ? __mmask8{0xff} : static_cast<__mmask8>((1u << left) - 1);
  __m512i x = _mm512_maskz_loadu_epi64(valid, keys + i);
  // Mix64 (common/hash.h), lane by lane.
  x = _mm512_add_epi64(_mm512_xor_si512(x, seed),
                       _mm512_set1_epi64(0x9e3779b97f4a7c15LL));
  x = _mm512_mullo_epi64(_mm512_xor_si512(x, _mm512_srli_epi64(x, 30)),
                         _mm512_set1_epi64(0xbf58476d1ce4e5b9LL));
  x = _mm512_mullo_epi64(_mm512_xor_si512(x, _mm512_srli_epi64(x, 27)),
                         _mm512_set1_epi64(0x94d049bb133111ebLL));
  x = _mm512_xor_si512(x, _mm512_srli_epi64(x, 31));
  _mm512_store_si512(home + i % kRing, _mm512_and_si512(x, mask));
}

const bool kAvx2FindMany = !kVectorFindMany && CpuHasAvx2();

// home[i % kRing ...] = the home lines of keys[i, min(i + 4, n)), i a
// multiple of 4 (a tail of fewer than 4 keys one key at a time).
__attribute__((target("avx2"), always_inline)) inline void HomeLines4(
    const uint64_t* keys, size_t i, size_t n, __m256i seed, __m256i mask,
    uint64_t* home) {
  if (n - i < 4) {
    const uint64_t s = static_cast<uint64_t>(_mm256_extract_epi64(seed, 0));
    const uint64_t m = static_cast<uint64_t>(_mm256_extract_epi64(mask, 0));
    for (size_t j = i; j < n; ++j) home[j % kRing] = Mix64(keys[j] ^ s) & m;
    return;
  }
  const __m256i x =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys + i));
  _mm256_store_si256(
      reinterpret_cast<__m256i*>(home + i % kRing),
      _mm256_and_si256(hash_avx2::Mix64x4(_mm256_xor_si256(x, seed)), mask));
}
#else
constexpr bool kVectorFindMany = false;
constexpr bool kAvx2FindMany = false;
#endif

}  // namespace

bool KeySlotMap::VectorFindMany() { return kVectorFindMany; }

bool KeySlotMap::Avx2FindMany() { return kAvx2FindMany; }

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
#if defined(__x86_64__)
  if (kVectorFindMany) {
    FindManyAvx512(keys, n, slots, none);
    return;
  }
  if (kAvx2FindMany) {
    FindManyAvx2(keys, n, slots, none);
    return;
  }
#endif
  FindManyPortable(keys, n, slots, none);
}

#if defined(__x86_64__)
// FindManyPortable's loop with the hashing done 8 keys at a time and a
// line's 4 keys compared at once, and lines loaded 32 keys ahead (with
// fewer instructions a key, 16 no longer hid the loads). store_bench
// 100000 100000, 3 interleaved rounds: push to stored keys 190-197 ->
// 223-233 M keys/s, pull 189-202 -> 213-217 (16 ahead: 214-229, 205-213).
__attribute__((target("avx512f,avx512dq"))) void KeySlotMap::FindManyAvx512(
    const uint64_t* keys, size_t n, uint32_t* slots, uint32_t none) const {
  if (size_ == 0) {
    std::fill(slots, slots + n, none);
    return;
  }
  static_assert(offsetof(Entry, key) == 0 && sizeof(Line) == 64);
  constexpr size_t kAhead = 32;  // a multiple of 8, at most kRing - 8
  static_assert(kAhead % 8 == 0 && kAhead + 8 <= kRing);
  alignas(64) uint64_t home[kRing];
  const __m512i seed = _mm512_set1_epi64(static_cast<int64_t>(seed_));
  const __m512i mask = _mm512_set1_epi64(static_cast<int64_t>(line_mask_));
  for (size_t i = 0; i < std::min(n, kAhead); i += 8) {
    HomeLines8(keys, i, n, seed, mask, home);
  }
  for (size_t i = 0; i < std::min(n, kAhead); ++i) {
    __builtin_prefetch(&lines_[home[i]]);
  }
  for (size_t i = 0; i < n; ++i) {
    if (const size_t ahead = i + kAhead; ahead < n) {
      if (ahead % 8 == 0) HomeLines8(keys, ahead, n, seed, mask, home);
      __builtin_prefetch(&lines_[home[ahead % kRing]]);
    }
    const uint64_t key = keys[i];
    const size_t b = home[i % kRing];
    const Line& l = lines_[b];
    // Lanes 0, 2, 4, 6 hold the entries' keys. Key 0 also equals an
    // empty entry's: Matches tests the used flags for it.
    if (key != 0) {
      const uint32_t m = _mm512_mask_cmpeq_epi64_mask(
          0x55, _mm512_load_si512(&l),
          _mm512_set1_epi64(static_cast<int64_t>(key)));
      if (m != 0) {
        slots[i] = l.e[__builtin_ctz(m) / 2].slot;
        continue;
      }
    } else if (const uint32_t m = Matches(l, key); m != 0) {
      slots[i] = l.e[__builtin_ctz(m)].slot;
      continue;
    }
    slots[i] = SlotPastHomeLine(l, b, key, none);
  }
}

// FindManyPortable's loop on a CPU with AVX2 but not AVX-512 (AMD EPYC up
// to Zen 3, Intel before Skylake-SP): 4 keys hashed at once (each 64-bit
// multiply from three 32-bit ones), a line's 4 keys compared in two
// 256-bit compares, lines loaded 56 keys ahead (32 was no different).
// store_bench 100000 100000 and store_bench (1M keys), 3 interleaved pairs
// on a 2-vCPU AMD EPYC Zen 3 (family 25 model 1): push to stored keys
// 138-142 -> 168-177 M keys/s, pull 135-136 -> 149-163; at 1M keys push
// 69-72 -> 78-83, pull 66-67 -> 79-81.
__attribute__((target("avx2"))) void KeySlotMap::FindManyAvx2(
    const uint64_t* keys, size_t n, uint32_t* slots, uint32_t none) const {
  if (size_ == 0) {
    std::fill(slots, slots + n, none);
    return;
  }
  static_assert(offsetof(Entry, key) == 0 && sizeof(Line) == 64);
  constexpr size_t kAhead = 56;  // a multiple of 4, at most kRing - 4
  static_assert(kAhead % 4 == 0 && kAhead + 4 <= kRing);
  alignas(32) uint64_t home[kRing];
  const __m256i seed = _mm256_set1_epi64x(static_cast<int64_t>(seed_));
  const __m256i mask = _mm256_set1_epi64x(static_cast<int64_t>(line_mask_));
  for (size_t i = 0; i < std::min(n, kAhead); i += 4) {
    HomeLines4(keys, i, n, seed, mask, home);
  }
  for (size_t i = 0; i < std::min(n, kAhead); ++i) {
    __builtin_prefetch(&lines_[home[i]]);
  }
  for (size_t i = 0; i < n; ++i) {
    if (const size_t ahead = i + kAhead; ahead < n) {
      if (ahead % 4 == 0) HomeLines4(keys, ahead, n, seed, mask, home);
      __builtin_prefetch(&lines_[home[ahead % kRing]]);
    }
    const uint64_t key = keys[i];
    const size_t b = home[i % kRing];
    const Line& l = lines_[b];
    // Lanes 0 and 2 of each half hold the entries' keys. Key 0 also
    // equals an empty entry's: Matches tests the used flags for it.
    if (key != 0) {
      const __m256i k = _mm256_set1_epi64x(static_cast<int64_t>(key));
      const __m256i* half = reinterpret_cast<const __m256i*>(&l);
      const uint32_t m =
          (static_cast<uint32_t>(_mm256_movemask_pd(_mm256_castsi256_pd(
               _mm256_cmpeq_epi64(_mm256_load_si256(half), k)))) &
           5u) |
          ((static_cast<uint32_t>(_mm256_movemask_pd(_mm256_castsi256_pd(
                _mm256_cmpeq_epi64(_mm256_load_si256(half + 1), k)))) &
            5u)
           << 4);
      if (m != 0) {
        slots[i] = l.e[__builtin_ctz(m) / 2].slot;
        continue;
      }
    } else if (const uint32_t m = Matches(l, key); m != 0) {
      slots[i] = l.e[__builtin_ctz(m)].slot;
      continue;
    }
    slots[i] = SlotPastHomeLine(l, b, key, none);
  }
}
#endif

void KeySlotMap::FindManyPortable(const uint64_t* keys, size_t n,
                                  uint32_t* slots, uint32_t none) const {
  if (size_ == 0) {
    std::fill(slots, slots + n, none);
    return;
  }
  // home[i % kAhead]: the home line of key i, hashed and loaded kAhead
  // keys before it is read (one prefetch per lookup: a burst of them
  // waited on the load queue). 64 ahead rather than 16: on a CPU without
  // AVX-512 (an AMD EPYC of the first Zen, 2 vCPUs), store_bench 100000
  // 100000, 5 interleaved pairs: push to stored keys 49-56 -> 62-71 M
  // keys/s, pull 54-67 -> 74-88; batches of 1k keys (runs of ~60) no
  // slower (34-39 -> 37-42).
  constexpr size_t kAhead = 64;
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
    } else {
      slots[i] = SlotPastHomeLine(l, b, keys[i], none);
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
