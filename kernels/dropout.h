// The MLP's dropout mask (kernels/mlp.h): a pure function of (seed, layer,
// index), so the CPU and CUDA backends drop exactly the same units. Plain C++
// that nvcc also compiles for the device; no other includes.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define PS_HOST_DEVICE __host__ __device__
#else
#define PS_HOST_DEVICE
#endif

namespace ps {

// splitmix64's finaliser (as Mix64 in common/hash.h).
PS_HOST_DEVICE inline uint64_t DropoutMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A uniform number in [0, 1) with 24 bits: unit `index` (= row * width +
// unit) of hidden layer `layer` is kept iff this is >= the dropout rate.
PS_HOST_DEVICE inline float DropoutUniform(uint64_t seed, int layer,
                                           uint64_t index) {
  const uint64_t h = DropoutMix(
      seed ^ DropoutMix((static_cast<uint64_t>(layer) << 48) ^ index));
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

}  // namespace ps
