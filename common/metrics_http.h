// The HTTP endpoint of a node's metrics and health (cpp-httplib, Debian's
// libcpp-httplib-dev), on a port of its own beside the gRPC one:
//   GET /metrics  the registry's text exposition (Prometheus scrapes it)
//   GET /healthz  200 "serving" while the node's NodeHealth is serving,
//                 503 with the state otherwise ("starting: not registered
//                 yet", "stopping: the job is over"); workers run no gRPC
//                 server, so this is their health check
//   GET /livez    200 "ok" while the process runs
// Anything else is 404. The endpoint is plaintext and unauthenticated: it
// tells counts and timings, never keys, values or the token; bind it to
// loopback or a private interface (it binds where the node's gRPC does).
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/health.h"
#include "common/metrics.h"

namespace httplib {
class Server;
}

namespace ps {

// The metrics port a node serves on: `flag` (--metrics_port) when >= 0,
// else $PS_METRICS_PORT when set and not empty, else `config_port`
// (observability.metrics_port; -1 when the node has no config yet). 0 means
// no endpoint, -1 that the config decides later. INVALID_ARGUMENT naming
// PS_METRICS_PORT for a value that is not a port number.
absl::StatusOr<int> ResolveMetricsPort(int flag, int config_port = -1);

class MetricsHttpServer {
 public:
  // `registry` and `health` (may be null: /healthz then answers like
  // /livez) must outlive the server.
  MetricsHttpServer(const MetricsRegistry* registry, const NodeHealth* health);
  // Stops it.
  ~MetricsHttpServer();

  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // Listens on host:port (port 0: a free one) and serves from a thread of
  // its own (two handler threads). Returns the port. UNAVAILABLE naming
  // the address when it cannot listen (port taken); FAILED_PRECONDITION
  // when already started.
  absl::StatusOr<int> Start(const std::string& host, int port);
  // Stops serving and joins the threads; idempotent.
  void Stop();

  int port() const { return port_; }

 private:
  const MetricsRegistry* const registry_;
  const NodeHealth* const health_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

// What every node (scheduler, server, worker) has: a registry, the
// endpoint serving it, and the metrics all nodes export besides their own:
// the process_* ones (WriteProcessMetrics), ps_node_info{role,node} 1 and
// ps_node_serving (1 while its NodeHealth is serving). Thread-safe.
class NodeMetrics {
 public:
  // `role`: "scheduler", "server" or "worker". `health` must outlive this.
  NodeMetrics(std::string role, const NodeHealth* health);
  ~NodeMetrics();

  MetricsRegistry* registry() { return &registry_; }
  // The node's name once known ("S[0]"; "" before registration).
  void SetName(std::string name);

  // Starts the endpoint on host:port when port > 0 (0: none, OK); logs
  // its URL. UNAVAILABLE when it cannot listen (MetricsHttpServer::Start).
  // At most once with port > 0.
  absl::Status Serve(const std::string& host, int port);
  // The port served on; 0 when none.
  int port() const { return http_.port(); }

 private:
  const std::string role_;
  const NodeHealth* const health_;
  MetricsRegistry registry_;
  absl::Mutex mu_;
  std::string name_ ABSL_GUARDED_BY(mu_);
  int collector_ = 0;
  MetricsHttpServer http_;  // last: stopped before the rest goes
};

}  // namespace ps
