#include "scheduler/scheduler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/numbers.h"
#include "common/job_report.h"
#include "common/logging.h"
#include "common/routing.h"
#include "common/status_macros.h"
#include "server/checkpoint.h"
#include "models/tables.h"

namespace ps {

proto::ConsistencyConfig ToProto(const ConsistencyConfig& c) {
  proto::ConsistencyConfig p;
  switch (c.mode) {
    case Mode::kBsp:
      p.set_mode(proto::MODE_BSP);
      p.set_tau(0);
      break;
    case Mode::kSsp:
      p.set_mode(proto::MODE_SSP);
      p.set_tau(c.tau);
      break;
    case Mode::kAsp:
      p.set_mode(proto::MODE_ASP);
      p.set_tau(-1);
      break;
  }
  return p;
}

namespace {

// `v` to 6 significant digits, as the report shows measured figures (the
// double nearest that decimal: protobuf's JSON prints it back as at most 6
// digits). A non-finite `v` is returned as is.
double Round6(double v) {
  if (!std::isfinite(v)) return v;
  double rounded = v;
  (void)absl::SimpleAtod(absl::StrFormat("%.6g", v), &rounded);
  return rounded;
}

// A report figure that may be non-finite: the number, or null (JSON has no
// NaN or infinity).
void SetNumber(double v, google::protobuf::Value* out) {
  if (std::isfinite(v)) {
    out->set_number_value(v);
  } else {
    out->set_null_value(google::protobuf::NULL_VALUE);
  }
}

// The seed of the work units' order (WorkQueue): data.shuffle's.
std::optional<uint64_t> UnitShuffleSeed(const JobConfig& config) {
  if (!config.data.shuffle) return std::nullopt;
  return config.training.seed;
}

// `options` with training.minibatch, fault_tolerance.work_unit_rows,
// training.epochs and optimizer.feature_scale `auto` replaced by their
// values for this data (issue 12), logged, before the config is shown to
// anyone.
SchedulerOptions ResolveDataDefaults(SchedulerOptions options) {
  JobConfig& c = options.config;
  const int64_t rows = EstimateTrainRows(c);
  for (const std::string& chosen :
       {ResolveAutoMinibatch(&c, rows), ResolveAutoWorkUnitRows(&c, rows),
        ResolveAutoEpochs(&c, rows),
        ResolveFeatureScale(&c, c.optimizer.feature_scale == kAutoFeatureScale
                                    ? EstimateFeatureScale(c)
                                    : 0)}) {
    if (!chosen.empty()) PS_LOG_INFO("{}", chosen);
  }
  return options;
}

}  // namespace

SchedulerCore::SchedulerCore(SchedulerOptions options)
    : options_(ResolveDataDefaults(std::move(options))),
      config_yaml_(ToYaml(options_.config)),
      start_(options_.clock->Now()) {
  absl::MutexLock l(&mu_);
  // BSP: no stealing, so its clocks combine the same batches every run.
  work_ = std::make_unique<WorkQueue>(
      PlanWorkUnits(options_.config), options_.config.training.epochs,
      options_.config.cluster.num_workers,
      /*steal=*/options_.config.consistency.mode != Mode::kBsp,
      UnitShuffleSeed(options_.config));
  if (!options_.restore_from.empty()) {
    // Checkpoints (issue 9): continue the data where the checkpoint stood.
    absl::StatusOr<proto::CheckpointManifest> m =
        ReadManifest(options_.restore_from);
    // The position is in units of the checkpoint's plan (which depends on
    // the worker count then): keep that plan when it is of this data.
    const DataConfig& d = options_.config.data;
    bool same_data = m.ok() && m->plan_size() > 0;
    for (int i = 0; same_data && i < m->plan_size(); ++i) {
      const proto::DataShard& u = m->plan(i);
      same_data = d.format == "synthetic"
                      ? u.path().empty() &&
                            u.seed_begin() == d.synthetic.seed &&
                            u.row_end() <= d.synthetic.train_rows
                      : u.path() == d.train;
    }
    if (same_data) {
      work_ = std::make_unique<WorkQueue>(
          std::vector<proto::DataShard>(m->plan().begin(), m->plan().end()),
          options_.config.training.epochs, options_.config.cluster.num_workers,
          /*steal=*/options_.config.consistency.mode != Mode::kBsp,
          UnitShuffleSeed(options_.config));
    }
    if (!m.ok() || !m->has_work() || !same_data) {
      PS_LOG_WARN("checkpoint {} has no data position for this data: "
                  "training starts from the first unit of epoch 0",
                  options_.restore_from);
    } else if (absl::StatusOr<int64_t> done = work_->ResumeFrom(m->work());
               !done.ok()) {
      PS_LOG_WARN("the data position of checkpoint {} does not fit this job "
                  "(training starts from the first unit of epoch 0): {}",
                  options_.restore_from, done.status().ToString());
    } else {
      resumed_units_ = *done;
      PS_LOG_INFO("resuming the data of checkpoint {}: {} of {} work units "
                  "were done",
                  options_.restore_from, *done,
                  work_->units_per_epoch() * work_->epochs());
    }
  }
  servers_.resize(options_.config.cluster.num_servers);
  workers_.resize(options_.config.cluster.num_workers);
  for (int i = 0; i < static_cast<int>(servers_.size()); ++i) {
    servers_[i].info.set_id(i);
    servers_[i].info.set_role(proto::ROLE_SERVER);
  }
  for (int i = 0; i < static_cast<int>(workers_.size()); ++i) {
    workers_[i].info.set_id(i);
    workers_[i].info.set_role(proto::ROLE_WORKER);
  }
}

const char* JobPhaseName(JobPhase phase) {
  switch (phase) {
    case JobPhase::kRegistering:
      return "registering";
    case JobPhase::kRunning:
      return "running";
    case JobPhase::kFinishing:
      return "finishing";
    case JobPhase::kDone:
      return "done";
    case JobPhase::kFailed:
      return "failed";
  }
  return "unknown";
}

namespace {

const char* RoleLetter(proto::Role role) {
  return role == proto::ROLE_SERVER ? "S" : "W";
}

// BroadcastView: how long a server gets before it is probed.
constexpr absl::Duration kBroadcastFirstTry = absl::Seconds(1);

absl::Status JobFailed(const absl::Status& end) {
  return WithReason(Annotate(end, "the job failed"), proto::REASON_JOB_FAILED);
}

}  // namespace

SchedulerCore::~SchedulerCore() { Close(); }

void SchedulerCore::Close() {
  std::vector<std::thread> probes;
  {
    absl::MutexLock l(&mu_);
    closing_ = true;
    probes.swap(probes_);
  }
  for (std::thread& t : probes) t.join();
}

absl::Status SchedulerCore::ProbeServer(const std::string& address,
                                        proto::ServerStatus* status) {
  const absl::Duration timeout = absl::Milliseconds(
      options_.config.fault_tolerance.probe_timeout_ms);
  absl::Status last;
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto st = options_.clients->Server(address)->GetStatus(
        options_.clock->Now() + timeout);
    if (st.ok()) {
      if (status != nullptr) *status = *std::move(st);
      return absl::OkStatus();
    }
    last = st.status();
    if (last.code() != absl::StatusCode::kUnavailable &&
        last.code() != absl::StatusCode::kDeadlineExceeded) {
      return absl::OkStatus();  // it answered, with an error: alive
    }
  }
  return last;
}

void SchedulerCore::Probe(int id, std::string address) {
  proto::ServerStatus status;
  const absl::Status probe = ProbeServer(address, &status);
  // A probe that timed out (the server accepts connections but answers
  // nothing: hung, or too busy) confirms a death only when the server's
  // heartbeats have stopped too: a busy server that still heartbeats is
  // not failed over on a slow answer. A refused connection needs no
  // heartbeat age: the process is gone. The age counts from the deadlines'
  // floor as CheckHeartbeats' does: a restarted scheduler's nodes may still
  // be reconnecting (NoteListening), and a heartbeat that waited for mu_
  // behind the heartbeat check is not the server's silence.
  absl::Duration silent = absl::InfiniteDuration();
  if (probe.code() == absl::StatusCode::kDeadlineExceeded) {
    absl::MutexLock l(&mu_);
    if (id < static_cast<int>(servers_.size())) {
      silent = options_.clock->Now() -
               std::max(servers_[id].last_seen, deadline_floor_);
    }
  }
  const absl::Duration fresh =
      absl::Milliseconds(3 * options_.config.cluster.heartbeat_ms);
  Unreachable unreachable;  // what its accusers' reports mean
  if (probe.ok()) {
    unreachable = UnreachableFrom(id, status);
  }
  if (probe.ok() && !unreachable.server_why.empty()) {
    PS_LOG_WARN("S[{}] answers the scheduler but is {}: failing it over", id,
                unreachable.server_why);
    FailoverServers({id}, unreachable.server_why);
  } else if (probe.ok() && unreachable.worker >= 0) {
    PS_LOG_WARN("S[{}] answers the scheduler; W[{}] is {}: dropping the "
                "worker",
                id, unreachable.worker, unreachable.worker_why);
    DropDeadWorkers({unreachable.worker}, unreachable.worker_why);
  } else if (probe.ok()) {
    PS_LOG_INFO("S[{}] answered its probe: not dead", id);
  } else if (silent < fresh) {
    PS_LOG_WARN("S[{}] did not answer its probe in time ({}) but heartbeated "
                "{} ago: busy, not failed over",
                id, std::string(probe.message()),
                absl::FormatDuration(silent));
  } else {
    // UNAVAILABLE: the connection was refused or reset (the process is
    // gone); a timeout may be a stopped or cut-off one.
    FailoverServers({id}, absl::StrCat("probe: ", probe.message()),
                    /*definitive=*/probe.code() ==
                        absl::StatusCode::kUnavailable);
  }
  absl::MutexLock l(&mu_);
  probing_.erase(id);
}

void SchedulerCore::WatchIrreplaceable(int id, std::string address) {
  const absl::Duration every =
      absl::Milliseconds(options_.config.cluster.heartbeat_ms);
  for (;;) {
    {
      absl::MutexLock l(&mu_);
      if (closing_ || concluding_ || !irreplaceable_.contains(id) ||
          servers_[id].info.state() != proto::NODE_ALIVE) {
        probing_.erase(id);
        return;
      }
    }
    const absl::Status probe = ProbeServer(address);
    if (probe.code() == absl::StatusCode::kUnavailable) {
      // Refused or reset: the process is gone.
      FailoverServers({id}, absl::StrCat("probe: ", probe.message()),
                      /*definitive=*/true);
    }
    absl::SleepFor(every);
  }
}

void SchedulerCore::NoteViewForSilenceLocked() {
  if (view_.epoch() == silence_epoch_) return;
  silence_epoch_since_ =
      silence_epoch_ < 0 ? ready_time_ : options_.clock->Now();
  silence_epoch_ = view_.epoch();
}

