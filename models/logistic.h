// Sparse logistic regression (training.model: logistic_regression): one
// weight per feature key in table 0 (models/tables.h), plus a bias key every
// row gets; the logistic-loss gradient on a ComputeBackend (kernels/).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config.h"
#include "data/data.h"
#include "data/metrics.h"
#include "kernels/backend.h"
#include "models/model.h"

namespace ps {

// The key of the bias feature every row gets.
uint64_t BiasKey();

// Turns rows [first, last) of `block` into a minibatch: unique keys
// ascending (plus the bias key), columns remapped to them.
void BuildBatch(const RowBlock& block, size_t first, size_t last,
                CsrBatch* batch);

// Fills *w with the weights of batch.keys (one float each).
using LogisticWeights =
    std::function<absl::Status(const CsrBatch& batch, std::vector<float>* w)>;
// Called with each block of predictions, in row order: the probabilities
// and the rows' labels (same size).
using PredictSink = std::function<absl::Status(absl::Span<const float> prob,
                                               absl::Span<const float> labels)>;

// Predicts every row of `reader` from where it stands (call Reset first to
// read it whole) on `backend`, in blocks of 20,000 rows batched by
// BuildBatch, with the weights `weights` gives each block; passes each
// block to `sink` (when set; its error stops the pass) and returns the
// metrics over all rows. The one prediction path of the job's evaluations
// and ps_predict, so the same weights give the same probabilities bit for
// bit.
absl::StatusOr<EvalMetrics> PredictLogistic(RowReader* reader,
                                            ComputeBackend* backend,
                                            const LogisticWeights& weights,
                                            const PredictSink& sink = nullptr);

// PredictLogistic with the weights the servers hold (pulled per block).
// Scratch of its own: safe beside training (the loop's curve and
// validation threads).
absl::StatusOr<EvalMetrics> EvaluateLogistic(ParamClient* params,
                                             ComputeBackend* backend,
                                             RowReader* reader);

// The KKT filter (the paper's section 5.1; filters.kkt_fraction): a
// feature whose pulled weight is 0 and whose gradient is small enough that
// the L1 term's optimality condition keeps it at 0 is not pushed.
struct KktFilter {
  // A feature is not pushed when its weight is 0 and |gradient| <= this
  // (in the optimizer's units: the summed gradient for ftrl, the mean for
  // sgd and adagrad, see mean_gradient). 0: off. The bias is always pushed.
  double threshold = 0;
  bool mean_gradient = false;
  // Filtered features are pushed with a zero gradient instead of being
  // left out (a zero changes nothing for a weight at 0 under ftrl, sgd and
  // adagrad): the pull's key list stays cached on the servers, and the
  // codec squeezes the zeros. On whenever filters.codec is; otherwise, with
  // key caching, whenever leaving features out would not be smaller with
  // their keys resent (kept * 12 >= all * 4 bytes).
  bool zero_filtered = false;
  bool key_caching = false;
  // filters.kkt_fraction * optimizer.l1 (off unless both are > 0).
  static KktFilter FromConfig(const JobConfig& config);
};

class LogisticModel final : public Model {
 public:
  // `params` and `backend` must outlive the model.
  LogisticModel(ParamClient* params, ComputeBackend* backend,
                KktFilter kkt = KktFilter())
      : params_(params), backend_(backend), kkt_(kkt) {}

  std::string name() const override { return "logistic regression"; }
  absl::StatusOr<BatchSource::Got> Read(BatchSource* source, size_t max_rows,
                                        int slot, int64_t* unit,
                                        size_t* rows) override;
  void Pull(int slot, int64_t at_clock) override;
  absl::Status WaitPull(int slot, absl::Time deadline) override;
  absl::Status Submit(int slot, int64_t clock) override;
  absl::Status Collect(int slot, double* loss) override;
  int64_t PushAndClock(int slot, int rows) override;
  bool pipelined() const override { return backend_->pipelined(); }
  std::pair<int, uint64_t> idle_key() const override { return {0, BiasKey()}; }
  int64_t filtered_push_bytes() const override { return filtered_bytes_; }

 private:
  struct Slot {
    CsrBatch batch;
    std::vector<float> w, grad;
    std::vector<uint64_t> kept_keys;  // the KKT filter's output
    std::vector<float> kept_grad;
    int64_t ts = -1;
    int64_t ticket = -1;  // SubmitGradient's, on a pipelined backend
    double loss = 0;
  };
  ParamClient* const params_;
  ComputeBackend* const backend_;
  const KktFilter kkt_;
  int64_t filtered_bytes_ = 0;
  RowBlock block_;
  Slot slots_[kSlots];
};

}  // namespace ps
