#include "server/server_runner.h"

#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/config.h"
#include "transport/grpc_transport.h"
#include "common/logging.h"
#include "common/membership.h"
#include "common/status_macros.h"
#include "server/server_node.h"
#include "server/server_service.h"

namespace ps {

absl::Status RunServer(const ServerRunOptions& options_in) {
  ServerRunOptions options = options_in;
  if (options.bind_host.empty()) {
    const char* env = std::getenv("PS_BIND_HOST");
    options.bind_host = env != nullptr && *env != '\0' ? env : "127.0.0.1";
  }
  PS_ASSIGN_OR_RETURN(const GrpcSecurity security,
                      SecurityFromEnv(GrpcSecurity()));
  PS_RETURN_IF_ERROR(
      CheckBindAllowed(options.bind_host, security, options.insecure));
  PS_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> creds,
                      MakeServerCredentials(security));
  const std::string& token = security.token;
  ServerNode node;
  absl::Notification exit_requested;
  ServerService service(&node, token, [&] { exit_requested.Notify(); });

  grpc::ServerBuilder builder;
  ConfigureServerBuilder(&builder, security.max_message_mb);
  int port = 0;
  builder.AddListeningPort(absl::StrCat(options.bind_host, ":", options.port),
                           creds, &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", options.bind_host, ":", options.port));
  }
  const std::string address = absl::StrCat(
      options.advertise_host.empty() ? options.bind_host
                                     : options.advertise_host,
      ":", port);

  GrpcClientFactory clients(GrpcClientFactory::Options(security, 1));
  std::shared_ptr<SchedulerClient> scheduler =
      clients.Scheduler(options.scheduler);
  proto::RegisterRequest reg;
  reg.set_role(proto::ROLE_SERVER);
  reg.set_address(address);
  reg.set_requested_id(options.requested_id);
  PS_ASSIGN_OR_RETURN(
      Membership m,
      JoinCluster(scheduler.get(), options.scheduler, reg,
                  absl::Now() +
                      absl::Milliseconds(options.register_timeout_ms)));
  const int id = m.id;
  const proto::ClusterView& view = m.view;
  InitLogging(absl::StrCat("S[", id, "]"));
  PS_LOG_INFO("serving on {}", address);
  PS_RETURN_IF_ERROR(node.Configure(id, view));
  auto config = ParseJobConfig(view.job_config_yaml());
  if (!config.ok()) return config.status();
  InitLogging(absl::StrCat("S[", id, "]"), config->output.log_level);
  PS_LOG_INFO("configured: epoch {}, {} of {} ranges", view.epoch(),
              node.Status().ranges(), view.routing().range_begin_size());

  absl::Notification stop;
  std::thread ticker([&] {
    while (!stop.WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
      node.Tick();
    }
  });
  // Heartbeats until told to save and exit, the job ends, or the scheduler
  // stays unreachable for the heartbeat timeout.
  absl::Status result;
  absl::Time last_ok = absl::Now();
  const absl::Duration hb = absl::Milliseconds(config->cluster.heartbeat_ms);
  const absl::Duration hb_timeout =
      absl::Milliseconds(config->cluster.heartbeat_timeout_ms);
  while (!exit_requested.WaitForNotificationWithTimeout(hb)) {
    proto::HeartbeatRequest req;
    req.set_role(proto::ROLE_SERVER);
    req.set_id(id);
    auto resp = scheduler->Heartbeat(req, absl::Now() + hb_timeout / 2);
    if (resp.ok()) {
      last_ok = absl::Now();
      if (resp->shutdown()) {
        PS_LOG_INFO("scheduler says the job is over");
        break;
      }
    } else if (absl::Now() - last_ok > hb_timeout) {
      result = absl::UnavailableError(absl::StrCat(
          "scheduler unreachable for ", absl::FormatDuration(hb_timeout),
          ": ", resp.status().message()));
      break;
    }
  }
  stop.Notify();
  ticker.join();
  node.CancelAll(absl::CancelledError("server shutting down"));
  // Give the save_and_exit reply time to leave before tearing down.
  server->Shutdown(std::chrono::system_clock::now() +
                   std::chrono::seconds(2));
  PS_LOG_INFO("exiting");
  return result;
}

}  // namespace ps
