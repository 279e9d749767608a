// RadixSortWithPayload and SortUnique against std::sort, std::unique and
// std::lower_bound on the inputs that matter: hashed keys, keys sharing
// high or low digits (passes skipped), repeats, and the trivial sizes.
#include "common/radix_sort.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "common/hash.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

// What SortUnique must give, the slow way.
void Reference(const std::vector<uint64_t>& in, std::vector<uint64_t>* unique,
               std::vector<uint32_t>* index_of) {
  *unique = in;
  std::sort(unique->begin(), unique->end());
  unique->erase(std::unique(unique->begin(), unique->end()), unique->end());
  index_of->clear();
  for (uint64_t k : in) {
    index_of->push_back(static_cast<uint32_t>(
        std::lower_bound(unique->begin(), unique->end(), k) - unique->begin()));
  }
}

std::vector<std::vector<uint64_t>> Inputs() {
  std::mt19937_64 rng(7);
  std::vector<std::vector<uint64_t>> out = {{}, {42}, {3, 3}, {9, 1}};
  std::vector<uint64_t> hashed, small, high, dups, extremes;
  for (uint64_t i = 0; i < 30000; ++i) hashed.push_back(Mix64(i));
  for (int i = 0; i < 5000; ++i) small.push_back(rng() % 3000);  // low digits
  for (int i = 0; i < 5000; ++i) high.push_back((rng() % 500) << 53);
  for (int i = 0; i < 20000; ++i) dups.push_back(Mix64(rng() % 700));
  extremes = {UINT64_MAX, 0, UINT64_MAX, 1, uint64_t{1} << 63, 0};
  out.push_back(hashed);
  out.push_back(small);
  out.push_back(high);
  out.push_back(dups);
  out.push_back(extremes);
  return out;
}

TEST(RadixSortTest, SortsLikeStdSortAndCarriesPositionsStably) {
  for (const std::vector<uint64_t>& in : Inputs()) {
    std::vector<uint64_t> keys = in, kt;
    std::vector<uint32_t> pos(in.size()), pt;
    std::iota(pos.begin(), pos.end(), 0u);
    RadixSortWithPayload(&keys, &pos, &kt, &pt);
    std::vector<std::pair<uint64_t, uint32_t>> want;
    for (uint32_t i = 0; i < in.size(); ++i) want.emplace_back(in[i], i);
    std::stable_sort(want.begin(), want.end(),
                     [](const auto& x, const auto& y) {
                       return x.first < y.first;
                     });
    ASSERT_EQ(keys.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(keys[i], want[i].first) << "size " << in.size() << " at " << i;
      ASSERT_EQ(pos[i], want[i].second) << "size " << in.size() << " at " << i;
    }
  }
}

TEST(RadixSortTest, SortUniqueMatchesSortUniqueAndLowerBound) {
  for (const std::vector<uint64_t>& in : Inputs()) {
    for (size_t cut : {size_t{0}, in.size() / 3, in.size()}) {
      std::vector<uint64_t> unique, want_unique;
      std::vector<uint32_t> index_of, want_index;
      SortUnique(absl::MakeConstSpan(in).subspan(0, cut),
                 absl::MakeConstSpan(in).subspan(cut), &unique, &index_of);
      Reference(in, &want_unique, &want_index);
      EXPECT_EQ(unique, want_unique) << "size " << in.size() << " cut " << cut;
      EXPECT_EQ(index_of, want_index) << "size " << in.size() << " cut " << cut;
    }
  }
  // The outputs are replaced, not appended to.
  std::vector<uint64_t> unique = {5, 6};
  std::vector<uint32_t> index_of = {9, 9, 9};
  const uint64_t one[] = {7};
  SortUnique(one, {}, &unique, &index_of);
  EXPECT_EQ(unique, std::vector<uint64_t>({7}));
  EXPECT_EQ(index_of, std::vector<uint32_t>({0}));
}

}  // namespace
}  // namespace ps