SchedulerCore::Unreachable SchedulerCore::UnreachableFrom(
    int id, const proto::ServerStatus& status) {
  absl::MutexLock l(&mu_);
  Unreachable out;
  auto it = accused_.find(id);
  if (it == accused_.end()) return out;
  Accusation& a = it->second;
  const absl::Time now = options_.clock->Now();
  const absl::Duration limit =
      absl::Milliseconds(options_.config.cluster.heartbeat_timeout_ms);
  const absl::Duration recent = 3 * options_.config.cluster.SuspectAfter();
  const absl::Duration replication_waiting =
      absl::Milliseconds(status.replication_waiting_ms());
  // A primary that waits on a backup's answer leaves its pushes unanswered
  // as long: the silence the workers hear is the backup's (found by its
  // heartbeats, or named by this primary), not a cut between them and it.
  // (A primary naming it as its backup is answered by it directly.)
  const bool waits_on_backup =
      replication_waiting >=
      std::min(limit / 2, options_.config.cluster.SuspectAfter());
  if (waits_on_backup) {
    PS_LOG_INFO("S[{}] has waited {} on a backup's replication answer: the "
                "silence its workers report is that backup's",
                id, absl::FormatDuration(replication_waiting));
  }
  // Silence counts from the current view on: one that began before it may
  // be the doing of a server the view change failed over (a primary
  // waiting on its cut-off backup is silent to its workers until then).
  NoteViewForSilenceLocked();
  std::vector<std::string> by;
  const Accusation::Report* lone = nullptr;  // when `by` has one name
  int named_recently = 0;  // by anyone, however short the silence
  absl::Duration silent = absl::InfiniteDuration();
  for (const auto& [node, report] : a.by) {
    if (now - report.when > recent) continue;
    if (waits_on_backup && report.role == proto::ROLE_WORKER) continue;
    ++named_recently;
    const absl::Duration since_view =
        report.when -
        std::max(report.when - report.silent, silence_epoch_since_);
    if (since_view >= limit) {
      by.push_back(node);
      lone = &report;
      silent = std::min(silent, since_view);
    }
  }
  if (by.empty()) return out;
  int live_workers = 0;
  for (const Node& w : workers_) {
    live_workers += static_cast<int>(w.info.state() == proto::NODE_ALIVE);
  }
  const bool believed =
      by.size() >= 2 ||
      (live_workers == 1 && lone->role == proto::ROLE_WORKER);
  const std::string names = absl::StrJoin(by, ", ");
  if (believed) {
    accused_.erase(it);
    out.server_why = absl::StrCat("unreachable from ", names, " for ",
                                  absl::FormatDuration(silent),
                                  " (a network partition)");
    return out;
  }
  // One node alone, for twice the timeout, while no other node (who had as
  // long to say so) names the server at all: the cut is that node's link.
  const bool alone_long = named_recently == 1 && silent >= 2 * limit;
  // A worker: it is dropped, and its work units go to the others.
  if (alone_long && lone->role == proto::ROLE_WORKER &&
      lone->id >= 0 &&
      lone->id < static_cast<int>(workers_.size()) &&
      workers_[lone->id].info.state() == proto::NODE_ALIVE) {
    out.worker = lone->id;
    out.worker_why = absl::StrCat(
        "cut off from S[", id, "]: heard nothing from it for ",
        absl::FormatDuration(silent),
        " while it answers the scheduler and no other worker names it (a "
        "network partition)");
    accused_.erase(it);
    return out;
  }
  // A primary naming its backup: the link between the two is cut (a
  // backup cut off from every primary it serves is named by two of them,
  // within the timeout). The backup is failed over: the primary's pushes
  // wait on it for as long as the cut lasts, and its ranges have other
  // copies. (A primary whose own link is broken is named by the primaries
  // it backs up first, within the timeout.)
  if (alone_long && lone->role == proto::ROLE_SERVER) {
    accused_.erase(it);
    out.server_why = absl::StrCat(
        "unreachable from ", names, ", a primary it backs up, for ",
        absl::FormatDuration(silent), " (a network partition)");
    return out;
  }
  if (!a.warned) {
    a.warned = true;
    PS_LOG_WARN("S[{}] answers the scheduler but {} alone has heard nothing "
                "from it for {}: not failed over on one node's word (that "
                "node's own link may be what is broken)",
                id, names, absl::FormatDuration(silent));
  }
  return out;
}

absl::StatusOr<proto::RoutingTable> SchedulerCore::ReassignLocked(
    const std::vector<bool>& live) {
  return Reassign(
      ring_, view_.routing(), live, replicas_, view_.epoch() + 1,
      [&](int r, int s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return copying_.contains({r, s});
      },
      [&](int s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return draining_.contains(s);
      });
}

void SchedulerCore::RefreshCopies(const std::vector<int>& ids) {
  std::vector<std::pair<int, std::string>> ask;  // members still copying
  {
    absl::MutexLock l(&mu_);
    if (concluding_ || !ready_ || replicas_ == 0 || copying_.empty()) return;
    std::vector<bool> live(servers_.size());
    for (size_t i = 0; i < servers_.size(); ++i) {
      live[i] = servers_[i].info.state() == proto::NODE_ALIVE &&
                std::find(ids.begin(), ids.end(), static_cast<int>(i)) ==
                    ids.end();
    }
    if (ReassignLocked(live).ok()) return;
    std::set<int> members;
    for (const auto& [rs, epoch] : copying_) {
      if (rs.second >= 0 && rs.second < static_cast<int>(live.size()) &&
          live[rs.second]) {
        members.insert(rs.second);
      }
    }
    for (int m : members) ask.emplace_back(m, servers_[m].info.address());
  }
  const absl::Duration timeout = absl::Milliseconds(
      options_.config.fault_tolerance.probe_timeout_ms);
  for (const auto& [m, address] : ask) {
    auto st = options_.clients->Server(address)->GetStatus(
        options_.clock->Now() + timeout);
    if (!st.ok()) continue;
    const auto& incomplete = st->incomplete_ranges();
    absl::MutexLock l(&mu_);
    for (auto it = copying_.begin(); it != copying_.end();) {
      const auto [r, s] = it->first;
      if (s == m && st->view_epoch() >= it->second &&
          std::find(incomplete.begin(), incomplete.end(), r) ==
              incomplete.end()) {
        PS_LOG_INFO("S[{}] holds its copy of range {} (asked before a "
                    "failover)",
                    s, r);
        it = copying_.erase(it);
      } else {
        ++it;
      }
    }
  }
}

void SchedulerCore::FailoverServers(const std::vector<int>& ids,
                                    const std::string& why, bool definitive) {
  absl::MutexLock change(&view_change_mu_);
  RefreshCopies(ids);
  absl::Status failure;
  proto::ClusterView view;
  std::vector<int> failed;
  const absl::Time t0 = options_.clock->Now();
  {
    absl::MutexLock l(&mu_);
    if (concluding_ || !ready_) return;
    std::vector<int> suspects;
    for (int id : ids) {
      if (id >= 0 && id < static_cast<int>(servers_.size()) &&
          servers_[id].info.state() == proto::NODE_ALIVE) {
        suspects.push_back(id);
      }
    }
    if (suspects.empty()) return;
    if (!definitive && !finalizing_) {
      bool loses = replicas_ == 0;
      if (!loses) {
        std::vector<bool> live(servers_.size());
        for (size_t i = 0; i < servers_.size(); ++i) {
          live[i] = servers_[i].info.state() == proto::NODE_ALIVE &&
                    std::find(suspects.begin(), suspects.end(),
                              static_cast<int>(i)) == suspects.end();
        }
        loses = !ReassignLocked(live).ok();
      }
      const absl::Duration grace = options_.config.cluster.SchedulerTimeout();
      bool past = false;
      for (int id : suspects) past |= t0 - servers_[id].last_seen > grace;
      if (loses && !past) {
        for (int id : suspects) {
          if (irreplaceable_.emplace(id, t0).second) {
            PS_LOG_WARN(
                "S[{}] looks dead ({}), but failing it over would lose key "
                "ranges (it holds their only complete copy): waiting for it "
                "up to {} after its last heartbeat "
                "(cluster.scheduler_timeout_ms), probing it meanwhile; it "
                "fails at once if it refuses connections",
                id, why, absl::FormatDuration(grace));
          }
          if (!closing_ && probing_.insert(id).second) {
            probes_.emplace_back(&SchedulerCore::WatchIrreplaceable, this, id,
                                 servers_[id].info.address());
          }
        }
        return;
      }
    }
    for (int id : ids) {
      if (id < 0 || id >= static_cast<int>(servers_.size())) continue;
      Node& n = servers_[id];
      if (n.info.state() != proto::NODE_ALIVE) continue;
      n.info.set_state(proto::NODE_DEAD);
      failed.push_back(id);
      std::string waited;
      if (auto it = irreplaceable_.find(id); it != irreplaceable_.end()) {
        waited = absl::StrCat("; waited for it ",
                              absl::FormatDuration(t0 - it->second));
        irreplaceable_.erase(it);
      }
      const std::string what = absl::StrCat(
          "server S[", id, "]", n.info.address().empty() ? "" : " at ",
          n.info.address(), " died (", why, "; last heartbeat ",
          absl::FormatDuration(t0 - n.last_seen), " ago", waited, ")");
      if (replicas_ == 0) {
        failure = absl::UnavailableError(absl::StrCat(
            what, "; its key ranges have no replica "
                  "(fault_tolerance.replicas is 0)"));
      } else if (finalizing_) {
        failure = absl::UnavailableError(
            absl::StrCat(what, " while the model was being saved"));
      }
      PS_LOG_WARN("{}", what);
    }
    if (failed.empty()) return;
    if (failure.ok()) {
      std::vector<bool> live(servers_.size());
      for (size_t i = 0; i < servers_.size(); ++i) {
        live[i] = servers_[i].info.state() == proto::NODE_ALIVE;
      }
      absl::StatusOr<proto::RoutingTable> t = ReassignLocked(live);
      if (!t.ok()) {
        failure = Annotate(t.status(), absl::StrCat("server S[", failed[0],
                                                    "] died"));
      } else {
        view_.set_epoch(view_.epoch() + 1);
        NoteChainsLocked(view_.routing(), *t);
        *view_.mutable_routing() = std::move(*t);
        for (proto::NodeInfo& si : *view_.mutable_routing()->mutable_servers()) {
          if (si.id() >= 0 && si.id() < static_cast<int>(servers_.size())) {
            si.set_state(servers_[si.id()].info.state());
          }
        }
        for (int id : failed) {
          Failover f;
          f.server = id;
          f.epoch = view_.epoch();
          f.last_seen_ms = absl::ToUnixMillis(servers_[id].last_seen);
          f.detected_ms = absl::ToUnixMillis(t0);
          f.why = why;
          failovers_.push_back(f);
        }
        view = view_;
        SaveStateLocked();
      }
    }
  }
  if (!failure.ok()) {
    Conclude(failure);
    return;
  }
  if (!BroadcastView(view).ok()) return;  // the job failed, naming the server
  PS_LOG_INFO("view epoch {}: S[{}] failed over to the backups in {}",
              view.epoch(), absl::StrJoin(failed, "], S["),
              absl::FormatDuration(options_.clock->Now() - t0));
}

SchedulerCore::Node* SchedulerCore::FindLocked(proto::Role role, int id) {
  std::vector<Node>* group = role == proto::ROLE_SERVER   ? &servers_
                             : role == proto::ROLE_WORKER ? &workers_
                                                          : nullptr;
  if (group == nullptr || id < 0 || id >= static_cast<int>(group->size())) {
    return nullptr;
  }
  return &(*group)[id];
}

