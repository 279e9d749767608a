// Issue 11: the scheduler's metrics (docs/observability.md).
#include "scheduler/scheduler_metrics.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ps {

SchedulerCore::MetricsView SchedulerCore::GetMetricsView() const {
  MetricsView v;
  absl::MutexLock l(&mu_);
  v.nodes.reserve(servers_.size() + workers_.size());
  for (const Node& s : servers_) v.nodes.push_back(s.info);
  for (const Node& w : workers_) v.nodes.push_back(w.info);
  v.phase = phase_;
  v.epoch = view_.epoch();
  v.failovers = static_cast<int64_t>(failovers_.size());
  return v;
}

namespace {
const char* StateName(proto::NodeState s) {
  switch (s) {
    case proto::NODE_ALIVE:
      return "alive";
    case proto::NODE_FINISHED:
      return "finished";
    case proto::NODE_DEAD:
      return "dead";
    case proto::NODE_LEFT:
      return "left";
    default:
      return "unknown";
  }
}
}  // namespace

void WriteSchedulerMetrics(const SchedulerCore::MetricsView& v,
                           ExpositionWriter* w) {
  for (JobPhase p : {JobPhase::kRegistering, JobPhase::kRunning,
                     JobPhase::kFinishing, JobPhase::kDone,
                     JobPhase::kFailed}) {
    w->AddGauge("ps_scheduler_phase",
                "1 for the job's current phase, 0 for the others",
                {{"phase", JobPhaseName(p)}}, p == v.phase ? 1 : 0);
  }
  w->AddGauge("ps_scheduler_view_epoch", "the cluster view's epoch", {},
              static_cast<double>(v.epoch));
  w->AddCounter("ps_scheduler_failovers_total",
                "servers failed over to their backups (issue 9)", {},
                static_cast<double>(v.failovers));
  std::map<std::pair<std::string, std::string>, int> counts;
  for (const char* role : {"server", "worker"}) {
    for (const char* state : {"alive", "finished", "dead", "left"}) {
      counts[{role, state}] = 0;
    }
  }
  int64_t examples = 0;
  for (const proto::NodeInfo& n : v.nodes) {
    const bool worker = n.role() == proto::ROLE_WORKER;
    ++counts[{worker ? "worker" : "server", StateName(n.state())}];
    if (!worker) continue;
    const MetricLabels id = {{"worker", absl::StrCat(n.id())}};
    w->AddGauge("ps_scheduler_worker_clock",
                "per worker, the clock of its last heartbeat", id,
                static_cast<double>(n.clock()));
    w->AddCounter("ps_scheduler_worker_examples_total",
                  "per worker, examples trained as of its last heartbeat", id,
                  static_cast<double>(n.examples()));
    examples += n.examples();
  }
  w->AddCounter("ps_scheduler_examples_total",
                "examples trained by all workers, as of their last heartbeats "
                "(rate(): examples/s)",
                {}, static_cast<double>(examples));
  for (const auto& [key, n] : counts) {
    w->AddGauge("ps_scheduler_nodes", "nodes by role and state",
                {{"role", key.first}, {"state", key.second}}, n);
  }
}

}  // namespace ps
