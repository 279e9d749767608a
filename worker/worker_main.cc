// ps_worker: one training worker.
//   ps_worker --scheduler host:port [--id N]
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/logging.h"
#include "common/process.h"
#include "worker/worker_runner.h"

ABSL_FLAG(std::string, scheduler, "127.0.0.1:7000", "scheduler host:port");
ABSL_FLAG(int, id, -1, "requested worker id (-1: any)");

int main(int argc, char** argv) {
  ps::UseReleaseMutexes();
  absl::ParseCommandLine(argc, argv);
  ps::InitLogging("W[?]");
  ps::WorkerRunOptions o;
  o.scheduler = absl::GetFlag(FLAGS_scheduler);
  o.requested_id = absl::GetFlag(FLAGS_id);
  absl::Status s = ps::RunWorker(o);
  if (!s.ok()) {
    PS_LOG_ERROR("worker failed: {}", s.ToString());
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
