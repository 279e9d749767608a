// Runs a worker process: registers, fetches the view and its data shard,
// trains, finishes, evaluates (worker 0) and reports to the scheduler.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config.h"
#include "common/metrics.h"
#include "data/data.h"
#include "transport/transport.h"
#include "proto/ps.pb.h"

namespace ps {

struct WorkerRunOptions {
  std::string scheduler;  // host:port
  int requested_id = -1;
  int register_timeout_ms = 60000;
  // Issue 11: the metrics endpoint (a worker runs no gRPC server; its
  // /healthz is its health check): port as ResolveMetricsPort decides
  // (this when >= 0, else $PS_METRICS_PORT, else the config's
  // observability.metrics_port once registered; 0: none), on bind_host
  // (empty: $PS_BIND_HOST, else 127.0.0.1).
  int metrics_port = -1;
  std::string bind_host;
};

// Where a worker's metrics go (issue 11); both must outlive RunWorkerWith.
struct WorkerMetrics {
  MetricsRegistry* registry = nullptr;
  PushPullMetrics* push_pull = nullptr;
};

// How epoch `epoch` of the training data is read: data.shuffle with
// training.seed and data.shuffle_buffer_rows.
ShuffleOptions ShuffleOf(const JobConfig& config, int64_t epoch);

// Opens the reader of a training shard the scheduler assigned, for epoch
// `epoch` (rows in a seeded order for it when data.shuffle is on).
absl::StatusOr<std::unique_ptr<RowReader>> OpenTrainShard(
    const JobConfig& config, const proto::DataShard& shard, int64_t epoch);
// With data.validation_fraction > 0, the shard's held-out rows are left out.
// The held-out validation rows of the whole training file (or generated
// training rows), in file order; null when data.validation_fraction is 0.
absl::StatusOr<std::unique_ptr<RowReader>> OpenValidationSet(
    const JobConfig& config);
// Opens the test set; nullptr (and OK) when the config has none.
absl::StatusOr<std::unique_ptr<RowReader>> OpenTestSet(const JobConfig& config);

// The whole life of a worker against an already-reachable cluster: used by
// the process (RunWorker) and by in-process clusters in tests.
// `metrics` (may be null) gets the KVWorker's pushes and pulls and, while
// it trains, ps_worker_clock, ps_worker_examples_total,
// ps_worker_wait_seconds_total and ps_worker_wait_share.
absl::Status RunWorkerWith(int worker_id, const proto::ClusterView& view,
                           ClientFactory* clients, SchedulerClient* scheduler,
                           const WorkerMetrics* metrics = nullptr);

absl::Status RunWorker(const WorkerRunOptions& options);

}  // namespace ps
