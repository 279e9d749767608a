#include "common/key_order.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/cpu_features.h"

namespace ps {
namespace {

#if defined(__x86_64__)
const bool kHaveAvx512 = CpuHasAvx512F();

__attribute__((target("avx512f"))) size_t FirstNotAscendingAvx512(
    const uint64_t* keys, size_t n) {
  if (n < 2) return n;
  // Pairs (keys[i - 1], keys[i]) for i in [1, n): 32 at a time, their
  // compares' masks or-ed so that a block costs one branch; a block with
  // a bad pair is searched again pair by pair.
  size_t i = 1;
  for (; i + 32 <= n; i += 32) {
    __mmask8 bad = 0;
    for (size_t j = 0; j < 32; j += 8) {
      bad |= _mm512_cmple_epu64_mask(_mm512_loadu_si512(keys + i + j),
                                     _mm512_loadu_si512(keys + i + j - 1));
    }
    if (bad != 0) break;
  }
  for (; i + 8 <= n; i += 8) {
    const __mmask8 bad = _mm512_cmple_epu64_mask(
        _mm512_loadu_si512(keys + i), _mm512_loadu_si512(keys + i - 1));
    if (bad != 0) return i + static_cast<size_t>(__builtin_ctz(bad));
  }
  if (i < n) {
    // The last n - i (< 8) pairs; masked loads read nothing past n.
    const __mmask8 valid = static_cast<__mmask8>((1u << (n - i)) - 1);
    const __mmask8 bad = _mm512_mask_cmple_epu64_mask(
        valid, _mm512_maskz_loadu_epi64(valid, keys + i),
        _mm512_maskz_loadu_epi64(valid, keys + i - 1));
    if (bad != 0) return i + static_cast<size_t>(__builtin_ctz(bad));
  }
  return n;
}

const bool kHaveAvx2 = CpuHasAvx2();
#endif

}  // namespace

#if defined(__x86_64__)
// AVX2 has no unsigned compare: keys with the top bit flipped compare as
// signed ones do unsigned. Pairs 4 at a time, 32 a block as above. On a
// Zen 3 EPYC (no AVX-512), a 100k-key sparse push (pushpull_bench 1x1):
// 5.4 % of the samples in the scalar loop, 1.3 % in this one.
__attribute__((target("avx2"))) size_t FirstNotAscendingAvx2(
    const uint64_t* keys, size_t n) {
  if (n < 2) return n;
  const __m256i flip =
      _mm256_set1_epi64x(static_cast<int64_t>(uint64_t{1} << 63));
  // Lane j set where keys[i + j] > keys[i + j - 1] (4 bits).
  auto ascending4 = [&](size_t i) __attribute__((target("avx2"))) {
    const __m256i cur = _mm256_xor_si256(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys + i)), flip);
    const __m256i prev = _mm256_xor_si256(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys + i - 1)),
        flip);
    return _mm256_cmpgt_epi64(cur, prev);
  };
  size_t i = 1;
  for (; i + 32 <= n; i += 32) {
    __m256i up = ascending4(i);
    for (size_t j = 4; j < 32; j += 4) {
      up = _mm256_and_si256(up, ascending4(i + j));
    }
    if (_mm256_movemask_pd(_mm256_castsi256_pd(up)) != 0xf) break;
  }
  for (; i + 4 <= n; i += 4) {
    const int up = _mm256_movemask_pd(_mm256_castsi256_pd(ascending4(i)));
    if (up != 0xf) return i + static_cast<size_t>(__builtin_ctz(~up & 0xf));
  }
  for (; i < n; ++i) {
    if (keys[i] <= keys[i - 1]) return i;
  }
  return n;
}
#endif

size_t FirstNotAscendingPortable(const uint64_t* keys, size_t n) {
  for (size_t i = 1; i < n; ++i) {
    if (keys[i] <= keys[i - 1]) return i;
  }
  return n;
}

size_t FirstNotAscending(const uint64_t* keys, size_t n) {
#if defined(__x86_64__)
  if (kHaveAvx512) return FirstNotAscendingAvx512(keys, n);
  if (kHaveAvx2) return FirstNotAscendingAvx2(keys, n);
#endif
  return FirstNotAscendingPortable(keys, n);
}

}  // namespace ps
