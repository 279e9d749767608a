// Dynamic work units (issue 9): each epoch's training data cut into small
// units that workers ask for when they are ready, as the OSDI'14 paper's
// scheduler hands out tasks. A slow worker takes fewer units; a dead
// worker's unfinished units go back to the queue and another worker redoes
// them, so every example is counted exactly once per epoch.
//
// Pure logic, no RPC and no clock: SchedulerCore owns a WorkQueue and calls
// it under its own mutex.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/config.h"
#include "proto/ps.pb.h"

namespace ps {

// The units of one epoch, in file (or row) order; together they cover the
// training data exactly once:
//  * synthetic: row ranges of about work_unit_rows rows;
//  * a file the scheduler can read: byte ranges of about work_unit_rows
//    lines, sized from the average line length of the file's first 64 KiB
//    (the readers cut on line boundaries, so any split is exact);
//  * a file the scheduler cannot see (it lives where the workers are):
//    part/num_parts with begin_byte = -1, 8 parts per worker, which the
//    worker cuts by its own file size.
// Never empty: at least one unit.
std::vector<proto::DataShard> PlanWorkUnits(const JobConfig& config);

// The training rows of one epoch as PlanWorkUnits sees them: synthetic
// train_rows; for a file the scheduler can read, its size over the average
// line length of its first 64 KiB; -1 when it cannot see the file.
int64_t EstimateTrainRows(const JobConfig& config);

// The mean |value| of the features in the first 64 KiB of a LIBSVM
// training file (what optimizer.feature_scale `auto` stands for); 1 for
// criteo and synthetic data (every value is 1); -1 when the file cannot be
// read or its first lines hold no feature.
double EstimateFeatureScale(const JobConfig& config);

// The worker whose queue unit `index` (0-based, of `units` an epoch) starts
// in: contiguous blocks, as the static shards were cut, so each worker
// first reads its own part of the file in order.
int PreferredWorker(int64_t index, int64_t units, int workers);

// Where a job stands, for the scheduler's progress line.
struct JobProgress {
  int epoch = 0;             // the lowest epoch not done (0-based)
  int epochs = 0;
  int64_t epoch_done = 0;    // its units done
  int64_t units_per_epoch = 0;
  int64_t done = 0;          // units done, all epochs
  int64_t total = 0;
};

// "epoch 3/20 41% (14/34 units), job 12%, ETA epoch 2s, job 1m05s" (epochs
// counted from 1): the ETAs at `units_per_s` (units done a second lately);
// "ETA unknown" while that is not positive.
std::string FormatProgress(const JobProgress& p, double units_per_s);

// Not thread-safe: the caller serialises.
//
// Each worker has its own queue (PreferredWorker, every epoch); units handed
// back by a dead worker go to a shared pool. With `steal` (SSP and ASP), a
// worker whose queue and the pool are empty takes the last unit of the
// longest other queue, so a slow worker does fewer units. Without it (BSP)
// which worker trains which unit, and in which order, depends only on the
// plan and the shuffle seed, so a BSP job is reproducible (its clocks
// combine the same batches every run) as long as no worker dies.
//
// Unit ids are slots: id = epoch * units_per_epoch() + i. Without a shuffle
// seed slot i holds plan unit i (file order, every epoch the same); with one
// (data.shuffle) it holds plan unit SeededPermutation(ShuffleKey(seed,
// kUnitOrder, epoch, 0), units_per_epoch()).At(i) (common/permutation.h),
// so which worker trains which part of the data, and in which order,
// changes every epoch. Saved states and checkpoints hold slots: restore
// them with the same plan and seed.
class WorkQueue {
 public:
  // `units` is one epoch's plan (non-empty), repeated for `epochs` epochs,
  // queued for `workers` workers (>= 1); `shuffle_seed` as above.
  WorkQueue(std::vector<proto::DataShard> units, int epochs, int workers,
            bool steal, std::optional<uint64_t> shuffle_seed = std::nullopt);

