// Sorting 64-bit keys for the workers' minibatch building (BuildBatch,
// BuildMlpBatch): an LSD radix sort that carries each key's position. A
// minibatch's feature keys are hashes (FeatureKey), uniform over 64 bits,
// tens of thousands per batch: six counting passes cost much less than a
// comparison sort's n log n steps, and the carried positions give every
// non-zero its column in one linear pass instead of a binary search each.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace ps {

// Sorts `keys` ascending and applies the same permutation to `payload`
// (same size). Stable: equal keys keep their order. `key_tmp` and
// `payload_tmp` are scratch (resized as needed; reuse them across calls to
// avoid allocating).
void RadixSortWithPayload(std::vector<uint64_t>* keys,
                          std::vector<uint32_t>* payload,
                          std::vector<uint64_t>* key_tmp,
                          std::vector<uint32_t>* payload_tmp);

// The distinct keys of `a` followed by `b`, ascending, into *unique
// (replaced), and for each of those a.size() + b.size() keys, in order, its
// index in *unique into *index_of (replaced). What std::sort, std::unique
// and a std::lower_bound per key give, in O(n). Scratch is kept per thread.
void SortUnique(absl::Span<const uint64_t> a, absl::Span<const uint64_t> b,
                std::vector<uint64_t>* unique, std::vector<uint32_t>* index_of);

}  // namespace ps
