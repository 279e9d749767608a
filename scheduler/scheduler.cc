#include "scheduler/scheduler.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/routing.h"
#include "common/status_macros.h"
#include "worker/mlp_trainer.h"

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

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string Num(double v) {
  if (!std::isfinite(v)) return "null";
  return absl::StrFormat("%.6g", v);
}

}  // namespace

SchedulerCore::SchedulerCore(SchedulerOptions options)
    : options_(std::move(options)),
      config_yaml_(ToYaml(options_.config)),
      start_(options_.clock->Now()) {
  absl::MutexLock l(&mu_);
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

absl::StatusOr<proto::RegisterResponse> SchedulerCore::Register(
    const proto::RegisterRequest& req) {
  absl::MutexLock l(&mu_);
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
  PS_LOG_INFO("{}[{}] registered ({})",
              req.role() == proto::ROLE_SERVER ? "S" : "W", id,
              req.address().empty() ? "-" : req.address());
  bool all = true;
  for (const Node& s : servers_) all &= s.info.state() != proto::NODE_UNKNOWN;
  for (const Node& w : workers_) all &= w.info.state() != proto::NODE_UNKNOWN;
  if (all && !ready_) {
    BuildViewLocked();
    ready_ = true;
    ready_time_ = options_.clock->Now();
    PS_LOG_INFO("cluster ready: {} servers, {} workers, {} key ranges, "
                "mode {} tau {}",
                servers_.size(), workers_.size(),
                view_.routing().range_begin_size(),
                ModeName(options_.config.consistency.mode),
                options_.config.EffectiveTau());
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
  *v.mutable_routing() = BuildHashRing(ids, c.cluster.virtual_nodes, v.epoch());
  for (const Node& s : servers_) *v.mutable_routing()->add_servers() = s.info;
  for (const Node& w : workers_) *v.add_workers() = w.info;
  *v.mutable_consistency() = view_.has_consistency()
                                 ? view_.consistency()
                                 : ps::ToProto(c.consistency);
  if (c.training.model == "mlp") {
    for (const proto::TableConfig& t : MlpTables(c)) *v.add_tables() = t;
  } else {
    proto::TableConfig* t = v.add_tables();
    t->set_id(0);
    t->set_name("weights");
    t->set_dim(1);
    *t->mutable_optimizer() = OptimizerProto(c.optimizer);
  }
  v.set_job_config_yaml(config_yaml_);
  v.set_model_dir(c.output.model_dir);
  view_ = std::move(v);
}

absl::StatusOr<proto::GetViewResponse> SchedulerCore::GetView(
    const proto::GetViewRequest& req, absl::Time deadline) {
  absl::Time until = std::min(
      deadline, absl::Now() + absl::Milliseconds(req.wait_ms()));
  absl::MutexLock l(&mu_);
  auto newer = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return (ready_ && view_.epoch() > req.known_epoch()) || ended_;
  };
  // Real time here: waits block a gRPC thread, bounded by `until`.
  mu_.AwaitWithDeadline(absl::Condition(&newer), until);
  proto::GetViewResponse resp;
  resp.set_ready(ready_);
  if (ready_) *resp.mutable_view() = view_;
  return resp;
}

absl::StatusOr<proto::HeartbeatResponse> SchedulerCore::Heartbeat(
    const proto::HeartbeatRequest& req) {
  absl::MutexLock l(&mu_);
  std::vector<Node>* group = req.role() == proto::ROLE_SERVER   ? &servers_
                             : req.role() == proto::ROLE_WORKER ? &workers_
                                                                : nullptr;
  if (group == nullptr || req.id() < 0 ||
      req.id() >= static_cast<int>(group->size())) {
    return absl::InvalidArgumentError("heartbeat: unknown node");
  }
  Node& n = (*group)[req.id()];
  if (n.info.state() == proto::NODE_UNKNOWN) {
    return absl::FailedPreconditionError("heartbeat before register");
  }
  n.last_seen = options_.clock->Now();
  n.info.set_last_heartbeat_ms(absl::ToUnixMillis(n.last_seen));
  if (req.role() == proto::ROLE_WORKER) {
    n.info.set_clock(req.clock());
    n.info.set_examples(req.examples());
  }
  proto::HeartbeatResponse resp;
  resp.set_epoch(view_.epoch());
  resp.set_shutdown(ended_);
  return resp;
}

absl::StatusOr<proto::GetShardResponse> SchedulerCore::GetShard(
    const proto::GetShardRequest& req) {
  const JobConfig& c = options_.config;
  const int w = req.worker_id();
  const int n = c.cluster.num_workers;
  if (w < 0 || w >= n) {
    return absl::InvalidArgumentError(absl::StrCat("unknown worker ", w));
  }
  proto::GetShardResponse resp;
  proto::DataShard* s = resp.add_train();
  s->set_part(w);
  s->set_num_parts(n);
  if (c.data.format == "synthetic") {
    const int64_t rows = c.data.synthetic.train_rows;
    s->set_row_begin(rows * w / n);
    s->set_row_end(rows * (w + 1) / n);
    s->set_seed_begin(c.data.synthetic.seed);
    s->set_seed_end(c.data.synthetic.seed);
  } else {
    s->set_path(c.data.train);
    struct stat st;
    if (::stat(c.data.train.c_str(), &st) == 0) {
      s->set_begin_byte(st.st_size * w / n);
      s->set_end_byte(w + 1 == n ? -1 : st.st_size * (w + 1) / n);
    } else {
      // The file lives where the workers are: they cut by part/num_parts.
      s->set_begin_byte(-1);
      s->set_end_byte(-1);
    }
  }
  return resp;
}

int SchedulerCore::LiveWorkersLocked() const {
  int live = 0;
  for (const Node& w : workers_) {
    if (w.info.state() == proto::NODE_ALIVE ||
        w.info.state() == proto::NODE_FINISHED) {
      ++live;
    }
  }
  return live;
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
    if (ended_) return true;
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
  if (!end_status_.ok()) return end_status_;
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
    done_[req.worker_id()] = req;
    workers_[req.worker_id()].info.set_state(proto::NODE_FINISHED);
    workers_[req.worker_id()].info.set_examples(req.examples());
    PS_LOG_INFO("W[{}] done: {} examples, compute {:.2f}s, wait {:.2f}s",
                req.worker_id(), req.examples(), req.compute_seconds(),
                req.wait_seconds());
    int done_live = 0;
    for (const Node& w : workers_) {
      if (w.info.state() == proto::NODE_FINISHED) ++done_live;
    }
    if (done_live < LiveWorkersLocked() || finalizing_) return absl::OkStatus();
    finalizing_ = true;
  }
  Finalize();
  return absl::OkStatus();
}

