// The MLP's dropout mask (kernels/mlp.h): a pure function of (seed, layer,
// index), so the CPU and CUDA backends drop exactly the same units. nvcc
// also compiles it for the device.
#pragma once

#include <cstdint>

#include "common/hash.h"

namespace ps {

// A uniform number in [0, 1) with 24 bits: unit `index` (= row * width +
// unit) of hidden layer `layer` is kept iff this is >= the dropout rate.
PS_HOST_DEVICE inline float DropoutUniform(uint64_t seed, int layer,
                                           uint64_t index) {
  const uint64_t h =
      Mix64(seed ^ Mix64((static_cast<uint64_t>(layer) << 48) ^ index));
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

}  // namespace ps
