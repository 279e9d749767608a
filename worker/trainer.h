// The one training loop of a worker (issue 12: both models share it):
// takes minibatches from a BatchSource, has the Model pull the weights each
// touches, compute the gradient and push it with the clock, and keeps the
// clocks moving (prefetching, pipelining, idle steps, SSP catch-up), the
// progress line, the test curve and the validation split's evaluations.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/config.h"
#include "data/data.h"
#include "data/metrics.h"
#include "models/model.h"
#include "proto/ps.pb.h"

namespace ps {

// A worker that makes fewer updates (minibatches) than this in its first
// epoch logs a warning naming a training.minibatch that would give this
// many (issue 12: minibatch 1000 on a small set gave each worker 1 to 7).
// Not 100: the auto minibatch's floor of 24 rows (common/config.h) gives
// criteo-10k's 4 workers 83 each, and trains better than 10-row updates.
inline constexpr int64_t kFewUpdatesPerEpoch = 50;

// A point of the test curve: metrics after `elapsed` and `examples`.
proto::EvalPoint MakeEvalPoint(absl::Duration elapsed, const EvalMetrics& m,
                               int64_t examples);

// Metrics of the model as the servers hold it on one data set, read from
// its start. Runs on a thread beside training: it must share no scratch or
// backend with the training thread's model.
using EvalFn = std::function<absl::StatusOr<EvalMetrics>()>;

// The epochs of one reader as a BatchSource (tests, and training without a
// scheduler): `epochs` passes, each after a Reset; the unit is the epoch.
// The reader must outlive it.
class EpochSource final : public BatchSource {
 public:
  EpochSource(RowReader* rows, int epochs) : rows_(rows), epochs_(epochs) {}
  EpochSource(FieldReader* fields, int epochs)
      : fields_(fields), epochs_(epochs) {}
  absl::StatusOr<Got> Next(size_t max_rows, RowBlock* out,
                           int64_t* unit) override;
  absl::StatusOr<Got> Next(size_t max_rows, FieldBlock* out,
                           int64_t* unit) override;
  void Pushed(int64_t, int64_t) override {}
  int epoch() const override { return epoch_; }
  proto::SkippedLines skipped() const override;
  // The reader's path and statistics (one pass).
  std::string path() const;
  ReadStats stats() const;

 private:
  template <typename Reader, typename Block>
  absl::StatusOr<Got> NextFrom(Reader* reader, size_t max_rows, Block* out,
                               int64_t* unit);
  RowReader* const rows_ = nullptr;
  FieldReader* const fields_ = nullptr;
  const int epochs_;
  int epoch_ = 0;
};

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
  // Everything passed must outlive the trainer; `model` trains through
  // `params`.
  Trainer(int worker_id, const JobConfig& config, ParamClient* params,
          Model* model);

  // Trains on the minibatches `source` hands out until it is done (with a
  // WorkSource: every epoch of the job; the scheduler cuts the epochs into
  // units). Each minibatch holds rows of one unit; after its push and
  // clock the unit is told (BatchSource::Pushed). While no unit is free
  // (others are finishing theirs, one may come back from a dead worker) the
  // worker keeps step: an empty clock and a pull of the model's idle key,
  // so BSP/SSP never wait for an idle worker. In SSP a worker more than
  // max(1, tau/8) clocks behind the other workers' lowest clock (the freshest
  // of what the scheduler and the servers' pull answers last said) skips ahead
  // to it with empty clocks, so a straggler that takes fewer units holds the
  // others back less: at each minibatch's end, and in the middle of one as soon
  // as the servers answer a watch (ParamClient::WatchOthers, kept outstanding
  // on a thread of its own) that the others got that far ahead. With a
  // staleness bound of at least one clock the next minibatch's pull is sent
  // before this one's gradient (declared at the next clock, so the bound
  // holds). When `curve` is given, evaluates it every training.eval_interval_s
  // and records the curve (on a thread beside training, so the clocks never
  // wait for it). Errors: the source's (reader, scheduler), the model's or
  // the servers'. Whether the job trained any example is the scheduler's
  // check (SchedulerCore::GetWork), or CheckTrainedExamples.
  absl::Status Train(BatchSource* source, EvalFn curve = nullptr);

  // SSP: a second source of the other workers' lowest clock (the
  // heartbeat replies'), read during Train; may be null. Must outlive Train.
  void set_others_min_clock(const std::atomic<int64_t>* v) {
    others_min_clock_ = v;
  }

  // data.validation_fraction (issue 12): `validation` (may be empty) is
  // evaluated, on a thread beside training, each time this worker starts
  // an epoch after the first (the model as it stands after the previous
  // ones; skipped when the previous evaluation is still running), and the
  // result is kept for validation_so_far().
  void set_validation(EvalFn validation) {
    validation_ = std::move(validation);
  }
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

  // The test file's malformed lines, for the report (ReportSkippedLines).
  void set_test_skipped(proto::SkippedLines s) {
    stats_.test_skipped = std::move(s);
  }

  const TrainerStats& stats() const { return stats_; }
  const Model& model() const { return *model_; }
  // Safe from other threads (heartbeats).
  int64_t examples_so_far() const { return examples_.load(); }
  double wait_seconds_so_far() const { return wait_ns_.load() * 1e-9; }
  double compute_seconds_so_far() const { return compute_ns_.load() * 1e-9; }
  double loss_sum_so_far() const { return loss_sum_.load(); }

 private:
  const int worker_id_;
  const JobConfig& config_;
  ParamClient* const params_;
  Model* const model_;
  TrainerStats stats_;
  std::atomic<int64_t> examples_{0};
  std::atomic<int64_t> wait_ns_{0}, compute_ns_{0};  // stats_'s, for others
  std::atomic<double> loss_sum_{0};
  const std::atomic<int64_t>* others_min_clock_ = nullptr;
  EvalFn validation_;
  mutable absl::Mutex validation_mu_;
  ValidationPoint validation_point_ ABSL_GUARDED_BY(validation_mu_);
};

}  // namespace ps