void SchedulerCore::Finalize() {
  std::vector<std::string> addresses;
  {
    absl::MutexLock l(&mu_);
    for (const Node& s : servers_) addresses.push_back(s.info.address());
  }
  absl::Status status;
  std::vector<proto::ServerControlResponse> models;
  for (size_t i = 0; i < addresses.size(); ++i) {
    proto::ServerControlRequest req;
    req.set_save_and_exit(true);
    auto resp = options_.clients->Server(addresses[i])
                    ->Control(req, absl::Now() + absl::Seconds(300));
    if (!resp.ok()) {
      status = absl::Status(resp.status().code(),
                            absl::StrCat("S[", i, "] could not save its model: ",
                                         resp.status().message()));
      PS_LOG_ERROR("{}", status.ToString());
      break;
    }
    models.push_back(*resp);
  }
  std::string report;
  {
    absl::MutexLock l(&mu_);
    models_ = std::move(models);
    end_time_ = options_.clock->Now();
    report = ReportJsonLocked();
  }
  if (status.ok() && !options_.report_path.empty()) {
    std::ofstream out(options_.report_path);
    out << report;
    if (!out) {
      status = absl::UnavailableError(
          absl::StrCat("cannot write report ", options_.report_path));
    }
  }
  absl::MutexLock l(&mu_);
  if (!ended_) {
    ended_ = true;
    end_status_ = status;
  }
}

