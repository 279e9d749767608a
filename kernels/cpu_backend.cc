// The CPU backend, and the backend factory.
//
// Determinism: every per-row quantity (margin, residual, loss) depends on its
// row only, and every gradient entry is summed in double precision over its
// column's non-zeros in ascending row order, whatever the thread count. The
// serial path scatters row by row into a double accumulator; the parallel
// path transposes the batch (a stable counting sort keeps row order inside a
// column) and gathers column by column. Both add the same products in the
// same order, so any thread count gives bitwise identical results.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/backend.h"
#include "common/status_macros.h"
#include "kernels/cuda_backend.h"

namespace ps {

void CsrBatch::Clear() {
  keys.clear();
  row_ptr.assign(1, 0);
  cols.clear();
  vals.clear();
  labels.clear();
}

absl::Status ValidateCsrBatch(const CsrBatch& batch) {
  if (batch.row_ptr.empty()) {
    return absl::InvalidArgumentError("CsrBatch: row_ptr is empty (needs rows+1 entries)");
  }
  const size_t rows = batch.rows();
  const size_t nnz = batch.nnz();
  if (rows > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("CsrBatch: too many rows: ", rows));
  }
  if (batch.vals.size() != nnz) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CsrBatch: ", nnz, " cols but ", batch.vals.size(), " vals"));
  }
  if (batch.labels.size() != rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CsrBatch: ", rows, " rows but ", batch.labels.size(), " labels"));
  }
  if (batch.row_ptr.front() != 0 ||
      batch.row_ptr.back() != static_cast<int64_t>(nnz)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CsrBatch: row_ptr must run from 0 to nnz=", nnz, ", got ",
        batch.row_ptr.front(), "..", batch.row_ptr.back()));
  }
  for (size_t i = 0; i < rows; ++i) {
    if (batch.row_ptr[i + 1] < batch.row_ptr[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("CsrBatch: row_ptr decreases at row ", i));
    }
    const float y = batch.labels[i];
    if (y != 0.0f && y != 1.0f) {
      return absl::InvalidArgumentError(
          absl::StrCat("CsrBatch: label of row ", i, " is ", y, ", not 0 or 1"));
    }
  }
  const size_t num_cols = batch.num_cols();
  for (size_t k = 0; k < nnz; ++k) {
    if (batch.cols[k] >= num_cols) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CsrBatch: column ", batch.cols[k], " at non-zero ", k,
          " out of range (num_cols=", num_cols, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidatePredictArgs(const CsrBatch& batch,
                                 absl::Span<const float> w,
                                 absl::Span<float> prob) {
  if (w.size() != batch.num_cols() || prob.size() != batch.rows()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LogisticPredict: batch has ", batch.num_cols(), " columns and ",
        batch.rows(), " rows but w has ", w.size(), " and prob ", prob.size(),
        " entries"));
  }
  return ValidateCsrBatch(batch);
}

absl::StatusOr<int64_t> ComputeBackend::SubmitGradient(
    const CsrBatch& batch, absl::Span<const float> w) {
  Done* slot = done_[0].ticket < 0 ? &done_[0]
               : done_[1].ticket < 0 ? &done_[1]
                                      : nullptr;
  if (slot == nullptr) {
    return absl::FailedPreconditionError(
        "SubmitGradient: two gradients are already in flight; collect one");
  }
  slot->grad.assign(batch.num_cols(), 0.0f);
  PS_RETURN_IF_ERROR(
      LogisticGradient(batch, w, absl::MakeSpan(slot->grad), &slot->loss));
  slot->ticket = next_ticket_++;
  return slot->ticket;
}

absl::Status ComputeBackend::CollectGradient(int64_t ticket,
                                             absl::Span<float> grad,
                                             double* loss_sum) {
  for (Done& d : done_) {
    if (d.ticket != ticket || ticket < 0) continue;
    if (grad.size() != d.grad.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CollectGradient: ticket ", ticket, " has ", d.grad.size(),
          " columns but grad has ", grad.size(), " entries"));
    }
    std::copy(d.grad.begin(), d.grad.end(), grad.begin());
    if (loss_sum != nullptr) *loss_sum = d.loss;
    d.ticket = -1;
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("CollectGradient: unknown ticket ", ticket));
}

double StableSigmoid(double m) {
  if (m >= 0) return 1.0 / (1.0 + std::exp(-m));
  const double e = std::exp(m);
  return e / (1.0 + e);
}