absl::StatusOr<proto::RegisterResponse> SchedulerCore::Register(
    const proto::RegisterRequest& req) {
  absl::MutexLock l(&mu_);
  if (concluding_) {
    return ErrorWithReason(absl::StatusCode::kFailedPrecondition,
                           proto::REASON_JOB_FAILED,
                           "register: the job has already ended");
  }
  std::vector<Node>* group;
  if (req.role() == proto::ROLE_SERVER) {
    group = &servers_;
    if (req.address().empty()) {
      return absl::InvalidArgumentError("a server must register an address");
    }
  } else if (req.role() == proto::ROLE_WORKER) {
    group = &workers_;
  } else {
    return absl::InvalidArgumentError("register: role must be server or worker");
  }
  int id = -1;
  const int n = static_cast<int>(group->size());
  if (req.requested_id() >= 0 && req.requested_id() < n &&
      (*group)[req.requested_id()].info.state() == proto::NODE_UNKNOWN) {
    id = req.requested_id();
  } else {
    for (int i = 0; i < n; ++i) {
      if ((*group)[i].info.state() == proto::NODE_UNKNOWN) {
        id = i;
        break;
      }
    }
  }
  if (id < 0 && req.role() == proto::ROLE_SERVER &&
      phase_ == JobPhase::kRunning && !finalizing_ && !closing_) {
    // Elasticity (issue 9): a server joins the running job as S[n] (a new
    // id: a dead server's id keeps its failover record). It is in the view
    // at once, owning nothing; Rebalance then moves an even share of the
    // ranges to it.
    Node node;
    node.info.set_id(n);
    node.info.set_role(proto::ROLE_SERVER);
    node.info.set_address(req.address());
    node.info.set_state(proto::NODE_ALIVE);
    node.last_seen = options_.clock->Now();
    node.info.set_last_heartbeat_ms(absl::ToUnixMillis(node.last_seen));
    servers_.push_back(node);
    view_.set_epoch(view_.epoch() + 1);
    view_.mutable_routing()->set_epoch(view_.epoch());
    *view_.mutable_routing()->add_servers() = node.info;
    PS_LOG_INFO("S[{}] joined the running job ({}): view epoch {}", n,
                req.address(), view_.epoch());
    if (req.has_rejoin_of()) NoteRejoinLocked(req.rejoin_of(), n);
    rebalancing_.insert(n);
    probes_.emplace_back(&SchedulerCore::Rebalance, this, n);
    SaveStateLocked();
    proto::RegisterResponse resp;
    resp.set_id(n);
    *resp.mutable_view() = view_;
    return resp;
  }
  if (id < 0 && req.role() == proto::ROLE_WORKER &&
      phase_ == JobPhase::kRunning && !finalizing_ && !closing_) {
    // Elasticity (issue 9): a worker joins the running job as W[n] with an
    // even share of the queued work units. It is `joining` until
    // JoinWorker has fixed the clock it starts at (it waits for that in
    // JoinCluster).
    Node node;
    node.info.set_id(n);
    node.info.set_role(proto::ROLE_WORKER);
    node.info.set_address(req.address());
    node.info.set_state(proto::NODE_ALIVE);
    node.info.set_joining(true);
    node.last_seen = options_.clock->Now();
    node.info.set_last_heartbeat_ms(absl::ToUnixMillis(node.last_seen));
    workers_.push_back(node);
    const int units = work_->AddWorker();
    view_.set_epoch(view_.epoch() + 1);
    view_.mutable_routing()->set_epoch(view_.epoch());
    *view_.add_workers() = node.info;
    PS_LOG_INFO("W[{}] joined the running job with {} work unit(s): view "
                "epoch {}",
                n, units, view_.epoch());
    probes_.emplace_back(&SchedulerCore::JoinWorker, this, n, units,
                         node.last_seen);
    SaveStateLocked();
    proto::RegisterResponse resp;
    resp.set_id(n);
    *resp.mutable_view() = view_;
    return resp;
  }
  if (id < 0 && phase_ != JobPhase::kRegistering) {
    return absl::FailedPreconditionError(absl::StrCat(
        "register: the job is ", JobPhaseName(phase_), " with all ", n,
        req.role() == proto::ROLE_SERVER ? " server" : " worker",
        " slots taken; ",
        req.role() == proto::ROLE_SERVER
            ? "a server can join only while the job is running"
            : "a worker can join only while the job is running"));
  }
  if (id < 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "all ", n, req.role() == proto::ROLE_SERVER ? " server" : " worker",
        " slots are taken"));
  }
  Node& node = (*group)[id];
  node.info.set_address(req.address());
  node.info.set_state(proto::NODE_ALIVE);
  node.last_seen = options_.clock->Now();
  node.info.set_last_heartbeat_ms(absl::ToUnixMillis(node.last_seen));
  PS_LOG_INFO("{}[{}] registered ({})", RoleLetter(req.role()), id,
              req.address().empty() ? "-" : req.address());
  bool all = true;
  for (const Node& s : servers_) all &= s.info.state() != proto::NODE_UNKNOWN;
  for (const Node& w : workers_) all &= w.info.state() != proto::NODE_UNKNOWN;
  if (all && !ready_) {
    BuildViewLocked();
    ready_ = true;
    phase_ = JobPhase::kRunning;
    ready_time_ = options_.clock->Now();
    // Bug "Healthy nodes declared dead during start-up": nobody heartbeats
    // for the registration phase; a node's deadline counts from when the
    // view is there for it (refreshed again when a GetView reply carries
    // it), never from its registration.
    for (Node& s : servers_) s.last_seen = ready_time_;
    for (Node& w : workers_) w.last_seen = ready_time_;
    PS_LOG_INFO("cluster ready: {} servers, {} workers, {} key ranges, "
                "mode {} tau {}",
                servers_.size(), workers_.size(),
                view_.routing().range_begin_size(),
                ModeName(options_.config.consistency.mode),
                options_.config.EffectiveTau());
    SaveStateLocked();
  }
  proto::RegisterResponse resp;
  resp.set_id(id);
  if (ready_) *resp.mutable_view() = view_;
  return resp;
}

void SchedulerCore::BuildViewLocked() {
  const JobConfig& c = options_.config;
  std::vector<int> ids;
  for (int i = 0; i < static_cast<int>(servers_.size()); ++i) ids.push_back(i);
  proto::ClusterView v;
  v.set_epoch(view_.epoch() + 1);
  replicas_ = c.fault_tolerance.EffectiveReplicas(static_cast<int>(ids.size()));
  *v.mutable_routing() =
      BuildHashRing(ids, c.cluster.virtual_nodes, v.epoch(), replicas_);
  ring_ = v.routing();
  for (const Node& s : servers_) *v.mutable_routing()->add_servers() = s.info;
  for (const Node& w : workers_) *v.add_workers() = w.info;
  *v.mutable_consistency() = view_.has_consistency()
                                 ? view_.consistency()
                                 : ps::ToProto(c.consistency);
  for (const proto::TableConfig& t : ModelTables(c)) *v.add_tables() = t;
  v.set_job_config_yaml(config_yaml_);
  v.set_model_dir(c.output.model_dir);
  v.set_restore_from(options_.restore_from);  // checkpoints (issue 9)
  view_ = std::move(v);
}


absl::StatusOr<proto::GetViewResponse> SchedulerCore::GetView(
    const proto::GetViewRequest& req, absl::Time deadline) {
  absl::Time until = std::min(
      deadline, absl::Now() + absl::Milliseconds(req.wait_ms()));
  absl::MutexLock l(&mu_);
  if (!ready_ && !concluding_ &&
      (req.role() == proto::ROLE_SERVER || req.role() == proto::ROLE_WORKER)) {
    // Issue 9: a node that registered with a scheduler which died before
    // the cluster was ready (and so wrote no state) is unknown here.
    const Node* n = FindLocked(req.role(), req.id());
    if (n == nullptr || n->info.state() == proto::NODE_UNKNOWN) {
      return ErrorWithReason(
          absl::StatusCode::kFailedPrecondition, proto::REASON_NOT_REGISTERED,
          absl::StrCat(RoleLetter(req.role()), "[", req.id(),
                       "] is not registered with this scheduler (it was "
                       "restarted before the cluster was ready): register "
                       "again"));
    }
  }
  // Failover (issue 9): a caller that could not reach a server has it
  // probed now; unless the caller is not a live node (a server failed over
  // while cut off, whose suspicions of its backups arrive once it is
  // reconnected: they would fail no one, but are not worth a probe).
  const Node* accuser = FindLocked(req.role(), req.id());
  const bool believable =
      accuser != nullptr && accuser->info.state() == proto::NODE_ALIVE;
  for (int i = 0; believable && i < req.suspect_servers_size(); ++i) {
    const int s = req.suspect_servers(i);
    if (s < 0 || s >= static_cast<int>(servers_.size()) || !ready_ ||
        concluding_ || closing_ || replicas_ == 0 ||
        servers_[s].info.state() != proto::NODE_ALIVE) {
      continue;
    }
    // Who names it, having heard nothing from it for how long
    // (UnreachableFrom), probe or not.
    NoteViewForSilenceLocked();
    if (i < req.suspect_silent_ms_size()) {
      accused_[s].by[absl::StrCat(RoleLetter(req.role()), "[", req.id(), "]")] =
          {options_.clock->Now(),
           absl::Milliseconds(std::max<int64_t>(0, req.suspect_silent_ms(i))),
           req.role(), req.id()};
    }
    StartProbeLocked(s, absl::StrCat("S[", s, "] suspected by ",
                                     RoleLetter(req.role()), "[", req.id(),
                                     "]"));
  }
  auto newer = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return (ready_ && view_.epoch() > req.known_epoch()) || concluding_;
  };
  // Real time here: waits block a gRPC thread, bounded by `until`.
  mu_.AwaitWithDeadline(absl::Condition(&newer), until);
  proto::GetViewResponse resp;
  resp.set_ready(ready_);
  if (ready_) {
    *resp.mutable_view() = view_;
    // This reply tells the node the view: its heartbeat deadline starts now.
    Node* n = FindLocked(req.role(), req.id());
    if (n != nullptr && n->info.state() == proto::NODE_ALIVE) {
      n->last_seen = std::max(n->last_seen, options_.clock->Now());
    }
  }
  return resp;
}

absl::Status SchedulerCore::OpenSession(proto::Role role, int id) {
  absl::MutexLock l(&mu_);
  Node* n = FindLocked(role, id);
  if (n == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("session: unknown node ", RoleLetter(role), "[", id, "]"));
  }
  if (n->info.state() != proto::NODE_ALIVE) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session: ", RoleLetter(role), "[", id, "] is ",
        n->info.state() == proto::NODE_UNKNOWN
            ? "not registered"
            : proto::NodeState_Name(n->info.state())));
  }
  ++n->sessions;
  n->had_session = true;
  return absl::OkStatus();
}

int SchedulerCore::OpenSessions(proto::Role role, int id) {
  absl::MutexLock l(&mu_);
  const Node* n = FindLocked(role, id);
  return n == nullptr ? 0 : n->sessions;
}

void SchedulerCore::CloseSession(proto::Role role, int id) {
  absl::MutexLock l(&mu_);
  Node* n = FindLocked(role, id);
  if (n == nullptr || n->sessions == 0) return;
  if (--n->sessions > 0 || n->info.state() != proto::NODE_ALIVE || !ready_ ||
      concluding_ || closing_) {
    return;
  }
  n->session_closed_at = options_.clock->Now();
  if (role == proto::ROLE_WORKER) {
    PS_LOG_INFO("W[{}]'s session with the scheduler closed: dropped if it "
                "stays silent for {} after its last heartbeat",
                id, absl::FormatDuration(
                        options_.config.cluster.WorkerGoneAfter()));
    return;
  }
  // A server's process that is gone refuses the probe: failed over now,
  // not at its heartbeat deadline (without replicas that deadline decides,
  // as for the suspects named in GetView).
  if (replicas_ == 0) return;
  StartProbeLocked(id, absl::StrCat("S[", id, "]'s session with the "
                                    "scheduler closed"));
}

void SchedulerCore::StartProbeLocked(int id, const std::string& what) {
  if (!probing_.insert(id).second) return;
  PS_LOG_WARN("{}: probing it", what);
  probes_.emplace_back(&SchedulerCore::Probe, this, id,
                       servers_[id].info.address());
}

