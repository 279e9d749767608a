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
#endif

}  // namespace

size_t FirstNotAscendingPortable(const uint64_t* keys, size_t n) {
  for (size_t i = 1; i < n; ++i) {
    if (keys[i] <= keys[i - 1]) return i;
  }
  return n;
}

size_t FirstNotAscending(const uint64_t* keys, size_t n) {
#if defined(__x86_64__)
  if (kHaveAvx512) return FirstNotAscendingAvx512(keys, n);
#endif
  return FirstNotAscendingPortable(keys, n);
}

}  // namespace ps
