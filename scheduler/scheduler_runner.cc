#include "scheduler/scheduler_runner.h"

#include <algorithm>
#include <csignal>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "transport/grpc_transport.h"
#include "common/health.h"
#include "common/metrics_http.h"
#include "common/logging.h"
#include "common/membership.h"
#include "common/security.h"
#include "common/net.h"
#include "common/process.h"
#include "common/status_macros.h"
#include "scheduler/scheduler.h"
#include "scheduler/scheduler_metrics.h"
#include "scheduler/scheduler_service.h"

namespace ps {

absl::StatusOr<JobConfig> LoadConfigWithOverrides(
    const std::string& path, const std::vector<std::string>& overrides) {
  PS_ASSIGN_OR_RETURN(JobConfig config,
                      LoadJobConfigWithOverrides(path, overrides));
  return config;
}

absl::Status RunScheduler(const SchedulerRunOptions& options) {
  UseFastGrpcBackupPolling();  // before any gRPC object
  PS_ASSIGN_OR_RETURN(JobConfig config,
                      LoadConfigWithOverrides(options.config_path,
                                              options.overrides));
  InitLogging("H", config.output.log_level);
  std::string host;
  int port = 0;
  PS_RETURN_IF_ERROR(SplitHostPort(config.cluster.scheduler, &host, &port));
  if (options.port >= 0) port = options.port;
  // Listens on cluster.bind_host; a config that names a non-loopback
  // scheduler host but leaves bind_host at its loopback default listens on
  // that host, as before bind_host was read.
  if (!IsLoopbackHost(config.cluster.bind_host) || IsLoopbackHost(host)) {
    host = config.cluster.bind_host;
  }
  // Before the scheduler listens, so that no node joins a job that cannot
  // run (the same check as ps_launch's). Only for a job on this machine: in
  // a multi-host job the data lives on the worker hosts and the model on
  // the server hosts, where the scheduler cannot look.
  if (IsLoopbackHost(host)) {
    PS_RETURN_IF_ERROR(CheckJobResources(config));
  } else {
    PS_LOG_INFO("multi-host job: data paths and model_dir are not checked "
                "here but by the workers and servers that use them");
  }
  PS_ASSIGN_OR_RETURN(const GrpcSecurity security,
                      SecurityFromEnv(SecurityFromConfig(config)));
  PS_RETURN_IF_ERROR(CheckBindAllowed(host, security, options.insecure));
  PS_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> creds,
                      MakeServerCredentials(security));
  PS_RETURN_IF_ERROR(MakeChannelCredentials(security).status());
  const std::string& token = security.token;

  // Checkpoints (issue 9): which checkpoint the job starts from, verified
  // before anyone joins (DATA_LOSS naming a corrupt file).
  PS_ASSIGN_OR_RETURN(const std::string restore_from, ResolveRestore(config));

  GrpcClientFactory clients(GrpcClientFactory::Options(security, 1));
  SchedulerOptions so;
  so.restore_from = restore_from;
  so.config = config;
  so.report_path = options.report_path;
  so.state_path = options.state_path;
  so.clients = &clients;
  SchedulerCore core(so);
  PS_ASSIGN_OR_RETURN(const bool restored, core.RestoreState());
  SchedulerService service(&core, token);

