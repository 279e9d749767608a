// Runs a parameter-server process: serves gRPC on a free port, registers
// with the scheduler, installs the cluster view, heartbeats (catching up
// with views it missed), and returns once the job ended.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "server/server_node.h"
#include "transport/transport.h"

namespace ps {

struct ServerRunOptions {
  std::string scheduler;  // host:port
  int requested_id = -1;
  std::string bind_host;  // empty: $PS_BIND_HOST, else 127.0.0.1
  int port = 0;  // 0: any free port
  std::string advertise_host;  // empty: bind_host
  int register_timeout_ms = 60000;
  // Listen on a non-loopback address without a token (CheckBindAllowed).
  bool insecure = false;
  // Issue 11: the metrics endpoint's port (ResolveMetricsPort: this when
  // >= 0, else $PS_METRICS_PORT, else the config's
  // observability.metrics_port once registered; 0: none), on bind_host.
  int metrics_port = -1;
  // Threads that apply one large push or pull (ServerNode's
  // apply_parallelism); 0: ParallelRunner::DefaultParallelism().
  int apply_threads = 0;
  // The id this process had when it was declared dead (issue 9): it joins
  // again as a new server (RegisterRequest.rejoin_of). -1: a first join.
  int rejoin_of = -1;
};

// OK once the job ended well; ABORTED (reason JOB_FAILED) with the
// scheduler's error when it failed; UNAVAILABLE when the scheduler stayed
// unreachable for the heartbeat timeout before the model was saved.
// A server told it was declared dead while the job runs (it hung past the
// heartbeat timeout and its ranges failed over) leaves and joins the job
// again as a new server, empty, as often as that happens; OK if it cannot
// register again (the job is ending): it had no part in the job any more.
absl::Status RunServer(const ServerRunOptions& options);

// The server's own metrics at scrape time (issue 11): ps_server_keys{table},
// ps_server_ranges, ps_server_view_epoch, ps_server_non_finite_pushes_total,
// ps_server_non_finite_updates_total,
// ps_server_worker_clock{worker}. The data path's are PushPullMetrics'.
void WriteServerMetrics(const ServerNode& node, ExpositionWriter* w);

// Bug "A server that misses one view broadcast": when `scheduler_epoch`
// (from a heartbeat reply) is newer than the node's, fetches the view
// (GetView) and installs it as server `id`. OK when there was nothing to do
// or the view was installed; the GetView or Configure error otherwise
// (FAILED_PRECONDITION when the scheduler's view is not ready or not newer).
absl::Status CatchUpView(ServerNode* node, SchedulerClient* scheduler, int id,
                         int64_t scheduler_epoch, absl::Time deadline);

}  // namespace ps