  // The next unit for `worker` (ids in [0, workers)), now assigned to it:
  // the pool's lowest id, else its own queue's lowest id (the lowest epoch
  // first), else (with steal) the last unit of the longest other queue;
  // nullopt when none is left for it.
  std::optional<proto::WorkUnit> Take(int worker);
  // Units assigned to `worker` and neither finished nor in `holding`: their
  // hand-out was lost in a reply. Returned again (still assigned to it).
  std::vector<proto::WorkUnit> Lost(int worker,
                                    const std::set<int64_t>& holding) const;
  // Records that `worker` finished unit `u.id()` with `u.examples()` rows.
  // OK again for a repeat by the same worker (idempotent); INVALID_ARGUMENT
  // for an unknown unit id or negative counts; FAILED_PRECONDITION when the
  // unit is not assigned to `worker` (it was handed back and given to
  // another worker, or finished by one).
  absl::Status Finish(int worker, const proto::FinishedUnit& u);
  // Hands back every unit assigned to `worker` and not finished, and its
  // queue, to the pool; returns how many units were in progress.
  int Release(int worker);

  // Early stopping (issue 12): the units of epochs >= `epochs` (0-based)
  // not handed out yet are dropped (counted done, with no examples), so
  // the job's data ends once the units in progress are finished. Returns
  // how many were dropped.
  int64_t StopAfter(int epochs);

  // A worker joined the running job (issue 9): it gets id num_queues()
  // and every (k+1)-th queued unit of each other queue (k = the queues
  // before it), an even share of each epoch left, so it has work in BSP
  // (no stealing) too. Returns how many units it got.
  int AddWorker();
  int num_queues() const { return static_cast<int>(own_.size()); }

  // Scheduler restart (issue 9): the queue's whole state, and a queue
  // built from the same plan, epochs, workers and steal set back to it (with
  // the queues of workers that joined since). INVALID_ARGUMENT when `s` does not fit this plan (unit count, queues,
  // epochs, an id out of range).
  void SaveTo(proto::WorkQueueState* s) const;
  absl::Status RestoreFrom(const proto::WorkQueueState& s);

  // Checkpoints (issue 9): a job restarted from a checkpoint continues the
  // data where the checkpointed job stood. Units `s` (a SaveTo of a queue
  // with this plan and epochs, any worker count) has done stay done and
  // counted; every other unit is queued afresh for this queue's workers as
  // the constructor queues it (a unit in progress then is redone whole).
  // Returns how many units were done; INVALID_ARGUMENT (nothing changed)
  // when `s` does not fit this plan (unit or epoch count).
  absl::StatusOr<int64_t> ResumeFrom(const proto::WorkQueueState& s);

  bool AllDone() const { return done_ == static_cast<int64_t>(state_.size()); }
  int64_t units_per_epoch() const {
    return static_cast<int64_t>(plan_.size());
  }
  int epochs() const { return epochs_; }
  const std::vector<proto::DataShard>& plan() const { return plan_; }
  // The plan unit slot `id` holds (see the class comment).
  int64_t PlanIndex(int64_t id) const;
  // Examples of finished units, per epoch (index = epoch).
  const std::vector<int64_t>& epoch_examples() const { return examples_; }
  // Malformed lines skipped in the finished units of epoch 0 (one pass).
  int64_t skipped_first_epoch() const { return skipped_; }
  // Units finished by `worker` (a redone unit counts for who finished it).
  int64_t finished_by(int worker) const;
  // Units finished in `epoch` (0-based; 0 for one out of range).
  int64_t done_in_epoch(int epoch) const;
  int64_t done() const { return done_; }
  JobProgress Progress() const;

 private:
  struct Unit {
    int worker = -1;  // assigned to, or who finished it
    bool done = false;
  };
  proto::WorkUnit Make(int64_t id) const;

  const std::vector<proto::DataShard> plan_;
  const int epochs_;
  const bool steal_;
  const std::optional<uint64_t> shuffle_seed_;
  std::vector<Unit> state_;          // by unit id
  // Queued ids, ascending (= ascending epoch): per worker, and the pool of
  // handed-back units.
  std::vector<std::set<int64_t>> own_;
  std::set<int64_t> pool_;
  std::map<int, std::set<int64_t>> assigned_;  // per worker, not done
  std::map<int, int64_t> finished_by_;
  std::vector<int64_t> examples_;    // per epoch
  int64_t skipped_ = 0;
  int64_t done_ = 0;
};

}  // namespace ps