absl::StatusOr<proto::SetConsistencyResponse> SchedulerCore::SetConsistency(
    const proto::SetConsistencyRequest& req) {
  const proto::ConsistencyConfig& c = req.consistency();
  if (c.mode() == proto::MODE_UNKNOWN) {
    return absl::InvalidArgumentError("consistency.mode must be set");
  }
  if (c.mode() == proto::MODE_SSP && c.tau() < 0) {
    return absl::InvalidArgumentError("consistency.tau must be >= 0 for ssp");
  }
  std::vector<std::string> addresses;
  int64_t epoch;
  {
    absl::MutexLock l(&mu_);
    if (!ready_) return absl::FailedPreconditionError("cluster not ready yet");
    for (const Node& s : servers_) addresses.push_back(s.info.address());
    epoch = view_.epoch();
  }
  for (const std::string& a : addresses) {
    proto::ServerControlRequest r;
    *r.mutable_set_consistency() = c;
    auto resp = options_.clients->Server(a)->Control(
        r, absl::Now() + absl::Seconds(10));
    if (!resp.ok()) return resp.status();
  }
  {
    absl::MutexLock l(&mu_);
    *view_.mutable_consistency() = c;
  }
  PS_LOG_INFO("consistency changed: mode {} tau {}",
              proto::ConsistencyMode_Name(c.mode()), c.tau());
  proto::SetConsistencyResponse resp;
  resp.set_epoch(epoch);
  return resp;
}

absl::StatusOr<proto::StatusResponse> SchedulerCore::Status() {
  proto::StatusResponse resp;
  std::vector<std::string> addresses;
  {
    absl::MutexLock l(&mu_);
    *resp.mutable_view() = view_;
    for (const Node& s : servers_) {
      *resp.add_nodes() = s.info;
      addresses.push_back(s.info.address());
    }
    for (const Node& w : workers_) *resp.add_nodes() = w.info;
    resp.set_phase(ended_ ? "done" : finalizing_ ? "saving"
                   : ready_ ? "training" : "registering");
    resp.set_now_ms(absl::ToUnixMillis(options_.clock->Now()));
  }
  for (const std::string& a : addresses) {
    if (a.empty()) continue;
    auto s = options_.clients->Server(a)->GetStatus(absl::Now() +
                                                    absl::Seconds(2));
    if (s.ok()) *resp.add_servers() = *s;
  }
  return resp;
}

