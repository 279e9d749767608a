// Issue 9, worker failure in one process: a worker is cut off mid-job (its
// server and scheduler calls all fail from some push on, as a killed
// process's would), the scheduler declares it dead after
// cluster.heartbeat_timeout_ms, BSP stops waiting for it, the others redo
// its unfinished work units, and the job ends ok with the exact example
// count of every epoch and the test metrics.
#include <atomic>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/inproc_cluster.h"

namespace ps {
namespace {

using ::testing::ElementsAre;

// Once `dead` is set, every call fails with CANCELLED (final for a
// KVWorker: the worker stops at once, as a killed process would).
struct Kill {
  std::atomic<bool> dead{false};
  std::atomic<int64_t> pushes{0};
  int64_t after_pushes = 0;  // dies at this push
};

absl::Status Killed() { return absl::CancelledError("killed by the test"); }

class KillableServerClient : public ServerClient {
 public:
  KillableServerClient(std::shared_ptr<ServerClient> inner, Kill* kill)
      : inner_(std::move(inner)), kill_(kill) {}
  void Push(std::shared_ptr<const proto::PushRequest> req, absl::Time d,
            Callback<proto::PushResponse> done) override {
    if (kill_->pushes.fetch_add(1) + 1 >= kill_->after_pushes) {
      kill_->dead = true;
    }
    if (kill_->dead) return done(Killed(), nullptr);
    inner_->Push(std::move(req), d, std::move(done));
  }
  void Pull(std::shared_ptr<const proto::PullRequest> req, absl::Time d,
            Callback<proto::PullResponse> done) override {
    if (kill_->dead) return done(Killed(), nullptr);
    inner_->Pull(std::move(req), d, std::move(done));
  }
  void Clock(std::shared_ptr<const proto::ClockRequest> req, absl::Time d,
             Callback<proto::ClockResponse> done) override {
    if (kill_->dead) return done(Killed(), nullptr);
    inner_->Clock(std::move(req), d, std::move(done));
  }
  absl::Status Finish(const proto::FinishRequest& req, absl::Time d) override {
    if (kill_->dead) return Killed();
    return inner_->Finish(req, d);
  }
  absl::StatusOr<proto::ServerControlResponse> Control(
      const proto::ServerControlRequest& req, absl::Time d) override {
    if (kill_->dead) return Killed();
    return inner_->Control(req, d);
  }
  absl::StatusOr<proto::ServerStatus> GetStatus(absl::Time d) override {
    if (kill_->dead) return Killed();
    return inner_->GetStatus(d);
  }

 private:
  const std::shared_ptr<ServerClient> inner_;
  Kill* const kill_;
};

class KillableFactory : public ClientFactory {
 public:
  KillableFactory(ClientFactory* inner, Kill* kill)
      : inner_(inner), kill_(kill) {}
  std::shared_ptr<ServerClient> Server(const std::string& address) override {
    return std::make_shared<KillableServerClient>(inner_->Server(address),
                                                  kill_);
  }
  std::shared_ptr<SchedulerClient> Scheduler(
      const std::string& address) override {
    return inner_->Scheduler(address);
  }

 private:
  ClientFactory* const inner_;
  Kill* const kill_;
};

#define PS_KILLABLE(Method, Req, Resp)                                    \
  absl::StatusOr<Resp> Method(const Req& req, absl::Time d) override {   \
    if (kill_->dead) return Killed();                                     \
    return inner_->Method(req, d);                                        \
  }
#define PS_KILLABLE_VOID(Method, Req)                                     \
  absl::Status Method(const Req& req, absl::Time d) override {           \
    if (kill_->dead) return Killed();                                     \
    return inner_->Method(req, d);                                        \
  }
class KillableScheduler : public SchedulerClient {
 public:
  KillableScheduler(std::shared_ptr<SchedulerClient> inner, Kill* kill)
      : inner_(std::move(inner)), kill_(kill) {}
  PS_KILLABLE(Register, proto::RegisterRequest, proto::RegisterResponse)
  PS_KILLABLE(GetView, proto::GetViewRequest, proto::GetViewResponse)
  PS_KILLABLE(Heartbeat, proto::HeartbeatRequest, proto::HeartbeatResponse)
  PS_KILLABLE(GetWork, proto::GetWorkRequest, proto::GetWorkResponse)
  PS_KILLABLE_VOID(Barrier, proto::BarrierRequest)
  PS_KILLABLE_VOID(WorkerDone, proto::WorkerDoneRequest)
  PS_KILLABLE_VOID(ServerDone, proto::ServerDoneRequest)
  PS_KILLABLE(SetConsistency, proto::SetConsistencyRequest,
              proto::SetConsistencyResponse)
  PS_KILLABLE(Status, proto::StatusRequest, proto::StatusResponse)

