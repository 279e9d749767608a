// Mix64 and UnMix64 (common/hash.h) on 4 keys at once in AVX2, for the
// key lookups of CPUs without AVX-512 (KeySlotMap::FindMany, the dense-id
// index of server/table.cc). AVX2 has no 64-bit multiply: each is made of
// three 32-bit ones. Callers must be compiled for AVX2 (a function with
// __attribute__((target("avx2")))) and run only where CpuHasAvx2().
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

namespace ps::hash_avx2 {

#define PS_AVX2_INLINE __attribute__((target("avx2"), always_inline)) inline

// x * c mod 2^64 lane by lane: x_lo * c_lo + ((x_hi * c_lo + x_lo * c_hi)
// << 32).
PS_AVX2_INLINE __m256i MulLo64(__m256i x, uint64_t c) {
  const __m256i c_lo =
      _mm256_set1_epi64x(static_cast<int64_t>(c & 0xffffffffu));
  const __m256i c_hi = _mm256_set1_epi64x(static_cast<int64_t>(c >> 32));
  const __m256i cross =
      _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(x, 32), c_lo),
                       _mm256_mul_epu32(x, c_hi));
  return _mm256_add_epi64(_mm256_mul_epu32(x, c_lo),
                          _mm256_slli_epi64(cross, 32));
}

// x ^ (x >> a) ^ (x >> b) lane by lane (b = 0: x ^ (x >> a)).
template <int a, int b = 0>
PS_AVX2_INLINE __m256i XorShifts(__m256i x) {
  __m256i y = _mm256_xor_si256(x, _mm256_srli_epi64(x, a));
  if constexpr (b != 0) y = _mm256_xor_si256(y, _mm256_srli_epi64(x, b));
  return y;
}

// Mix64 of each lane.
PS_AVX2_INLINE __m256i Mix64x4(__m256i x) {
  x = _mm256_add_epi64(
      x, _mm256_set1_epi64x(static_cast<int64_t>(0x9e3779b97f4a7c15ULL)));
  x = MulLo64(XorShifts<30>(x), 0xbf58476d1ce4e5b9ULL);
  x = MulLo64(XorShifts<27>(x), 0x94d049bb133111ebULL);
  return XorShifts<31>(x);
}

// UnMix64 of each lane.
PS_AVX2_INLINE __m256i UnMix64x4(__m256i x) {
  x = MulLo64(XorShifts<31, 62>(x), 0x319642b2d24d8ec3ULL);
  x = MulLo64(XorShifts<27, 54>(x), 0x96de1b173f119089ULL);
  x = XorShifts<30, 60>(x);
  return _mm256_sub_epi64(
      x, _mm256_set1_epi64x(static_cast<int64_t>(0x9e3779b97f4a7c15ULL)));
}

#undef PS_AVX2_INLINE

}  // namespace ps::hash_avx2

#endif  // __x86_64__
