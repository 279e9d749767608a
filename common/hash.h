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