absl::StatusOr<proto::HeartbeatResponse> SchedulerCore::Heartbeat(
    const proto::HeartbeatRequest& req) {
  absl::MutexLock l(&mu_);
  Node* found = FindLocked(req.role(), req.id());
  if (found == nullptr) {
    return absl::InvalidArgumentError("heartbeat: unknown node");
  }
  if (found->info.state() == proto::NODE_ALIVE) {
    last_heartbeat_ = std::max(last_heartbeat_, options_.clock->Now());
  }
  Node& n = *found;
  if (n.info.state() == proto::NODE_UNKNOWN) {
    return absl::FailedPreconditionError("heartbeat before register");
  }
  if (req.role() == proto::ROLE_WORKER &&
      n.info.state() == proto::NODE_DEAD) {
    // Its units were handed to the others: it must not come back.
    return absl::FailedPreconditionError(absl::StrCat(
        "W[", req.id(), "] was declared dead",
        n.dead_why.empty() ? "" : absl::StrCat(" (", n.dead_why, ")"),
        "; its work was handed to others"));
  }
  n.last_seen = std::max(n.last_seen, options_.clock->Now());
  n.info.set_last_heartbeat_ms(absl::ToUnixMillis(n.last_seen));
  if (req.role() == proto::ROLE_SERVER) {
    for (int32_t w : req.workers_gone()) {
      if (w < 0 || w >= static_cast<int>(workers_.size()) ||
          workers_[w].info.state() != proto::NODE_ALIVE) {
        continue;
      }
      workers_[w].gone_at = options_.clock->Now();
      workers_[w].gone_server = req.id();
    }
    if (auto it = irreplaceable_.find(req.id()); it != irreplaceable_.end()) {
      PS_LOG_WARN("S[{}] heard from again after {}: it stays", req.id(),
                  absl::FormatDuration(n.last_seen - it->second));
      irreplaceable_.erase(it);
    }
  }
  if (req.role() == proto::ROLE_SERVER && req.view_epoch() > 0 &&
      !copying_.empty()) {
    // Issue 9: chain members of this server that now hold their copy (it
    // reports a view no older than the one that added it, without the
    // range among its incomplete ones).
    const auto& incomplete = req.incomplete_ranges();
    for (auto it = copying_.begin(); it != copying_.end();) {
      const auto [r, s] = it->first;
      if (s == req.id() && req.view_epoch() >= it->second &&
          std::find(incomplete.begin(), incomplete.end(), r) ==
              incomplete.end()) {
        it = copying_.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (req.role() == proto::ROLE_SERVER) {
    NoteFirstAckLocked(req.first_ack_epoch(), req.first_ack_unix_ms());
  }
  if (req.role() == proto::ROLE_WORKER) {
    n.info.set_clock(std::max(n.info.clock(), req.clock()));
    n.info.set_examples(req.examples());
    n.info.set_wait_seconds(req.wait_seconds());
    n.info.set_compute_seconds(req.compute_seconds());
    n.info.set_loss_sum(req.loss_sum());
    if (req.validation_rows() > 0) NoteValidationLocked(req);
  }
  proto::HeartbeatResponse resp;
  if (req.role() == proto::ROLE_WORKER) {
    resp.set_others_min_clock(OthersMinClockLocked(req.id()));
  }
  resp.set_epoch(view_.epoch());
  resp.set_shutdown(ended_);
  if (req.role() == proto::ROLE_SERVER && n.info.state() == proto::NODE_LEFT) {
    resp.set_shutdown(true);  // drained (issue 9): it holds nothing now
    resp.set_left(true);
  }
  if (req.role() == proto::ROLE_SERVER && n.info.state() == proto::NODE_DEAD &&
      !ended_) {
    // Failed over, yet it runs (it hung past the timeout): it holds nothing
    // of the job now, and rejoins as a new server, restoring the capacity
    // and the replication factor the job had.
    resp.set_declared_dead(true);
    std::string why = "no heartbeat for longer than the timeout";
    for (const Failover& f : failovers_) {
      if (f.server == req.id()) why = f.why;
    }
    resp.set_error(absl::StrCat("S[", req.id(), "] was declared dead (", why,
                                ") and its key ranges went to their backups"));
  }
  if (ended_ && phase_ == JobPhase::kFailed) {
    resp.set_failed(true);
    resp.set_error(std::string(end_status_.message()));
  }
  if (resp.shutdown()) n.told_shutdown = true;
  return resp;
}

bool SchedulerCore::EndSeenByAll() const {
  absl::MutexLock l(&mu_);
  if (!ended_) return false;
  for (const std::vector<Node>* nodes : {&servers_, &workers_}) {
    for (const Node& n : *nodes) {
      const proto::NodeState state = n.info.state();
      if (state != proto::NODE_ALIVE && state != proto::NODE_FINISHED) {
        continue;  // never registered, dead or drained
      }
      // Gone: its sessions all closed with its process (SessionLost's time
      // is not recorded once the job is concluding).
      const bool gone = n.had_session && n.sessions == 0;
      if (!n.told_shutdown && !gone) return false;
    }
  }
  // A status watcher (ps_status --watch, a dashboard) asking lately: until
  // it has been answered with the end (it exits 2, the outcome unknown,
  // when the scheduler is gone first).
  return end_status_served_ ||
         options_.clock->Now() - last_status_ > kStatusWatchWindow;
}

// ------------------------------------------------------ work units (issue 9)

bool SchedulerCore::HasTestSet() const {
  const DataConfig& d = options_.config.data;
  return d.format == "synthetic" ? d.synthetic.test_rows > 0 : !d.test.empty();
}

absl::StatusOr<proto::GetWorkResponse> SchedulerCore::GetWork(
    const proto::GetWorkRequest& req) {
  absl::Status zero_examples;
  proto::GetWorkResponse resp;
  {
    absl::MutexLock l(&mu_);
    const int w = req.worker_id();
    if (w < 0 || w >= static_cast<int>(workers_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("unknown worker ", w));
    }
    if (concluding_ && !end_status_.ok()) return JobFailed(end_status_);
    if (!ready_) return absl::FailedPreconditionError("cluster not ready yet");
    const proto::NodeState state = workers_[w].info.state();
    if (state != proto::NODE_ALIVE && state != proto::NODE_FINISHED) {
      return absl::FailedPreconditionError(absl::StrCat(
          "W[", w, "] is not a live worker of this job (declared dead: its "
          "units were handed to the others)"));
    }
    workers_[w].info.set_clock(
        std::max(workers_[w].info.clock(), req.clock()));
    resp.set_others_min_clock(OthersMinClockLocked(w));
    const bool was_done = work_->AllDone();
    for (const proto::FinishedUnit& u : req.finished()) {
      PS_RETURN_IF_ERROR(work_->Finish(w, u));
    }
    if (work_->AllDone()) {
      if (!was_done) {
        PS_LOG_INFO("all {} work units done ({} epochs)",
                    work_->units_per_epoch() * work_->epochs(),
                    work_->epochs());
        if (work_->epoch_examples()[0] == 0) {
          const DataConfig& d = options_.config.data;
          zero_examples = absl::FailedPreconditionError(absl::StrCat(
              "trained 0 examples from ",
              d.format == "synthetic" ? "synthetic data" : d.train, " (",
              work_->skipped_first_epoch(), " lines skipped)"));
        }
      }
      resp.set_state(proto::WORK_DONE);
      // One evaluator: the lowest live worker when first asked, chosen
      // again only when that one died.
      const auto live = [&](int id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        const proto::NodeState s = workers_[id].info.state();
        return s == proto::NODE_ALIVE || s == proto::NODE_FINISHED;
      };
      if (evaluator_ < 0 || !live(evaluator_)) {
        for (int i = 0; i < static_cast<int>(workers_.size()); ++i) {
          if (live(i)) {
            evaluator_ = i;
            break;
          }
        }
      }
      resp.set_evaluate(evaluator_ == w);
    } else {
      const std::set<int64_t> holding(req.holding().begin(),
                                      req.holding().end());
      std::vector<proto::WorkUnit> lost = work_->Lost(w, holding);
      std::optional<proto::WorkUnit> next;
      if (!lost.empty()) {
        next = std::move(lost.front());
      } else {
        next = work_->Take(w);
      }
      if (next.has_value()) {
        resp.set_state(proto::WORK_UNIT);
        *resp.mutable_unit() = std::move(*next);
      } else {
        resp.set_state(proto::WORK_WAIT);
      }
    }
    SaveStateLocked();  // before the reply commits the worker to it
  }
  if (!zero_examples.ok()) {
    Conclude(zero_examples);
    return JobFailed(zero_examples);
  }
  return resp;
}

void SchedulerCore::DropDeadWorkers(const std::vector<int>& ids,
                                    const std::string& why) {
  if (ids.empty()) return;
  // One view change at a time (taken before mu_), so servers see epochs in
  // order.
  absl::MutexLock change(&view_change_mu_);
  absl::Status failure;
  bool finalize = false;
  proto::ClusterView view;
  {
    absl::MutexLock l(&mu_);
    if (concluding_) return;
    for (int id : ids) {
      workers_[id].info.set_state(proto::NODE_DEAD);
      workers_[id].dead_why = why;
    }
    int live = 0;
    for (const Node& n : workers_) {
      if (n.info.state() == proto::NODE_ALIVE ||
          n.info.state() == proto::NODE_FINISHED) {
        ++live;
      }
    }
    for (int id : ids) {
      if (std::find(dead_workers_.begin(), dead_workers_.end(), id) ==
          dead_workers_.end()) {
        dead_workers_.push_back(id);
      }
      const int released = work_->Release(id);
      PS_LOG_WARN("W[{}] declared dead ({}): {} unfinished work unit(s) go "
                  "back to the queue; {} worker(s) left",
                  id, why, released, live);
      if (id == evaluator_ && HasTestSet() && !done_.contains(id)) {
        failure = absl::UnavailableError(absl::StrCat(
            "worker W[", id, "], chosen to evaluate the test set, died before "
            "reporting the test metrics"));
      }
    }
    if (live == 0) {
      failure = absl::UnavailableError(absl::StrCat(
          "every worker died (the last: W[", ids.back(), "]); ",
          !work_->AllDone() ? "the training data" : "the job",
          " cannot be completed"));
    }
    if (failure.ok()) {
      for (proto::NodeInfo& wi : *view_.mutable_workers()) {
        if (wi.id() >= 0 && wi.id() < static_cast<int>(workers_.size())) {
          wi.set_state(workers_[wi.id()].info.state());
        }
      }
      view_.set_epoch(view_.epoch() + 1);
      view_.mutable_routing()->set_epoch(view_.epoch());
      view = view_;
      finalize = StartFinalizingLocked();
      SaveStateLocked();
    }
  }
  if (!failure.ok()) {
    Conclude(failure);
    return;
  }
  // The servers stop waiting for the dead workers' clocks.
  if (!BroadcastView(view).ok()) return;  // the job failed, naming the server
  PS_LOG_INFO("view epoch {}: {} dead worker(s)", view.epoch(), ids.size());
  if (finalize) Finalize();
}

int64_t SchedulerCore::OthersMinClockLocked(int worker) const {
  int64_t min = -1;
  for (const Node& n : workers_) {
    if (n.info.id() == worker || n.info.state() != proto::NODE_ALIVE ||
        n.info.joining()) {
      continue;  // a joiner has no clock yet
    }
    if (min < 0 || n.info.clock() < min) min = n.info.clock();
  }
  return min;
}

bool SchedulerCore::StartFinalizingLocked() {
  if (finalizing_ || !ready_) return false;
  int live = 0, finished = 0;
  for (const Node& n : workers_) {
    if (n.info.state() == proto::NODE_FINISHED) ++finished;
    if (n.info.state() != proto::NODE_DEAD) ++live;
  }
  if (live == 0 || finished < live) return false;
  finalizing_ = true;
  phase_ = JobPhase::kFinishing;
  // The curve ends where training did, also for a job shorter than one
  // progress interval.
  AddProgressPointLocked(options_.clock->Now(), work_->Progress().epoch,
                         /*last=*/true);
  return true;
}

absl::Status SchedulerCore::Barrier(const proto::BarrierRequest& req,
                                    absl::Time deadline) {
  absl::MutexLock l(&mu_);
  if (req.role() != proto::ROLE_WORKER && req.role() != proto::ROLE_SERVER) {
    return absl::InvalidArgumentError("barrier: role must be server or worker");
  }
  const std::string key = absl::StrCat(req.name(), "/", req.role());
  barriers_[key].insert(req.id());
  auto passed = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    if (concluding_) return true;
    const std::vector<Node>& group =
        req.role() == proto::ROLE_SERVER ? servers_ : workers_;
    const std::set<int>& in = barriers_[key];
    for (const Node& n : group) {
      bool live = n.info.state() == proto::NODE_ALIVE ||
                  n.info.state() == proto::NODE_FINISHED;
      if (live && !in.contains(n.info.id())) return false;
    }
    return true;
  };
  if (req.timeout_ms() > 0) {
    deadline = std::min(deadline,
                        absl::Now() + absl::Milliseconds(req.timeout_ms()));
  }
  if (!mu_.AwaitWithDeadline(absl::Condition(&passed), deadline)) {
    std::vector<int> missing;
    const std::vector<Node>& group =
        req.role() == proto::ROLE_SERVER ? servers_ : workers_;
    for (const Node& n : group) {
      if (!barriers_[key].contains(n.info.id())) missing.push_back(n.info.id());
    }
    return absl::DeadlineExceededError(
        absl::StrCat("barrier '", req.name(), "': still waiting for ids ",
                     absl::StrJoin(missing, ",")));
  }
  if (concluding_ && !end_status_.ok()) return JobFailed(end_status_);
  return absl::OkStatus();
}

absl::Status SchedulerCore::WorkerDone(const proto::WorkerDoneRequest& req) {
  {
    absl::MutexLock l(&mu_);
    if (req.worker_id() < 0 ||
        req.worker_id() >= static_cast<int>(workers_.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown worker ", req.worker_id()));
    }
    if (concluding_ && !end_status_.ok()) return JobFailed(end_status_);
    Node& w = workers_[req.worker_id()];
    if (w.info.state() != proto::NODE_ALIVE &&
        w.info.state() != proto::NODE_FINISHED) {
      return absl::FailedPreconditionError(absl::StrCat(
          "W[", req.worker_id(), "] is not a live worker of this job"));
    }
    done_[req.worker_id()] = req;
    w.info.set_state(proto::NODE_FINISHED);
    w.info.set_examples(req.examples());
    // Its final loss (heartbeats may not have carried the last of it).
    if (req.examples() > 0 && std::isfinite(req.train_loss())) {
      w.info.set_loss_sum(req.train_loss() *
                          static_cast<double>(req.examples()));
    }
    PS_LOG_INFO("W[{}] done: {} examples, compute {:.2f}s, wait {:.2f}s",
                req.worker_id(), req.examples(), req.compute_seconds(),
                req.wait_seconds());
    // A retry of a WorkerDone whose reply was lost finds finalizing_ set.
    const bool finalize = StartFinalizingLocked();
    SaveStateLocked();
    if (!finalize) return absl::OkStatus();
  }
  Finalize();
  return absl::OkStatus();
}

absl::StatusOr<proto::ServerControlResponse> SchedulerCore::ControlWithRetry(
    const std::string& address, const proto::ServerControlRequest& req,
    absl::Time deadline, int gone_server) {
  Clock* clock = options_.clock;
  absl::Duration backoff = options_.retry_initial;
  for (int attempt = 1;; ++attempt) {
    const absl::Time attempt_deadline =
        std::min(deadline, clock->Now() + options_.attempt_timeout);
    auto resp = options_.clients->Server(address)->Control(req, attempt_deadline);
    if (resp.ok()) return resp;
    // Decided by code and reason: the peer was not reached or did not answer
    // in time. Anything else (INVALID_ARGUMENT, FAILED_PRECONDITION, ...) a
    // resend cannot fix.
    const absl::StatusCode code = resp.status().code();
    const bool retryable = (code == absl::StatusCode::kUnavailable ||
                            code == absl::StatusCode::kDeadlineExceeded) &&
                           ReasonOf(resp.status()) != proto::REASON_JOB_FAILED;
    const absl::Time next = clock->Now() + backoff;
    if (!retryable || next >= deadline) {
      return Annotate(resp.status(),
                      absl::StrCat("after ", attempt, " attempt(s)"));
    }
    {
      absl::MutexLock l(&mu_);
      if (phase_ == JobPhase::kFailed) return JobFailed(end_status_);
      if (gone_server >= 0 && code == absl::StatusCode::kUnavailable &&
          gone_server < static_cast<int>(servers_.size())) {
        if (servers_[gone_server].SessionLost()) {
          return Annotate(
              resp.status(),
              absl::StrCat("after ", attempt, " attempt(s), not retried: its "
                           "session with the scheduler closed"));
        }
      }
    }
    PS_LOG_WARN("control call to {} failed (attempt {}), retrying in {}: {}",
                address, attempt, absl::FormatDuration(backoff),
                resp.status().ToString());
    clock->SleepUntil(next);
    backoff = std::min(backoff * 2, options_.retry_max);
  }
}

void SchedulerCore::Finalize() {
  std::vector<std::string> addresses;
  std::vector<int> ids;
  {
    absl::MutexLock l(&mu_);
    for (const Node& s : servers_) {
      // Failed over or drained (issue 9): it holds no range.
      if (s.info.state() != proto::NODE_ALIVE) continue;
      addresses.push_back(s.info.address());
      ids.push_back(s.info.id());
    }
  }
  // Bug "one failed save lost the trained model": each save is retried
  // (saving again overwrites the same files) until save_deadline.
  const absl::Time deadline = options_.clock->Now() + options_.save_deadline;
  std::vector<proto::ServerControlResponse> models;
  // Early stopping (issue 12): also the best model's copy (in
  // <model_dir>/best), when the job stopped early and every server kept the
  // copy of the best epoch.
  bool save_copy = false;
  int copy_epoch = 0;
  {
    absl::MutexLock l(&mu_);
    copy_epoch = copy_kept_;
    save_copy = stopped_early_after_ > 0 && validation_best_ >= 0 &&
                copy_kept_ == validation_points_[validation_best_].epoch;
  }
  bool all_from_copy = save_copy;
  for (size_t i = 0; i < addresses.size(); ++i) {
    proto::ServerControlRequest req;
    req.set_save_and_exit(true);
    req.set_save_kept_copy(save_copy);
    auto resp = ControlWithRetry(addresses[i], req, deadline);
    if (!resp.ok()) {
      Conclude(absl::Status(
          resp.status().code(),
          absl::StrCat("S[", ids[i], "] at ", addresses[i],
                       " could not save its model: ", resp.status().message())));
      return;
    }
    all_from_copy = all_from_copy && resp->saved_kept_copy();
    {
      absl::MutexLock l(&mu_);
      NoteFirstAckLocked(resp->first_ack_epoch(), resp->first_ack_unix_ms());
    }
    models.push_back(*resp);
  }
  {
    absl::MutexLock l(&mu_);
    models_ = std::move(models);
    best_model_epoch_ = all_from_copy ? copy_epoch : 0;
  }
  if (save_copy && !all_from_copy) {
    PS_LOG_WARN("early stopping: not every server had the copy of the best "
                "model (a failover since?); {}/best is incomplete",
                options_.config.output.model_dir);
  } else if (save_copy) {
    PS_LOG_INFO("early stopping: the best model (after {} epochs) is in "
                "{}/best; {} holds the model as training left it",
                copy_epoch, options_.config.output.model_dir,
                options_.config.output.model_dir);
  }
  Conclude(absl::OkStatus());
}

void SchedulerCore::NoteRejoinLocked(int old, int now) {
  if (old < 0 || old >= static_cast<int>(servers_.size()) ||
      servers_[old].info.state() != proto::NODE_DEAD) {
    return;
  }
  for (Failover& f : failovers_) {
    if (f.server == old && f.rejoined_as < 0) {
      f.rejoined_as = now;
      PS_LOG_INFO("S[{}] is S[{}] back after its failover", now, old);
    }
  }
}

void SchedulerCore::NoteFirstAckLocked(int64_t epoch, int64_t unix_ms) {
  if (unix_ms <= 0) return;
  for (Failover& f : failovers_) {
    if (epoch >= f.epoch && (f.first_ack_ms == 0 || unix_ms < f.first_ack_ms)) {
      f.first_ack_ms = unix_ms;
    }
  }
}

void SchedulerCore::Conclude(absl::Status status) {
  std::string report;
  {
    absl::MutexLock l(&mu_);
    if (concluding_) return;
    concluding_ = true;
    if (status.ok()) {
      phase_ = JobPhase::kDone;
    } else {
      failed_in_ = phase_;
      phase_ = JobPhase::kFailed;
      models_.clear();  // a failed job claims no model as final
      PS_LOG_ERROR("job failed while {}: {}", JobPhaseName(failed_in_),
                   status.ToString());
    }
    end_status_ = status;
    end_time_ = options_.clock->Now();
    report = ReportJsonLocked();
    SaveStateLocked();  // ended: a restarted scheduler takes nothing over
  }
  if (!options_.report_path.empty()) {
    // A file is written beside and renamed over: a reader (ps_launch reads
    // it as children exit) sees no report or a whole one, never half of
    // one. Anything else (/dev/stdout, a pipe) is written in place.
    std::error_code ec;
    const auto type = std::filesystem::status(options_.report_path, ec).type();
    const bool in_place = type != std::filesystem::file_type::regular &&
                          type != std::filesystem::file_type::not_found;
    const std::string tmp =
        in_place ? options_.report_path : options_.report_path + ".tmp";
    std::ofstream out(tmp);
    out << report;
    out.close();
    ec.clear();
    if (out && !in_place) std::filesystem::rename(tmp, options_.report_path, ec);
    if (!out || ec) {
      if (!in_place) std::filesystem::remove(tmp, ec);
      PS_LOG_ERROR("cannot write report {}", options_.report_path);
      absl::MutexLock l(&mu_);
      if (end_status_.ok()) {
        failed_in_ = JobPhase::kFinishing;
        phase_ = JobPhase::kFailed;
        models_.clear();
        end_status_ = absl::UnavailableError(
            absl::StrCat("cannot write report ", options_.report_path));
      }
    }
  }
  absl::MutexLock l(&mu_);
  ended_ = true;
}

absl::StatusOr<proto::SetConsistencyResponse> SchedulerCore::SetConsistency(
    const proto::SetConsistencyRequest& req) {
  const proto::ConsistencyConfig& c = req.consistency();
  if (c.mode() != proto::MODE_BSP && c.mode() != proto::MODE_SSP &&
      c.mode() != proto::MODE_ASP) {
    return absl::InvalidArgumentError("consistency.mode must be bsp, ssp or asp");
  }
  if (c.mode() == proto::MODE_SSP && c.tau() < 0) {
    return absl::InvalidArgumentError("consistency.tau must be >= 0 for ssp");
  }
  // One view change at a time, so servers see epochs in order.
  absl::MutexLock change(&view_change_mu_);
  proto::ClusterView view;
  {
    absl::MutexLock l(&mu_);
    if (!ready_) return absl::FailedPreconditionError("cluster not ready yet");
    if (concluding_) {
      return absl::FailedPreconditionError("the job has already ended");
    }
    if ((view_.consistency().mode() == proto::MODE_BSP) !=
        (c.mode() == proto::MODE_BSP)) {
      return absl::FailedPreconditionError(
          "switching to or from bsp while running is not supported; "
          "change tau instead");
    }
    *view_.mutable_consistency() = c;
    view_.set_epoch(view_.epoch() + 1);
    view_.mutable_routing()->set_epoch(view_.epoch());
    view = view_;
    SaveStateLocked();
  }
  PS_RETURN_IF_ERROR(BroadcastView(view));
  PS_LOG_INFO("consistency changed: mode {} tau {} (epoch {})",
              proto::ConsistencyMode_Name(c.mode()), c.tau(), view.epoch());
  proto::SetConsistencyResponse resp;
  resp.set_epoch(view.epoch());
  return resp;
}

absl::StatusOr<proto::StatusResponse> SchedulerCore::Status(bool brief) {
  proto::StatusResponse resp;
  std::vector<std::string> addresses;
  {
    absl::MutexLock l(&mu_);
    *resp.mutable_view() = view_;
    for (const Node& s : servers_) {
      *resp.add_nodes() = s.info;
      if (s.info.state() == proto::NODE_ALIVE) {
        addresses.push_back(s.info.address());
      }
    }
    for (const Node& w : workers_) *resp.add_nodes() = w.info;
    resp.set_phase(JobPhaseName(phase_));
    resp.set_now_ms(absl::ToUnixMillis(options_.clock->Now()));
    last_status_ = options_.clock->Now();
    if (ended_) end_status_served_ = true;
    const JobProgress p = work_->Progress();
    if (p.units_per_epoch > 0) {
      resp.set_epochs_done(static_cast<double>(p.done) /
                           static_cast<double>(p.units_per_epoch));
    }
    resp.set_replicas(replicas_);
    int degraded = 0, single = 0;
    for (int n : SyncedMembersLocked()) {
      degraded += n < 1 + replicas_ ? 1 : 0;
      single += n <= 1 && replicas_ > 0 ? 1 : 0;
    }
    resp.set_ranges_degraded(degraded);
    resp.set_ranges_single_copy(single);
  }
  if (brief) return resp;
  for (const std::string& a : addresses) {
    if (a.empty()) continue;
    auto s = options_.clients->Server(a)->GetStatus(
        options_.clock->Now() + absl::Seconds(2));
    if (s.ok()) *resp.add_servers() = *s;
  }
  return resp;
}

void SchedulerCore::NoteStall(absl::Duration gap) {
  absl::MutexLock l(&mu_);
  const absl::Time now = options_.clock->Now();
  int nodes = 0;
  for (std::vector<Node>* group : {&servers_, &workers_}) {
    for (Node& n : *group) {
      if (n.info.state() != proto::NODE_ALIVE) continue;
      n.last_seen = std::max(n.last_seen, now);
      ++nodes;
    }
  }
  PS_LOG_WARN("the scheduler did not run for {}: the heartbeat deadlines "
              "of {} live node(s) start again now",
              absl::FormatDuration(gap), nodes);
}

void SchedulerCore::CheckHeartbeats() {
  const absl::Duration timeout =
      absl::Milliseconds(options_.config.cluster.heartbeat_timeout_ms);
  absl::Status failure;
  std::vector<int> dead_workers;
  std::vector<int> gone_workers;
  std::vector<std::string> gone_why;
  std::vector<int> dead_servers;
  {
    const absl::Time asked = options_.clock->Now();
    absl::MutexLock l(&mu_);
    if (concluding_ || finalizing_) return;
    const absl::Time now = options_.clock->Now();
    // Kept waiting for mu_ longer than a heartbeat period: heartbeats
    // waited on it as well, and whichever took it first decided; a node
    // whose heartbeat was still queued would be declared dead for the
    // scheduler's own delay. Deadlines run from now.
    if (ready_ && now - asked > absl::Milliseconds(std::max(
                                    1, options_.config.cluster.heartbeat_ms))) {
      deadline_floor_ = std::max(deadline_floor_, now);
      PS_LOG_WARN("the heartbeat check waited {} for the scheduler's lock: "
                  "heartbeat deadlines start again now",
                  absl::FormatDuration(now - asked));
      return;
    }
    // How long node `n` has been silent, as far as deadlines go.
    const absl::Time floor = deadline_floor_;
    auto silent = [now, floor](const Node& n) {
      return now - std::max(n.last_seen, floor);
    };
    if (!ready_) {
      const int64_t limit = options_.config.cluster.register_timeout_ms;
      if (now - start_ <= absl::Milliseconds(limit)) return;
      std::vector<std::string> missing;
      for (const Node& n : servers_) {
        if (n.info.state() == proto::NODE_UNKNOWN) {
          missing.push_back(absl::StrCat("S[", n.info.id(), "]"));
        }
      }
      for (const Node& n : workers_) {
        if (n.info.state() == proto::NODE_UNKNOWN) {
          missing.push_back(absl::StrCat("W[", n.info.id(), "]"));
        }
      }
      failure = absl::DeadlineExceededError(absl::StrCat(
          "cluster incomplete after ", limit, " ms (cluster.register_timeout_ms)"
          ": waiting for ", absl::StrJoin(missing, ", ")));
    } else {
      // No live node heard from at all (no heartbeat from any for half a
      // heartbeat timeout, two heartbeat periods at least) while nodes are
      // due to be declared dead: the scheduler is more likely cut off from
      // the cluster (its host's network) than all of them dead together,
      // and failing them over would end the job (DATA_LOSS) when nothing
      // died. None is declared dead while nobody is heard from, for up to
      // cluster.scheduler_timeout_ms (how long the nodes wait for an
      // unreachable scheduler); the first heartbeat again gives every live
      // node a full heartbeat timeout to be heard from too (their
      // heartbeats come back one by one as connections recover). Counted
      // from heartbeats received (or this scheduler's start, or the
      // cluster's), not from when nodes were last told the view (a
      // long-polled view answered after the cut moves that).
      const absl::Time heard = std::max({last_heartbeat_, start_, ready_time_});
      const absl::Duration quiet = std::max(
          timeout / 2,
          absl::Milliseconds(2 * int64_t{options_.config.cluster.heartbeat_ms}));
      int live = 0;
      bool due = false;
      for (const std::vector<Node>* group : {&servers_, &workers_}) {
        for (const Node& n : *group) {
          if (n.info.state() != proto::NODE_ALIVE) continue;
          due |= silent(n) > timeout;
          ++live;
        }
      }
      if (live > 1 && (isolated_ || due) && now - heard > quiet) {
        const absl::Duration limit =
            options_.config.cluster.SchedulerTimeout();
        if (now - heard > std::max(limit, timeout)) {
          failure = absl::UnavailableError(absl::StrCat(
              "no node heard from for ", absl::FormatDuration(now - heard),
              " (cluster.scheduler_timeout_ms): all ", live,
              " live nodes went silent at once (the scheduler cut off from "
              "the cluster, or the whole cluster down)"));
        } else {
          if (!isolated_) {
            PS_LOG_WARN(
                "all {} live nodes silent for {}: the scheduler is likely cut "
                "off from the cluster; declaring none dead until one is heard "
                "from (giving up after {}, cluster.scheduler_timeout_ms)",
                live, absl::FormatDuration(now - heard),
                absl::FormatDuration(limit));
          }
          isolated_ = true;
          return;
        }
      } else if (isolated_) {
        isolated_ = false;
        for (std::vector<Node>* group : {&servers_, &workers_}) {
          for (Node& n : *group) {
            if (n.info.state() == proto::NODE_ALIVE) {
              n.last_seen = std::max(n.last_seen, now);
            }
          }
        }
        PS_LOG_WARN("nodes heard from again: the scheduler reaches the "
                    "cluster; the heartbeat deadlines of {} live node(s) "
                    "start again now",
                    live);
        return;
      }
    }
    if (ready_ && failure.ok()) {
      // A dead worker is dropped (DropDeadWorkers: its work units go to the
      // others); a dead server fails over (FailoverServers), or, when that
      // would lose data (without replication, say), ends the job once it
      // is certainly gone.
      // A worker whose connection a server saw closed after its last
      // heartbeat, and silent since for WorkerGoneAfter(): its process is
      // gone (a live one whose connection closed for another reason goes
      // on heartbeating).
      const absl::Duration gone_after =
          options_.config.cluster.WorkerGoneAfter();
      for (const Node& n : workers_) {
        if (n.info.state() != proto::NODE_ALIVE) continue;
        if (silent(n) > timeout) {
          dead_workers.push_back(n.info.id());
        } else if ((n.gone_at > n.last_seen || n.SessionLost()) &&
                   silent(n) > gone_after) {
          gone_workers.push_back(n.info.id());
        }
      }
      for (const Node& n : servers_) {
        if (n.info.state() == proto::NODE_ALIVE && silent(n) > timeout) {
          dead_servers.push_back(n.info.id());
        }
      }
      if (dead_workers.empty() && gone_workers.empty() &&
          dead_servers.empty()) {
        return;
      }
      for (int w : gone_workers) {
        const Node& n = workers_[w];
        std::vector<std::string> closed;
        if (n.gone_at > n.last_seen) {
          closed.push_back(
              absl::StrCat("its connection to S[", n.gone_server, "]"));
        }
        if (n.SessionLost()) closed.push_back("its session with the scheduler");
        gone_why.push_back(absl::StrCat(
            absl::StrJoin(closed, " and "), " closed, and no heartbeat for ",
            absl::FormatDuration(now - n.last_seen)));
      }
      for (std::vector<Node>* group : {&workers_}) {
        for (Node& n : *group) {
          if (n.info.state() == proto::NODE_ALIVE && silent(n) > timeout) {
            n.info.set_state(proto::NODE_DEAD);
          }
        }
      }
      for (int w : gone_workers) workers_[w].info.set_state(proto::NODE_DEAD);
    }
  }
  if (!failure.ok()) {
    Conclude(failure);
    return;
  }
  FailoverServers(dead_servers, absl::StrCat("no heartbeat for ",
                                             options_.config.cluster
                                                 .heartbeat_timeout_ms,
                                             " ms"));
  DropDeadWorkers(dead_workers,
                  absl::StrCat("no heartbeat for ",
                               options_.config.cluster.heartbeat_timeout_ms,
                               " ms"));
  for (size_t i = 0; i < gone_workers.size(); ++i) {
    DropDeadWorkers({gone_workers[i]}, gone_why[i]);
  }
}

absl::Status SchedulerCore::BroadcastView(
    const proto::ClusterView& view,
    std::vector<proto::ServerControlResponse>* replies) {
  const absl::Time deadline = options_.clock->Now() + options_.view_deadline;
  proto::ServerControlRequest r;
  *r.mutable_new_view() = view;
  for (const proto::NodeInfo& s : view.routing().servers()) {
    // Failed over or drained (issue 9).
    if (s.state() == proto::NODE_DEAD || s.state() == proto::NODE_LEFT) {
      continue;
    }
    // A first try of a second; a server that still does not take the view
    // is probed as a suspect is (issue 9): one that does not answer either
    // is dead, skipped here and failed over (on a thread of its own: that
    // waits for view_change_mu_, which the caller may hold), instead of
    // failing the job after view_deadline. A live one gets the rest of
    // the deadline.
    const absl::Time first = std::min(
        deadline, options_.clock->Now() + kBroadcastFirstTry);
    auto resp = ControlWithRetry(s.address(), r, first, s.id());
    const auto retryable = [](const absl::Status& st) {
      return (st.code() == absl::StatusCode::kUnavailable ||
              st.code() == absl::StatusCode::kDeadlineExceeded) &&
             ReasonOf(st) != proto::REASON_JOB_FAILED;
    };
    if (!resp.ok() && retryable(resp.status()) && first < deadline) {
      bool dead = false;
      {
        absl::MutexLock l(&mu_);
        dead = replicas_ > 0 && !closing_;
      }
      absl::Status probe;
      if (dead) {
        probe = ProbeServer(s.address());
        dead = !probe.ok();
      }
      if (dead) {
        PS_LOG_WARN("S[{}] at {} could not be told view epoch {} and does not "
                    "answer its probe: failing it over",
                    s.id(), s.address(), view.epoch());
        const std::string why = absl::StrCat(
            "view broadcast: could not be told epoch ", view.epoch(), ": ",
            resp.status().message());
        absl::MutexLock l(&mu_);
        if (!probing_.contains(s.id())) {
          probing_.insert(s.id());
          const int id = s.id();
          const bool refused = probe.code() == absl::StatusCode::kUnavailable;
          probes_.emplace_back([this, id, why, refused] {
            FailoverServers({id}, why, /*definitive=*/refused);
            absl::MutexLock l2(&mu_);
            probing_.erase(id);
          });
        }
        continue;
      }
      resp = ControlWithRetry(s.address(), r, deadline);
    }
    if (!resp.ok()) {
      // Declared failed, not skipped: a server left on an old view would
      // stall every worker that routes to it.
      absl::Status failed = absl::UnavailableError(absl::StrCat(
          "server S[", s.id(), "] at ", s.address(),
          " could not be told view epoch ", view.epoch(), ": ",
          resp.status().message()));
      Conclude(failed);
      return failed;
    }
    if (replies != nullptr) replies->push_back(*std::move(resp));
  }
  return absl::OkStatus();
}

absl::Status SchedulerCore::WaitForEnd(absl::Time deadline) {
  absl::MutexLock l(&mu_);
  auto ended = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return ended_; };
  if (!mu_.AwaitWithDeadline(absl::Condition(&ended), deadline)) {
    return absl::DeadlineExceededError("job did not end in time");
  }
  return end_status_;
}

void SchedulerCore::Fail(const absl::Status& status) {
  Conclude(status.ok() ? absl::UnknownError("failed with an OK status")
                       : status);
}

JobPhase SchedulerCore::phase() const {
  absl::MutexLock l(&mu_);
  return phase_;
}

std::string SchedulerCore::ReportJson() const {
  absl::MutexLock l(&mu_);
  return ReportJsonLocked();
}

void SchedulerCore::FailoverReportLocked(proto::JobReport* report) const {
  for (const Failover& f : failovers_) {
    proto::JobReport::Failover* r = report->add_failovers();
    r->set_node(absl::StrCat("S[", f.server, "]"));
    r->set_epoch(static_cast<int32_t>(f.epoch));
    r->set_why(f.why);
    if (f.rejoined_as >= 0) {
      r->set_rejoined_as(absl::StrCat("S[", f.rejoined_as, "]"));
    }
    r->set_detect_ms(static_cast<double>(f.detected_ms - f.last_seen_ms));
    r->set_last_heartbeat_unix_ms(static_cast<double>(f.last_seen_ms));
    r->set_first_ack_unix_ms(static_cast<double>(f.first_ack_ms));
    if (f.first_ack_ms > 0) {
      r->mutable_recovery_ms()->set_number_value(
          static_cast<double>(f.first_ack_ms - f.last_seen_ms));
    } else {
      r->mutable_recovery_ms()->set_null_value(google::protobuf::NULL_VALUE);
    }
  }
}

void SchedulerCore::MembershipReportLocked(proto::JobReport* report) const {
  for (const MembershipChange& m : membership_) {
    proto::JobReport::MembershipChange* r = report->add_membership();
    r->set_event(m.event);
    r->set_node(absl::StrCat(m.worker ? "W[" : "S[", m.server, "]"));
    r->set_epoch(static_cast<int32_t>(m.epoch));
    if (m.worker) {
      r->set_units(m.ranges);
      r->set_start_clock(static_cast<int32_t>(m.start_clock));
    } else {
      r->set_ranges(m.ranges);
    }
    r->set_seconds(Round6(m.seconds));
    r->set_error(m.error);
  }
}

proto::JobReport SchedulerCore::Report() const {
  absl::MutexLock l(&mu_);
  return ReportLocked();
}

std::string SchedulerCore::ReportJsonLocked() const {
  return JobReportJson(ReportLocked());
}

proto::JobReport SchedulerCore::ReportLocked() const {
  const JobConfig& c = options_.config;
  const double wall = absl::ToDoubleSeconds(
      (concluding_ ? end_time_ : options_.clock->Now()) - start_);
  // 0 for a job that never became ready (it failed while registering).
  const double train =
      ready_ ? absl::ToDoubleSeconds(
                   (concluding_ ? end_time_ : options_.clock->Now()) -
                   ready_time_)
             : 0;
  int64_t examples = 0;
  double max_worker_wall = 0;
  const proto::WorkerDoneRequest* eval = nullptr;
  const proto::WorkerDoneRequest* validated = nullptr;
  for (const auto& [id, d] : done_) {
    examples += d.examples();
    max_worker_wall = std::max(max_worker_wall, d.wall_seconds());
    if (d.has_eval() && eval == nullptr) eval = &d;
    if (d.validation_rows() > 0 && validated == nullptr) validated = &d;
  }
  // The finished units, a dead worker's included (its WorkerDone never
  // came, but the units it finished count: their pushes were acked).
  examples = 0;
  for (int64_t n : work_->epoch_examples()) examples += n;
  proto::JobReport r;
  r.set_status(phase_ == JobPhase::kDone     ? "ok"
               : phase_ == JobPhase::kFailed ? "failed"
                                             : "running");
  r.set_error(std::string(end_status_.message()));
  r.set_phase(JobPhaseName(phase_));
  if (phase_ == JobPhase::kFailed) r.set_failed_in(JobPhaseName(failed_in_));
  r.set_mode(ModeName(c.consistency.mode));
  // The view's (ps_status may have changed it), the config's before there
  // is a view.
  r.set_tau(ready_ ? view_.consistency().tau() : ToProto(c.consistency).tau());
  r.set_servers(static_cast<int32_t>(servers_.size()));
  r.set_workers(static_cast<int32_t>(workers_.size()));
  r.set_data(c.data.format == "synthetic" ? "synthetic" : c.data.train);
  r.set_optimizer(c.optimizer.name);
  r.set_wall_seconds(Round6(wall));
  r.set_train_seconds(Round6(max_worker_wall));
  r.set_job_seconds(Round6(train));
  r.set_examples(static_cast<double>(examples));
  r.set_examples_per_sec(
      Round6(max_worker_wall > 0 ? examples / max_worker_wall : 0));
  // Issue 9: examples of the finished work units per epoch (each equals the
  // data's row count once the job is done), and the workers that died.
  r.set_work_units_per_epoch(static_cast<int32_t>(work_->units_per_epoch()));
  for (int64_t n : work_->epoch_examples()) {
    r.add_epoch_examples(static_cast<double>(n));
  }
  for (int w : dead_workers_) r.add_dead_workers(w);
  r.set_replicas(replicas_);
  FailoverReportLocked(&r);
  MembershipReportLocked(&r);
  // Scheduler restart (issue 9): how many schedulers took this job over.
  r.set_scheduler_restarts(restarts_);
  // The training loss every training.progress_interval_s (issue 11).
  ProgressReportLocked(&r);
  if (eval != nullptr) {
    // Exact: ps_predict must reproduce these figures.
    SetNumber(eval->test_auc(), r.mutable_test_auc());
    SetNumber(eval->test_logloss(), r.mutable_test_logloss());
    SetNumber(eval->test_accuracy(), r.mutable_test_accuracy());
    r.set_test_rows(static_cast<double>(eval->test_rows()));
    for (const proto::EvalPoint& p : eval->curve()) {
      proto::JobReport::EvalPoint* e = r.add_curve();
      e->set_seconds(Round6(p.seconds()));
      SetNumber(Round6(p.logloss()), e->mutable_logloss());
      SetNumber(Round6(p.auc()), e->mutable_auc());
      e->set_examples(static_cast<double>(p.examples()));
    }
  }
  ValidationReportLocked(validated, &r);
  int64_t keys = 0, nonzeros = 0;
  for (const auto& m : models_) {
    keys += m.keys();
    nonzeros += m.nonzeros();
    r.add_model_files(m.model_path());
  }
  r.set_model_dir(c.output.model_dir);
  r.set_model_keys(static_cast<double>(keys));
  r.set_model_nonzeros(static_cast<double>(nonzeros));
  CheckpointReportLocked(&r);  // checkpoints (issue 9)
  // Malformed lines skipped, per file (the shards of one file summed).
  auto& skipped = *r.mutable_skipped_lines();
  for (const auto& [id, d] : done_) {
    for (const proto::SkippedLines& s : d.skipped_lines()) {
      skipped[s.path()] += static_cast<double>(s.skipped());
    }
  }
  for (const auto& [id, d] : done_) {
    const double busy = d.compute_seconds() + d.wait_seconds();
    int64_t worker_skipped = 0;
    for (const proto::SkippedLines& s : d.skipped_lines()) {
      worker_skipped += s.skipped();
    }
    proto::JobReport::Worker* w = r.add_per_worker();
    w->set_id(id);
    w->set_examples(static_cast<double>(d.examples()));
    w->set_units(static_cast<int32_t>(work_->finished_by(id)));
    w->set_skipped_lines(static_cast<double>(worker_skipped));
    w->set_compute_seconds(Round6(d.compute_seconds()));
    w->set_wait_seconds(Round6(d.wait_seconds()));
    w->set_wait_share(Round6(busy > 0 ? d.wait_seconds() / busy : 0));
    w->set_consistency_wait_seconds(Round6(d.consistency_wait_seconds()));
    w->set_consistency_wait_share(
        Round6(busy > 0 ? d.consistency_wait_seconds() / busy : 0));
    w->set_wall_seconds(Round6(d.wall_seconds()));
    w->set_first_epoch_updates(static_cast<int32_t>(d.first_epoch_updates()));
    SetNumber(Round6(d.train_loss()), w->mutable_train_loss());
    w->set_push_bytes(static_cast<double>(d.push_bytes()));
    w->set_push_raw_bytes(static_cast<double>(d.push_raw_bytes()));
    r.set_push_bytes(r.push_bytes() + static_cast<double>(d.push_bytes()));
    r.set_push_raw_bytes(r.push_raw_bytes() +
                         static_cast<double>(d.push_raw_bytes()));
  }
  r.set_push_filters(DescribeFilters(options_.config.filters));
  return r;
}

// ---------------------------------------------------------------------------
// Checkpoints (issue 9)

absl::StatusOr<proto::CheckpointResponse> SchedulerCore::Checkpoint() {
  absl::MutexLock serial(&checkpoint_mu_);
  const JobConfig& c = options_.config;
  const std::string root = CheckpointDirOf(c);
  std::vector<std::string> addresses;
  int64_t id;
  double since_ready;
  proto::WorkQueueState work_at_start;
  std::vector<proto::DataShard> plan_at_start;  // empty: no work units
  {
    absl::MutexLock l(&mu_);
    if (phase_ != JobPhase::kRunning) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint: the job is ", JobPhaseName(phase_),
                       ", not running"));
    }
    if (next_checkpoint_id_ == 0) next_checkpoint_id_ = MaxCheckpointId(root) + 1;
    id = next_checkpoint_id_++;
    SaveStateLocked();
    for (const Node& s : servers_) {
      if (s.info.state() == proto::NODE_DEAD) continue;  // failed over
      addresses.push_back(s.info.address());
    }
    since_ready = absl::ToDoubleSeconds(options_.clock->Now() - ready_time_);
    // The data position before any range is copied: a unit finished by now
    // had its pushes acknowledged, so they are in the copies.
    work_->SaveTo(&work_at_start);
    plan_at_start = work_->plan();
  }
  const std::string dir = absl::StrCat(root, "/", CheckpointFolderName(id));
  proto::CheckpointManifest m;
  if (!plan_at_start.empty()) {
    *m.mutable_work() = std::move(work_at_start);
    for (proto::DataShard& u : plan_at_start) *m.add_plan() = std::move(u);
  }
  m.set_checkpoint_id(id);
  m.set_num_servers(static_cast<int>(addresses.size()));
  int64_t clock = -1, keys = 0;
  absl::Status status;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);  // servers create it too
  if (ec) {
    status = absl::UnavailableError(absl::StrCat(
        "checkpoint ", id, ": cannot create ", dir, ": ", ec.message()));
  }
  const absl::Time deadline = options_.clock->Now() + options_.save_deadline;
  for (size_t i = 0; i < addresses.size() && status.ok(); ++i) {
    proto::ServerControlRequest req;
    req.mutable_checkpoint()->set_dir(dir);
    req.mutable_checkpoint()->set_checkpoint_id(id);
    auto resp = CheckpointCall(addresses[i], req, deadline);
    if (!resp.ok()) {
      status = absl::Status(
          resp.status().code(),
          absl::StrCat("checkpoint ", id, ": S[", i, "] at ", addresses[i],
                       ": ", resp.status().message()));
      break;
    }
    for (const auto& f : resp->checkpoint_files()) *m.add_files() = f;
    for (int64_t wc : resp->worker_clocks()) {
      clock = clock < 0 ? wc : std::min(clock, wc);
    }
    keys += resp->keys();
  }
  m.set_clock(std::max<int64_t>(clock, 0));
  m.set_created_unix_ms(absl::ToUnixMillis(absl::Now()));
  {
    absl::MutexLock l(&mu_);
    *m.mutable_tables() = view_.tables();
  }
  if (status.ok()) status = WriteManifest(dir, m);
  proto::CheckpointResponse out;
  out.set_checkpoint_id(id);
  out.set_dir(dir);
  out.set_keys(keys);
  out.set_clock(m.clock());
  if (!status.ok()) {
    PS_LOG_ERROR("checkpoint {} failed (the job goes on): {}", id,
                 status.ToString());
    absl::MutexLock l(&mu_);
    checkpoint_error_ = std::string(status.message());
    return status;
  }
  PS_LOG_INFO("checkpoint {} complete: {} keys, clock {}, {}", id, keys,
              m.clock(), dir);
  absl::Status pruned = PruneCheckpoints(root, c.fault_tolerance.checkpoints_kept);
  if (!pruned.ok()) PS_LOG_WARN("{}", pruned.ToString());
  absl::MutexLock l(&mu_);
  checkpoints_.push_back({out, since_ready});
  return out;
}

