// Host side of the CUDA sparse-LR backend: buffers, streams, copies and the
// order of kernel launches (the kernels are in cuda_backend.cu).
//
// Pipelining: the backend has two slots, each with its own stream, pinned
// host staging buffers and device buffers. SubmitGradient copies the batch
// into a free slot's pinned buffers, enqueues H2D copies, the kernels and the
// D2H copy of the result on the slot's stream and returns; CollectGradient
// waits on that stream. So while slot 0 computes, slot 1's copies run.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda_backend.h"
#include "kernels/cuda_internal.h"
#include "kernels/cuda_util.h"
#include "common/status_macros.h"

namespace ps {

namespace {

using cuda_internal::CudaError;
using cuda_internal::DeviceBuffer;
using cuda_internal::PinnedBuffer;

struct Slot {
  cudaStream_t stream = nullptr;
  int64_t ticket = -1;  // -1: free
  size_t rows = 0, nnz = 0, cols = 0;
  // Host staging: row_ptr | cols | vals | labels | w, packed; result: grad
  // floats then one double loss.
  PinnedBuffer h_in, h_out;
  DeviceBuffer d_row_ptr, d_cols, d_vals, d_labels, d_w;
  DeviceBuffer d_acc, d_grad, d_residual, d_row_loss, d_loss, d_scratch,
      d_prob;
};

class CudaBackendImpl final : public CudaBackend {
 public:
  explicit CudaBackendImpl(GradientAlgo algo) : algo_(algo) {}
  ~CudaBackendImpl() override {
    for (Slot& s : slots_) {
      if (s.stream != nullptr) {
        cudaStreamSynchronize(s.stream);
        cudaStreamDestroy(s.stream);
      }
    }
  }

  absl::Status Init() {
    for (Slot& s : slots_) {
      PS_CUDA_RETURN(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking),
                     "cudaStreamCreate");
    }
    return absl::OkStatus();
  }

  std::string name() const override {
    return algo_ == GradientAlgo::kScatter ? "cuda" : "cuda-segmented";
  }
  GradientAlgo algo() const override { return algo_; }