namespace {

// softplus(z) = log(1 + exp(z)) without overflow.
inline double Softplus(double z) {
  return std::max(z, 0.0) + std::log1p(std::exp(-std::abs(z)));
}

}  // namespace

double LogisticLoss(double margin, float label) {
  // -log s(m) = softplus(-m); -log(1 - s(m)) = softplus(m).
  return label > 0.5f ? Softplus(-margin) : Softplus(margin);
}

namespace {

// Splits [0, n) into `parts` ranges of roughly equal weight, where
// prefix[i] is the total weight of items < i (prefix has n+1 entries).
// bounds gets parts+1 entries.
void SplitByWeight(const int64_t* prefix, size_t n, int parts,
                   std::vector<size_t>* bounds) {
  bounds->assign(parts + 1, n);
  (*bounds)[0] = 0;
  const int64_t total = prefix[n] - prefix[0];
  for (int t = 1; t < parts; ++t) {
    const int64_t target = prefix[0] + total * t / parts;
    (*bounds)[t] = std::lower_bound(prefix, prefix + n + 1, target) - prefix;
    (*bounds)[t] = std::max((*bounds)[t], (*bounds)[t - 1]);
  }
}

// Runs fn(t) for t in [0, parts): parts-1 fresh threads plus the caller.
template <typename Fn>
void RunParts(int parts, const Fn& fn) {
  if (parts <= 1) {
    fn(0);
    return;
  }
  std::vector<std::thread> threads;
  threads.reserve(parts - 1);
  for (int t = 1; t < parts; ++t) threads.emplace_back([&fn, t] { fn(t); });
  fn(0);
  for (auto& th : threads) th.join();
}

class CpuBackend final : public ComputeBackend {
 public:
  CpuBackend(int threads, int64_t min_parallel_nnz)
      : threads_(std::max(threads, 1)), min_parallel_nnz_(min_parallel_nnz) {}

  std::string name() const override { return "cpu"; }

