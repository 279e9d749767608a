// The table of CUDA entry points libps_cuda.so exports (kernels/cuda_entry.cc)
// and cuda_loader.cc loads on first use: the CUDA toolkit's libraries
// (cudart, cuBLAS, cuDNN) cost a process about half a CPU-second of static
// initialisation when they are linked, paid by every worker of every job on
// machines with no GPU at all. Internal to kernels/.
#pragma once

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda_backend.h"
#include "kernels/mlp.h"

namespace ps::cuda_internal {

// Bumped whenever the table changes: a library of another build is refused.
inline constexpr int kCudaApiVersion = 1;

struct CudaApi {
  int version;
  absl::Status (*device_available)();
  absl::StatusOr<CudaDeviceInfo> (*device_info)();
  absl::StatusOr<double> (*measure_bandwidth)(size_t bytes);
  absl::StatusOr<std::unique_ptr<CudaBackend>> (*create_backend)(
      GradientAlgo algo);
  absl::StatusOr<std::unique_ptr<MlpBackend>> (*create_mlp_backend)();
};

}  // namespace ps::cuda_internal

// Exported by libps_cuda.so.
extern "C" const ps::cuda_internal::CudaApi* ps_cuda_api();
