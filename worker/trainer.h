// The training application of a worker: streams its data shard in
// minibatches, pulls the weights each minibatch touches, computes the
// logistic-loss gradient on a ComputeBackend, pushes it and ends the clock.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/config.h"
#include "data/data.h"
#include "data/metrics.h"
#include "kernels/backend.h"
#include "proto/ps.pb.h"
#include "worker/kv_worker.h"
#include "worker/work_source.h"

namespace ps {

// A worker that makes fewer updates (minibatches) than this in its first
// epoch logs a warning naming a training.minibatch that would give this
// many (issue 12: minibatch 1000 on a small set gave each worker 1 to 7).
// Not 100: the auto minibatch's floor of 24 rows (common/config.h) gives
// criteo-10k's 4 workers 83 each, and trains better than 10-row updates.
inline constexpr int64_t kFewUpdatesPerEpoch = 50;

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
  // Updates in the first epoch this worker finished, and that epoch (-1:
  // not counted); see kFewUpdatesPerEpoch.
  int64_t first_epoch_updates = -1;
  int first_epoch = -1;
  std::vector<proto::EvalPoint> curve;
  // Malformed lines skipped in one pass over the training shard (set when
  // Train returns) and over the test file (set by each Evaluate); path ""
  // when there was no such file.
  proto::SkippedLines train_skipped;
  proto::SkippedLines test_skipped;
};

// The report entry for one file read with `stats`.
proto::SkippedLines SkippedLinesOf(const std::string& path,
                                   const ReadStats& stats);

// Adds to `done` an entry for each file of `stats` that had malformed lines
// skipped, and logs a warning for each (once per call: call it once, when
// the worker reports), with the count and the first bad line.
void ReportSkippedLines(const TrainerStats& stats,
                        proto::WorkerDoneRequest* done);

// Whether a worker that trained `examples` examples from one pass over its
// shard (`path`, "" for generated data; `stats`) may report success:
//   * examples > 0: OK;
//   * its shard held no line at all while the file has bytes (more workers
//     than lines of a tiny file, or an empty synthetic row range): OK, with
//     a warning; the others train the file (the job fails only when every
//     line of the file is in shards that fail below);
//   * otherwise (an empty file, or a shard whose every line was blank or
//     skipped as malformed): FAILED_PRECONDITION "W[i] trained 0 examples
//     from <file> (<k> lines skipped)". A shard that is all malformed lines
//     fails the job even when other shards have data: the file is broken.
absl::Status CheckTrainedExamples(int worker_id, const std::string& path,
                                  const ReadStats& stats, int64_t examples);

class Trainer {
 public:
  // Everything passed must outlive the trainer.
  Trainer(int worker_id, const JobConfig& config, KVWorker* kv,
          ComputeBackend* backend);

  // Trains on the work units `work` hands out until the job's work is done
  // (every epoch: the scheduler cuts the epochs into units). Each minibatch
  // holds rows of one unit; after its push and clock the unit is told
  // (WorkSource::Pushed). While no unit is free (others are finishing
  // theirs, one may come back from a dead worker) the worker keeps step:
  // an empty clock and a pull of the bias key, so BSP/SSP never wait for
  // an idle worker. In SSP a worker more than tau/2 clocks behind the
  // other workers' lowest clock (as the scheduler last heard it) skips
  // ahead to it with empty clocks, so a
  // straggler that takes fewer units holds the others back less.
  // When `eval` is given, evaluates on it every
  // training.eval_interval_s and records the curve (on a thread beside
  // training, so the clocks never wait for it). Errors: the work
  // source's (reader, scheduler) or the servers'. Whether the job trained
  // any example is the scheduler's check (SchedulerCore::GetWork).
  absl::Status Train(WorkSource* work, RowReader* eval = nullptr);

  // Computes test metrics of the current model on all rows of `reader`.
  absl::StatusOr<EvalMetrics> Evaluate(RowReader* reader);
  // The same for the validation split: its skipped lines are the training
  // file's, already counted, so stats() is left alone.
  absl::StatusOr<EvalMetrics> EvaluateHeldOut(RowReader* reader) {
    return EvaluateOn(reader, backend_);
  }

  // SSP: a second source of the other workers' lowest clock (the
  // heartbeat replies'), read during Train; may be null. Must outlive Train.
  void set_others_min_clock(const std::atomic<int64_t>* v) {
    others_min_clock_ = v;
  }

  // data.validation_fraction (issue 12): `validation` (may be null; must
  // outlive Train) is evaluated, on a thread beside training, each time
  // this worker starts an epoch after the first (the model as it stands
  // after the previous ones; skipped when the previous evaluation is still
  // running), and the result is kept for validation_so_far().
  void set_validation(RowReader* validation) { validation_ = validation; }
  // The newest epoch-start validation evaluation (rows 0: none yet). Safe
  // from other threads (heartbeats).
  struct ValidationPoint {
    int epoch = 0;  // evaluated when this worker started epoch `epoch`
    double auc = 0, logloss = 0;
    int64_t rows = 0;
  };
  ValidationPoint validation_so_far() const {
    absl::MutexLock l(&validation_mu_);
    return validation_point_;
  }

  const TrainerStats& stats() const { return stats_; }
  // Safe from other threads (heartbeats).
  int64_t examples_so_far() const { return examples_.load(); }
  double wait_seconds_so_far() const { return wait_ns_.load() * 1e-9; }
  double compute_seconds_so_far() const { return compute_ns_.load() * 1e-9; }
  double loss_sum_so_far() const { return loss_sum_.load(); }

 private:
  const int worker_id_;
  const JobConfig& config_;
  KVWorker* const kv_;
  ComputeBackend* const backend_;
  TrainerStats stats_;
  std::atomic<int64_t> examples_{0};
  std::atomic<int64_t> wait_ns_{0}, compute_ns_{0};  // stats_'s, for others
  std::atomic<double> loss_sum_{0};
  const std::atomic<int64_t>* others_min_clock_ = nullptr;
  RowReader* validation_ = nullptr;
  mutable absl::Mutex validation_mu_;
  ValidationPoint validation_point_ ABSL_GUARDED_BY(validation_mu_);

  // Evaluate on `backend` (the curve's own, from its thread), leaving
  // stats_ alone.
  absl::StatusOr<EvalMetrics> EvaluateOn(RowReader* reader,
                                         ComputeBackend* backend);
};

}  // namespace ps
