// The CUDA compute backend for sparse logistic regression, and what it adds
// to ComputeBackend: a choice of gradient algorithm and an asynchronous
// Submit / Collect pair that overlaps copying one minibatch to the device
// with computing the previous one. No CUDA types here: this header builds
// without CUDA (then CreateCudaBackend answers UNAVAILABLE).
//
// Most callers want CreateBackend("cuda" | "auto", ...) from backend.h; this
// header is for the benchmark, the tests and callers that pipeline batches.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/backend.h"

namespace ps {

// How X^T r is formed on the device.
enum class GradientAlgo {
  // atomicAdd of residual * value per non-zero into a double accumulator,
  // fused into the row pass (one warp per row). Default: no extra pass over
  // the data and no sort; column sums are double, so the order in which the
  // atomics land changes the result by < 1e-12 relative before rounding.
  kScatter,
  // A column-sorted copy of the batch is built on the device (stable radix
  // sort of (column, non-zero) pairs), then each column is summed by one
  // warp. Deterministic (bitwise reproducible run to run); slower by the cost
  // of the sort. See kernels/kernel_bench for the measured difference.
  kSegmented,
};
const char* GradientAlgoName(GradientAlgo algo);

// OK when the process can use a CUDA device; otherwise UNAVAILABLE "no CUDA
// device found" (with the CUDA error when there is one) or, in a build
// without CUDA, UNAVAILABLE "built without CUDA support".
absl::Status CudaDeviceAvailable();

// Properties of device 0, for reports. UNAVAILABLE as CudaDeviceAvailable.
struct CudaDeviceInfo {
  std::string name;
  int sm_count = 0;
  int64_t global_memory_bytes = 0;
};
absl::StatusOr<CudaDeviceInfo> GetCudaDeviceInfo();

// Measured device-to-device copy bandwidth in bytes/s (read + write counted),
// copying `bytes` a few times. UNAVAILABLE as CudaDeviceAvailable; INTERNAL
// on a CUDA error.
absl::StatusOr<double> MeasureDeviceBandwidth(size_t bytes);

// LogisticGradient / LogisticPredict as the CPU backend (results within
// 1e-5 relative of it; see GradientAlgo for determinism). Not thread-safe,
// like every ComputeBackend.
class CudaBackend : public ComputeBackend {
 public:
  // Starts computing the gradient of `batch` at `w` and returns a ticket at
  // once. The inputs are copied (into pinned host buffers) before Submit
  // returns, so the caller may reuse them. Two batches may be in flight at
  // a time (each on its own CUDA stream): submitting batch k+1 before
  // collecting batch k overlaps k+1's host-to-device copy with k's kernels.
  // Errors: INVALID_ARGUMENT as LogisticGradient; FAILED_PRECONDITION when
  // two tickets are already uncollected; INTERNAL on a CUDA error.
  absl::StatusOr<int64_t> SubmitGradient(
      const CsrBatch& batch, absl::Span<const float> w) override = 0;
  // Blocks until ticket's gradient is ready and writes it (num_cols()
  // entries of the submitted batch) and the loss sum (may be null).
  // Tickets may be collected in any order, each once. Errors:
  // INVALID_ARGUMENT for an unknown ticket or a grad of the wrong size (the
  // ticket is then still collectable); INTERNAL on a CUDA error.
  absl::Status CollectGradient(int64_t ticket, absl::Span<float> grad,
                               double* loss_sum) override = 0;
  bool pipelined() const override { return true; }

  virtual GradientAlgo algo() const = 0;
};

// A backend on device 0. UNAVAILABLE "no CUDA device found" without a
// device (or "built without CUDA support").
absl::StatusOr<std::unique_ptr<CudaBackend>> CreateCudaBackend(
    GradientAlgo algo = GradientAlgo::kScatter);

}  // namespace ps
