// Hash functions for keys. Feature ids are hashed into the 64-bit key space
// so that consistent-hash ranges receive balanced load.
#pragma once

#include <cstdint>
#include <string_view>

// Functions marked so also compile for CUDA devices (kernels/dropout.h).
#if defined(__CUDACC__)
#define PS_HOST_DEVICE __host__ __device__
#else
#define PS_HOST_DEVICE
#endif

namespace ps {

// A bijective 64-bit mixer (splitmix64 finaliser): distinct inputs stay
// distinct, nearby inputs land far apart.
PS_HOST_DEVICE inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The key of feature `feature` in feature namespace `field` (0 for plain
// LIBSVM features; Criteo uses one namespace per column).
inline uint64_t FeatureKey(uint64_t feature, uint64_t field = 0) {
  return Mix64(feature ^ Mix64(field + 0x51ed27a3ULL));
}

// The inverse of Mix64: UnMix64(Mix64(x)) == x for every x.
inline uint64_t UnMix64(uint64_t x) {
  x ^= (x >> 31) ^ (x >> 62);
  x *= 0x319642b2d24d8ec3ULL;  // the inverse of 0x94d049bb133111eb mod 2^64
  x ^= (x >> 27) ^ (x >> 54);
  x *= 0x96de1b173f119089ULL;  // the inverse of 0xbf58476d1ce4e5b9 mod 2^64
  x ^= (x >> 30) ^ (x >> 60);
  return x - 0x9e3779b97f4a7c15ULL;
}

// The feature whose key in namespace `field` is `key`: FeatureOf(
// FeatureKey(f, field), field) == f. Every key is some feature's key in
// every namespace, so this says nothing about which namespace a key came
// from (a model export checks that the features it gets are plausible).
inline uint64_t FeatureOf(uint64_t key, uint64_t field = 0) {
  return UnMix64(key) ^ Mix64(field + 0x51ed27a3ULL);
}

// FNV-1a over bytes, then mixed; for string features.
inline uint64_t HashBytes(std::string_view s, uint64_t seed = 0) {
  uint64_t h = 0xcbf29ce484222325ULL ^ seed;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return Mix64(h);
}

}  // namespace ps
