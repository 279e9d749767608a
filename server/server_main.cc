// ps_server: one parameter server.
//   ps_server --scheduler host:port [--id N] [--bind 0.0.0.0 --advertise h]
#include <algorithm>
#include <csignal>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/process.h"
#include "common/thread_dump.h"
#include "server/server_runner.h"
#include "transport/data_plane.h"

ABSL_FLAG(std::string, scheduler, "127.0.0.1:7000", "scheduler host:port");
ABSL_FLAG(int, id, -1, "requested server id (-1: any)");
ABSL_FLAG(std::string, bind, "",
          "interface to listen on (default: $PS_BIND_HOST, else 127.0.0.1)");
ABSL_FLAG(int, port, 0, "port to listen on (0: any free one)");
ABSL_FLAG(bool, insecure, false,
          "allow listening on a non-loopback address without PS_AUTH_TOKEN");
ABSL_FLAG(std::string, advertise, "",
          "host other nodes reach this server at (default: --bind)");
ABSL_FLAG(int, metrics_port, -1,
          "serve Prometheus metrics and /healthz over HTTP on this port, on "
          "the --bind host (0: none; default: $PS_METRICS_PORT, else the "
          "config's observability.metrics_port)");
ABSL_FLAG(int, term_grace_ms, 1000,
          "on SIGTERM or SIGINT, go on serving this long before dying of it, "
          "unless the job ends first: a scheduler stopped by the same signal "
          "(scancel, Ctrl-C) cancels the job meanwhile, so it is reported "
          "as cancelled rather than as lost servers");
ABSL_FLAG(int, apply_threads, 0,
          "threads that apply one large push or answer one large pull "
          "together, split by key range (0: the machine's cores, at most 4; "
          "1: the handler's thread only)");

int main(int argc, char** argv) {
  // Before any thread exists: SIGTERM and SIGINT wait for `term` below.
  ps::BlockSignals({SIGTERM, SIGINT});
  ps::UseReleaseMutexes();
  // The heartbeat loop's stall watch dumps every thread's stack
  // (common/thread_dump.h).
  ps::InstallThreadDump(argv[0]);
  absl::ParseCommandLine(argc, argv);
  ps::InitLogging("S[?]");
  ps::ServerRunOptions o;
  o.scheduler = absl::GetFlag(FLAGS_scheduler);
  o.requested_id = absl::GetFlag(FLAGS_id);
  o.bind_host = absl::GetFlag(FLAGS_bind);
  o.port = absl::GetFlag(FLAGS_port);
  o.advertise_host = absl::GetFlag(FLAGS_advertise);
  o.insecure = absl::GetFlag(FLAGS_insecure);
  o.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  o.apply_threads = absl::GetFlag(FLAGS_apply_threads);
  if (o.apply_threads < 0) {
    PS_LOG_ERROR("--apply_threads must be >= 0 (0: the cores, at most 4), "
                 "got {}",
                 o.apply_threads);
    return 2;
  }
  // Slurm's scancel signals every process of the job at once. A server
  // that died at once was found dead by the scheduler (its session closed)
  // before the scheduler's own SIGTERM cancelled the job, and the job was
  // reported as failed with DATA_LOSS instead of cancelled. It now dies of
  // the signal only after --term_grace_ms, unless the job ended first.
  const absl::Duration grace =
      absl::Milliseconds(std::max(0, absl::GetFlag(FLAGS_term_grace_ms)));
  absl::Notification done;
  std::thread term([&done, grace] {
    while (!done.HasBeenNotified()) {
      const int sig =
          ps::WaitForSignal({SIGTERM, SIGINT}, absl::Milliseconds(100));
      if (sig <= 0) continue;
      PS_LOG_WARN("received signal {}: leaving in {} unless the job ends "
                  "first",
                  sig, absl::FormatDuration(grace));
      if (!done.WaitForNotificationWithTimeout(grace)) ps::DieBySignal(sig);
    }
  });
  absl::Status s = ps::RunServer(o);
  done.Notify();
  term.join();
  // Before the static objects go (transport/data_plane.h).
  if (!ps::DataPlaneClient::AwaitDetachedReaders(absl::Now() +
                                                 absl::Seconds(5))) {
    PS_LOG_WARN(
        "a data-plane connection's reader still runs 5 s after the "
        "end; exiting anyway");
  }
  if (!s.ok()) {
    PS_LOG_ERROR("server failed: {}", s.ToString());
    return 1;
  }
  return 0;
}
