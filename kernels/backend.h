// Numeric kernels for sparse logistic regression behind a small interface, so
// the worker can run the same minibatch on the CPU or (later) on a GPU.
//
// The interface speaks only plain C++ types (no CUDA types), so code that
// includes this header builds with or without CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ps {

// A minibatch in CSR form, columns remapped to the minibatch's unique keys.
//
// Well-formed means: row_ptr has rows()+1 entries, starts at 0, is
// non-decreasing and ends at nnz(); cols and vals have nnz() entries; every
// cols[k] < num_cols(); labels has rows() entries, each 0 or 1.
struct CsrBatch {
  std::vector<uint64_t> keys;       // unique keys, ascending; column j <-> keys[j]
  std::vector<int64_t> row_ptr{0};  // size rows+1
  std::vector<uint32_t> cols;       // column index per non-zero
  std::vector<float> vals;          // value per non-zero
  std::vector<float> labels;        // 0 or 1 per row

  size_t rows() const { return row_ptr.empty() ? 0 : row_ptr.size() - 1; }
  size_t nnz() const { return cols.size(); }
  size_t num_cols() const { return keys.size(); }
  // Empties the batch but keeps the vectors' capacity for reuse.
  void Clear();
};

// Returns OK if `batch` is well-formed (see CsrBatch), otherwise
// INVALID_ARGUMENT saying what is wrong. O(rows + nnz).
absl::Status ValidateCsrBatch(const CsrBatch& batch);

// The argument checks every backend's LogisticPredict makes: sizes of `w`
// and `prob` against the batch, then ValidateCsrBatch.
absl::Status ValidatePredictArgs(const CsrBatch& batch,
                                 absl::Span<const float> w,
                                 absl::Span<float> prob);

// Numerically stable helpers shared by all backends (and tests).
// Sigmoid(m) = 1 / (1 + exp(-m)), never overflowing.
double StableSigmoid(double m);
// The log loss of margin m for label y (0 or 1):
// -[y log s(m) + (1-y) log(1-s(m))], computed as softplus(+-m).
double LogisticLoss(double margin, float label);

// One compute device. An instance is NOT thread-safe: one caller at a time
// (it reuses internal scratch buffers between calls). It may use threads of
// its own inside a call.
class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;
  virtual std::string name() const = 0;

  // grad[j] = sum_i (sigmoid(x_i . w) - y_i) * x_ij  (a SUM over rows, not a
  // mean); *loss_sum = sum over rows of the log loss (numerically stable,
  // finite for any finite margin). w and grad have num_cols() entries; grad
  // is overwritten. loss_sum may be null. Results are bitwise identical for
  // any thread count.
  // Errors: INVALID_ARGUMENT on a size mismatch or a malformed batch (then
  // grad and *loss_sum are unspecified).
  virtual absl::Status LogisticGradient(const CsrBatch& batch,
                                        absl::Span<const float> w,
                                        absl::Span<float> grad,
                                        double* loss_sum) = 0;

  // prob[i] = sigmoid(x_i . w) for each row i; prob has rows() entries.
  // Errors: INVALID_ARGUMENT on a size mismatch or a malformed batch.
  virtual absl::Status LogisticPredict(const CsrBatch& batch,
                                       absl::Span<const float> w,
                                       absl::Span<float> prob) = 0;

  // LogisticGradient in two halves, so that a device can compute while its
  // caller does other work (issue 12: the trainer uses these on every
  // backend, no dynamic_cast). SubmitGradient starts the gradient of
  // `batch` at `w` and returns a ticket; the inputs may be reused as soon as
  // it returns. At most two tickets may be uncollected at a time.
  // CollectGradient blocks until the ticket's gradient is ready and writes
  // it (num_cols() entries of the submitted batch) and its loss sum (may be
  // null); tickets may be collected in any order, each once. Errors:
  // INVALID_ARGUMENT as LogisticGradient, or for an unknown ticket or a grad
  // of the wrong size (the ticket is then still collectable);
  // FAILED_PRECONDITION when two tickets are already uncollected.
  //
  // The default computes the whole gradient in SubmitGradient (into a
  // buffer of its own, copied out by CollectGradient): correct anywhere,
  // but it overlaps nothing; pipelined() says whether a backend overlaps.
  virtual absl::StatusOr<int64_t> SubmitGradient(const CsrBatch& batch,
                                                 absl::Span<const float> w);
  virtual absl::Status CollectGradient(int64_t ticket, absl::Span<float> grad,
                                       double* loss_sum);
  // True when SubmitGradient returns before the gradient is computed (the
  // CUDA backend's streams), so work between Submit and Collect overlaps
  // it; the trainer then reads the next minibatch in between.
  virtual bool pipelined() const { return false; }

 private:
  // The default SubmitGradient's results, by ticket.
  struct Done {
    int64_t ticket = -1;  // -1: the slot is free
    std::vector<float> grad;
    double loss = 0;
  };
  Done done_[2];
  int64_t next_ticket_ = 0;
};

// "cpu" -> the CPU backend using `threads` threads (<= 1: the caller's thread
// only). "cuda" -> the CUDA backend (kernels/cuda_backend.h) on device 0;
// UNAVAILABLE "... no CUDA device found" without a device, or "... built
// without CUDA support" in a CPU-only build. "auto" -> the CUDA backend when
// a device is usable, else the CPU one.
// Anything else -> INVALID_ARGUMENT naming the backend.
absl::StatusOr<std::unique_ptr<ComputeBackend>> CreateBackend(
    const std::string& name, int threads);

// The smallest minibatch, in rows, for which training.backend "auto" puts
// logistic regression's gradient on a GPU. Measured on an H200 host
// (docs/benchmarks.md, "Third GPU run"): at 100 rows the CPU backend took
// a third of the GPU's time, at 1000 rows about as long (and the quick-start
// job, 1000-row minibatches, ran 5 % slower on 19 % more CPU on the GPU), at
// 10,000 rows four times as long. A GPU also costs each worker a CUDA
// context (about 0.3 GB of host memory).
inline constexpr int kAutoCudaMinLrRows = 4000;
// The backend name "auto" stands for when training logistic regression on
// minibatches of `minibatch_rows`: "cpu" below kAutoCudaMinLrRows, else
// "auto" (the GPU where one is usable). Any other name is returned as is.
std::string AutoLrBackend(const std::string& name, int minibatch_rows);

// The CPU backend with an explicit parallelism threshold: a call whose batch
// has fewer than `min_parallel_nnz` non-zeros runs on the caller's thread
// only (starting threads costs more than it saves on tiny batches). Results
// do not depend on `threads` or the threshold. CreateBackend("cpu", t) uses
// kDefaultMinParallelNnz.
inline constexpr int64_t kDefaultMinParallelNnz = 1 << 16;
std::unique_ptr<ComputeBackend> CreateCpuBackend(int threads,
                                                 int64_t min_parallel_nnz);

}  // namespace ps