  // grpc.health.v1.Health on the same port (common/health.h): SERVING from
  // the moment it listens (nodes must be able to register), NOT_SERVING
  // once the job has ended.
  EnableGrpcHealthService();
  NodeHealth health({proto::Scheduler::service_full_name()});
  grpc::ServerBuilder builder;
  ConfigureServerBuilder(&builder, security.max_message_mb);
  int selected = 0;
  builder.AddListeningPort(absl::StrCat(host, ":", port), creds, &selected);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || selected == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", host, ":", port));
  }
  health.Attach(server->GetHealthCheckService());
  absl::Cleanup detach_health = [&health] { health.Detach(); };
  health.Set(Serving::kServing, "listening");
  // A restarted scheduler: the nodes' deadlines run from now (RestoreState
  // started them before the port was open).
  if (restored) core.NoteListening();
  // Metrics (issue 11, docs/observability.md), on the gRPC host.
  PS_ASSIGN_OR_RETURN(
      const int metrics_port,
      ResolveMetricsPort(options.metrics_port,
                         config.observability.metrics_port));
  NodeMetrics metrics("scheduler", &health);
  metrics.SetName("H");
  metrics.registry()->AddCollector([&core](ExpositionWriter* w) {
    WriteSchedulerMetrics(core.GetMetricsView(), w);
  });
  PS_RETURN_IF_ERROR(metrics.Serve(host, metrics_port));
  PS_LOG_INFO("scheduler listening on {}:{}, waiting for {} servers and {} "
              "workers",
              host, selected, config.cluster.num_servers,
              config.cluster.num_workers);
  if (options.on_listening) options.on_listening(selected);

  absl::Notification stop;
  std::thread checker([&] {
    const absl::Duration every = absl::Milliseconds(config.cluster.heartbeat_ms);
    // A gap this long between two checks means the scheduler itself was
    // stopped or starved (issue 9): heartbeats were not taken either.
    const absl::Duration stall = std::max(
        absl::Milliseconds(config.cluster.heartbeat_timeout_ms) / 2,
        10 * every);
    for (;;) {
      const absl::Time before = absl::Now();
      if (stop.WaitForNotificationWithTimeout(every)) break;
      // Measured over the wait only: a check itself may take seconds (a
      // failover's view broadcast) while heartbeats are taken.
      const absl::Duration overslept = absl::Now() - before - every;
      if (overslept > stall) core.NoteStall(overslept);
      core.CheckHeartbeats();
      // The job's progress with ETAs (what ps_launch shows as H's line).
      if (auto line = core.MaybeProgress()) PS_LOG_INFO("progress: {}", *line);
    }
  });
  // Checkpoints (issue 9) on a thread of their own: one can take long, and
  // must not hold up failure detection.
  // Early stopping's model copies (issue 12) on another: they call servers.
  std::thread copier([&] {
    if (config.training.early_stopping <= 0) return;
    while (!stop.WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
      core.MaybeKeepModelCopy();
    }
  });
  std::thread checkpointer([&] {
    if (config.fault_tolerance.checkpoint_interval_s <= 0) return;
    const absl::Duration poll = std::min(
        absl::Milliseconds(200),
        absl::Seconds(config.fault_tolerance.checkpoint_interval_s));
    while (!stop.WaitForNotificationWithTimeout(poll)) core.MaybeCheckpoint();
  });
  // The state file's fsyncs, off the lock heartbeats take (SyncState).
  std::thread syncer([&] {
    if (options.state_path.empty()) return;
    while (!stop.WaitForNotificationWithTimeout(
        SchedulerCore::kStateSyncInterval)) {
      core.SyncState();
    }
    core.SyncState();
  });
  // A restarted scheduler finishes what its predecessor was doing.
  std::thread resume([&] {
    if (restored) core.ResumeAfterRestore();
  });
  // Cancellation (scancel, Ctrl-C): the job ends as failed, with a report.
  std::thread canceller([&] {
    if (options.cancel_signals.empty()) return;
    while (!stop.HasBeenNotified()) {
      const int sig =
          WaitForSignal(options.cancel_signals, absl::Milliseconds(200));
      if (sig <= 0) continue;
      const std::string name = sig == SIGTERM  ? "SIGTERM"
                               : sig == SIGINT ? "SIGINT"
                                               : absl::StrCat("signal ", sig);
      PS_LOG_WARN("received {}: cancelling the job", name);
      core.Fail(absl::CancelledError(absl::StrCat("cancelled: received ", name)));
    }
  });
  // Registration must finish in time, then the job may run as long as it
  // needs (failures end it through heartbeats).
  absl::Status result = core.WaitForEnd(absl::InfiniteFuture());
  health.Set(Serving::kStopping,
             result.ok() ? "the job is over" : std::string(result.message()));
  stop.Notify();
  checker.join();
  checkpointer.join();
  syncer.join();
  copier.join();
  resume.join();
  canceller.join();
  if (result.ok()) {
    PS_LOG_INFO("job done\n{}", core.ReportJson());
  }
  // Let workers and servers see the end through their heartbeats, for two
  // heartbeats at most: until every node heard or is gone (a fixed two
  // heartbeats, as until 2026-12-07, held every job's end a second after
  // its last node had left).
  const absl::Time seen_by =
      absl::Now() +
      absl::Milliseconds(std::min(2000, 2 * config.cluster.heartbeat_ms));
  while (!core.EndSeenByAll() && absl::Now() < seen_by) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  service.EndSessions();  // nodes still running: not waited for
  server->Shutdown(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(500));
  return result;
}

}  // namespace ps
