// The wide & deep model (models/wide_deep.h) in the one training loop
// (worker/trainer.h) without the network: the loop drives an in-memory
// ParamClient whose tables are the servers' own Table class (same random
// initialisation, same averaging by the example count, same Adam), so the
// learning logic is the cluster's minus the transport. Also the table
// layout. (The field reader and its shuffle buffer are tested in
// data/criteo_test.cc.)
//
// Reads ../shared/data/criteo-10k; the tests that need it skip when missing.

#include "models/wide_deep.h"

#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status_macros.h"
#include "data/data.h"
#include "gtest/gtest.h"
#include "kernels/cuda_backend.h"
#include "server/table.h"
#include "worker/trainer.h"

namespace ps {
namespace {

std::string DataPath(const std::string& rel) {
  return std::string(PS_SOURCE_DIR) + "/../shared/data/" + rel;
}

bool Exists(const std::string& p) { return std::ifstream(p).good(); }

// Tables in memory, applied at once (a one-worker BSP cluster).
class InMemoryParams final : public ParamClient {
 public:
  explicit InMemoryParams(const std::vector<proto::TableConfig>& tables) {
    for (const auto& t : tables) {
      TableSpec spec;
      spec.id = t.id();
      spec.dim = t.dim();
      spec.optimizer = OptimizerFromProto(t.optimizer());
      spec.init_scale = t.optimizer().init_scale();
      auto table = Table::Create(spec, 1);
      EXPECT_TRUE(table.ok()) << table.status();
      tables_[t.id()] = std::move(*table);
    }
  }
  // Answered at once, whatever the clock asked for: the loop pulls at the
  // next clock only with a staleness bound, and these tests train BSP.
  int64_t Pull(int table, absl::Span<const uint64_t> keys,
               std::vector<float>* out, int64_t /*at_clock*/ = -1) override {
    Table* t = tables_.at(table).get();
    out->resize(keys.size() * t->dim());
    t->Pull(0, keys, out->data());
    return ++ts_;
  }
  int64_t Push(int table, absl::Span<const uint64_t> keys,
               absl::Span<const float> vals, int num_examples) override {
    Table* t = tables_.at(table).get();
    EXPECT_EQ(vals.size(), keys.size() * t->dim());
    t->Push(0, keys, vals.data(), t->optimizer().GradientScale(num_examples));
    return ++ts_;
  }
  absl::Status Wait(int64_t, absl::Time) override { return absl::OkStatus(); }
  int64_t Clock(int) override {
    ++clock_;
    return ++ts_;
  }
  int64_t clock() const override { return clock_; }

