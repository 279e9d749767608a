#include "server/server_runner.h"

#include <atomic>
#include <cstdlib>
#include <limits>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/config.h"
#include "common/health.h"
#include "common/metrics_http.h"
#include "transport/grpc_transport.h"
#include "common/logging.h"
#include "common/membership.h"
#include "common/status_macros.h"
#include "common/thread_dump.h"
#include "server/server_node.h"
#include "server/server_service.h"
#include "transport/errors.h"

namespace ps {

absl::Status CatchUpView(ServerNode* node, SchedulerClient* scheduler, int id,
                         int64_t scheduler_epoch, absl::Time deadline) {
  const int64_t mine = node->epoch();
  if (scheduler_epoch <= mine) return absl::OkStatus();
  proto::GetViewRequest gv;
  gv.set_known_epoch(mine);
  gv.set_role(proto::ROLE_SERVER);
  gv.set_id(id);
  PS_ASSIGN_OR_RETURN(proto::GetViewResponse v, scheduler->GetView(gv, deadline));
  if (!v.ready() || v.view().epoch() <= mine) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the scheduler's view (epoch ", v.view().epoch(),
        v.ready() ? "" : ", not ready", ") is not newer than ", mine));
  }
  PS_RETURN_IF_ERROR(node->Configure(id, v.view()));
  PS_LOG_WARN("caught up from view epoch {} to {} (missed a broadcast)", mine,
              v.view().epoch());
  return absl::OkStatus();
}

void WriteServerMetrics(const ServerNode& node, ExpositionWriter* w) {
  const proto::ServerStatus st = node.Status();
  for (int t = 0;; ++t) {
    const Table* table = node.table(t);
    if (table == nullptr) break;
    w->AddGauge("ps_server_keys", "keys stored, by table",
                {{"table", absl::StrCat(t)}},
                static_cast<double>(table->size()));
  }
  w->AddGauge("ps_server_ranges", "key ranges this server owns", {},
              st.ranges());
  w->AddGauge("ps_server_view_epoch", "the cluster view installed", {},
              static_cast<double>(node.epoch()));
  const KeyCache& kc = node.key_cache();
  w->AddCounter("ps_server_key_cache_hits_total",
                "pushes and pulls that named a key list this server kept "
                "(key caching: no keys sent, no hashing)",
                {}, static_cast<double>(kc.hits()));
  w->AddCounter("ps_server_key_cache_misses_total",
                "pushes and pulls that named a key list this server did not "
                "keep (evicted, or never sent): answered KEYS_NOT_CACHED",
                {}, static_cast<double>(kc.misses()));
  w->AddGauge("ps_server_key_cache_lists", "key lists kept", {},
              static_cast<double>(kc.lists()));
  w->AddGauge("ps_server_key_cache_bytes", "bytes of the key lists kept", {},
              static_cast<double>(kc.bytes()));
  w->AddCounter("ps_server_non_finite_pushes_total",
                "pushes refused for NaN or infinite values", {},
                static_cast<double>(st.non_finite_pushes()));
  w->AddCounter("ps_server_non_finite_updates_total",
                "value elements not updated because their update would not "
                "be finite",
                {}, static_cast<double>(st.non_finite_updates()));
  for (int i = 0; i < st.worker_clocks_size(); ++i) {
    w->AddGauge("ps_server_worker_clock",
                "per worker, the lowest clock it completed on this server's "
                "ranges",
                {{"worker", absl::StrCat(i)}},
                static_cast<double>(st.worker_clocks(i)));
  }
}

