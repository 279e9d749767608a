// The CUDA entry points of a build without CUDA (PS_HAVE_CUDA off): every
// one answers UNAVAILABLE, so callers need no #ifdefs.

#include "absl/status/status.h"
#include "kernels/cuda_backend.h"
#include "kernels/mlp.h"

namespace ps {

namespace {
absl::Status NoCuda() {
  return absl::UnavailableError("built without CUDA support");
}
}  // namespace

const char* GradientAlgoName(GradientAlgo algo) {
  return algo == GradientAlgo::kScatter ? "scatter" : "segmented";
}
absl::Status CudaDeviceAvailable() { return NoCuda(); }
absl::StatusOr<CudaDeviceInfo> GetCudaDeviceInfo() { return NoCuda(); }
absl::StatusOr<double> MeasureDeviceBandwidth(size_t) { return NoCuda(); }
absl::StatusOr<std::unique_ptr<CudaBackend>> CreateCudaBackend(GradientAlgo) {
  return NoCuda();
}
absl::StatusOr<std::unique_ptr<MlpBackend>> CreateCudaMlpBackend() {
  return NoCuda();
}

}  // namespace ps