  absl::Status LogisticGradient(const CsrBatch& batch,
                                absl::Span<const float> w,
                                absl::Span<float> grad,
                                double* loss_sum) override {
    if (w.size() != batch.num_cols() || grad.size() != batch.num_cols()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LogisticGradient: batch has ", batch.num_cols(), " columns but w has ",
          w.size(), " and grad ", grad.size(), " entries"));
    }
    if (absl::Status s = ValidateCsrBatch(batch); !s.ok()) return s;
    const int parts = Parts(batch);
    double loss = 0;
    if (parts <= 1) {
      SerialGradient(batch, w, grad, &loss);
    } else {
      ParallelGradient(batch, w, grad, &loss, parts);
    }
    if (loss_sum != nullptr) *loss_sum = loss;
    return absl::OkStatus();
  }

  absl::Status LogisticPredict(const CsrBatch& batch, absl::Span<const float> w,
                               absl::Span<float> prob) override {
    if (absl::Status s = ValidatePredictArgs(batch, w, prob); !s.ok()) {
      return s;
    }
    const int parts = Parts(batch);
    SplitByWeight(batch.row_ptr.data(), batch.rows(), parts, &row_bounds_);
    RunParts(parts, [&](int t) {
      for (size_t i = row_bounds_[t]; i < row_bounds_[t + 1]; ++i) {
        prob[i] = static_cast<float>(StableSigmoid(Margin(batch, w, i)));
      }
    });
    return absl::OkStatus();
  }

 private:
  int Parts(const CsrBatch& batch) const {
    if (threads_ <= 1 || static_cast<int64_t>(batch.nnz()) < min_parallel_nnz_ ||
        batch.rows() < 2) {
      return 1;
    }
    return threads_;
  }

  static double Margin(const CsrBatch& batch, absl::Span<const float> w,
                       size_t row) {
    double m = 0;
    for (int64_t k = batch.row_ptr[row]; k < batch.row_ptr[row + 1]; ++k) {
      m += static_cast<double>(w[batch.cols[k]]) *
           static_cast<double>(batch.vals[k]);
    }
    return m;
  }

  void SerialGradient(const CsrBatch& batch, absl::Span<const float> w,
                      absl::Span<float> grad, double* loss) {
    acc_.assign(batch.num_cols(), 0.0);
    for (size_t i = 0; i < batch.rows(); ++i) {
      const double m = Margin(batch, w, i);
      const double r = StableSigmoid(m) - batch.labels[i];
      *loss += LogisticLoss(m, batch.labels[i]);
      for (int64_t k = batch.row_ptr[i]; k < batch.row_ptr[i + 1]; ++k) {
        acc_[batch.cols[k]] += r * static_cast<double>(batch.vals[k]);
      }
    }
    for (size_t j = 0; j < acc_.size(); ++j) grad[j] = static_cast<float>(acc_[j]);
  }

  void ParallelGradient(const CsrBatch& batch, absl::Span<const float> w,
                        absl::Span<float> grad, double* loss, int parts) {
    const size_t rows = batch.rows();
    const size_t cols = batch.num_cols();
    const size_t nnz = batch.nnz();
    // Phase 1, by rows: residual and loss per row.
    residual_.resize(rows);
    row_loss_.resize(rows);
    SplitByWeight(batch.row_ptr.data(), rows, parts, &row_bounds_);
    RunParts(parts, [&](int t) {
      for (size_t i = row_bounds_[t]; i < row_bounds_[t + 1]; ++i) {
        const double m = Margin(batch, w, i);
        residual_[i] = StableSigmoid(m) - batch.labels[i];
        row_loss_[i] = LogisticLoss(m, batch.labels[i]);
      }
    });
    // Transpose (stable counting sort by column: row order kept per column).
    col_ptr_.assign(cols + 1, 0);
    for (size_t k = 0; k < nnz; ++k) ++col_ptr_[batch.cols[k] + 1];
    for (size_t j = 0; j < cols; ++j) col_ptr_[j + 1] += col_ptr_[j];
    t_rows_.resize(nnz);
    t_vals_.resize(nnz);
    fill_.assign(col_ptr_.begin(), col_ptr_.end() - 1);
    for (size_t i = 0; i < rows; ++i) {
      for (int64_t k = batch.row_ptr[i]; k < batch.row_ptr[i + 1]; ++k) {
        const int64_t pos = fill_[batch.cols[k]]++;
        t_rows_[pos] = static_cast<uint32_t>(i);
        t_vals_[pos] = batch.vals[k];
      }
    }
    // Phase 2, by columns: the same sums as SerialGradient, in the same order.
    SplitByWeight(col_ptr_.data(), cols, parts, &col_bounds_);
    RunParts(parts, [&](int t) {
      for (size_t j = col_bounds_[t]; j < col_bounds_[t + 1]; ++j) {
        double g = 0;
        for (int64_t p = col_ptr_[j]; p < col_ptr_[j + 1]; ++p) {
          g += residual_[t_rows_[p]] * static_cast<double>(t_vals_[p]);
        }
        grad[j] = static_cast<float>(g);
      }
    });
    for (size_t i = 0; i < rows; ++i) *loss += row_loss_[i];
  }

  // Constant after construction.
  const int threads_;
  const int64_t min_parallel_nnz_;

  // Scratch, reused between calls (hence not thread-safe).
  std::vector<double> acc_;
  std::vector<double> residual_;
  std::vector<double> row_loss_;
  std::vector<int64_t> col_ptr_;
  std::vector<int64_t> fill_;
  std::vector<uint32_t> t_rows_;
  std::vector<float> t_vals_;
  std::vector<size_t> row_bounds_;
  std::vector<size_t> col_bounds_;
};

}  // namespace

std::unique_ptr<ComputeBackend> CreateCpuBackend(int threads,
                                                 int64_t min_parallel_nnz) {
  return std::make_unique<CpuBackend>(threads, min_parallel_nnz);
}

std::string AutoLrBackend(const std::string& name, int minibatch_rows) {
  if (name == "auto" && minibatch_rows < kAutoCudaMinLrRows) return "cpu";
  return name;
}

absl::StatusOr<std::unique_ptr<ComputeBackend>> CreateBackend(
    const std::string& name, int threads) {
  if (name == "cpu") return CreateCpuBackend(threads, kDefaultMinParallelNnz);
  if (name == "cuda" || name == "auto") {
    // CreateCudaBackend answers UNAVAILABLE without a device (or in a build
    // without CUDA); "auto" then falls back to the CPU.
    absl::StatusOr<std::unique_ptr<CudaBackend>> cuda = CreateCudaBackend();
    if (cuda.ok()) return std::unique_ptr<ComputeBackend>(std::move(*cuda));
    if (name == "auto") {
      return CreateCpuBackend(threads, kDefaultMinParallelNnz);
    }
    return absl::Status(cuda.status().code(),
                        absl::StrCat("compute backend 'cuda': ",
                                     cuda.status().message()));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown compute backend '", name, "' (expected cpu, cuda or auto)"));
}

}  // namespace ps
