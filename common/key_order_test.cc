#include "common/key_order.h"

#include <cstdint>
#include <random>
#include <vector>

#include "common/cpu_features.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

// Strictly ascending keys, every gap drawn (some 1, some huge), with the
// top bit set in the second half: an unsigned compare is needed.
std::vector<uint64_t> Ascending(size_t n, std::mt19937_64& rng) {
  std::vector<uint64_t> k(n);
  uint64_t v = rng() % 3;
  for (size_t i = 0; i < n; ++i) {
    k[i] = v;
    if (i == n / 2) {
      v += uint64_t{1} << 63;
    } else {
      v += 1 + (rng() % 4 == 0 ? rng() % (uint64_t{1} << 40) : 0);
    }
  }
  return k;
}

TEST(KeyOrderTest, FirstNotAscendingFindsTheFirstBadPairAnywhere) {
  std::mt19937_64 rng(5);
  for (size_t n : {0, 1, 2, 7, 8, 9, 31, 32, 33, 40, 64, 65, 100, 1000}) {
    const std::vector<uint64_t> good = Ascending(n, rng);
    EXPECT_EQ(FirstNotAscending(good.data(), n), n) << n;
    EXPECT_EQ(FirstNotAscendingPortable(good.data(), n), n) << n;
#if defined(__x86_64__)
    if (CpuHasAvx2()) EXPECT_EQ(FirstNotAscendingAvx2(good.data(), n), n);
#endif
    // A repeat (keys[i] == keys[i - 1]) or a step down at each position,
    // alone and with a later bad pair too: the first one is reported.
    for (size_t i = 1; i < n; ++i) {
      for (int kind = 0; kind < 3; ++kind) {
        std::vector<uint64_t> k = good;
        if (kind == 0) k[i] = k[i - 1];
        if (kind == 1) {  // below keys[i - 1] (equal when that is 0)
          k[i] = k[i - 1] == 0 ? 0 : k[i - 1] - 1 - rng() % k[i - 1];
        }
        if (kind == 2) {
          k[i] = k[i - 1];
          if (i + 5 < n) k[i + 5] = 0;
        }
        ASSERT_EQ(FirstNotAscending(k.data(), n), i) << n << " " << kind;
        ASSERT_EQ(FirstNotAscendingPortable(k.data(), n), i)
            << n << " " << kind;
#if defined(__x86_64__)
        if (CpuHasAvx2()) {
          ASSERT_EQ(FirstNotAscendingAvx2(k.data(), n), i) << n << " " << kind;
        }
#endif
      }
    }
  }
}

TEST(KeyOrderTest, TheCompareIsUnsigned) {
  // Signed, 1 << 63 is below 1: these ascend only unsigned.
  const uint64_t up[3] = {0, 1, uint64_t{1} << 63};
  EXPECT_EQ(FirstNotAscending(up, 3), 3u);
  const uint64_t down[3] = {0, uint64_t{1} << 63, 1};
  EXPECT_EQ(FirstNotAscending(down, 3), 2u);
  // Past the 32-key blocks and the 8-key steps too.
  std::vector<uint64_t> k(50);
  for (size_t i = 0; i < k.size(); ++i) k[i] = (uint64_t{1} << 63) + i;
  k[45] = 5;
  EXPECT_EQ(FirstNotAscending(k.data(), k.size()), 45u);
#if defined(__x86_64__)
  if (CpuHasAvx2()) {
    EXPECT_EQ(FirstNotAscendingAvx2(up, 3), 3u);
    EXPECT_EQ(FirstNotAscendingAvx2(down, 3), 2u);
    EXPECT_EQ(FirstNotAscendingAvx2(k.data(), k.size()), 45u);
  }
#endif
}

}  // namespace
}  // namespace ps