 private:
  std::map<int, std::unique_ptr<Table>> tables_;
  int64_t ts_ = 0, clock_ = 0;
};

TEST(MlpTables, Layout) {
  JobConfig c;
  c.mlp.embedding_dim = 8;
  c.mlp.hidden = {256, 128};
  std::vector<proto::TableConfig> t = MlpTables(c);
  ASSERT_EQ(t.size(), 4u);
  c.mlp.wide = true;
  std::vector<proto::TableConfig> wide = MlpTables(c);
  ASSERT_EQ(wide.size(), 5u);
  EXPECT_EQ(wide[4].id(), MlpWideTable(MlpShapeOf(c)));
  EXPECT_EQ(wide[4].id(), 4);
  EXPECT_EQ(wide[4].dim(), 1);
  EXPECT_EQ(wide[4].optimizer().name(), c.optimizer.name);  // ftrl
  EXPECT_EQ(wide[4].optimizer().init_scale(), 0);
  EXPECT_EQ(t[0].id(), kMlpEmbeddingTable);
  EXPECT_EQ(t[0].dim(), 8);
  EXPECT_EQ(t[1].id(), 1);
  EXPECT_EQ(t[1].dim(), 39 * 8 + 1);
  EXPECT_EQ(t[2].dim(), 256 + 1);
  EXPECT_EQ(t[3].dim(), 128 + 1);
  for (const auto& x : t) {
    EXPECT_EQ(x.optimizer().name(), "adam");
    EXPECT_GT(x.optimizer().init_scale(), 0);
  }
}

TEST(MlpBatch, BuildRemapsToUniqueKeys) {
  FieldBlock b;
  b.num_fields = 2;
  b.keys = {50, 7, 7, 99};
  b.labels = {1, 0};
  MlpBatch m;
  BuildMlpBatch(b, &m);
  EXPECT_EQ(m.keys, (std::vector<uint64_t>{7, 50, 99}));
  EXPECT_EQ(m.slots, (std::vector<uint32_t>{1, 0, 0, 2}));
  EXPECT_EQ(m.labels, (std::vector<float>{1, 0}));
}

// The goal of issue 4: the MLP reaches at least logistic regression's test
const std::string kCriteoTrain = DataPath("criteo-10k/train.tsv");
const std::string kCriteoTest = DataPath("criteo-10k/test.tsv");

// deploy/configs/criteo_mlp.yaml with progress reports off.
absl::StatusOr<JobConfig> CriteoMlpConfig() {
  PS_ASSIGN_OR_RETURN(
      JobConfig c,
      LoadJobConfig(std::string(PS_SOURCE_DIR) + "/deploy/configs/criteo_mlp.yaml"));
  c.training.progress_interval_s = 1000;
  return c;
}

struct CriteoRun {
  EvalMetrics metrics;  // on the test split
  int64_t examples = 0;
  int64_t clocks = 0;
};

// Trains `c` on criteo-10k's training split as one worker against in-memory
// tables (BSP: each pull sees every earlier push), then evaluates on the
// test split.
absl::StatusOr<CriteoRun> TrainOnCriteo10k(JobConfig c, MlpBackend* backend) {
  c.consistency.mode = Mode::kBsp;
  InMemoryParams params(MlpTables(c));
  WideDeepModel model(0, c, &params, backend);
  PS_RETURN_IF_ERROR(model.Validate());
  Trainer trainer(0, c, &params, &model);
  PS_ASSIGN_OR_RETURN(auto train, OpenCriteoFields(kCriteoTrain, 0, -1, false));
  PS_ASSIGN_OR_RETURN(auto test, OpenCriteoFields(kCriteoTest, 0, -1, false));
  EpochSource source(train.get(), c.training.epochs);
  PS_RETURN_IF_ERROR(trainer.Train(&source));
  CriteoRun run;
  PS_ASSIGN_OR_RETURN(run.metrics, model.Evaluate(backend, test.get()));
  run.examples = trainer.stats().examples;
  run.clocks = params.clock();
  return run;
}

// deploy/configs/criteo_mlp.yaml's model (wide & deep with dropout) on
// criteo-10k, training as a one-worker BSP cluster would (server-side Adam
// and FTRL over averaged pushes), CPU backend: at least the AUC of
// LIBLINEAR's best logistic regression on the same data, 0.745
// (../shared/data/README.md).
TEST(MlpTrainer, LearnsCriteo10k) {
  if (!Exists(kCriteoTrain) || !Exists(kCriteoTest)) {
    GTEST_SKIP() << "missing criteo-10k";
  }
  absl::StatusOr<JobConfig> c = CriteoMlpConfig();
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->training.model, "mlp");
  ASSERT_TRUE(c->mlp.wide);
  // One worker takes the minibatch of all the config's workers.
  c->training.minibatch *= c->cluster.num_workers;
  auto backend = CreateCpuMlpBackend();
  absl::StatusOr<CriteoRun> run = TrainOnCriteo10k(*c, backend.get());
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->examples, c->training.epochs * 8000);
  EXPECT_EQ(run->clocks, c->training.epochs * (8000 / c->training.minibatch));
  std::printf("MLP on criteo-10k: test AUC %.4f, log loss %.4f\n",
              run->metrics.auc, run->metrics.logloss);
  EXPECT_GE(run->metrics.auc, 0.745);
}

