// ps_scheduler: runs the scheduler of one job.
//   ps_scheduler --config job.yaml [--set training.epochs=3] [--port 7000]
//                [--report report.json]
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
ABSL_FLAG(int, port, -1, "port to serve on (default: cluster.scheduler's)");
ABSL_FLAG(std::string, report, "", "write the JSON job report here");
ABSL_FLAG(std::string, state_file, "",
          "keep the scheduler's state here (rewritten on every change); a "
          "scheduler started again with the same config and state file "
          "takes the running job over (issue 9)");
ABSL_FLAG(bool, insecure, false,
          "allow listening on a non-loopback address without PS_AUTH_TOKEN");

int main(int argc, char** argv) {
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
  absl::Status s = ps::RunScheduler(o);
  if (!s.ok()) {
    PS_LOG_ERROR("job failed: {}", s.ToString());
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