void SchedulerCore::CheckHeartbeats() {
  const absl::Duration timeout =
      absl::Milliseconds(options_.config.cluster.heartbeat_timeout_ms);
  proto::ClusterView broadcast;
  bool changed = false;
  {
    absl::MutexLock l(&mu_);
    const absl::Time now = options_.clock->Now();
    if (!ready_ && !ended_ &&
        now - start_ > absl::Milliseconds(
                           options_.config.cluster.register_timeout_ms)) {
      int s = 0, w = 0;
      for (const Node& n : servers_) s += n.info.state() != proto::NODE_UNKNOWN;
      for (const Node& n : workers_) w += n.info.state() != proto::NODE_UNKNOWN;
      ended_ = true;
      end_status_ = absl::DeadlineExceededError(absl::StrCat(
          "cluster incomplete after ", options_.config.cluster.register_timeout_ms,
          " ms: ", s, " of ", servers_.size(), " servers and ", w, " of ",
          workers_.size(), " workers registered"));
      return;
    }
    if (!ready_ || ended_ || finalizing_) return;
    for (Node& s : servers_) {
      if (s.info.state() == proto::NODE_ALIVE && now - s.last_seen > timeout) {
        s.info.set_state(proto::NODE_DEAD);
        PS_LOG_ERROR("S[{}] missed heartbeats for {}: failing the job",
                     s.info.id(), absl::FormatDuration(now - s.last_seen));
        ended_ = true;
        end_status_ = absl::UnavailableError(absl::StrCat(
            "server S[", s.info.id(), "] at ", s.info.address(),
            " died (no heartbeat); its key ranges have no replica"));
        return;
      }
    }
    for (Node& w : workers_) {
      if (w.info.state() == proto::NODE_ALIVE && now - w.last_seen > timeout) {
        w.info.set_state(proto::NODE_DEAD);
        PS_LOG_ERROR("W[{}] missed heartbeats for {}: dropping it from the "
                     "clocks",
                     w.info.id(), absl::FormatDuration(now - w.last_seen));
        changed = true;
      }
    }
    if (!changed) return;
    for (int i = 0; i < static_cast<int>(workers_.size()); ++i) {
      *view_.mutable_workers(i) = workers_[i].info;
    }
    view_.set_epoch(view_.epoch() + 1);
    view_.mutable_routing()->set_epoch(view_.epoch());
    broadcast = view_;
  }
  BroadcastView(broadcast);
  // A dead worker may have been the last one the job waited for.
  bool finalize = false;
  {
    absl::MutexLock l(&mu_);
    int finished = 0;
    for (const Node& w : workers_) {
      if (w.info.state() == proto::NODE_FINISHED) ++finished;
    }
    if (LiveWorkersLocked() == 0) {
      ended_ = true;
      end_status_ = absl::UnavailableError("every worker died");
    } else if (finished == LiveWorkersLocked() && !finalizing_) {
      finalizing_ = true;
      finalize = true;
    }
  }
  if (finalize) Finalize();
}

void SchedulerCore::BroadcastView(const proto::ClusterView& view) {
  for (const proto::NodeInfo& s : view.routing().servers()) {
    proto::ServerControlRequest r;
    *r.mutable_new_view() = view;
    auto resp = options_.clients->Server(s.address())
                    ->Control(r, absl::Now() + absl::Seconds(10));
    if (!resp.ok()) {
      PS_LOG_WARN("S[{}]: view update failed: {}", s.id(),
                  resp.status().ToString());
    }
  }
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
  absl::MutexLock l(&mu_);
  if (ended_) return;
  ended_ = true;
  end_status_ = status;
}

std::string SchedulerCore::ReportJson() const {
  absl::MutexLock l(&mu_);
  return ReportJsonLocked();
}

