// The training application of a worker: streams its data shard in
// minibatches, pulls the weights each minibatch touches, computes the
// logistic-loss gradient on a ComputeBackend, pushes it and ends the clock.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config.h"
#include "kernels/backend.h"
#include "proto/ps.pb.h"
#include "worker/data.h"
#include "worker/kv_worker.h"
#include "worker/metrics.h"

namespace ps {

// The key of the bias feature every row gets.
uint64_t BiasKey();

// Turns rows [first, last) of `block` into a minibatch: unique keys
// ascending (plus the bias key), columns remapped to them.
void BuildBatch(const RowBlock& block, size_t first, size_t last,
                CsrBatch* batch);

// A point of the test curve: metrics after `elapsed` and `examples`.
proto::EvalPoint MakeEvalPoint(absl::Duration elapsed, const EvalMetrics& m,
                               int64_t examples);

struct TrainerStats {
  double compute_seconds = 0;  // gradient computation
  double wait_seconds = 0;     // blocked on pulls (the network + consistency)
  double wall_seconds = 0;
  int64_t examples = 0;
  double loss_sum = 0;  // training log loss, summed over examples
  std::vector<proto::EvalPoint> curve;
};

class Trainer {
 public:
  // Everything passed must outlive the trainer.
  Trainer(int worker_id, const JobConfig& config, KVWorker* kv,
          ComputeBackend* backend);

  // Trains `config.training.epochs` passes over `reader`. When `eval` is
  // given, evaluates on it every training.eval_interval_s and records the
  // curve.
  absl::Status Train(RowReader* reader, RowReader* eval = nullptr);

  // Computes test metrics of the current model on all rows of `reader`.
  absl::StatusOr<EvalMetrics> Evaluate(RowReader* reader);

  const TrainerStats& stats() const { return stats_; }
  // Safe from other threads (heartbeats).
  int64_t examples_so_far() const { return examples_.load(); }

 private:
  const int worker_id_;
  const JobConfig& config_;
  KVWorker* const kv_;
  ComputeBackend* const backend_;
  TrainerStats stats_;
  std::atomic<int64_t> examples_{0};
};

}  // namespace ps