absl::StatusOr<proto::ServerControlResponse> SchedulerCore::CheckpointCall(
    const std::string& address, const proto::ServerControlRequest& req,
    absl::Time deadline) {
  // The save's retry helper, in short windows: between them, a checkpoint
  // of a job that ended meanwhile (its servers exit) is abandoned instead
  // of retried until the deadline, which would hold up the scheduler's
  // exit.
  constexpr absl::Duration kWindow = absl::Seconds(2);
  for (;;) {
    const absl::Time window =
        std::min(deadline, options_.clock->Now() + kWindow);
    auto resp = ControlWithRetry(address, req, window);
    const absl::StatusCode code = resp.status().code();
    if (resp.ok() || window >= deadline ||
        (code != absl::StatusCode::kUnavailable &&
         code != absl::StatusCode::kDeadlineExceeded)) {
      return resp;
    }
    absl::MutexLock l(&mu_);
    if (phase_ != JobPhase::kRunning) {
      return absl::FailedPreconditionError(
          absl::StrCat("abandoned: the job is ", JobPhaseName(phase_), " (",
                       resp.status().message(), ")"));
    }
  }
}

void SchedulerCore::MaybeCheckpoint() {
  const double interval = options_.config.fault_tolerance.checkpoint_interval_s;
  if (interval <= 0) return;
  {
    absl::MutexLock l(&mu_);
    if (phase_ != JobPhase::kRunning) return;
    const absl::Time now = options_.clock->Now();
    const absl::Time last = std::max(last_interval_checkpoint_, ready_time_);
    if (now - last < absl::Seconds(interval)) return;
    last_interval_checkpoint_ = now;
  }
  Checkpoint().IgnoreError();  // logged and reported by Checkpoint()
}

