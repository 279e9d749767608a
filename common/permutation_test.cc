#include "common/permutation.h"

#include <cstdint>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace ps {
namespace {

std::vector<uint64_t> Order(uint64_t key, uint64_t n) {
  SeededPermutation p(key, n);
  std::vector<uint64_t> out;
  for (uint64_t i = 0; i < n; ++i) out.push_back(p.At(i));
  return out;
}

TEST(SeededPermutationTest, IsABijectionForEverySize) {
  std::vector<uint64_t> sizes;
  for (uint64_t n = 1; n <= 70; ++n) sizes.push_back(n);
  for (uint64_t n : {255u, 256u, 257u, 1000u, 4097u, 65536u}) sizes.push_back(n);
  for (uint64_t n : sizes) {
    SCOPED_TRACE(n);
    const std::vector<uint64_t> order = Order(/*key=*/n * 31 + 7, n);
    std::vector<bool> seen(n, false);
    for (uint64_t x : order) {
      ASSERT_LT(x, n);
      ASSERT_FALSE(seen[x]) << x << " twice";
      seen[x] = true;
    }
  }
}

TEST(SeededPermutationTest, SameKeySameOrderOtherKeyOtherOrder) {
  const std::vector<uint64_t> a = Order(42, 1000);
  EXPECT_EQ(Order(42, 1000), a);
  EXPECT_NE(Order(43, 1000), a);
  std::vector<uint64_t> identity(1000);
  for (uint64_t i = 0; i < 1000; ++i) identity[i] = i;
  EXPECT_NE(a, identity);
  // Shuffled, not shifted: few elements stay in place (about 1 expected).
  int fixed = 0;
  for (uint64_t i = 0; i < 1000; ++i) fixed += a[i] == i;
  EXPECT_LT(fixed, 10);
}

TEST(ShuffleKeyTest, EveryPartOfTheTupleChangesTheKey) {
  const uint64_t k = ShuffleKey(1, ShufflePurpose::kBuffer, 0, 0);
  EXPECT_EQ(ShuffleKey(1, ShufflePurpose::kBuffer, 0, 0), k);
  std::set<uint64_t> keys = {
      k,
      ShuffleKey(2, ShufflePurpose::kBuffer, 0, 0),
      ShuffleKey(1, ShufflePurpose::kBlockOrder, 0, 0),
      ShuffleKey(1, ShufflePurpose::kBuffer, 1, 0),
      ShuffleKey(1, ShufflePurpose::kBuffer, 0, 1),
  };
  EXPECT_EQ(keys.size(), 5u);
}

TEST(ShuffleRngTest, DeterministicAndInRange) {
  ShuffleRng a(9), b(9);
  std::vector<int> hits(7, 0);
  for (int i = 0; i < 7000; ++i) {
    const uint64_t x = a.Below(7);
    ASSERT_EQ(x, b.Below(7));
    ASSERT_LT(x, 7u);
    ++hits[x];
  }
  for (int h : hits) EXPECT_GT(h, 800);  // about 1000 each
  EXPECT_EQ(ShuffleRng(5).Below(1), 0u);
}

}  // namespace
}  // namespace ps
