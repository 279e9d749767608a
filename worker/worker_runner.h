// Runs a worker process: registers, fetches the view and its data shard,
// trains, finishes, evaluates (worker 0) and reports to the scheduler.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config.h"
#include "transport/transport.h"
#include "proto/ps.pb.h"
#include "worker/data.h"

namespace ps {

struct WorkerRunOptions {
  std::string scheduler;  // host:port
  int requested_id = -1;
  int register_timeout_ms = 60000;
};

// How epoch `epoch` of the training data is read: data.shuffle with
// training.seed and data.shuffle_buffer_rows.
ShuffleOptions ShuffleOf(const JobConfig& config, int64_t epoch);

// Opens the reader of a training shard the scheduler assigned, for epoch
// `epoch` (rows in a seeded order for it when data.shuffle is on).
absl::StatusOr<std::unique_ptr<RowReader>> OpenTrainShard(
    const JobConfig& config, const proto::DataShard& shard, int64_t epoch);
// Opens the test set; nullptr (and OK) when the config has none.
absl::StatusOr<std::unique_ptr<RowReader>> OpenTestSet(const JobConfig& config);

// The whole life of a worker against an already-reachable cluster: used by
// the process (RunWorker) and by in-process clusters in tests.
absl::Status RunWorkerWith(int worker_id, const proto::ClusterView& view,
                           ClientFactory* clients, SchedulerClient* scheduler);

absl::Status RunWorker(const WorkerRunOptions& options);

}  // namespace ps
