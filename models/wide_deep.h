// The dense CTR model (training.model: mlp): per minibatch it pulls the
// embeddings of the batch's keys and every MLP layer from the parameter
// servers, computes the gradient on an MlpBackend (kernels/mlp.h) and pushes
// it, each push carrying the minibatch's example count (the servers apply
// mlp.optimizer: Adam, AdaGrad or SGD, to the mean gradient).
//
// Inputs: Criteo rows WITH field identity (FieldBlock; OpenCriteoFields in
// data/data.h): 39 keys per row, the same keys OpenCriteo gives (integer
// field i -> FeatureKey(bucket, i), categorical field j -> FeatureKey(
// HashBytes(s), 13 + j)), and an empty field its own learned "missing" key
// MissingFieldKey(field). Integer features are embedded like categorical
// ones (their log^2 buckets are categories), so every one of the 39 fields
// is an embedding lookup and the MLP input is 39 * embedding_dim wide.
//
// Tables (models/tables.h): table 0 the embeddings, one key per (field,
// value) — the keys carry the field namespace, so this one table is the 39
// per-field tables without 39 pushes per minibatch; tables 1..L the layers,
// key o = output unit o, value = [weights..., bias] (kernels/mlp.h's
// layout), initialised randomly by the servers (which breaks the symmetry
// of the hidden units). With mlp.wide (wide & deep), table L+1 holds one
// linear weight per embedding key, updated by the `optimizer` section's
// rule (FTRL by default, as logistic regression) and initialised to 0; row
// b's logit is the MLP's plus the sum of its 39 keys' wide weights
// (MlpParams::logit_offset), and a key's wide gradient is the sum of
// d loss / d logit over the rows that hold it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config.h"
#include "data/data.h"
#include "data/metrics.h"
#include "kernels/mlp.h"
#include "models/model.h"
#include "models/tables.h"

namespace ps {

// Turns a block into a minibatch: unique keys ascending, slots into them.
void BuildMlpBatch(const FieldBlock& block, MlpBatch* batch);

// The wide & deep model of a job (mlp section) against `params`.
class WideDeepModel final : public Model {
 public:
  // `config`, `params` and `backend` must outlive the model. `worker_id`
  // and training.seed seed each step's dropout mask.
  WideDeepModel(int worker_id, const JobConfig& config, ParamClient* params,
                MlpBackend* backend);

  // The configured shape's error, if any (ValidateMlpShape).
  absl::Status Validate() const;

  std::string name() const override { return "mlp"; }
  absl::StatusOr<BatchSource::Got> Read(BatchSource* source, size_t max_rows,
                                        int slot, int64_t* unit,
                                        size_t* rows) override;
  void Pull(int slot, int64_t at_clock) override;
  absl::Status WaitPull(int slot, absl::Time deadline) override;
  absl::Status Submit(int slot, int64_t clock) override;
  absl::Status Collect(int slot, double* loss) override;
  int64_t PushAndClock(int slot, int rows) override;
  std::pair<int, uint64_t> idle_key() const override {
    return {kMlpFirstLayerTable, 0};
  }

  // Test metrics of the model the servers hold over every row of `reader`
  // from where it stands, predicted on `backend` in blocks of 5,000 rows.
  // Scratch of its own: safe beside training (pass a backend other than
  // the training one).
  absl::StatusOr<EvalMetrics> Evaluate(MlpBackend* backend,
                                       FieldReader* reader) const;

 private:
  // Pulled values of one minibatch.
  struct Values {
    std::vector<float> emb, wide_w, offset;
    std::vector<std::vector<float>> layers;
    std::vector<int64_t> ts;
  };
  struct Slot {
    MlpBatch batch;
    Values v;
  };
  // Sends the pulls of `batch` into *v.
  void SendPulls(const MlpBatch& batch, int64_t at_clock, Values* v) const;
  // Waits for them; with the wide part, sums each row's wide weights into
  // v->offset.
  absl::Status WaitPulls(const MlpBatch& batch, absl::Time deadline,
                         Values* v) const;
  // The values, as the backend reads them.
  MlpParams Params(const Values& v) const;

  const int worker_id_;
  const JobConfig& config_;
  ParamClient* const params_;
  MlpBackend* const backend_;
  const MlpShape shape_;
  const bool wide_;
  const int wide_table_;
  std::vector<std::vector<uint64_t>> layer_keys_;  // 0..fan_out-1 per layer
  FieldBlock block_;
  Slot slots_[kSlots];
  // The gradient of the last Submit (pushed before the next Submit).
  std::vector<float> gemb_, wide_g_, dlogit_;
  std::vector<std::vector<float>> glayers_;
  double loss_ = 0;
};

}  // namespace ps