  absl::Status LogisticGradient(const CsrBatch& batch,
                                absl::Span<const float> w,
                                absl::Span<float> grad,
                                double* loss_sum) override {
    if (grad.size() != batch.num_cols()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LogisticGradient: batch has ", batch.num_cols(), " columns but w has ",
          w.size(), " and grad ", grad.size(), " entries"));
    }
    absl::StatusOr<int64_t> t = SubmitGradient(batch, w);
    if (!t.ok()) return t.status();
    return CollectGradient(*t, grad, loss_sum);
  }

  absl::Status LogisticPredict(const CsrBatch& batch, absl::Span<const float> w,
                               absl::Span<float> prob) override {
    if (absl::Status s = ValidatePredictArgs(batch, w, prob); !s.ok()) {
      return s;
    }
    Slot* s = FreeSlot();
    if (s == nullptr) {
      return absl::FailedPreconditionError(
          "LogisticPredict: collect the submitted gradients first");
    }
    if (absl::Status st = Upload(batch, w, s); !st.ok()) return st;
    if (batch.rows() > 0) {
      PS_RETURN_IF_ERROR(s->d_prob.Reserve(sizeof(float) * batch.rows()));
      PS_CUDA_RETURN(cuda_internal::LaunchRowPass(
                         s->d_row_ptr.as<int64_t>(), s->d_cols.as<uint32_t>(),
                         s->d_vals.as<float>(), s->d_labels.as<float>(),
                         s->d_w.as<float>(), batch.rows(), nullptr, nullptr,
                         nullptr, s->d_prob.as<float>(), s->stream),
                     "row pass");
      PS_CUDA_RETURN(cudaMemcpyAsync(prob.data(), s->d_prob.as<float>(),
                                     sizeof(float) * batch.rows(),
                                     cudaMemcpyDeviceToHost, s->stream),
                     "cudaMemcpy D2H");
    }
    PS_CUDA_RETURN(cudaStreamSynchronize(s->stream), "predict");
    return absl::OkStatus();
  }

  absl::StatusOr<int64_t> SubmitGradient(const CsrBatch& batch,
                                         absl::Span<const float> w) override {
    if (w.size() != batch.num_cols()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LogisticGradient: batch has ", batch.num_cols(), " columns but w has ",
          w.size(), " entries"));
    }
    if (absl::Status s = ValidateCsrBatch(batch); !s.ok()) return s;
    if (batch.nnz() > static_cast<size_t>(INT32_MAX)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LogisticGradient: the CUDA backend takes < 2^31 non-zeros, got ",
          batch.nnz()));
    }
    Slot* s = FreeSlot();
    if (s == nullptr) {
      return absl::FailedPreconditionError(
          "SubmitGradient: two gradients are already in flight; collect one");
    }
    if (absl::Status st = Upload(batch, w, s); !st.ok()) return st;
    const size_t rows = batch.rows(), cols = batch.num_cols();
    PS_RETURN_IF_ERROR(s->h_out.Reserve(sizeof(float) * cols + sizeof(double) + 8));
    PS_RETURN_IF_ERROR(s->d_grad.Reserve(sizeof(float) * cols));
    PS_RETURN_IF_ERROR(s->d_residual.Reserve(sizeof(double) * rows));
    PS_RETURN_IF_ERROR(s->d_row_loss.Reserve(sizeof(double) * rows));
    PS_RETURN_IF_ERROR(s->d_loss.Reserve(sizeof(double)));
    double* acc = nullptr;
    if (algo_ == GradientAlgo::kScatter) {
      PS_RETURN_IF_ERROR(s->d_acc.Reserve(sizeof(double) * cols));
      acc = s->d_acc.as<double>();
      PS_CUDA_RETURN(
          cudaMemsetAsync(acc, 0, sizeof(double) * cols, s->stream), "memset");
    } else {
      PS_RETURN_IF_ERROR(s->d_scratch.Reserve(cuda_internal::SegmentedScratchBytes(
                         batch.nnz(), cols)));
    }
    PS_CUDA_RETURN(cudaMemsetAsync(s->d_loss.as<double>(), 0, sizeof(double),
                                   s->stream),
                   "memset");
    PS_CUDA_RETURN(cuda_internal::LaunchRowPass(
                       s->d_row_ptr.as<int64_t>(), s->d_cols.as<uint32_t>(),
                       s->d_vals.as<float>(), s->d_labels.as<float>(),
                       s->d_w.as<float>(), rows, s->d_residual.as<double>(),
                       s->d_row_loss.as<double>(), acc, nullptr, s->stream),
                   "row pass");
    if (algo_ == GradientAlgo::kScatter) {
      PS_CUDA_RETURN(cuda_internal::LaunchToFloat(acc, cols,
                                                  s->d_grad.as<float>(),
                                                  s->stream),
                     "to float");
    } else {
      PS_CUDA_RETURN(cuda_internal::LaunchSegmentedGradient(
                         s->d_row_ptr.as<int64_t>(), s->d_cols.as<uint32_t>(),
                         s->d_vals.as<float>(), rows, batch.nnz(), cols,
                         s->d_residual.as<double>(), s->d_scratch.as<void>(),
                         s->d_scratch.capacity(), s->d_grad.as<float>(),
                         s->stream),
                     "segmented gradient");
    }
    PS_CUDA_RETURN(cuda_internal::LaunchSum(s->d_row_loss.as<double>(), rows,
                                            s->d_loss.as<double>(), s->stream),
                   "loss sum");
    // Result layout in h_out: the loss double first (aligned), then grad.
    char* out = s->h_out.as<char>();
    PS_CUDA_RETURN(cudaMemcpyAsync(out, s->d_loss.as<double>(), sizeof(double),
                                   cudaMemcpyDeviceToHost, s->stream),
                   "cudaMemcpy D2H");
    if (cols > 0) {
      PS_CUDA_RETURN(cudaMemcpyAsync(out + sizeof(double), s->d_grad.as<float>(),
                                     sizeof(float) * cols,
                                     cudaMemcpyDeviceToHost, s->stream),
                     "cudaMemcpy D2H");
    }
    s->ticket = next_ticket_++;
    return s->ticket;
  }

  absl::Status CollectGradient(int64_t ticket, absl::Span<float> grad,
                               double* loss_sum) override {
    Slot* s = nullptr;
    for (Slot& c : slots_) {
      if (ticket >= 0 && c.ticket == ticket) s = &c;
    }
    if (s == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("CollectGradient: unknown ticket ", ticket));
    }
    if (grad.size() != s->cols) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CollectGradient: ticket ", ticket, " has ", s->cols,
          " columns but grad has ", grad.size(), " entries"));
    }
    const cudaError_t e = cudaStreamSynchronize(s->stream);
    s->ticket = -1;
    if (e != cudaSuccess) return CudaError(e, "gradient");
    const char* out = s->h_out.as<char>();
    if (loss_sum != nullptr) std::memcpy(loss_sum, out, sizeof(double));
    if (s->cols > 0) {
      std::memcpy(grad.data(), out + sizeof(double), sizeof(float) * s->cols);
    }
    return absl::OkStatus();
  }

 private:
  Slot* FreeSlot() {
    // Alternate between the slots so consecutive submits use both streams.
    for (int i = 0; i < 2; ++i) {
      Slot& s = slots_[(next_slot_ + i) % 2];
      if (s.ticket < 0) {
        next_slot_ = (next_slot_ + i + 1) % 2;
        return &s;
      }
    }
    return nullptr;
  }

  // Stages the batch and w in s's pinned buffer and enqueues the H2D copies.
  // The slot is free, so its previous work has finished (Collect synced).
  absl::Status Upload(const CsrBatch& batch, absl::Span<const float> w,
                      Slot* s) {
    const size_t rows = batch.rows(), nnz = batch.nnz(),
                 cols = batch.num_cols();
    // A free slot's stream is idle unless an earlier call failed half-way;
    // then this waits for its copies before the pinned buffer is reused.
    PS_CUDA_RETURN(cudaStreamSynchronize(s->stream), "stream");
    s->rows = rows;
    s->nnz = nnz;
    s->cols = cols;
    const size_t b_rp = sizeof(int64_t) * (rows + 1);
    const size_t b_cols = sizeof(uint32_t) * nnz;
    const size_t b_vals = sizeof(float) * nnz;
    const size_t b_lab = sizeof(float) * rows;
    const size_t b_w = sizeof(float) * cols;
    // Offsets keep 8-byte alignment for the int64 row_ptr at the front.
    const size_t o_cols = b_rp, o_vals = o_cols + b_cols,
                 o_lab = o_vals + b_vals, o_w = o_lab + b_lab,
                 total = o_w + b_w;
    PS_RETURN_IF_ERROR(s->h_in.Reserve(total));
    PS_RETURN_IF_ERROR(s->d_row_ptr.Reserve(b_rp));
    PS_RETURN_IF_ERROR(s->d_cols.Reserve(b_cols + 4));
    PS_RETURN_IF_ERROR(s->d_vals.Reserve(b_vals + 4));
    PS_RETURN_IF_ERROR(s->d_labels.Reserve(b_lab + 4));
    PS_RETURN_IF_ERROR(s->d_w.Reserve(b_w + 4));
    char* h = s->h_in.as<char>();
    std::memcpy(h, batch.row_ptr.data(), b_rp);
    if (nnz > 0) {
      std::memcpy(h + o_cols, batch.cols.data(), b_cols);
      std::memcpy(h + o_vals, batch.vals.data(), b_vals);
    }
    if (rows > 0) std::memcpy(h + o_lab, batch.labels.data(), b_lab);
    if (cols > 0) std::memcpy(h + o_w, w.data(), b_w);
    const auto copy = [&](void* dst, size_t off, size_t bytes) -> absl::Status {
      if (bytes == 0) return absl::OkStatus();
      PS_CUDA_RETURN(cudaMemcpyAsync(dst, h + off, bytes,
                                     cudaMemcpyHostToDevice, s->stream),
                     "cudaMemcpy H2D");
      return absl::OkStatus();
    };
    if (absl::Status st = copy(s->d_row_ptr.as<void>(), 0, b_rp); !st.ok()) return st;
    if (absl::Status st = copy(s->d_cols.as<void>(), o_cols, b_cols); !st.ok()) return st;
    if (absl::Status st = copy(s->d_vals.as<void>(), o_vals, b_vals); !st.ok()) return st;
    if (absl::Status st = copy(s->d_labels.as<void>(), o_lab, b_lab); !st.ok()) return st;
    return copy(s->d_w.as<void>(), o_w, b_w);
  }

  const GradientAlgo algo_;
  Slot slots_[2];
  int next_slot_ = 0;
  int64_t next_ticket_ = 0;
};

}  // namespace

