#include "common/metrics_http.h"

#include <sys/socket.h>

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "httplib.h"

namespace ps {

absl::StatusOr<int> ResolveMetricsPort(int flag, int config_port) {
  if (flag >= 0) {
    if (flag > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("--metrics_port: not a port number: ", flag));
    }
    return flag;
  }
  const char* env = std::getenv("PS_METRICS_PORT");
  if (env != nullptr && *env != '\0') {
    int v = 0;
    if (!absl::SimpleAtoi(env, &v) || v < 0 || v > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("PS_METRICS_PORT: not a port number: '", env, "'"));
    }
    return v;
  }
  return config_port;
}

MetricsHttpServer::MetricsHttpServer(const MetricsRegistry* registry,
                                     const NodeHealth* health)
    : registry_(registry), health_(health) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

absl::StatusOr<int> MetricsHttpServer::Start(const std::string& host,
                                             int port) {
  if (server_ != nullptr) {
    return absl::FailedPreconditionError("metrics endpoint already started");
  }
  auto server = std::make_unique<httplib::Server>();
  // Two handler threads: a scrape every few seconds and a probe or two
  // (the default is one per core, at least 8).
  server->new_task_queue = [] { return new httplib::ThreadPool(2); };
  server->set_keep_alive_timeout(5);
  server->set_read_timeout(5);
  server->set_write_timeout(5);
  server->set_payload_max_length(4096);  // GETs only
  // SO_REUSEADDR only: cpp-httplib's default adds SO_REUSEPORT, which
  // would let a second node share a port by mistake instead of failing.
  server->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  const MetricsRegistry* registry = registry_;
  const NodeHealth* health = health_;
  server->Get("/metrics", [registry](const httplib::Request&,
                                     httplib::Response& res) {
    res.set_content(registry->Scrape(), "text/plain; version=0.0.4; charset=utf-8");
  });
  server->Get("/healthz", [health](const httplib::Request&,
                                   httplib::Response& res) {
    const bool up = health == nullptr || health->serving();
    res.status = up ? 200 : 503;
    res.set_content(
        absl::StrCat(health == nullptr ? "serving" : health->Describe(), "\n"),
        "text/plain; charset=utf-8");
  });
  server->Get("/livez", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain; charset=utf-8");
  });
  int bound = port;
  if (port == 0) {
    bound = server->bind_to_any_port(host);
    if (bound <= 0) bound = 0;
  } else if (!server->bind_to_port(host, port)) {
    bound = 0;
  }
  if (bound == 0) {
    return absl::UnavailableError(absl::StrCat(
        "metrics endpoint: cannot listen on ", host, ":", port));
  }
  server_ = std::move(server);
  port_ = bound;
  thread_ = std::thread([s = server_.get()] { s->listen_after_bind(); });
  // stop() does nothing before the accept loop runs: wait for it, so that
  // Stop() right after Start() cannot leave the thread serving forever.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!server_->is_running() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  return bound;
}

void MetricsHttpServer::Stop() {
  if (server_ == nullptr) return;
  server_->stop();
  if (thread_.joinable()) thread_.join();
  server_.reset();
}

NodeMetrics::NodeMetrics(std::string role, const NodeHealth* health)
    : role_(std::move(role)), health_(health), http_(&registry_, health) {
  collector_ = registry_.AddCollector([this](ExpositionWriter* w) {
    std::string name;
    {
      absl::MutexLock l(&mu_);
      name = name_;
    }
    w->AddGauge("ps_node_info", "The node: its role and name (S[0], W[1], H).",
                {{"role", role_}, {"node", name}}, 1);
    w->AddGauge("ps_node_serving",
                "1 while the node is serving (registered, not stopping), as "
                "its gRPC health service and /healthz report",
                {}, health_ != nullptr && health_->serving() ? 1 : 0);
    WriteProcessMetrics(w);
  });
}

NodeMetrics::~NodeMetrics() {
  http_.Stop();
  registry_.RemoveCollector(collector_);
}

void NodeMetrics::SetName(std::string name) {
  absl::MutexLock l(&mu_);
  name_ = std::move(name);
}

absl::Status NodeMetrics::Serve(const std::string& host, int port) {
  if (port <= 0) return absl::OkStatus();
  absl::StatusOr<int> bound = http_.Start(host, port);
  if (!bound.ok()) return bound.status();
  PS_LOG_INFO("metrics on http://{}:{}/metrics (health: /healthz)", host,
              *bound);
  return absl::OkStatus();
}

}  // namespace ps