void SchedulerCore::MaybeKeepModelCopy() {
  int epoch = 0;
  std::vector<std::pair<int, std::string>> servers;
  {
    absl::MutexLock l(&mu_);
    if (phase_ != JobPhase::kRunning || copy_wanted_ == 0) return;
    epoch = copy_wanted_;
    copy_wanted_ = 0;
    for (const Node& s : servers_) {
      if (s.info.state() == proto::NODE_ALIVE) {
        servers.emplace_back(s.info.id(), s.info.address());
      }
    }
  }
  proto::ServerControlRequest req;
  req.set_keep_model_copy(true);
  const absl::Time deadline = options_.clock->Now() + absl::Seconds(30);
  for (const auto& [id, address] : servers) {
    auto r = ControlWithRetry(address, req, deadline);
    if (!r.ok()) {
      PS_LOG_WARN("S[{}] could not keep a copy of the model after {} epochs "
                  "(early stopping will save the live model): {}",
                  id, epoch, r.status().ToString());
      absl::MutexLock l(&mu_);
      copy_kept_ = 0;
      return;
    }
  }
  absl::MutexLock l(&mu_);
  copy_kept_ = epoch;
  PS_LOG_INFO("the servers keep a copy of the model after {} epochs (the "
              "best validation log loss so far)",
              epoch);
}

