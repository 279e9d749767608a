#include "common/radix_sort.h"

#include <array>
#include <cstddef>
#include <numeric>
#include <utility>

#include "absl/base/internal/raw_logging.h"

namespace ps {
namespace {

constexpr int kDigitBits = 11;
constexpr size_t kBuckets = size_t{1} << kDigitBits;
constexpr int kPasses = (64 + kDigitBits - 1) / kDigitBits;  // 6

}  // namespace

void RadixSortWithPayload(std::vector<uint64_t>* keys,
                          std::vector<uint32_t>* payload,
                          std::vector<uint64_t>* key_tmp,
                          std::vector<uint32_t>* payload_tmp) {
  ABSL_RAW_CHECK(keys->size() == payload->size(),
                 "RadixSortWithPayload: keys and payload differ in size");
  const size_t n = keys->size();
  if (n < 2) return;
  // Every pass's histogram in one read of the keys.
  std::vector<std::array<uint32_t, kBuckets>> count(kPasses);
  for (auto& c : count) c.fill(0);
  const uint64_t* k = keys->data();
  for (size_t i = 0; i < n; ++i) {
    const uint64_t x = k[i];
    for (int p = 0; p < kPasses; ++p) {
      ++count[p][(x >> (p * kDigitBits)) & (kBuckets - 1)];
    }
  }
  key_tmp->resize(n);
  payload_tmp->resize(n);
  uint64_t* src_k = keys->data();
  uint32_t* src_p = payload->data();
  uint64_t* dst_k = key_tmp->data();
  uint32_t* dst_p = payload_tmp->data();
  bool in_tmp = false;  // whether the sorted-so-far data is in the scratch
  for (int p = 0; p < kPasses; ++p) {
    std::array<uint32_t, kBuckets>& c = count[p];
    // A digit every key shares orders nothing: skip its pass.
    const int shift = p * kDigitBits;
    if (c[(src_k[0] >> shift) & (kBuckets - 1)] == n) continue;
    uint32_t sum = 0;
    for (size_t b = 0; b < kBuckets; ++b) {
      const uint32_t here = c[b];
      c[b] = sum;
      sum += here;
    }
    for (size_t i = 0; i < n; ++i) {
      const uint32_t at = c[(src_k[i] >> shift) & (kBuckets - 1)]++;
      dst_k[at] = src_k[i];
      dst_p[at] = src_p[i];
    }
    std::swap(src_k, dst_k);
    std::swap(src_p, dst_p);
    in_tmp = !in_tmp;
  }
  if (in_tmp) {
    keys->swap(*key_tmp);
    payload->swap(*payload_tmp);
  }
}

void SortUnique(absl::Span<const uint64_t> a, absl::Span<const uint64_t> b,
                std::vector<uint64_t>* unique,
                std::vector<uint32_t>* index_of) {
  const size_t n = a.size() + b.size();
  ABSL_RAW_CHECK(n <= UINT32_MAX, "SortUnique: more than 2^32 keys");
  thread_local std::vector<uint64_t> sorted, key_tmp;
  thread_local std::vector<uint32_t> pos, pos_tmp;
  sorted.assign(a.begin(), a.end());
  sorted.insert(sorted.end(), b.begin(), b.end());
  pos.resize(n);
  std::iota(pos.begin(), pos.end(), 0u);
  RadixSortWithPayload(&sorted, &pos, &key_tmp, &pos_tmp);
  unique->clear();
  index_of->resize(n);
  for (size_t i = 0; i < n; ++i) {
    if (i == 0 || sorted[i] != sorted[i - 1]) unique->push_back(sorted[i]);
    (*index_of)[pos[i]] = static_cast<uint32_t>(unique->size() - 1);
  }
}

}  // namespace ps
