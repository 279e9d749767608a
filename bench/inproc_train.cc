// inproc_train: the same training job as ps_launch, with every role inside
// this one process and no network (the in-process transport), so its
// examples/s can be set against the distributed run's.
//   inproc_train --config deploy/configs/scale.yaml [--set k=v] --report r.json
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/logging.h"
#include "common/process.h"
#include "scheduler/scheduler_runner.h"
#include "tests/inproc_cluster.h"

ABSL_FLAG(std::string, config, "", "job config (YAML)");
ABSL_FLAG(std::vector<std::string>, set, {},
          "overrides section.field=value, comma-separated (a repeated --set "
          "replaces the previous one)");
ABSL_FLAG(std::string, report, "", "write the JSON job report here");
ABSL_FLAG(int, timeout_s, 3600, "give up after this long");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  ps::UseReleaseMutexes();  // as ps_server and ps_worker run
  ps::InitLogging("L");
  auto config = ps::LoadConfigWithOverrides(absl::GetFlag(FLAGS_config),
                                            absl::GetFlag(FLAGS_set));
  if (!config.ok()) {
    std::fprintf(stderr, "inproc_train: %s\n",
                 config.status().ToString().c_str());
    return 2;
  }
  ps::InitLogging("L", config->output.log_level);
  ps::LocalClusterOptions o;
  o.config = *config;
  o.report_path = absl::GetFlag(FLAGS_report);
  o.model_dir = config->output.model_dir;
  o.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  ps::LocalCluster cluster(o);
  absl::Status s = cluster.Run();
  if (!s.ok()) {
    PS_LOG_ERROR("in-process job failed: {}", s.ToString());
    return 1;
  }
  std::printf("%s", cluster.ReportJson().c_str());
  return 0;
}
