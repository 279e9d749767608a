// The dense CTR model's training app (training.model: mlp): per minibatch it
// pulls the embeddings of the batch's keys and every MLP layer from the
// parameter servers, computes the gradient on an MlpBackend (kernels/mlp.h)
// and pushes it, each push carrying the minibatch's example count (the
// servers average and apply mlp.optimizer: Adam, AdaGrad or SGD).
//
// Inputs: Criteo rows WITH field identity. The generic RowReader drops which
// field a key came from (empty fields are skipped), and the MLP needs it to
// place each embedding in the concatenated input, so Criteo files are read
// as field rows (FieldReader, OpenCriteoFields in data/data.h): 39 keys per
// row, the same keys OpenCriteo gives (integer field i -> FeatureKey(bucket,
// i), categorical field j -> FeatureKey(HashBytes(s), 13 + j)), and an empty
// field gets its own learned "missing" key MissingFieldKey(field).
//
// Integer features are embedded like categorical ones (their log^2 buckets
// are categories), so every one of the 39 fields is an embedding lookup and
// the MLP input is 39 * embedding_dim wide.
//
// Parameter-server tables (MlpTables, models/tables.h): table 0 "mlp_embeddings", dim
// embedding_dim, one key per (field, value) — the keys already carry the
// field namespace, so this one table is the 39 per-field tables without 39
// pushes per minibatch; tables 1..L "mlp_layer<l>", dim fan_in + 1, key o =
// output unit o, value = [weights..., bias] (the layout of kernels/mlp.h).
// Servers initialise the values randomly (TableConfig optimizer.init_scale),
// which breaks the symmetry of the hidden units. With mlp.wide (wide &
// deep), table L+1 "mlp_wide", dim 1, holds one linear weight per
// embedding key, updated by the `optimizer` section's rule (FTRL by default,
// as logistic regression) and initialised to 0; row b's logit is the MLP's
// plus the sum of its 39 keys' wide weights (MlpParams::logit_offset), and
// a key's wide gradient is the sum of d loss / d logit over the rows that
// hold it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/config.h"
#include "data/data.h"
#include "data/metrics.h"
#include "kernels/mlp.h"
#include "models/tables.h"
#include "proto/ps.pb.h"
#include "worker/kv_worker.h"
#include "worker/trainer.h"

namespace ps {

// Turns a block into a minibatch: unique keys ascending, slots into them.
void BuildMlpBatch(const FieldBlock& block, MlpBatch* batch);

// What the trainer needs from the parameter servers: KVWorker's calls, so
// tests can run the trainer against an in-memory store.
class ParamClient {
 public:
  virtual ~ParamClient() = default;
  virtual int64_t Pull(int table, absl::Span<const uint64_t> keys,
                       std::vector<float>* out) = 0;
  virtual int64_t Push(int table, absl::Span<const uint64_t> keys,
                       absl::Span<const float> vals, int num_examples) = 0;
  virtual absl::Status Wait(int64_t ts, absl::Time deadline) = 0;
  virtual int64_t Clock(int num_examples) = 0;
  // Push then Clock; KVWorker does both in one round trip per server.
  virtual int64_t PushAndClock(int table, absl::Span<const uint64_t> keys,
                               absl::Span<const float> vals,
                               int num_examples) {
    Push(table, keys, vals, num_examples);
    return Clock(num_examples);
  }
  virtual int64_t clock() const = 0;
};

// Forwards to a KVWorker (which must outlive it).
class KVWorkerParamClient final : public ParamClient {
 public:
  explicit KVWorkerParamClient(KVWorker* kv) : kv_(kv) {}
  int64_t Pull(int table, absl::Span<const uint64_t> keys,
               std::vector<float>* out) override {
    return kv_->Pull(table, keys, out);
  }
  int64_t Push(int table, absl::Span<const uint64_t> keys,
               absl::Span<const float> vals, int num_examples) override {
    return kv_->Push(table, keys, vals, num_examples);
  }
  absl::Status Wait(int64_t ts, absl::Time deadline) override {
    return kv_->Wait(ts, deadline);
  }
  int64_t Clock(int num_examples) override { return kv_->Clock(num_examples); }
  int64_t PushAndClock(int table, absl::Span<const uint64_t> keys,
                       absl::Span<const float> vals,
                       int num_examples) override {
    return kv_->PushAndClock(table, keys, vals, num_examples);
  }
  int64_t clock() const override { return kv_->clock(); }

 private:
  KVWorker* const kv_;
};

class MlpTrainer {
 public:
  // Everything passed must outlive the trainer.
  MlpTrainer(int worker_id, const JobConfig& config, ParamClient* params,
             MlpBackend* backend);

  // Trains training.epochs passes over `reader`, one clock per minibatch of
  // training.minibatch rows; with `eval`, records the test curve every
  // training.eval_interval_s. Errors: the reader's, the backend's, or a
  // pull/push failure (including DEADLINE_EXCEEDED after 600 s);
  // FAILED_PRECONDITION when no example was trained (CheckTrainedExamples).
  absl::Status Train(FieldReader* reader, FieldReader* eval = nullptr);
  // Trains on the work units `work` hands out (a WorkSource built with a
  // FieldOpener) until the job's work is done, as Trainer::Train does for
  // LR (issue 9): a dead worker's units are redone by the others, a worker
  // that joins takes a share. Errors as above; whether the job trained any
  // example is the scheduler's check.
  absl::Status Train(WorkSource* work, FieldReader* eval = nullptr);

  // Test metrics of the current model over all rows of `reader`.
  absl::StatusOr<EvalMetrics> Evaluate(FieldReader* reader);

  const TrainerStats& stats() const { return stats_; }
  // Safe from other threads (heartbeats).
  int64_t examples_so_far() const { return examples_.load(); }
  double wait_seconds_so_far() const { return wait_ns_.load() * 1e-9; }
  double compute_seconds_so_far() const { return compute_ns_.load() * 1e-9; }
  double loss_sum_so_far() const { return loss_sum_.load(); }

 private:
  struct Progress;
  // One minibatch: pull, gradient, push, clock. Returns the clock's
  // timestamp; *loss is the batch's summed loss.
  absl::StatusOr<int64_t> Step(const FieldBlock& block, MlpBatch* batch,
                               double* loss);
  // Progress line and test curve after a step of `rows` rows.
  absl::Status AfterStep(int epoch, size_t rows, double loss,
                         FieldReader* eval, Progress* p);
  // Pulls the batch's embeddings and all layers into emb_ / layers_, and
  // with the wide part its weights, summed per row into offset_.
  absl::Status PullParams(const MlpBatch& batch);
  // The parameters just pulled, as the backend reads them.
  MlpParams Params() const;

  const int worker_id_;
  const JobConfig& config_;
  ParamClient* const params_;
  MlpBackend* const backend_;
  const MlpShape shape_;
  std::vector<std::vector<uint64_t>> layer_keys_;  // 0..fan_out-1 per layer

  const bool wide_;
  std::vector<float> emb_, gemb_;
  std::vector<std::vector<float>> layers_, glayers_;
  std::vector<float> wide_w_, wide_g_, offset_, dlogit_;  // wide part
  TrainerStats stats_;
  std::atomic<int64_t> examples_{0};
  std::atomic<int64_t> wait_ns_{0}, compute_ns_{0};  // stats_'s, for others
  std::atomic<double> loss_sum_{0};
};

}  // namespace ps