namespace {

// One membership of the job: registers, serves until the job is over (or
// this server was declared dead: REASON_DECLARED_DEAD), and shuts down.
// *id: the id it had (-1 until registered).
absl::Status RunServerOnce(const ServerRunOptions& options_in, int* id_out) {
  UseFastGrpcBackupPolling();  // before any gRPC object
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
  ServerLimits limits;
  limits.max_decoded_value_bytes = static_cast<size_t>(security.max_message_mb)
                                   << 20;
  ServerNode node(Clock::Real(), limits,
                  options.apply_threads > 0
                      ? options.apply_threads
                      : ParallelRunner::DefaultParallelism());
  absl::Notification exit_requested;
  // Metrics (issue 11, docs/observability.md): served from the start when
  // the port is known (flag, environment), else once the config says.
  PS_ASSIGN_OR_RETURN(int metrics_port,
                      ResolveMetricsPort(options.metrics_port));
  NodeHealth health({proto::Server::service_full_name()});
  NodeMetrics metrics("server", &health);
  PushPullMetrics rpc_metrics(
      metrics.registry(), "ps_server",
      "seconds a push spent in its handler (checks and applying it; a "
      "replicated push's wait for its backups comes after)",
      "seconds from a pull's arrival to its answer, the consistency wait "
      "included");
  metrics.registry()->AddCollector([&node](ExpositionWriter* w) {
    WriteServerMetrics(node, w);
  });
  PS_RETURN_IF_ERROR(metrics.Serve(options.bind_host, metrics_port));
  ServerService service(&node, token, [&] { exit_requested.Notify(); },
                        &rpc_metrics);
  // Issue 10: push, pull and clock over plain TCP beside gRPC
  // (transport/data_plane.h); not with TLS, which only gRPC carries.
  DataService data_service(&node, &rpc_metrics);
  std::unique_ptr<DataPlaneServer> data_plane;
  if (!security.tls.enabled()) {
    DataPlaneServerOptions dopt;
    dopt.host = options.bind_host;
    dopt.token = token;
    dopt.max_frame_bytes = static_cast<size_t>(security.max_message_mb) << 20;
    absl::StatusOr<std::unique_ptr<DataPlaneServer>> d =
        DataPlaneServer::Start(dopt, &data_service);
    if (d.ok()) {
      data_plane = std::move(*d);
      service.set_data_plane(data_plane->port(), data_plane->local_name());
    } else {
      PS_LOG_WARN("no data plane, gRPC only: {}", d.status().ToString());
    }
  }

  // grpc.health.v1.Health on the same port (common/health.h): NOT_SERVING
  // until the view is installed, and again once the server stops.
  EnableGrpcHealthService();
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
  health.Attach(server->GetHealthCheckService());
  absl::Cleanup detach_health = [&health] { health.Detach(); };
  const std::string address = absl::StrCat(
      options.advertise_host.empty() ? options.bind_host
                                     : options.advertise_host,
      ":", port);

  GrpcClientFactory clients(GrpcClientFactory::Options(security, 1));
  // Replication (issue 9): the node reaches its backups through `clients`;
  // it lets go of them before they are destroyed.
  node.SetPeers(&clients);
  node.SetSuspectHandler([&clients, &options, &node](int server,
                                                     absl::Duration silent) {
    proto::GetViewRequest req;
    // Named: the scheduler believes only live nodes, and counts who names
    // a server that answers it (a partial partition).
    req.set_role(proto::ROLE_SERVER);
    req.set_id(node.id());
    req.set_wait_ms(0);
    req.set_known_epoch(std::numeric_limits<int64_t>::max());
    req.add_suspect_servers(server);
    // A backup that answers the scheduler but not this primary (a cut
    // between the two alone) is failed over on it (UnreachableFrom).
    req.add_suspect_silent_ms(absl::ToInt64Milliseconds(silent));
    (void)clients.Scheduler(options.scheduler)
        ->GetView(req, absl::Now() + absl::Seconds(1));
  });
  absl::Cleanup unpeer = [&node] {
    node.SetPeers(nullptr);
    node.SetSuspectHandler(nullptr);
  };
  std::shared_ptr<SchedulerClient> scheduler =
      clients.Scheduler(options.scheduler);
  proto::RegisterRequest reg;
  reg.set_role(proto::ROLE_SERVER);
  reg.set_address(address);
  reg.set_requested_id(options.requested_id);
  if (options.rejoin_of >= 0) reg.set_rejoin_of(options.rejoin_of);
  PS_ASSIGN_OR_RETURN(
      Membership m,
      JoinCluster(scheduler.get(), options.scheduler, reg,
                  absl::Now() +
                      absl::Milliseconds(options.register_timeout_ms)));
  const int id = m.id;
  *id_out = id;
  const proto::ClusterView& view = m.view;
  InitLogging(absl::StrCat("S[", id, "]"));
  PS_LOG_INFO("serving on {}", address);
  auto config = ParseJobConfig(view.job_config_yaml());
  if (!config.ok()) return config.status();
  InitLogging(absl::StrCat("S[", id, "]"), config->output.log_level);
  // The job's settings for reaching the other servers before Configure,
  // which starts replicating to the backups: set after it, a first
  // connection could go over the same-host socket of a job that turned it
  // off (cluster.local_socket: false), and with the default linger.
  node.SetReplicationLinger(
      absl::Milliseconds(config->fault_tolerance.replication_linger_ms));
  node.SetReplicationDeltas(config->fault_tolerance.replicate_deltas);
  // Replication goes over the backups' data planes as workers' pushes do,
  // or over gRPC where the job turned the data plane off.
  clients.SetDataPlane(config->cluster.data_plane);
  clients.SetLocalSocket(config->cluster.local_socket);
  clients.SetSharedMemory(
      size_t{static_cast<unsigned>(config->cluster.shared_memory_mb)} << 20);
  if (absl::Status s = node.Configure(id, view); !s.ok()) {
    // A server joining a running job (issue 9) may have been told a newer
    // view by the scheduler's broadcast already.
    if (node.epoch() < view.epoch()) return s;
  }
  metrics.SetName(absl::StrCat("S[", id, "]"));
  if (metrics_port < 0) {
    PS_RETURN_IF_ERROR(metrics.Serve(options.bind_host,
                                     config->observability.metrics_port));
  }
  PS_LOG_INFO("configured: epoch {}, {} of {} ranges", view.epoch(),
              node.Status().ranges(), view.routing().range_begin_size());
  health.Set(Serving::kServing, absl::StrCat("registered as S[", id, "]"));

  absl::Notification stop;
  std::thread ticker([&] {
    while (!stop.WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
      node.Tick();
    }
  });
  // Heartbeats until the scheduler says the job is over (after the model
  // was saved, the server stays up so a save whose reply was lost can be
  // retried), or the scheduler stays unreachable for
  // cluster.scheduler_timeout_ms (issue 9: a restarted scheduler may take
  // longer than a heartbeat timeout to come back, and the job's data path
  // does not need it meanwhile); once the model was saved, for the
  // heartbeat timeout.
  // A heartbeat reply with a newer epoch than the server's makes it fetch
  // and install that view (it missed a broadcast).
  absl::Status result;
  absl::Time last_ok = absl::Now();
  const absl::Duration hb = absl::Milliseconds(config->cluster.heartbeat_ms);
  const absl::Duration hb_timeout =
      absl::Milliseconds(config->cluster.heartbeat_timeout_ms);
  const absl::Duration scheduler_timeout = config->cluster.SchedulerTimeout();
  bool told_unreachable = false;
  // The session from the start, not from the first heartbeat a period
  // later: a server killed before it is found by its closed session too.
  scheduler->KeepSession(proto::ROLE_SERVER, id);
  // Suspicions of silent backups and catching up with a newer view go on a
  // thread of their own: both call the scheduler (up to a second each), and
  // on the heartbeat thread they delayed the next heartbeat, so that a
  // loaded machine could see a live server declared dead.
  std::atomic<int64_t> scheduler_epoch{0};
  std::thread watch([&] {
    while (!stop.WaitForNotificationWithTimeout(hb)) {
      // A backup that hangs is named to the scheduler in seconds (issue 9).
      node.SuspectSilentBackups(config->cluster.SuspectAfter());
      const int64_t epoch = scheduler_epoch.load();
      if (epoch > node.epoch()) {
        absl::Status s = CatchUpView(&node, scheduler.get(), id, epoch,
                                     absl::Now() + hb_timeout / 2);
        if (!s.ok()) PS_LOG_WARN("catching up with the view: {}", s.ToString());
      }
    }
  });
  // A heartbeat late by more than this is logged with its cause: a live
  // server whose heartbeats stop is failed over (issue 9), and without the
  // cause an operator cannot tell a stalled process from a false alarm.
  const absl::Duration late_after = std::max(hb, absl::Seconds(1));
  // The stall watch: while the loop below is stuck in one step for longer
  // than it may take (three heartbeats and a check, at least 1.5 s: a
  // worker names a silent server after four; a call to the scheduler has
  // its own deadline, hb_timeout / 2), the stacks of every thread go to the
  // log, once per stall and at most once a minute, so that what held it is
  // known while it holds (issue 9: a live server silent for 4 s under load
  // was failed over, and nothing in its log said why).
  const absl::Duration step_limit =
      std::max(3 * hb + absl::Milliseconds(250), absl::Milliseconds(1500));
  const StallWatch::Step waiting{"the heartbeat loop has been waiting to be "
                                 "woken",
                                 step_limit};
  const StallWatch::Step filling{"the heartbeat loop has been filling a "
                                 "heartbeat (the node's state locked)",
                                 step_limit};
  const StallWatch::Step calling{
      "the heartbeat loop has been waiting on its call to the scheduler",
      std::max(step_limit, hb_timeout / 2)};
  StallWatch stall_watch(absl::Milliseconds(250), absl::Minutes(1),
                         [](const std::string& what) {
                           PS_LOG_WARN("{}", what);
                         });
  for (;;) {
    const absl::Time wait_from = absl::Now();
    stall_watch.Enter(&waiting);
    if (exit_requested.HasBeenNotified()) {
      absl::SleepFor(hb);  // saved: only waiting for the end of the job
    } else {
      exit_requested.WaitForNotificationWithTimeout(hb);
    }
    const absl::Time woke = absl::Now();
    stall_watch.Enter(&filling);
    proto::HeartbeatRequest req;
    node.FillHeartbeat(&req);
    node.TakeWorkersGone(&req);
    req.set_id(id);
    const absl::Time filled = absl::Now();
    stall_watch.Enter(&calling);
    // (A wait ended early by exit_requested is never late.)
    if (woke - wait_from - hb > late_after) {
      PS_LOG_WARN("the heartbeat thread woke {} late: this process was not "
                  "run meanwhile (an overloaded machine, or a stopped "
                  "process)",
                  absl::FormatDuration(woke - wait_from - hb));
    }
    if (filled - woke > late_after) {
      PS_LOG_WARN("filling a heartbeat took {}: the node's state was locked "
                  "that long",
                  absl::FormatDuration(filled - woke));
    }
    auto resp = scheduler->Heartbeat(req, filled + hb_timeout / 2);
    if (const absl::Duration took = absl::Now() - filled;
        resp.ok() && took > late_after) {
      PS_LOG_WARN("the scheduler took {} to answer a heartbeat",
                  absl::FormatDuration(took));
    }
    if (resp.ok()) {
      last_ok = absl::Now();
      if (told_unreachable) {
        PS_LOG_INFO("the scheduler answers again");
        told_unreachable = false;
      }
      if (resp->shutdown()) {
        if (resp->failed()) {
          result = ErrorWithReason(
              absl::StatusCode::kAborted, proto::REASON_JOB_FAILED,
              absl::StrCat("the job failed: ", resp->error()));
        } else if (resp->left()) {
          PS_LOG_INFO("drained: this server holds no key range any more and "
                      "leaves the job (issue 9)");
        } else {
          PS_LOG_INFO("scheduler says the job is over");
        }
        break;
      }
      if (resp->declared_dead()) {
        result = ErrorWithReason(absl::StatusCode::kAborted,
                                 proto::REASON_DECLARED_DEAD, resp->error());
        break;
      }
      // A newer view (a missed broadcast): the watch thread fetches it.
      scheduler_epoch.store(resp->epoch());
      // Its session tells the scheduler the moment this process is gone
      // (issue 9); opened again here after the scheduler restarted.
      scheduler->KeepSession(proto::ROLE_SERVER, id);
    } else if (absl::Now() - last_ok > hb_timeout) {
      if (exit_requested.HasBeenNotified()) {
        PS_LOG_WARN("scheduler gone after the model was saved: {}",
                    resp.status().ToString());
        break;
      }
      if (absl::Now() - last_ok > scheduler_timeout) {
        result = absl::UnavailableError(absl::StrCat(
            "scheduler unreachable for ",
            absl::FormatDuration(scheduler_timeout),
            " (cluster.scheduler_timeout_ms): ", resp.status().message()));
        break;
      }
      if (!told_unreachable) {
        PS_LOG_WARN("scheduler unreachable for {}; serving on, giving up "
                    "after {} (cluster.scheduler_timeout_ms): {}",
                    absl::FormatDuration(absl::Now() - last_ok),
                    absl::FormatDuration(scheduler_timeout),
                    resp.status().ToString());
        told_unreachable = true;
      }
    }
  }
  stall_watch.Enter(nullptr);  // the loop is over: nothing more to watch
  health.Set(Serving::kStopping,
             result.ok() ? "the job is over" : std::string(result.message()));
  stop.Notify();
  ticker.join();
  watch.join();
  if (ReasonOf(result) == proto::REASON_DECLARED_DEAD) {
    // Failed over: what waits here (a push's replication, a pull) goes to
    // the ranges' new owners, as for any stale epoch; CANCELLED would end
    // the worker.
    node.CancelAll(ErrorWithReason(
        absl::StatusCode::kFailedPrecondition, proto::REASON_STALE_EPOCH,
        absl::StrCat("stale-epoch: S[", id,
                     "] was failed over; its ranges have new owners")));
  } else {
    node.CancelAll(absl::CancelledError("server shutting down"));
  }
  service.EndStreams();
  if (data_plane != nullptr) {
    data_plane->Stop();
    PS_LOG_INFO("data plane: {} connections over the same-host socket, {} "
                "over TCP; {} shared memory",
                data_plane->served(true), data_plane->served(false),
                data_plane->arenas());
  }
  // Give the save_and_exit reply time to leave before tearing down.
  server->Shutdown(std::chrono::system_clock::now() +
                   std::chrono::seconds(2));
  if (const proto::ServerStatus st = node.Status(); st.replica_entries() > 0) {
    PS_LOG_INFO(
        "replicated {} entries in {} batches (deltas' rows: {} by slot, {} "
        "by key)",
        st.replica_entries(), st.replica_batches(), st.replica_rows_by_slot(),
        st.replica_rows_by_key());
  }
  if (const KeyCache& kc = node.key_cache(); kc.hits() + kc.misses() > 0) {
    PS_LOG_INFO("key cache: {} hits, {} misses, {} lists kept", kc.hits(),
                kc.misses(), kc.lists());
  }
  PS_LOG_INFO("exiting");
  return result;
}

}  // namespace

absl::Status RunServer(const ServerRunOptions& options) {
  ServerRunOptions o = options;
  for (;;) {
    int id = -1;
    absl::Status s = RunServerOnce(o, &id);
    if (o.rejoin_of >= 0 && id < 0) {
      // Not let in again (the job is ending, or the scheduler is gone):
      // nothing of the job depends on this server since its failover, so
      // its leaving is no failure.
      PS_LOG_WARN("S[{}] could not join the job again ({}); it leaves",
                  o.rejoin_of, s.ToString());
      return absl::OkStatus();
    }
    if (ReasonOf(s) != proto::REASON_DECLARED_DEAD) return s;
    // Issue 9: its ranges are its backups' now, and what it held is
    // stale; as a new, empty server it restores the capacity and the
    // replication factor the job had before it hung.
    PS_LOG_WARN("{}; joining the job again as a new server",
                std::string(s.message()));
    o.requested_id = -1;
    o.rejoin_of = id;
  }
}

}  // namespace ps