const char* GradientAlgoName(GradientAlgo algo) {
  return algo == GradientAlgo::kScatter ? "scatter" : "segmented";
}

absl::Status CudaDeviceAvailable() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state
    return absl::UnavailableError(
        absl::StrCat("no CUDA device found (", cudaGetErrorString(e), ")"));
  }
  if (n == 0) return absl::UnavailableError("no CUDA device found");
  return absl::OkStatus();
}

absl::StatusOr<CudaDeviceInfo> GetCudaDeviceInfo() {
  if (absl::Status s = CudaDeviceAvailable(); !s.ok()) return s;
  cudaDeviceProp p{};
  PS_CUDA_RETURN(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
  CudaDeviceInfo info;
  info.name = p.name;
  info.sm_count = p.multiProcessorCount;
  info.global_memory_bytes = static_cast<int64_t>(p.totalGlobalMem);
  return info;
}

absl::StatusOr<double> MeasureDeviceBandwidth(size_t bytes) {
  if (absl::Status s = CudaDeviceAvailable(); !s.ok()) return s;
  DeviceBuffer a, b;
  if (absl::Status s = a.Reserve(bytes); !s.ok()) return s;
  if (absl::Status s = b.Reserve(bytes); !s.ok()) return s;
  cudaEvent_t start, stop;
  PS_CUDA_RETURN(cudaEventCreate(&start), "cudaEventCreate");
  PS_CUDA_RETURN(cudaEventCreate(&stop), "cudaEventCreate");
  PS_CUDA_RETURN(cudaMemcpy(b.as<void>(), a.as<void>(), bytes,
                            cudaMemcpyDeviceToDevice),
                 "warm-up copy");
  constexpr int kReps = 10;
  cudaEventRecord(start);
  for (int i = 0; i < kReps; ++i) {
    cudaMemcpyAsync(b.as<void>(), a.as<void>(), bytes, cudaMemcpyDeviceToDevice);
  }
  cudaEventRecord(stop);
  PS_CUDA_RETURN(cudaEventSynchronize(stop), "bandwidth copy");
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return 2.0 * static_cast<double>(bytes) * kReps / (ms * 1e-3);
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CreateCudaBackend(
    GradientAlgo algo) {
  if (absl::Status s = CudaDeviceAvailable(); !s.ok()) return s;
  auto b = std::make_unique<CudaBackendImpl>(algo);
  if (absl::Status s = b->Init(); !s.ok()) return s;
  return std::unique_ptr<CudaBackend>(std::move(b));
}

}  // namespace ps