void SchedulerCore::NoteValidationLocked(const proto::HeartbeatRequest& req) {
  if (!validation_points_.empty() &&
      req.validation_epoch() <= validation_points_.back().epoch) {
    return;  // already noted
  }
  ValidationPoint p;
  p.epoch = req.validation_epoch();
  p.auc = req.validation_auc();
  p.logloss = req.validation_logloss();
  p.rows = req.validation_rows();
  p.seconds = ready_ ? absl::ToDoubleSeconds(options_.clock->Now() -
                                             ready_time_)
                     : 0;
  validation_points_.push_back(p);
  const int index = static_cast<int>(validation_points_.size()) - 1;
  if (validation_best_ < 0 ||
      p.logloss < validation_points_[validation_best_].logloss) {
    validation_best_ = index;
    if (options_.config.training.early_stopping > 0) copy_wanted_ = p.epoch;
  }
  const ValidationPoint& best = validation_points_[validation_best_];
  PS_LOG_INFO("validation after {} epochs: AUC {:.4f}, log loss {:.4f} ({} "
              "rows; best log loss {:.4f} after {} epochs)",
              p.epoch, p.auc, p.logloss, p.rows, best.logloss, best.epoch);
  const int patience = options_.config.training.early_stopping;
  if (patience <= 0 || stopped_early_after_ > 0) return;
  if (index - validation_best_ < patience) return;
  const int64_t dropped = work_->StopAfter(p.epoch);
  stopped_early_after_ = p.epoch;
  PS_LOG_INFO("early stopping: the validation log loss has not improved for "
              "{} evaluations (best {:.4f} after {} epochs); training ends "
              "with the units of epoch {} in progress ({} units dropped)",
              patience, best.logloss, best.epoch, p.epoch + 1, dropped);
}