// One epoch of the same model on the CUDA and the CPU backend: the same test
// AUC to FP32 noise. Skips with "no CUDA device found" where there is none.
TEST(MlpTrainer, CudaBackendTrainsAsCpu) {
  if (absl::Status dev = CudaDeviceAvailable(); !dev.ok()) {
    GTEST_SKIP() << dev.message();
  }
  if (!Exists(kCriteoTrain) || !Exists(kCriteoTest)) {
    GTEST_SKIP() << "missing criteo-10k";
  }
  absl::StatusOr<JobConfig> c = CriteoMlpConfig();
  ASSERT_TRUE(c.ok()) << c.status();
  c->training.epochs = 1;
  double auc[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<std::unique_ptr<MlpBackend>> backend =
        CreateMlpBackend(i == 0 ? "cpu" : "cuda");
    ASSERT_TRUE(backend.ok()) << backend.status();
    absl::StatusOr<CriteoRun> run = TrainOnCriteo10k(*c, backend->get());
    ASSERT_TRUE(run.ok()) << run.status();
    auc[i] = run->metrics.auc;
  }
  std::printf("MLP 1 epoch: test AUC cpu %.5f, cuda %.5f\n", auc[0], auc[1]);
  EXPECT_NEAR(auc[0], auc[1], 2e-3);
}

// The wide part's gradient reaches its table: one minibatch of two rows
// that differ only in field 5 (and in the label).
TEST(MlpTrainer, WidePartIsTrained) {
  JobConfig c;
  c.training.model = "mlp";
  c.training.minibatch = 2;
  c.training.epochs = 1;
  c.training.progress_interval_s = 1000;
  c.mlp.embedding_dim = 2;
  c.mlp.hidden = {3};
  c.mlp.wide = true;
  c.mlp.dropout = 0.5;
  InMemoryParams params(MlpTables(c));
  auto backend = CreateCpuMlpBackend();
  WideDeepModel model(0, c, &params, backend.get());
  Trainer trainer(0, c, &params, &model);
  class TwoRows final : public FieldReader {
   public:
    absl::StatusOr<size_t> Next(size_t, FieldBlock* out) override {
      if (done_) return 0;
      done_ = true;
      for (int r = 0; r < 2; ++r) {
        for (int f = 0; f < kCriteoNumFields; ++f) {
          out->keys.push_back(1000 * f + (f == 5 ? r : 0));
        }
        out->labels.push_back(static_cast<float>(r));
      }
      return 2;
    }
    absl::Status Reset() override {
      done_ = false;
      return absl::OkStatus();
    }

   private:
    bool done_ = false;
  } rows;
  EpochSource source(&rows, 1);
  ASSERT_TRUE(trainer.Train(&source).ok());
  const int wide = MlpWideTable(MlpShapeOf(c));
  std::vector<float> w;
  params.Pull(wide, std::vector<uint64_t>{5000, 5001}, &w);
  ASSERT_EQ(w.size(), 2u);
  // Row 0 (label 0) holds key 5000, row 1 (label 1) key 5001: FTRL moves
  // their weights apart, down and up.
  EXPECT_LT(w[0], 0.0f);
  EXPECT_GT(w[1], 0.0f);
}

// Issue 8: "an entirely skipped data file trains 0 examples and exits 0".
TEST(MlpTrainer, RegressionAllLinesSkippedTrainsZeroExamples) {
  JobConfig c;
  c.training.model = "mlp";
  c.training.minibatch = 2;
  c.training.epochs = 1;
  c.training.progress_interval_s = 1000;
  c.mlp.embedding_dim = 2;
  c.mlp.hidden = {3};
  const std::string path = ::testing::TempDir() + "/mlp_all_bad.tsv";
  std::ofstream(path) << "x\ny\n";
  auto reader = OpenCriteoFields(path, 0, -1, /*skip_malformed=*/true);
  ASSERT_TRUE(reader.ok());
  InMemoryParams params(MlpTables(c));
  auto backend = CreateCpuMlpBackend();
  WideDeepModel model(3, c, &params, backend.get());
  Trainer trainer(3, c, &params, &model);
  EpochSource source(reader->get(), 1);
  ASSERT_TRUE(trainer.Train(&source).ok());
  absl::Status s = CheckTrainedExamples(3, source.path(), source.stats(),
                                        trainer.stats().examples);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(s.message(),
            "W[3] trained 0 examples from " + path + " (2 lines skipped)");
  EXPECT_EQ(trainer.stats().train_skipped.skipped(), 2);
  EXPECT_EQ(trainer.stats().train_skipped.first_bad_line(), 1);
}

}  // namespace
}  // namespace ps
