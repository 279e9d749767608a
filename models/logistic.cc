#include "models/logistic.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/time/clock.h"
#include "common/hash.h"
#include "common/radix_sort.h"
#include "common/status_macros.h"
#include "models/tables.h"

namespace ps {

uint64_t BiasKey() { return FeatureKey(0, 0xb1a5); }

void BuildBatch(const RowBlock& block, size_t first, size_t last,
                CsrBatch* batch) {
  batch->Clear();
  const int64_t nz_begin = block.row_ptr[first];
  const int64_t nz_end = block.row_ptr[last];
  const size_t nz = static_cast<size_t>(nz_end - nz_begin);
  // Column of each non-zero, then of the bias (index nz). Kept per thread:
  // a worker builds a batch per step.
  thread_local std::vector<uint32_t> col_at;
  const uint64_t bias = BiasKey();
  SortUnique(absl::MakeConstSpan(block.keys).subspan(nz_begin, nz),
             absl::MakeConstSpan(&bias, 1), &batch->keys, &col_at);
  const uint32_t bias_col = col_at[nz];
  batch->row_ptr.assign(1, 0);
  batch->cols.reserve(nz + (last - first));
  batch->vals.reserve(nz + (last - first));
  for (size_t r = first; r < last; ++r) {
    for (int64_t j = block.row_ptr[r]; j < block.row_ptr[r + 1]; ++j) {
      batch->cols.push_back(col_at[static_cast<size_t>(j - nz_begin)]);
      batch->vals.push_back(block.vals[j]);
    }
    batch->cols.push_back(bias_col);
    batch->vals.push_back(1.0f);
    batch->row_ptr.push_back(static_cast<int64_t>(batch->cols.size()));
    batch->labels.push_back(block.labels[r]);
  }
}

absl::StatusOr<EvalMetrics> PredictLogistic(RowReader* reader,
                                            ComputeBackend* backend,
                                            const LogisticWeights& weights,
                                            const PredictSink& sink) {
  RowBlock block;
  CsrBatch batch;
  std::vector<float> w, prob, all_prob, all_labels;
  for (;;) {
    block.Clear();
    PS_ASSIGN_OR_RETURN(size_t n, reader->Next(20000, &block));
    if (n == 0) break;
    BuildBatch(block, 0, block.rows(), &batch);
    PS_RETURN_IF_ERROR(weights(batch, &w));
    prob.assign(batch.rows(), 0.0f);
    PS_RETURN_IF_ERROR(
        backend->LogisticPredict(batch, w, absl::MakeSpan(prob)));
    if (sink) PS_RETURN_IF_ERROR(sink(prob, batch.labels));
    all_prob.insert(all_prob.end(), prob.begin(), prob.end());
    all_labels.insert(all_labels.end(), batch.labels.begin(),
                      batch.labels.end());
  }
  return Evaluate(all_prob, all_labels);
}

absl::StatusOr<EvalMetrics> EvaluateLogistic(ParamClient* params,
                                             ComputeBackend* backend,
                                             RowReader* reader) {
  return PredictLogistic(
      reader, backend,
      [params](const CsrBatch& batch, std::vector<float>* w) {
        const int64_t ts = params->Pull(kLrWeightsTable, batch.keys, w);
        return params->Wait(ts, absl::Now() + absl::Seconds(600));
      });
}

absl::StatusOr<BatchSource::Got> LogisticModel::Read(BatchSource* source,
                                                     size_t max_rows, int slot,
                                                     int64_t* unit,
                                                     size_t* rows) {
  block_.Clear();
  PS_ASSIGN_OR_RETURN(BatchSource::Got got,
                      source->Next(max_rows, &block_, unit));
  if (got == BatchSource::Got::kRows) {
    BuildBatch(block_, 0, block_.rows(), &slots_[slot].batch);
    *rows = block_.rows();
  }
  return got;
}

void LogisticModel::Pull(int slot, int64_t at_clock) {
  Slot& s = slots_[slot];
  s.ts = params_->Pull(0, s.batch.keys, &s.w, at_clock);
}

absl::Status LogisticModel::WaitPull(int slot, absl::Time deadline) {
  Slot& s = slots_[slot];
  const int64_t ts = s.ts;
  s.ts = -1;
  return params_->Wait(ts, deadline);
}

absl::Status LogisticModel::Submit(int slot, int64_t /*clock*/) {
  Slot& s = slots_[slot];
  s.grad.assign(s.batch.keys.size(), 0.0f);
  s.loss = 0;
  if (backend_->pipelined()) {
    PS_ASSIGN_OR_RETURN(s.ticket, backend_->SubmitGradient(s.batch, s.w));
    return absl::OkStatus();
  }
  return backend_->LogisticGradient(s.batch, s.w, absl::MakeSpan(s.grad),
                                    &s.loss);
}

absl::Status LogisticModel::Collect(int slot, double* loss) {
  Slot& s = slots_[slot];
  if (backend_->pipelined()) {
    PS_RETURN_IF_ERROR(
        backend_->CollectGradient(s.ticket, absl::MakeSpan(s.grad), &s.loss));
  }
  *loss = s.loss;
  return absl::OkStatus();
}

KktFilter KktFilter::FromConfig(const JobConfig& config) {
  KktFilter k;
  if (config.filters.kkt_fraction > 0 && config.optimizer.l1 > 0) {
    k.threshold = config.filters.kkt_fraction * config.optimizer.l1;
    k.mean_gradient = config.optimizer.name != "ftrl";
    k.zero_filtered = config.filters.codec != "none";
    k.key_caching = config.cluster.key_caching;
  }
  return k;
}

int64_t LogisticModel::PushAndClock(int slot, int rows) {
  Slot& s = slots_[slot];
  if (kkt_.threshold <= 0) {
    // The clock rides on the push: one round trip per server.
    return params_->PushAndClock(0, s.batch.keys, s.grad, rows);
  }
  // |g| <= threshold, with g the gradient as the server weighs it (the
  // worker's own rows standing in for the update's).
  const double limit =
      kkt_.threshold * (kkt_.mean_gradient ? std::max(rows, 1) : 1);
  const uint64_t bias = BiasKey();
  auto filtered = [&](size_t i) {
    return s.w[i] == 0.0f && std::fabs(s.grad[i]) <= limit &&
           s.batch.keys[i] != bias;
  };
  size_t out = 0;
  for (size_t i = 0; i < s.batch.keys.size(); ++i) out += filtered(i);
  const size_t kept = s.batch.keys.size() - out;
  if (kkt_.zero_filtered ||
      (kkt_.key_caching &&
       kept * (sizeof(uint64_t) + sizeof(float)) >=
           s.batch.keys.size() * sizeof(float))) {
    for (size_t i = 0; i < s.batch.keys.size(); ++i) {
      if (filtered(i)) s.grad[i] = 0.0f;
    }
    return params_->PushAndClock(0, s.batch.keys, s.grad, rows);
  }
  s.kept_keys.clear();
  s.kept_grad.clear();
  for (size_t i = 0; i < s.batch.keys.size(); ++i) {
    if (filtered(i)) {
      filtered_bytes_ += sizeof(uint64_t) + sizeof(float);
      continue;
    }
    s.kept_keys.push_back(s.batch.keys[i]);
    s.kept_grad.push_back(s.grad[i]);
  }
  return params_->PushAndClock(0, s.kept_keys, s.kept_grad, rows);
}

}  // namespace ps
