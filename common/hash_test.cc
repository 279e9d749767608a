#include "common/hash.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "common/cpu_features.h"
#include "common/hash_avx2.h"

namespace ps {
namespace {

// (Mix64 and UnMix64 themselves: routing_test.cc.)

#if defined(__x86_64__)
// Lane by lane, the AVX2 hashes give Mix64's and UnMix64's bits.
__attribute__((target("avx2"))) void CheckAvx2Lanes(const uint64_t* in) {
  alignas(32) uint64_t mixed[4];
  alignas(32) uint64_t unmixed[4];
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in));
  _mm256_store_si256(reinterpret_cast<__m256i*>(mixed), hash_avx2::Mix64x4(x));
  _mm256_store_si256(reinterpret_cast<__m256i*>(unmixed),
                     hash_avx2::UnMix64x4(x));
  for (int j = 0; j < 4; ++j) {
    ASSERT_EQ(mixed[j], Mix64(in[j])) << in[j];
    ASSERT_EQ(unmixed[j], UnMix64(in[j])) << in[j];
  }
}

TEST(HashTest, Avx2LanesMatchTheScalarHashes) {
  if (!CpuHasAvx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937_64 rng(7);
  const uint64_t edges[4] = {0, 1, ~uint64_t{0}, uint64_t{1} << 63};
  CheckAvx2Lanes(edges);
  for (int i = 0; i < 10000; ++i) {
    const uint64_t in[4] = {rng(), rng(), rng() >> (i % 64), rng() << (i % 64)};
    CheckAvx2Lanes(in);
  }
}
#endif

}  // namespace
}  // namespace ps
