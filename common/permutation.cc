#include "common/permutation.h"

#include "common/hash.h"

namespace ps {

uint64_t ShuffleKey(uint64_t seed, ShufflePurpose purpose, int64_t epoch,
                    uint64_t stream) {
  uint64_t h = Mix64(seed ^ 0x5f3759df0badc0deULL);
  h = Mix64(h ^ static_cast<uint64_t>(purpose));
  h = Mix64(h ^ static_cast<uint64_t>(epoch));
  return Mix64(h ^ stream);
}

SeededPermutation::SeededPermutation(uint64_t key, uint64_t n) : n_(n) {
  int bits = 0;
  while (bits < 64 && (uint64_t{1} << bits) < n) ++bits;
  bits += bits & 1;  // an even width: two halves of equal size
  half_bits_ = bits / 2;
  half_mask_ = half_bits_ == 0 ? 0 : (uint64_t{1} << half_bits_) - 1;
  ShuffleRng rng(key);
  for (uint64_t& k : round_keys_) k = rng.Next();
}

uint64_t SeededPermutation::Encrypt(uint64_t x) const {
  uint64_t left = x >> half_bits_;
  uint64_t right = x & half_mask_;
  for (uint64_t k : round_keys_) {
    const uint64_t next = left ^ (Mix64(right ^ k) & half_mask_);
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

uint64_t SeededPermutation::At(uint64_t i) const {
  // Cycle walking: the Feistel network permutes [0, 4^half_bits), and the
  // cycle through i (< n) comes back below n, so this ends, on a value no
  // other position below n reaches.
  uint64_t x = Encrypt(i);
  while (x >= n_) x = Encrypt(x);
  return x;
}

uint64_t ShuffleRng::Next() {
  state_ += 0x9e3779b97f4a7c15ULL;
  return Mix64(state_);
}

}  // namespace ps