std::string SchedulerCore::ReportJsonLocked() const {
  const JobConfig& c = options_.config;
  const double wall = absl::ToDoubleSeconds(
      (ended_ || finalizing_ ? end_time_ : options_.clock->Now()) - start_);
  const double train = absl::ToDoubleSeconds(
      (ended_ || finalizing_ ? end_time_ : options_.clock->Now()) -
      ready_time_);
  int64_t examples = 0;
  double max_worker_wall = 0;
  const proto::WorkerDoneRequest* eval = nullptr;
  for (const auto& [id, d] : done_) {
    examples += d.examples();
    max_worker_wall = std::max(max_worker_wall, d.wall_seconds());
    if (d.has_eval() && eval == nullptr) eval = &d;
  }
  std::string j = "{\n";
  absl::StrAppend(&j, "  \"mode\": ", JsonString(ModeName(c.consistency.mode)),
                  ",\n");
  absl::StrAppend(&j, "  \"tau\": ", view_.consistency().tau(), ",\n");
  absl::StrAppend(&j, "  \"servers\": ", servers_.size(), ",\n");
  absl::StrAppend(&j, "  \"workers\": ", workers_.size(), ",\n");
  absl::StrAppend(&j, "  \"data\": ", JsonString(c.data.format == "synthetic"
                                                     ? "synthetic"
                                                     : c.data.train),
                  ",\n");
  absl::StrAppend(&j, "  \"optimizer\": ", JsonString(c.optimizer.name), ",\n");
  absl::StrAppend(&j, "  \"wall_seconds\": ", Num(wall), ",\n");
  absl::StrAppend(&j, "  \"train_seconds\": ", Num(max_worker_wall), ",\n");
  absl::StrAppend(&j, "  \"job_seconds\": ", Num(train), ",\n");
  absl::StrAppend(&j, "  \"examples\": ", examples, ",\n");
  absl::StrAppend(
      &j, "  \"examples_per_sec\": ",
      Num(max_worker_wall > 0 ? examples / max_worker_wall : 0), ",\n");
  if (eval != nullptr) {
    absl::StrAppend(&j, "  \"test_auc\": ", Num(eval->test_auc()), ",\n");
    absl::StrAppend(&j, "  \"test_logloss\": ", Num(eval->test_logloss()),
                    ",\n");
    absl::StrAppend(&j, "  \"test_accuracy\": ", Num(eval->test_accuracy()),
                    ",\n");
    absl::StrAppend(&j, "  \"test_rows\": ", eval->test_rows(), ",\n");
    absl::StrAppend(&j, "  \"curve\": [");
    for (int i = 0; i < eval->curve_size(); ++i) {
      const proto::EvalPoint& p = eval->curve(i);
      absl::StrAppend(&j, i ? ", " : "", "{\"seconds\": ", Num(p.seconds()),
                      ", \"logloss\": ", Num(p.logloss()),
                      ", \"auc\": ", Num(p.auc()),
                      ", \"examples\": ", p.examples(), "}");
    }
    absl::StrAppend(&j, "],\n");
  }
  int64_t keys = 0, nonzeros = 0;
  std::vector<std::string> files;
  for (const auto& m : models_) {
    keys += m.keys();
    nonzeros += m.nonzeros();
    files.push_back(JsonString(m.model_path()));
  }
  absl::StrAppend(&j, "  \"model_dir\": ", JsonString(c.output.model_dir),
                  ",\n");
  absl::StrAppend(&j, "  \"model_files\": [", absl::StrJoin(files, ", "),
                  "],\n");
  absl::StrAppend(&j, "  \"model_keys\": ", keys, ",\n");
  absl::StrAppend(&j, "  \"model_nonzeros\": ", nonzeros, ",\n");
  // Malformed lines skipped, per file (the shards of one file summed).
  std::map<std::string, int64_t> skipped;
  for (const auto& [id, d] : done_) {
    for (const proto::SkippedLines& s : d.skipped_lines()) {
      skipped[s.path()] += s.skipped();
    }
  }
  absl::StrAppend(&j, "  \"skipped_lines\": {");
  bool first = true;
  for (const auto& [path, count] : skipped) {
    absl::StrAppend(&j, first ? "" : ", ", JsonString(path), ": ", count);
    first = false;
  }
  absl::StrAppend(&j, "},\n");
  absl::StrAppend(&j, "  \"per_worker\": [");
  first = true;
  for (const auto& [id, d] : done_) {
    const double busy = d.compute_seconds() + d.wait_seconds();
    int64_t worker_skipped = 0;
    for (const proto::SkippedLines& s : d.skipped_lines()) {
      worker_skipped += s.skipped();
    }
    absl::StrAppend(
        &j, first ? "\n" : ",\n", "    {\"id\": ", id,
        ", \"examples\": ", d.examples(),
        ", \"skipped_lines\": ", worker_skipped,
        ", \"compute_seconds\": ", Num(d.compute_seconds()),
        ", \"wait_seconds\": ", Num(d.wait_seconds()),
        ", \"wait_share\": ", Num(busy > 0 ? d.wait_seconds() / busy : 0),
        ", \"wall_seconds\": ", Num(d.wall_seconds()),
        ", \"train_loss\": ", Num(d.train_loss()), "}");
    first = false;
  }
  absl::StrAppend(&j, "\n  ]\n}\n");
  return j;
}

}  // namespace ps
