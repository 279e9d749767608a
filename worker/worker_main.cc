// ps_worker: one training worker.
//   ps_worker --scheduler host:port [--id N]
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/process.h"
#include "transport/data_plane.h"
#include "worker/worker_runner.h"

ABSL_FLAG(std::string, scheduler, "127.0.0.1:7000", "scheduler host:port");
ABSL_FLAG(int, id, -1, "requested worker id (-1: any)");
ABSL_FLAG(int, metrics_port, -1,
          "serve Prometheus metrics and /healthz over HTTP on this port (0: "
          "none; default: $PS_METRICS_PORT, else the config's "
          "observability.metrics_port)");
ABSL_FLAG(std::string, bind, "",
          "interface the metrics endpoint listens on (default: "
          "$PS_BIND_HOST, else 127.0.0.1)");

int main(int argc, char** argv) {
  ps::UseReleaseMutexes();
  absl::ParseCommandLine(argc, argv);
  ps::InitLogging("W[?]");
  ps::WorkerRunOptions o;
  o.scheduler = absl::GetFlag(FLAGS_scheduler);
  o.requested_id = absl::GetFlag(FLAGS_id);
  o.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  o.bind_host = absl::GetFlag(FLAGS_bind);
  absl::Status s = ps::RunWorker(o);
  // Before the static objects go (transport/data_plane.h).
  if (!ps::DataPlaneClient::AwaitDetachedReaders(absl::Now() +
                                                 absl::Seconds(5))) {
    PS_LOG_WARN(
        "a data-plane connection's reader still runs 5 s after the "
        "end; exiting anyway");
  }
  if (!s.ok()) {
    PS_LOG_ERROR("worker failed: {}", s.ToString());
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
