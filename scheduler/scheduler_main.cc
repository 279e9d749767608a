// ps_scheduler: runs the scheduler of one job.
//   ps_scheduler --config job.yaml [--set training.epochs=3] [--port 7000]
//                [--report report.json] [--port_file FILE]
// SIGTERM or SIGINT (scancel, Ctrl-C) cancels the job: the report says
// "failed" ("cancelled: received SIGTERM"), the nodes are told, exit 1.
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/logging.h"
#include "common/process.h"
#include "scheduler/scheduler_runner.h"

ABSL_FLAG(std::string, config, "", "job config (YAML); defaults when empty");
ABSL_FLAG(std::vector<std::string>, set, {},
          "overrides, section.field=value, comma-separated (a repeated --set "
          "replaces the previous one)");
ABSL_FLAG(int, port, -1,
          "port to serve on (default: cluster.scheduler's; 0: any free one, "
          "see --port_file)");
ABSL_FLAG(std::string, report, "", "write the JSON job report here");
ABSL_FLAG(std::string, port_file, "",
          "once listening, write the port to this file (atomically: a "
          "temporary file renamed into place), for nodes started elsewhere "
          "to find it (deploy/slurm)");
ABSL_FLAG(std::string, state_file, "",
          "keep the scheduler's state here (rewritten on every change); a "
          "scheduler started again with the same config and state file "
          "takes the running job over (issue 9)");
ABSL_FLAG(bool, insecure, false,
          "allow listening on a non-loopback address without PS_AUTH_TOKEN");
ABSL_FLAG(int, metrics_port, -1,
          "serve Prometheus metrics and /healthz over HTTP on this port, on "
          "the gRPC host (0: none; default: $PS_METRICS_PORT, else "
          "observability.metrics_port)");

namespace {

// Writes `port` to `path` through a temporary file renamed into place, so a
// reader sees the whole number or no file.
void PublishPort(const std::string& path, int port) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << port << "\n";
    if (!out.flush()) {
      PS_LOG_ERROR("cannot write {}", tmp);
      return;
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) PS_LOG_ERROR("cannot rename {} to {}: {}", tmp, path, ec.message());
}

}  // namespace

int main(int argc, char** argv) {
  // Before any thread exists: SIGTERM and SIGINT wait for RunScheduler,
  // which cancels the job on them.
  ps::BlockSignals({SIGTERM, SIGINT});
  ps::UseReleaseMutexes();
  absl::ParseCommandLine(argc, argv);
  ps::InitLogging("H");
  ps::SchedulerRunOptions o;
  o.config_path = absl::GetFlag(FLAGS_config);
  o.overrides = absl::GetFlag(FLAGS_set);
  o.port = absl::GetFlag(FLAGS_port);
  o.report_path = absl::GetFlag(FLAGS_report);
  o.state_path = absl::GetFlag(FLAGS_state_file);
  o.insecure = absl::GetFlag(FLAGS_insecure);
  o.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  o.cancel_signals = {SIGTERM, SIGINT};
  if (const std::string f = absl::GetFlag(FLAGS_port_file); !f.empty()) {
    o.on_listening = [f](int port) { PublishPort(f, port); };
  }
  absl::Status s = ps::RunScheduler(o);
  if (!s.ok()) {
    PS_LOG_ERROR("job failed: {}", s.ToString());
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
