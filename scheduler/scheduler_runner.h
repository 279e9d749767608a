// Runs a scheduler process: loads the config, serves gRPC, detects failures,
// returns when the job has ended.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/config.h"

namespace ps {

struct SchedulerRunOptions {
  std::string config_path;             // empty: defaults
  std::vector<std::string> overrides;  // "section.field=value"
  int port = -1;                       // -1: from cluster.scheduler
  std::string report_path;
  // Scheduler restart (issue 9): SchedulerOptions::state_path. A scheduler
  // started with the state file of this job's running predecessor takes
  // the job over.
  std::string state_path;
  // Listen on a non-loopback address without a token (CheckBindAllowed).
  bool insecure = false;
  // Issue 11: the metrics endpoint's port (ResolveMetricsPort: this when
  // >= 0, else $PS_METRICS_PORT, else observability.metrics_port; 0: none).
  int metrics_port = -1;
  // Called once, with the port it listens on, as soon as it listens (before
  // any node can have registered), e.g. to publish a port the kernel chose
  // (port 0).
  std::function<void(int port)> on_listening;
  // Signals (blocked in every thread by the caller: BlockSignals in
  // common/process.h) that cancel the job: it ends as failed with
  // CANCELLED ("cancelled: received SIGTERM"), the report says so, the
  // nodes are told, and RunScheduler returns that status.
  std::vector<int> cancel_signals;
};

// Loads `path` (defaults when empty) and applies the overrides in order
// (LoadJobConfigWithOverrides). Errors name the file and field. RunScheduler
// then checks the machine (CheckJobResources: data files readable, model_dir
// writable with free space) when it listens on loopback (a one-host job).
absl::StatusOr<JobConfig> LoadConfigWithOverrides(
    const std::string& path, const std::vector<std::string>& overrides);

// OK when the job finished; the failure otherwise (INVALID_ARGUMENT for a
// bad config).
absl::Status RunScheduler(const SchedulerRunOptions& options);

}  // namespace ps