 private:
  const std::shared_ptr<SchedulerClient> inner_;
  Kill* const kill_;
};
#undef PS_KILLABLE
#undef PS_KILLABLE_VOID

JobConfig Job(Mode mode) {
  JobConfig c;
  c.cluster.num_servers = 2;
  c.cluster.num_workers = 3;
  c.cluster.virtual_nodes = 16;
  c.cluster.heartbeat_ms = 50;
  c.cluster.heartbeat_timeout_ms = 400;
  c.consistency.mode = mode;
  c.consistency.tau = 2;
  c.consistency.pull_timeout_ms = 60000;
  c.optimizer.name = "ftrl";
  c.optimizer.alpha = 0.5;
  c.optimizer.beta = 0.1;  // summed gradients of 100 rows (issue 12)
  c.optimizer.l1 = 0.1;
  c.optimizer.l2 = 0.1;
  c.data.format = "synthetic";
  c.data.synthetic.train_rows = 6000;
  c.data.synthetic.test_rows = 2000;
  c.data.synthetic.features = 5000;
  c.data.synthetic.seed = 7;
  c.fault_tolerance.work_unit_rows = 300;  // 20 units an epoch
  c.training.minibatch = 100;
  c.training.epochs = 2;
  c.training.progress_interval_s = 1000;
  return c;
}

struct Case {
  std::string name;
  Mode mode;
  int victim;
};

class WorkerFailureTest : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() { InitLogging("T", "warn"); }
};

TEST_P(WorkerFailureTest, OthersRedoTheDeadWorkersUnitsWithExactCounts) {
  const Case& c = GetParam();
  Kill kill;
  kill.after_pushes = 12;  // a few units in, mid-unit
  LocalClusterOptions o;
  o.config = Job(c.mode);
  o.killed_workers = {c.victim};
  o.timeout = absl::Seconds(120);
  Kill never;
  never.after_pushes = int64_t{1} << 60;
  o.worker_clients = [&](int w, ClientFactory* inproc)
      -> std::unique_ptr<ClientFactory> {
    return std::make_unique<KillableFactory>(inproc,
                                             w == c.victim ? &kill : &never);
  };
  o.worker_scheduler = [&](int w, std::shared_ptr<SchedulerClient> inproc)
      -> std::shared_ptr<SchedulerClient> {
    return std::make_shared<KillableScheduler>(std::move(inproc),
                                               w == c.victim ? &kill : &never);
  };
  LocalCluster cluster(o);
  absl::Status s = cluster.Run();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(kill.dead);
  EXPECT_FALSE(cluster.worker_status()[c.victim].ok());
  const std::string r = cluster.ReportJson();
  EXPECT_NE(r.find("\"status\": \"ok\""), std::string::npos) << r;
  EXPECT_THAT(ParseReportOrEmpty(r).epoch_examples(), ElementsAre(6000, 6000))
      << r;
  EXPECT_THAT(ParseReportOrEmpty(r).dead_workers(), ElementsAre(c.victim))
      << r;
  // Every live worker's examples are whole units: they add up exactly.
  absl::StatusOr<double> examples = JsonNumber(r, "examples");
  ASSERT_TRUE(examples.ok()) << examples.status();
  EXPECT_EQ(*examples, 12000);
  // The test metrics are there even when the evaluator (W[0]) died.
  absl::StatusOr<double> auc = JsonNumber(r, "test_auc");
  ASSERT_TRUE(auc.ok()) << auc.status() << "\n" << r;
  EXPECT_GT(*auc, 0.6);
  absl::StatusOr<double> rows = JsonNumber(r, "test_rows");
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(*rows, 2000);
}

INSTANTIATE_TEST_SUITE_P(
    Victims, WorkerFailureTest,
    ::testing::Values(Case{"BspW1", Mode::kBsp, 1},
                      Case{"BspW0Evaluator", Mode::kBsp, 0},
                      Case{"SspW2", Mode::kSsp, 2}),
    [](const ::testing::TestParamInfo<Case>& p) { return p.param.name; });

// Without a death, a slow worker simply takes fewer units (and the counts
// stay exact).
TEST(WorkUnitsTest, EveryExampleOncePerEpochWithoutFailures) {
  InitLogging("T", "warn");
  LocalClusterOptions o;
  o.config = Job(Mode::kSsp);
  o.config.training.straggler_factor = 4;
  LocalCluster cluster(o);
  absl::Status s = cluster.Run();
  ASSERT_TRUE(s.ok()) << s;
  const std::string r = cluster.ReportJson();
  EXPECT_THAT(ParseReportOrEmpty(r).epoch_examples(), ElementsAre(6000, 6000))
      << r;
  EXPECT_NE(r.find("\"dead_workers\": []"), std::string::npos) << r;
  absl::StatusOr<double> examples = JsonNumber(r, "examples");
  ASSERT_TRUE(examples.ok());
  EXPECT_EQ(*examples, 12000);
}

// The mlp model on work units (issue 9): criteo field rows; a worker joins
// mid-run and another dies (its units redone): every epoch counts each of
// the 8000 rows once and the model still learns.
TEST(WorkUnitsTest, MlpTrainsOnWorkUnitsThroughAJoinAndADeath) {
  InitLogging("T", "warn");
  const std::string data = PS_SOURCE_DIR "/../shared/data/criteo-10k";
  if (!std::filesystem::exists(data + "/train.tsv")) {
    GTEST_SKIP() << "no " << data << " (../shared/data/README.md)";
  }
  JobConfig c = Job(Mode::kAsp);
  c.cluster.num_workers = 2;
  c.training.model = "mlp";
  c.data.format = "criteo";
  c.data.train = data + "/train.tsv";
  c.data.test = data + "/test.tsv";
  c.training.minibatch = 50;
  c.training.epochs = 2;
  c.fault_tolerance.work_unit_rows = 500;
  c.mlp.embedding_dim = 4;
  c.mlp.hidden = {16};
  c.mlp.optimizer = "adam";
  c.mlp.learning_rate = 0.001;
  Kill kill;
  kill.after_pushes = 40;  // mid-unit (a step pushes 3 tables)
  Kill never;
  never.after_pushes = int64_t{1} << 60;
  LocalClusterOptions o;
  o.config = c;
  o.killed_workers = {1};
  o.timeout = absl::Seconds(120);
  o.join_workers_after_pushes = {30};
  o.worker_clients = [&](int w, ClientFactory* inproc)
      -> std::unique_ptr<ClientFactory> {
    return std::make_unique<KillableFactory>(inproc, w == 1 ? &kill : &never);
  };
  o.worker_scheduler = [&](int w, std::shared_ptr<SchedulerClient> inproc)
      -> std::shared_ptr<SchedulerClient> {
    return std::make_shared<KillableScheduler>(std::move(inproc),
                                               w == 1 ? &kill : &never);
  };
  LocalCluster cluster(o);
  absl::Status s = cluster.Run();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(kill.dead);
  ASSERT_EQ(cluster.joined_workers().size(), 1u);
  EXPECT_EQ(cluster.joined_workers()[0].first, 2);
  EXPECT_TRUE(cluster.joined_workers()[0].second.ok())
      << cluster.joined_workers()[0].second;
  const std::string r = cluster.ReportJson();
  EXPECT_NE(r.find("\"status\": \"ok\""), std::string::npos) << r;
  EXPECT_THAT(ParseReportOrEmpty(r).epoch_examples(), ElementsAre(8000, 8000))
      << r;
  EXPECT_THAT(ParseReportOrEmpty(r).dead_workers(), ElementsAre(1)) << r;
  EXPECT_TRUE(FindMembership(r, "joined", "W[2]").has_value()) << r;
  absl::StatusOr<double> auc = JsonNumber(r, "test_auc");
  ASSERT_TRUE(auc.ok()) << auc.status() << "\n" << r;
  EXPECT_GT(*auc, 0.6) << r;
}

// Issue 12: the mlp model holds out a validation split as logistic
// regression does (the one training loop evaluates it at epoch starts, on
// a thread): held-out rows are never trained on, the evaluating worker
// reports validation figures, and early stopping may act on them.
TEST(WorkUnitsTest, MlpHoldsOutAValidationSplit) {
  InitLogging("T", "warn");
  const std::string data = PS_SOURCE_DIR "/../shared/data/criteo-10k";
  if (!std::filesystem::exists(data + "/train.tsv")) {
    GTEST_SKIP() << "no " << data << " (../shared/data/README.md)";
  }
  JobConfig c = Job(Mode::kBsp);
  c.cluster.num_workers = 2;
  c.training.model = "mlp";
  c.data.format = "criteo";
  c.data.train = data + "/train.tsv";
  c.data.test = data + "/test.tsv";
  c.data.validation_fraction = 0.1;
  c.training.early_stopping = 5;
  c.training.minibatch = 50;
  c.training.epochs = 3;
  c.fault_tolerance.work_unit_rows = 1000;
  c.mlp.embedding_dim = 4;
  c.mlp.hidden = {16};
  c.mlp.optimizer = "adam";
  c.mlp.learning_rate = 0.001;
  LocalClusterOptions o;
  o.config = c;
  o.timeout = absl::Seconds(120);
  LocalCluster cluster(o);
  absl::Status s = cluster.Run();
  ASSERT_TRUE(s.ok()) << s;
  const std::string r = cluster.ReportJson();
  const proto::JobReport report = ParseReportOrEmpty(r);
  EXPECT_NE(r.find("\"status\": \"ok\""), std::string::npos) << r;
  // About 10% of 8000 rows (sd ~27).
  const int64_t held = static_cast<int64_t>(report.validation_rows());
  EXPECT_GT(held, 650) << r;
  EXPECT_LT(held, 950) << r;
  EXPECT_THAT(report.epoch_examples(),
              ElementsAre(8000 - held, 8000 - held, 8000 - held))
      << r;
  absl::StatusOr<double> auc = JsonNumber(r, "validation_auc");
  absl::StatusOr<double> logloss = JsonNumber(r, "validation_logloss");
  ASSERT_TRUE(auc.ok() && logloss.ok()) << r;
  EXPECT_GT(*auc, 0.6) << r;
  EXPECT_GT(*logloss, 0) << r;
  // Evaluated at the start of epochs 1 and 2 (the scheduler's curve).
  EXPECT_GE(report.validation_curve_size(), 1) << r;
}

}  // namespace
}  // namespace ps
