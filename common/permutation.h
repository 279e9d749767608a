// Seeded orders for shuffling data larger than memory (data.shuffle,
// training.seed): the work-unit queue (scheduler/work_units.h) and the
// readers (data/data.h) build their orders from these. Every order is a
// pure function of its key, so a run is reproducible: nothing depends on
// timing, threads or the order calls happen in.
#pragma once

#include <cstdint>

namespace ps {

// What a key is for: keys for different purposes derived from one seed are
// unrelated.
enum class ShufflePurpose : uint64_t {
  kUnitOrder = 1,   // which plan unit each work-unit slot of an epoch holds
  kBlockOrder = 2,  // the order a reader visits the blocks of its shard
  kBuffer = 3,      // a shuffle buffer's draws
  kRowOrder = 4,    // the row order of a synthetic shard
};

// The key of one order: a hash of (seed, purpose, epoch, stream), where
// `stream` names what is shuffled (a shard's first byte or row; 0 for the
// whole plan). Distinct tuples give unrelated keys.
uint64_t ShuffleKey(uint64_t seed, ShufflePurpose purpose, int64_t epoch,
                    uint64_t stream);

// A seeded bijection of [0, n) onto itself in O(1) memory: a 4-round
// Feistel network over the smallest power of 4 that is >= n, cycle-walked
// back into [0, n). At() takes O(1) expected time (fewer than 4 walks on
// average). Const after construction, so any thread may call At().
class SeededPermutation {
 public:
  SeededPermutation(uint64_t key, uint64_t n);
  uint64_t size() const { return n_; }
  // The element at position i; requires i < size(). Distinct positions give
  // distinct elements.
  uint64_t At(uint64_t i) const;

 private:
  uint64_t Encrypt(uint64_t x) const;

  // Constant after construction.
  uint64_t n_;
  int half_bits_;
  uint64_t half_mask_;
  uint64_t round_keys_[4];
};

// A splitmix64 stream: the same key gives the same draws on every platform
// (unlike std::uniform_int_distribution). Not thread-safe.
class ShuffleRng {
 public:
  explicit ShuffleRng(uint64_t key) : state_(key) {}
  uint64_t Next();
  // Uniform in [0, n) (Lemire's multiply-shift; bias below n / 2^64);
  // requires n >= 1.
  uint64_t Below(uint64_t n) {
    return static_cast<uint64_t>(
        (static_cast<unsigned __int128>(Next()) * n) >> 64);
  }

 private:
  uint64_t state_;
};

}  // namespace ps