void SchedulerCore::ValidationReportLocked(const proto::WorkerDoneRequest* eval,
                                           proto::JobReport* report) const {
  if (options_.config.data.validation_fraction <= 0) return;
  if (eval != nullptr && eval->validation_rows() > 0) {
    SetNumber(eval->validation_auc(), report->mutable_validation_auc());
    SetNumber(eval->validation_logloss(), report->mutable_validation_logloss());
    report->set_validation_rows(static_cast<double>(eval->validation_rows()));
  }
  for (const ValidationPoint& p : validation_points_) {
    proto::JobReport::ValidationPoint* r = report->add_validation_curve();
    r->set_epoch(p.epoch);
    r->set_seconds(Round6(p.seconds));
    SetNumber(Round6(p.auc), r->mutable_auc());
    SetNumber(Round6(p.logloss), r->mutable_logloss());
  }
  report->set_best_validation_epoch(
      validation_best_ < 0 ? 0 : validation_points_[validation_best_].epoch);
  report->set_stopped_early_after_epochs(stopped_early_after_);
  // <model_dir>/best holds the model after this many epochs, the best
  // validation log loss (0: no such copy was saved). model_dir and the
  // test_* figures are the model as training left it.
  report->set_best_model_epoch(best_model_epoch_);
}

std::optional<std::string> SchedulerCore::MaybeProgress() {
  absl::MutexLock l(&mu_);
  if (phase_ != JobPhase::kRunning) return std::nullopt;
  const absl::Time now = options_.clock->Now();
  if (!progress_base_) {
    progress_base_.emplace(now, work_->done());
    last_progress_ = now;
    return std::nullopt;
  }
  if (now - last_progress_ <
      absl::Seconds(options_.config.training.progress_interval_s)) {
    return std::nullopt;
  }
  last_progress_ = now;
  // A scan of the units: once a line, not on every call.
  const JobProgress p = work_->Progress();
  AddProgressPointLocked(now, p.epoch);
  const double seconds = absl::ToDoubleSeconds(now - progress_base_->first);
  std::string line = FormatProgress(
      p, seconds > 0 ? (p.done - progress_base_->second) / seconds : 0);
  if (!validation_points_.empty()) {
    const ValidationPoint& v = validation_points_.back();
    absl::StrAppend(&line, absl::StrFormat(
                               ", validation AUC %.4f log loss %.4f (after "
                               "%d epochs)",
                               v.auc, v.logloss, v.epoch));
  }
  return line;
}

void SchedulerCore::AddProgressPointLocked(absl::Time now, int epoch,
                                           bool last) {
  // Every worker's examples and summed loss, the dead ones' last reports
  // included (they stay in workers_).
  int64_t examples = 0;
  double loss = 0;
  for (const Node& w : workers_) {
    examples += w.info.examples();
    loss += w.info.loss_sum();
  }
  const int64_t n = examples - progress_last_.first;
  const double l = loss - progress_last_.second;
  if (n <= 0) return;
  if (progress_lines_++ % progress_stride_ != 0 && !last) return;
  progress_last_ = {examples, loss};
  ProgressPoint point;
  point.seconds = absl::ToDoubleSeconds(now - ready_time_);
  point.examples = examples;
  point.train_loss = l / static_cast<double>(n);
  point.epoch = epoch;
  progress_points_.push_back(point);
  if (progress_points_.size() >= kMaxProgressPoints) {
    for (size_t i = 0; 2 * i < progress_points_.size(); ++i) {
      progress_points_[i] = progress_points_[2 * i];
    }
    progress_points_.resize((progress_points_.size() + 1) / 2);
    progress_stride_ *= 2;
  }
}

void SchedulerCore::ProgressReportLocked(proto::JobReport* report) const {
  for (const ProgressPoint& p : progress_points_) {
    proto::JobReport::ProgressPoint* r = report->add_progress();
    r->set_seconds(Round6(p.seconds));
    r->set_examples(static_cast<double>(p.examples));
    SetNumber(Round6(p.train_loss), r->mutable_train_loss());
    r->set_epoch(p.epoch);
  }
}

void SchedulerCore::CheckpointReportLocked(proto::JobReport* report) const {
  report->set_restored_from(options_.restore_from);
  report->set_resumed_units(static_cast<int32_t>(resumed_units_));
  for (const CheckpointRecord& c : checkpoints_) {
    proto::JobReport::Checkpoint* r = report->add_checkpoints();
    r->set_id(static_cast<int32_t>(c.resp.checkpoint_id()));
    r->set_dir(c.resp.dir());
    r->set_keys(static_cast<double>(c.resp.keys()));
    r->set_clock(static_cast<int32_t>(c.resp.clock()));
    r->set_seconds(Round6(c.seconds));
  }
  report->set_checkpoint_error(checkpoint_error_);
}

absl::StatusOr<std::string> ResolveRestore(const JobConfig& config) {
  const FaultToleranceConfig& ft = config.fault_tolerance;
  std::string dir = ft.restore_from;
  if (dir.empty() && ft.resume) {
    auto latest = FindLatestCheckpoint(CheckpointDirOf(config));
    if (!latest.ok()) {
      PS_LOG_WARN("resume: {}; starting from initial values",
                  latest.status().ToString());
      return std::string();
    }
    dir = *latest;
  }
  if (dir.empty()) return std::string();
  int64_t keys = 0;
  PS_RETURN_IF_ERROR(VerifyCheckpoint(dir, &keys));
  PS_LOG_INFO("starting from checkpoint {} ({} keys, verified)", dir, keys);
  return dir;
}

}  // namespace ps
