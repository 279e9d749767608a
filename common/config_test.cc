#include "common/config.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

// Expects INVALID_ARGUMENT whose message contains `needle`.
void ExpectInvalid(const absl::Status& s, const std::string& needle) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(needle), std::string::npos)
      << "message: " << s.message() << "\nexpected to contain: " << needle;
}

absl::Status ParseStatus(const std::string& yaml) {
  return ParseJobConfig(yaml).status();
}

TEST(ConfigTest, EmptyDocumentGivesDefaults) {
  for (const char* text : {"", "# nothing\n", "training:\n"}) {
    absl::StatusOr<JobConfig> c = ParseJobConfig(text);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE(*c == JobConfig()) << text;
  }
  JobConfig d;
  EXPECT_EQ(d.cluster.num_servers, 2);
  EXPECT_EQ(d.consistency.mode, Mode::kSsp);
  EXPECT_EQ(d.EffectiveTau(), 4);
  EXPECT_TRUE(Validate(d).ok()) << Validate(d);
}

TEST(ConfigTest, FullFile) {
  const char* text = R"(
cluster:
  scheduler: "10.0.0.1:7000"
  num_servers: 4
  num_workers: 8
  virtual_nodes: 128
  heartbeat_ms: 250
  heartbeat_timeout_ms: 5000
  register_timeout_ms: 30000
  auth_token: s3cret
  bind_host: 0.0.0.0
consistency:
  mode: BSP
  tau: 2
  pull_timeout_ms: 1000
optimizer:
  name: adagrad
  learning_rate: 0.05
  alpha: 0.2
  beta: 0.5
  l1: 0
  l2: 0.001
  initial_accumulator: 1e-6
data:
  format: criteo
  train: /data/train.svm
  test: /data/test.svm
  skip_malformed: true
  shuffle: false
  shuffle_buffer_rows: 64
  synthetic:
    train_rows: 10
    test_rows: 0
    features: 50
    nnz_per_row: 50
    zipf_exponent: 0
    true_sparsity: 1
    label_noise: 0.5
    seed: 18446744073709551615
training:
  model: mlp
  minibatch: 500
  epochs: 3
  threads: 256
  backend: auto
  progress_interval_s: 0.5
  seed: 7
  straggler_factor: 2.5
  straggler_delay_ms: 40
  eval_interval_s: 10
output:
  model_dir: /tmp/m
  log_level: debug
)";
  absl::StatusOr<JobConfig> r = ParseJobConfig(text);
  ASSERT_TRUE(r.ok()) << r.status();
  const JobConfig& c = *r;
  EXPECT_EQ(c.cluster.scheduler, "10.0.0.1:7000");
  EXPECT_EQ(c.cluster.num_servers, 4);
  EXPECT_EQ(c.cluster.num_workers, 8);
  EXPECT_EQ(c.cluster.virtual_nodes, 128);
  EXPECT_EQ(c.cluster.heartbeat_ms, 250);
  EXPECT_EQ(c.cluster.heartbeat_timeout_ms, 5000);
  EXPECT_EQ(c.cluster.register_timeout_ms, 30000);
  EXPECT_EQ(c.cluster.auth_token, "s3cret");
  EXPECT_EQ(c.cluster.bind_host, "0.0.0.0");
  EXPECT_EQ(c.consistency.mode, Mode::kBsp);
  EXPECT_EQ(c.consistency.tau, 2);
  EXPECT_EQ(c.consistency.pull_timeout_ms, 1000);
  EXPECT_EQ(c.EffectiveTau(), 0);
  EXPECT_EQ(c.optimizer.name, "adagrad");
  EXPECT_DOUBLE_EQ(c.optimizer.learning_rate, 0.05);
  EXPECT_DOUBLE_EQ(c.optimizer.alpha, 0.2);
  EXPECT_DOUBLE_EQ(c.optimizer.beta, 0.5);
  EXPECT_DOUBLE_EQ(c.optimizer.l1, 0);
  EXPECT_DOUBLE_EQ(c.optimizer.l2, 0.001);
  EXPECT_DOUBLE_EQ(c.optimizer.initial_accumulator, 1e-6);
  EXPECT_EQ(c.data.format, "criteo");
  EXPECT_EQ(c.data.train, "/data/train.svm");
  EXPECT_EQ(c.data.test, "/data/test.svm");
  EXPECT_TRUE(c.data.skip_malformed);
  EXPECT_FALSE(c.data.shuffle);
  EXPECT_EQ(c.data.shuffle_buffer_rows, 64);
  EXPECT_EQ(c.data.synthetic.train_rows, 10);
  EXPECT_EQ(c.data.synthetic.test_rows, 0);
  EXPECT_EQ(c.data.synthetic.features, 50);
  EXPECT_EQ(c.data.synthetic.nnz_per_row, 50);
  EXPECT_DOUBLE_EQ(c.data.synthetic.zipf_exponent, 0);
  EXPECT_DOUBLE_EQ(c.data.synthetic.true_sparsity, 1);
  EXPECT_DOUBLE_EQ(c.data.synthetic.label_noise, 0.5);
  EXPECT_EQ(c.data.synthetic.seed, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(c.training.model, "mlp");
  EXPECT_EQ(c.training.minibatch, 500);
  EXPECT_EQ(c.training.epochs, 3);
  EXPECT_EQ(c.training.threads, 256);
  EXPECT_EQ(c.training.backend, "auto");
  EXPECT_DOUBLE_EQ(c.training.progress_interval_s, 0.5);
  EXPECT_EQ(c.training.seed, 7u);
  EXPECT_DOUBLE_EQ(c.training.straggler_factor, 2.5);
  EXPECT_EQ(c.training.straggler_delay_ms, 40);
  EXPECT_DOUBLE_EQ(c.training.eval_interval_s, 10);
  EXPECT_EQ(c.output.model_dir, "/tmp/m");
  EXPECT_EQ(c.output.log_level, "debug");
  EXPECT_TRUE(Validate(c).ok()) << Validate(c);
}

// Issue 12: the default minibatch is sized from the data.
TEST(ConfigTest, AutoMinibatchIsSizedFromTheRowsPerWorker) {
  JobConfig c;
  EXPECT_EQ(c.training.minibatch, kAutoMinibatch);
  EXPECT_EQ(CheckMinibatchResolved(c.training).code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<JobConfig> parsed =
      ParseJobConfig("training: {minibatch: AUTO}");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->training.minibatch, kAutoMinibatch);
  EXPECT_NE(ToYaml(*parsed).find("minibatch: auto"), std::string::npos);

  c.cluster.num_workers = 4;
  JobConfig a9a = c;  // 32561 rows: 8140 per worker
  EXPECT_NE(ResolveAutoMinibatch(&a9a, 32561).find("minibatch auto: 40"),
            std::string::npos);
  EXPECT_EQ(a9a.training.minibatch, 40);
  EXPECT_FALSE(CheckMinibatchResolved(a9a.training).ok());  // epochs auto
  EXPECT_NE(ResolveAutoEpochs(&a9a, 32561).find("epochs auto: 3"),
            std::string::npos);
  EXPECT_EQ(a9a.training.epochs, 3);
  EXPECT_TRUE(CheckMinibatchResolved(a9a.training).ok());
  JobConfig mid = c;
  ResolveAutoEpochs(&mid, 60000);
  EXPECT_EQ(mid.training.epochs, 2);

  JobConfig tiny = c;
  ResolveAutoMinibatch(&tiny, 100);
  EXPECT_EQ(tiny.training.minibatch, kAutoMinibatchMin);
  JobConfig criteo = c;  // criteo-10k: 8000 rows, 2000 per worker
  ResolveAutoMinibatch(&criteo, 8000);
  EXPECT_EQ(criteo.training.minibatch, 24);  // 10 without the floor
  JobConfig huge = c;
  ResolveAutoMinibatch(&huge, int64_t{1} << 40);
  EXPECT_EQ(huge.training.minibatch, 1000);
  JobConfig unseen = c;
  ResolveAutoMinibatch(&unseen, -1);
  EXPECT_EQ(unseen.training.minibatch, 100);
  ResolveAutoEpochs(&huge, int64_t{1} << 40);
  EXPECT_EQ(huge.training.epochs, 1);
  ResolveAutoEpochs(&unseen, -1);
  EXPECT_EQ(unseen.training.epochs, 1);
  JobConfig set = c;
  set.training.minibatch = 7;
  set.training.epochs = 5;
  EXPECT_EQ(ResolveAutoMinibatch(&set, 32561), "");
  EXPECT_EQ(ResolveAutoEpochs(&set, 32561), "");
  EXPECT_EQ(set.training.minibatch, 7);
  EXPECT_EQ(set.training.epochs, 5);
}

// The dense-id layout's bound: auto follows the data's feature ids; 0 turns
// it off; a bound past kMaxDenseFeatures names the field.
TEST(ConfigTest, DenseFeaturesFollowTheData) {
  JobConfig c;
  EXPECT_EQ(c.training.dense_features, kAutoDenseFeatures);
  c.data.synthetic.features = 5000;
  EXPECT_EQ(DenseFeatures(c), 5000);
  c.data.format = "libsvm";
  EXPECT_EQ(DenseFeatures(c), int64_t{1} << 20);
  c.data.format = "criteo";
  EXPECT_EQ(DenseFeatures(c), 0);
  absl::StatusOr<JobConfig> parsed =
      ParseJobConfig("training: {dense_features: 0}");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(DenseFeatures(*parsed), 0);
  parsed = ParseJobConfig("training: {dense_features: auto}");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_NE(ToYaml(*parsed).find("dense_features: auto"), std::string::npos);
  parsed = ParseJobConfig("training: {dense_features: 123}");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(DenseFeatures(*parsed), 123);
  EXPECT_EQ(ParseJobConfig("training: {dense_features: 4294967297}")
                .status()
                .message(),
            "config field training.dense_features: must be in [0, "
            "4294967296], got 4294967297 (or auto)");
  EXPECT_EQ(ParseJobConfig("training: {dense_features: -1}").status().message(),
            "config field training.dense_features: must be in [0, "
            "4294967296], got -1 (or auto)");
}

// Work units default to about ten minibatches (each unit costs a GetWork
// round trip and a state-file write), but no fewer than 16 per worker an
// epoch, and no less than a minibatch.
TEST(ConfigTest, AutoWorkUnitRowsAreTenMinibatchesWithSixteenPerWorker) {
  JobConfig c;
  EXPECT_EQ(c.fault_tolerance.work_unit_rows, kAutoWorkUnitRows);
  absl::StatusOr<JobConfig> parsed =
      ParseJobConfig("fault_tolerance: {work_unit_rows: Auto}");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->fault_tolerance.work_unit_rows, kAutoWorkUnitRows);
  EXPECT_NE(ToYaml(*parsed).find("work_unit_rows: auto"), std::string::npos);
  absl::StatusOr<JobConfig> back = ParseJobConfig(ToYaml(*parsed));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->fault_tolerance.work_unit_rows, kAutoWorkUnitRows);
  EXPECT_EQ(ParseJobConfig("fault_tolerance: {work_unit_rows: lots}")
                .status()
                .message(),
            "config field fault_tolerance.work_unit_rows: expected an "
            "integer, got 'lots' (or auto)");

  c.cluster.num_workers = 4;
  c.training.minibatch = 1000;
  JobConfig scale = c;  // 3M rows: 750k per worker, 10 minibatches a unit
  EXPECT_NE(ResolveAutoWorkUnitRows(&scale, 3000000)
                .find("work_unit_rows auto: 10000 (10 minibatches of 1000 "
                      "rows; about 300 units an epoch)"),
            std::string::npos);
  EXPECT_EQ(scale.fault_tolerance.work_unit_rows, 10000);
  // 400k rows: 10 minibatches would leave a worker 10 units; 16 it is.
  EXPECT_EQ(AutoWorkUnitRows(c, 400000), 400000 / 64);
  // Fewer rows than 16 minibatches a worker: one minibatch a unit.
  EXPECT_EQ(AutoWorkUnitRows(c, 20000), 1000);
  // Unknown size: ten minibatches; minibatch still auto: 100 rows.
  EXPECT_EQ(AutoWorkUnitRows(c, -1), 10000);
  JobConfig a9a = c;
  a9a.cluster.num_workers = 2;
  a9a.training.minibatch = kAutoMinibatch;
  EXPECT_EQ(AutoWorkUnitRows(a9a, 32561), 1000);  // 32561 / 32 = 1017
  JobConfig set = c;
  set.fault_tolerance.work_unit_rows = 77;
  EXPECT_EQ(ResolveAutoWorkUnitRows(&set, 3000000), "");
  EXPECT_EQ(set.fault_tolerance.work_unit_rows, 77);
}

// optimizer.feature_scale: ftrl's parameters as for values divided by s.
TEST(ConfigTest, FeatureScaleRescalesFtrl) {
  JobConfig c;  // ftrl alpha 0.5, beta 32, l1 = l2 = 0.03
  ASSERT_EQ(c.optimizer.feature_scale, kAutoFeatureScale);
  JobConfig news = c;
  EXPECT_NE(ResolveFeatureScale(&news, 0.05).find("feature_scale auto: 0.05"),
            std::string::npos);
  EXPECT_DOUBLE_EQ(news.optimizer.alpha, 0.5 / 0.05);
  EXPECT_DOUBLE_EQ(news.optimizer.beta, 32 * 0.05);
  EXPECT_DOUBLE_EQ(news.optimizer.l1, 0.03 * 0.05);
  EXPECT_DOUBLE_EQ(news.optimizer.l2, 0.03 * 0.05 * 0.05);
  EXPECT_EQ(news.optimizer.feature_scale, 1.0);
  JobConfig again = news;  // resolved once: nothing more happens
  EXPECT_EQ(ResolveFeatureScale(&again, 0.05), "");
  EXPECT_TRUE(again == news);
  JobConfig unknown = c;
  EXPECT_EQ(ResolveFeatureScale(&unknown, -1), "");
  EXPECT_DOUBLE_EQ(unknown.optimizer.alpha, 0.5);
  JobConfig given = c;
  given.optimizer.feature_scale = 2;
  ResolveFeatureScale(&given, 0.05);  // the field wins over the estimate
  EXPECT_DOUBLE_EQ(given.optimizer.alpha, 0.25);
  JobConfig sgd = c;
  sgd.optimizer.name = "sgd";
  EXPECT_EQ(ResolveFeatureScale(&sgd, 0.05), "");
  EXPECT_DOUBLE_EQ(sgd.optimizer.learning_rate, c.optimizer.learning_rate);
  absl::StatusOr<JobConfig> p =
      ParseJobConfig("optimizer: {feature_scale: 0.5}");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->optimizer.feature_scale, 0.5);
  ExpectInvalid(ParseStatus("optimizer: {feature_scale: 0}"),
                "config field optimizer.feature_scale: must be > 0 and "
                "finite, got 0 (or auto)");
}

TEST(ConfigTest, ModesAndTau) {
  absl::StatusOr<JobConfig> c = ParseJobConfig("consistency: {mode: ssp, tau: 4}");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->EffectiveTau(), 4);
  c = ParseJobConfig("consistency: {mode: Ssp, tau: inf}");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->consistency.tau, -1);
  EXPECT_EQ(c->EffectiveTau(), -1);
  c = ParseJobConfig("consistency: {mode: ASP, tau: 3}");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->consistency.mode, Mode::kAsp);
  EXPECT_EQ(c->EffectiveTau(), -1);
  c = ParseJobConfig("consistency: {mode: bsp, tau: 3}");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->EffectiveTau(), 0);
  c = ParseJobConfig("consistency: {tau: 0}");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->EffectiveTau(), 0);
  EXPECT_STREQ(ModeName(Mode::kBsp), "bsp");
  EXPECT_STREQ(ModeName(Mode::kSsp), "ssp");
  EXPECT_STREQ(ModeName(Mode::kAsp), "asp");

  ExpectInvalid(ParseStatus("consistency: {mode: tsp}"),
                "config field consistency.mode: must be one of bsp|ssp|asp, "
                "got 'tsp'");
  ExpectInvalid(ParseStatus("consistency: {tau: -1}"),
                "config field consistency.tau: must be >= 0 or inf, got -1");
  ExpectInvalid(ParseStatus("consistency: {tau: lots}"),
                "config field consistency.tau: expected an integer or inf, "
                "got 'lots'");
}

TEST(ConfigTest, UnknownKeyNamesTheField) {
  ExpectInvalid(ParseStatus("training: {minibatchh: 5}"),
                "config field training.minibatchh: unknown key");
  ExpectInvalid(ParseStatus("trainin: {minibatch: 5}"),
                "config field trainin: unknown key");
  ExpectInvalid(ParseStatus("data: {synthetic: {rows: 5}}"),
                "config field data.synthetic.rows: unknown key");
  // A field at the wrong level, and a dotted key, are unknown too.
  ExpectInvalid(ParseStatus("minibatch: 5"), "config field minibatch: unknown key");
  ExpectInvalid(ParseStatus("training.minibatch: 5"),
                "config field training.minibatch: unknown key");
  ExpectInvalid(ParseStatus("training: {minibatch: 5, minibatch: 6}"),
                "config field training.minibatch: duplicate key");
}

TEST(ConfigTest, WrongTypeNamesTheField) {
  ExpectInvalid(ParseStatus("training: {minibatch: abc}"),
                "config field training.minibatch: expected an integer, got 'abc'");
  ExpectInvalid(ParseStatus("training: {minibatch: 1.5}"),
                "config field training.minibatch: expected an integer, got '1.5'");
  ExpectInvalid(ParseStatus("training: {minibatch: [1, 2]}"),
                "config field training.minibatch: expected an integer, got a "
                "sequence");
  ExpectInvalid(ParseStatus("optimizer: {alpha: fast}"),
                "config field optimizer.alpha: expected a number, got 'fast'");
  ExpectInvalid(ParseStatus("optimizer: {alpha: nan}"),
                "config field optimizer.alpha: expected a number");
  ExpectInvalid(ParseStatus("data: {skip_malformed: maybe}"),
                "config field data.skip_malformed: expected true or false, "
                "got 'maybe'");
  ExpectInvalid(ParseStatus("data: {train: {a: 1}}"),
                "config field data.train: expected a string, got a mapping");
  ExpectInvalid(ParseStatus("training: 5"),
                "config field training: expected a mapping, got '5'");
  ExpectInvalid(ParseStatus("training: {seed: -1}"),
                "config field training.seed: expected a non-negative integer");
  ExpectInvalid(ParseStatus("cluster: {num_servers: 99999999999}"),
                "config field cluster.num_servers: must be <= 1024");
  ExpectInvalid(ParseStatus("- a\n- b\n"), "expected a mapping of sections");
}

TEST(ConfigTest, OutOfRangeNamesTheField) {
  struct Case {
    const char* yaml;
    const char* message;
  };
  const Case cases[] = {
      {"cluster: {num_servers: 0}",
       "config field cluster.num_servers: must be >= 1, got 0"},
      {"cluster: {num_workers: 1025}",
       "config field cluster.num_workers: must be <= 1024, got 1025"},
      {"cluster: {virtual_nodes: 4097}",
       "config field cluster.virtual_nodes: must be <= 4096, got 4097"},
      {"cluster: {heartbeat_ms: 9}",
       "config field cluster.heartbeat_ms: must be >= 10, got 9"},
      {"fault_tolerance: {work_unit_rows: 0}",
       "config field fault_tolerance.work_unit_rows: must be >= 1, got 0 (or "
       "auto)"},
      {"data: {shuffle_buffer_rows: 0}",
       "config field data.shuffle_buffer_rows: must be >= 1, got 0"},
      {"cluster: {heartbeat_timeout_ms: 99}",
       "config field cluster.heartbeat_timeout_ms: must be >= 100, got 99"},
      {"cluster: {scheduler_timeout_ms: 99}",
       "config field cluster.scheduler_timeout_ms: must be >= 100, got 99"},
      {"cluster: {register_timeout_ms: 0}",
       "config field cluster.register_timeout_ms: must be >= 100, got 0"},
      {"consistency: {pull_timeout_ms: 0}",
       "config field consistency.pull_timeout_ms: must be >= 1, got 0"},
      {"optimizer: {name: rmsprop}",
       "config field optimizer.name: must be one of sgd|adagrad|ftrl|adam, "
       "got 'rmsprop'"},
      {"optimizer: {learning_rate: 0}",
       "config field optimizer.learning_rate: must be > 0, got 0"},
      {"optimizer: {alpha: -1}",
       "config field optimizer.alpha: must be > 0, got -1"},
      {"optimizer: {beta: -0.5}",
       "config field optimizer.beta: must be >= 0, got -0.5"},
      {"optimizer: {l1: -1}", "config field optimizer.l1: must be >= 0"},
      {"optimizer: {l2: -1}", "config field optimizer.l2: must be >= 0"},
      {"data: {validation_fraction: 0.6}",
       "config field data.validation_fraction: must be in [0, 0.5], got 0.6"},
      {"training: {early_stopping: -1}",
       "config field training.early_stopping: must be >= 0"},
      {"optimizer: {initial_accumulator: -1}",
       "config field optimizer.initial_accumulator: must be >= 0"},
      {"data: {format: csv}",
       "config field data.format: must be one of synthetic|libsvm|criteo, "
       "got 'csv'"},
      {"data: {synthetic: {train_rows: 0}}",
       "config field data.synthetic.train_rows: must be >= 1, got 0"},
      {"data: {synthetic: {test_rows: -1}}",
       "config field data.synthetic.test_rows: must be >= 0, got -1"},
      {"data: {synthetic: {features: 0}}",
       "config field data.synthetic.features: must be >= 1, got 0"},
      {"data: {synthetic: {nnz_per_row: 0}}",
       "config field data.synthetic.nnz_per_row: must be >= 1, got 0"},
      {"data: {synthetic: {features: 10, nnz_per_row: 11}}",
       "config field data.synthetic.nnz_per_row: must be <= "
       "data.synthetic.features (10), got 11"},
      {"data: {synthetic: {zipf_exponent: -0.1}}",
       "config field data.synthetic.zipf_exponent: must be >= 0, got -0.1"},
      {"data: {synthetic: {true_sparsity: 0}}",
       "config field data.synthetic.true_sparsity: must be in (0, 1], got 0"},
      {"data: {synthetic: {true_sparsity: 1.5}}",
       "config field data.synthetic.true_sparsity: must be in (0, 1], got 1.5"},
      {"data: {synthetic: {label_noise: 0.6}}",
       "config field data.synthetic.label_noise: must be in [0, 0.5], got 0.6"},
      {"training: {model: svm}",
       "config field training.model: must be one of logistic_regression|mlp, "
       "got 'svm'"},
      {"training: {minibatch: 0}",
       "config field training.minibatch: must be >= 1, got 0 (or auto)"},
      {"training: {minibatch: many}",
       "config field training.minibatch: expected an integer, got 'many' "
       "(or auto)"},
      {"training: {epochs: 0}",
       "config field training.epochs: must be >= 1, got 0"},
      {"training: {threads: 257}",
       "config field training.threads: must be <= 256, got 257"},
      {"training: {threads: 0}",
       "config field training.threads: must be >= 1, got 0"},
      {"training: {backend: tpu}",
       "config field training.backend: must be one of cpu|cuda|auto, got 'tpu'"},
      {"training: {progress_interval_s: 0}",
       "config field training.progress_interval_s: must be > 0, got 0"},
      {"training: {straggler_factor: 0.5}",
       "config field training.straggler_factor: must be >= 1, got 0.5"},
      {"training: {straggler_delay_ms: -1}",
       "config field training.straggler_delay_ms: must be >= 0, got -1"},
      {"training: {eval_interval_s: -1}",
       "config field training.eval_interval_s: must be >= 0, got -1"},
      {"output: {log_level: trace}",
       "config field output.log_level: must be one of debug|info|warn|error, "
       "got 'trace'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.yaml);
    ExpectInvalid(ParseStatus(c.yaml), c.message);
  }
}

TEST(ConfigTest, SyntaxErrorNamesTheLine) {
  const absl::Status s =
      ParseStatus("cluster:\n  num_servers: 2\ntraining: {minibatch: 5\n");
  ExpectInvalid(s, "YAML syntax error at line");
  const absl::Status s2 = ParseStatus("cluster:\n  a: [1\n  b: \"x\n");
  ExpectInvalid(s2, "line ");
}

TEST(ConfigTest, Overrides) {
  JobConfig c;
  ASSERT_TRUE(ApplyOverride(&c, "training.minibatch=500").ok());
  EXPECT_EQ(c.training.minibatch, 500);
  ASSERT_TRUE(ApplyOverride(&c, "consistency.mode=BSP").ok());
  EXPECT_EQ(c.consistency.mode, Mode::kBsp);
  ASSERT_TRUE(ApplyOverride(&c, "consistency.tau=inf").ok());
  EXPECT_EQ(c.consistency.tau, -1);
  ASSERT_TRUE(ApplyOverride(&c, "cluster.scheduler=10.1.2.3:9000").ok());
  EXPECT_EQ(c.cluster.scheduler, "10.1.2.3:9000");
  ASSERT_TRUE(ApplyOverride(&c, "data.synthetic.features=77").ok());
  EXPECT_EQ(c.data.synthetic.features, 77);
  ASSERT_TRUE(ApplyOverride(&c, "data.skip_malformed=true").ok());
  EXPECT_TRUE(c.data.skip_malformed);
  ASSERT_TRUE(ApplyOverride(&c, "cluster.auth_token=").ok());
  EXPECT_EQ(c.cluster.auth_token, "");
  ASSERT_TRUE(ApplyOverride(&c, " optimizer.l2 = 0.25").ok());
  EXPECT_DOUBLE_EQ(c.optimizer.l2, 0.25);

  const JobConfig before = c;
  ExpectInvalid(ApplyOverride(&c, "training.minibatch=abc"),
                "config field training.minibatch: expected an integer, got 'abc'");
  ExpectInvalid(ApplyOverride(&c, "training.minibatch=0"),
                "config field training.minibatch: must be >= 1, got 0");
  ExpectInvalid(ApplyOverride(&c, "training.minibatchh=5"),
                "config field training.minibatchh: unknown key");
  ExpectInvalid(ApplyOverride(&c, "training=5"),
                "config field training: is a section");
  ExpectInvalid(ApplyOverride(&c, "training.minibatch"),
                "expected section.field=value");
  ExpectInvalid(ApplyOverride(&c, "training.minibatch=[1"),
                "config field training.minibatch");
  ExpectInvalid(ApplyOverride(&c, "optimizer.name=rmsprop"),
                "config field optimizer.name: must be one of");
  EXPECT_TRUE(c == before) << "a failed override must not change the config";
}

TEST(ConfigTest, ValidateChecksCrossFieldConstraints) {
  JobConfig c;
  EXPECT_TRUE(Validate(c).ok());
  c.data.format = "libsvm";
  ExpectInvalid(Validate(c), "config field data.train: required");
  c.data.format = "criteo";
  ExpectInvalid(Validate(c), "config field data.train");
  c.data.train = "/data/day_0";
  EXPECT_TRUE(Validate(c).ok()) << Validate(c);

  JobConfig d;
  d.data.synthetic.features = 5;  // nnz_per_row stays 20
  ExpectInvalid(Validate(d), "config field data.synthetic.nnz_per_row");
  JobConfig e;
  e.training.threads = 0;  // built in code, never parsed
  ExpectInvalid(Validate(e), "config field training.threads: must be >= 1");
}

// Issue 12: early stopping watches the validation split, which both models
// have.
TEST(ConfigTest, EarlyStoppingNeedsAValidationSplit) {
  JobConfig c;
  c.training.early_stopping = 2;
  ExpectInvalid(Validate(c), "config field training.early_stopping: needs "
                             "data.validation_fraction > 0");
  c.data.validation_fraction = 0.1;
  EXPECT_TRUE(Validate(c).ok()) << Validate(c);
  c.training.model = "mlp";
  c.data.format = "criteo";
  c.data.train = "/data/train.tsv";
  EXPECT_TRUE(Validate(c).ok()) << Validate(c);
}

// Issue 8 ("late checks"): the workers found these only after the cluster
// had started, or never.
TEST(ConfigTest, RegressionMlpOnNonCriteoDataFoundAfterStart) {
  JobConfig c;
  c.training.model = "mlp";
  ExpectInvalid(Validate(c), "config field training.model: mlp needs "
                             "data.format criteo, got synthetic");
  c.data.format = "criteo";
  c.data.train = "/data/train.tsv";
  EXPECT_TRUE(Validate(c).ok()) << Validate(c);
}

TEST(ConfigTest, RegressionEvalIntervalWithoutTestSetRecordsNothing) {
  JobConfig c;
  c.training.eval_interval_s = 5;
  EXPECT_TRUE(Validate(c).ok()) << Validate(c);  // synthetic test rows
  c.data.synthetic.test_rows = 0;
  ExpectInvalid(Validate(c), "config field training.eval_interval_s: needs a "
                             "test set (data.synthetic.test_rows > 0)");
  c.data.format = "libsvm";
  c.data.train = "/data/a.train";
  ExpectInvalid(Validate(c), "needs a test set (data.test)");
  c.data.test = "/data/a.test";
  EXPECT_TRUE(Validate(c).ok()) << Validate(c);
}

TEST(ConfigTest, ToYamlRoundTrips) {
  JobConfig c;
  EXPECT_TRUE(*ParseJobConfig(ToYaml(c)) == c) << ToYaml(c);

  c.cluster.scheduler = "host:1";
  c.cluster.num_servers = 1024;
  c.cluster.auth_token = "tok: \"en\" # not a comment\nline2";
  c.cluster.bind_host = "yes";  // would read as a bool if unquoted
  c.consistency.mode = Mode::kAsp;
  c.consistency.tau = -1;
  c.consistency.pull_timeout_ms = 1;
  c.optimizer.name = "adam";
  c.optimizer.learning_rate = 0.1 + 0.2;  // not exactly 0.3
  c.optimizer.alpha = 1e-300;
  c.optimizer.l1 = 0;
  c.data.format = "criteo";
  c.data.train = "";
  c.data.test = "null";
  c.data.skip_malformed = true;
  c.data.shuffle = false;
  c.data.shuffle_buffer_rows = int64_t{1} << 40;
  c.data.synthetic.features = int64_t{1} << 40;
  c.data.synthetic.nnz_per_row = 1;
  c.data.synthetic.true_sparsity = 1.0 / 3;
  c.data.synthetic.seed = std::numeric_limits<uint64_t>::max();
  c.training.seed = 0;
  c.training.straggler_factor = 12345.678;
  c.training.straggler_delay_ms = 600000;
  c.fault_tolerance.work_unit_rows = 77;
  c.output.model_dir = "~";
  c.output.log_level = "error";
  const std::string yaml = ToYaml(c);
  absl::StatusOr<JobConfig> back = ParseJobConfig(yaml);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << yaml;
  EXPECT_TRUE(*back == c) << yaml;
  EXPECT_EQ(back->cluster.auth_token, c.cluster.auth_token);
  EXPECT_EQ(back->optimizer.learning_rate, c.optimizer.learning_rate);
  EXPECT_NE(yaml.find("tau: inf"), std::string::npos) << yaml;

  c.consistency.mode = Mode::kSsp;
  c.consistency.tau = 17;
  back = ParseJobConfig(ToYaml(c));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == c);
}

TEST(ConfigTest, LoadJobConfigNamesTheFile) {
  const std::string dir = ::testing::TempDir();
  const std::string good = absl::StrCat(dir, "/ps_config_test_good.yaml");
  const std::string bad = absl::StrCat(dir, "/ps_config_test_bad.yaml");
  {
    std::ofstream(good) << "training:\n  minibatch: 500\n";
    std::ofstream(bad) << "training:\n  minibatch: 0\n";
  }
  absl::StatusOr<JobConfig> c = LoadJobConfig(good);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->training.minibatch, 500);

  absl::Status s = LoadJobConfig(bad).status();
  ExpectInvalid(s, absl::StrCat(bad, ": config field training.minibatch: "
                                     "must be >= 1, got 0"));
  s = LoadJobConfig(absl::StrCat(dir, "/no_such_ps_config.yaml")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find("no_such_ps_config.yaml"), std::string::npos);
  std::remove(good.c_str());
  std::remove(bad.c_str());
}

TEST(ConfigTest, MlpSection) {
  absl::StatusOr<JobConfig> d = ParseJobConfig("");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->mlp.embedding_dim, 8);
  EXPECT_EQ(d->mlp.hidden, (std::vector<int>{256, 128}));
  EXPECT_EQ(d->mlp.optimizer, "adam");

  absl::StatusOr<JobConfig> c = ParseJobConfig(
      "training:\n  model: mlp\n"
      "mlp:\n  embedding_dim: 4\n  hidden: [64, 32, 16]\n"
      "  optimizer: adagrad\n  learning_rate: 0.01\n  l2: 0.0001\n"
      "  embedding_init: 0.1\n  dropout: 0.25\n  wide: true\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mlp.dropout, 0.25);
  EXPECT_TRUE(c->mlp.wide);
  EXPECT_FALSE(d->mlp.wide);
  EXPECT_EQ(d->mlp.dropout, 0);
  EXPECT_EQ(c->training.model, "mlp");
  EXPECT_EQ(c->mlp.embedding_dim, 4);
  EXPECT_EQ(c->mlp.hidden, (std::vector<int>{64, 32, 16}));
  EXPECT_EQ(c->mlp.optimizer, "adagrad");
  EXPECT_EQ(c->mlp.learning_rate, 0.01);
  EXPECT_EQ(c->mlp.l2, 0.0001);
  EXPECT_EQ(c->mlp.embedding_init, 0.1);

  // Round trip, including the empty list.
  absl::StatusOr<JobConfig> back = ParseJobConfig(ToYaml(*c));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == *c);
  JobConfig e = *c;
  e.mlp.hidden.clear();
  back = ParseJobConfig(ToYaml(e));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->mlp.hidden.empty());
  e.data.format = "criteo";  // what the mlp model trains on
  e.data.train = "/data/train.tsv";
  EXPECT_TRUE(Validate(e).ok()) << Validate(e);

  // Overrides: comma-separated or bracketed.
  JobConfig o;
  ASSERT_TRUE(ApplyOverride(&o, "mlp.hidden=[32, 8]").ok());
  EXPECT_EQ(o.mlp.hidden, (std::vector<int>{32, 8}));
  ASSERT_TRUE(ApplyOverride(&o, "mlp.hidden=16,4").ok());
  EXPECT_EQ(o.mlp.hidden, (std::vector<int>{16, 4}));

  ExpectInvalid(ParseStatus("mlp:\n  dropout: 1\n"),
                "config field mlp.dropout: must be in [0, 1), got 1");
  ExpectInvalid(ParseStatus("mlp:\n  wide: maybe\n"), "config field mlp.wide");
  ExpectInvalid(ParseStatus("mlp:\n  hidden: [64, 0]\n"),
                "config field mlp.hidden: every entry must be in [1, 65536], got 0");
  ExpectInvalid(ParseStatus("mlp:\n  hidden: [64, x]\n"),
                "config field mlp.hidden: expected an integer, got 'x'");
  ExpectInvalid(ParseStatus("mlp:\n  hidden: {a: 1}\n"),
                "config field mlp.hidden: expected a list of integers");
  ExpectInvalid(ParseStatus("mlp:\n  embedding_dim: 0\n"),
                "config field mlp.embedding_dim: must be >= 1, got 0");
  ExpectInvalid(ParseStatus("mlp:\n  optimizer: ftrl\n"),
                "config field mlp.optimizer: must be one of adam|adagrad|sgd");
  ExpectInvalid(ParseStatus("mlp:\n  learning_rate: 0\n"),
                "config field mlp.learning_rate: must be > 0");
  ExpectInvalid(ParseStatus("mlp:\n  bogus: 1\n"),
                "config field mlp.bogus: unknown key");
  EXPECT_EQ(o.mlp.hidden.size(), 2u);
  EXPECT_FALSE(ApplyOverride(&o, "mlp.hidden=[3").ok());
  EXPECT_EQ(o.mlp.hidden, (std::vector<int>{16, 4}));  // unchanged on error
}


// ---------------------------------------------------------------------------
// Issue 8: validation before start.

// A fresh folder under the test temp dir.
std::string FreshDir(const std::string& name) {
  const std::string dir =
      (std::filesystem::path(::testing::TempDir()) /
       absl::StrCat("ps_cfg_", name, "_", ::getpid()))
          .lexically_normal()
          .string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

TEST(ConfigTest, RegressionConfigDirRunsTheDefaultJob) {
  const std::string dir = FreshDir("configdir");
  absl::Status s = LoadJobConfig(dir).status();
  ExpectInvalid(s, "is a directory");
  EXPECT_NE(s.message().find(dir), std::string::npos) << s;
  s = LoadJobConfigWithOverrides(dir, {}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // Not a regular file either.
  s = LoadJobConfig("/dev/null").status();
  ExpectInvalid(s, "not a regular file");
  std::filesystem::remove_all(dir);
}

TEST(ConfigTest, RegressionUnreadableConfigFile) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads any file";
  const std::string dir = FreshDir("unreadable");
  const std::string path = dir + "/job.yaml";
  WriteText(path, "training:\n  minibatch: 5\n");
  std::filesystem::permissions(path, std::filesystem::perms::none);
  EXPECT_EQ(LoadJobConfig(path).status().code(),
            absl::StatusCode::kPermissionDenied);
  std::filesystem::remove_all(dir);
}

// Issue 9: how long nodes wait out an unreachable scheduler; never less
// than the heartbeat timeout.
TEST(ConfigTest, SchedulerTimeoutIsAtLeastTheHeartbeatTimeout) {
  JobConfig c;
  EXPECT_EQ(c.cluster.SchedulerTimeout(), absl::Seconds(60));
  absl::StatusOr<JobConfig> set = LoadJobConfigWithOverrides(
      "", {"cluster.scheduler_timeout_ms=5000"});
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->cluster.SchedulerTimeout(), absl::Seconds(10));
  set = LoadJobConfigWithOverrides("", {"cluster.scheduler_timeout_ms=90000"});
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->cluster.SchedulerTimeout(), absl::Seconds(90));
}

TEST(ConfigTest, RegressionHeartbeatTimeoutBelowHeartbeatAccepted) {
  JobConfig c;
  c.cluster.heartbeat_ms = 500;
  c.cluster.heartbeat_timeout_ms = 400;
  absl::Status s = Validate(c);
  ExpectInvalid(s, "config field cluster.heartbeat_timeout_ms: must be >= 3 * "
                   "cluster.heartbeat_ms (3 * 500 = 1500), got 400");
  c.cluster.heartbeat_timeout_ms = 1499;
  ExpectInvalid(Validate(c), "cluster.heartbeat_timeout_ms");
  c.cluster.heartbeat_timeout_ms = 1500;
  EXPECT_TRUE(Validate(c).ok()) << Validate(c);

  // The override order does not matter: the check runs after the last one.
  absl::StatusOr<JobConfig> ok = LoadJobConfigWithOverrides(
      "", {"cluster.heartbeat_ms=5000", "cluster.heartbeat_timeout_ms=15000"});
  EXPECT_TRUE(ok.ok()) << ok.status();
  ExpectInvalid(
      LoadJobConfigWithOverrides("", {"cluster.heartbeat_ms=5000"}).status(),
      "cluster.heartbeat_timeout_ms");
}

TEST(ConfigTest, RegressionRegisterTimeoutShorterThanHeartbeats) {
  JobConfig c;
  c.cluster.heartbeat_ms = 500;
  c.cluster.register_timeout_ms = 900;
  ExpectInvalid(Validate(c), "config field cluster.register_timeout_ms: must "
                             "be >= 2 * cluster.heartbeat_ms");
  c.cluster.register_timeout_ms = 1000;
  EXPECT_TRUE(Validate(c).ok()) << Validate(c);
}

TEST(ConfigTest, RegressionRelativePathsResolveAgainstTheConfigFolder) {
  const std::string dir = FreshDir("relative");
  std::filesystem::create_directories(dir + "/conf");
  const std::string path = dir + "/conf/job.yaml";
  WriteText(path,
            "data:\n  format: libsvm\n  train: ../data/a.train\n"
            "  test: /abs/a.test\n");
  absl::StatusOr<JobConfig> c = LoadJobConfig(path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->data.train, dir + "/data/a.train");
  EXPECT_EQ(c->data.test, "/abs/a.test");
  // Not set by the file: left for the caller (relative to the cwd).
  EXPECT_EQ(c->output.model_dir, "runs/model");

  // The same from another current directory, and through a relative path
  // to the file itself.
  const std::filesystem::path old_cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir + "/conf");
  absl::StatusOr<JobConfig> again = LoadJobConfigWithOverrides(
      "job.yaml", {"output.model_dir=out/m", "data.test=t.libsvm"});
  std::filesystem::current_path(old_cwd);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->data.train, dir + "/data/a.train");
  // Overrides from the command line stay relative to the current directory.
  EXPECT_EQ(again->output.model_dir, dir + "/conf/out/m");
  EXPECT_EQ(again->data.test, dir + "/conf/t.libsvm");
  std::filesystem::remove_all(dir);
}

TEST(ConfigTest, ResolvePathKeepsAbsoluteAndEmpty) {
  EXPECT_EQ(ResolvePath("/a/b", ""), "");
  EXPECT_EQ(ResolvePath("/a/b", "/x/y"), "/x/y");
  EXPECT_EQ(ResolvePath("/a/b", "../c/./d"), "/a/c/d");
}

TEST(ConfigTest, ResolvedConfigRoundTripsThroughYaml) {
  // ps_launch writes the resolved config to RUN_DIR/job.yaml and the
  // scheduler loads that file: absolute paths must come back unchanged.
  const std::string dir = FreshDir("roundtrip");
  absl::StatusOr<JobConfig> c = LoadJobConfigWithOverrides(
      "", {"data.format=libsvm", "data.train=x.train"});
  ASSERT_TRUE(c.ok()) << c.status();
  WriteText(dir + "/job.yaml", ToYaml(*c));
  absl::StatusOr<JobConfig> back = LoadJobConfig(dir + "/job.yaml");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == *c) << ToYaml(*back);
  std::filesystem::remove_all(dir);
}

TEST(ConfigTest, ShippedConfigsWorkFromAnyDirectory) {
  // Every deploy/configs/*.yaml resolves to the same paths from the project
  // root and from elsewhere, and its data paths point at ../shared/data
  // next to the project root.
  const std::filesystem::path root = PS_SOURCE_DIR;
  const std::filesystem::path shared =
      (root / "../shared/data").lexically_normal();
  const std::filesystem::path old_cwd = std::filesystem::current_path();
  int checked = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(root / "deploy/configs")) {
    if (entry.path().extension() != ".yaml") continue;
    SCOPED_TRACE(entry.path().string());
    std::filesystem::current_path(root);
    absl::StatusOr<JobConfig> from_root = LoadJobConfig(entry.path().string());
    std::filesystem::current_path(::testing::TempDir());
    absl::StatusOr<JobConfig> from_tmp = LoadJobConfig(entry.path().string());
    std::filesystem::current_path(old_cwd);
    ASSERT_TRUE(from_root.ok()) << from_root.status();
    ASSERT_TRUE(from_tmp.ok()) << from_tmp.status();
    EXPECT_TRUE(*from_root == *from_tmp);
    for (const std::string* p : {&from_root->data.train, &from_root->data.test}) {
      if (p->empty()) continue;
      EXPECT_EQ(p->rfind(shared.string() + "/", 0), 0u)
          << *p << " is not under " << shared;
    }
    EXPECT_TRUE(std::filesystem::path(from_root->output.model_dir).is_absolute());
    ++checked;
  }
  EXPECT_GE(checked, 5);
}

TEST(ConfigTest, RegressionMissingDataFileFoundOnlyAfterStart) {
  const std::string dir = FreshDir("missingdata");
  JobConfig c;
  c.data.format = "libsvm";
  c.data.train = dir + "/no_such.train";
  c.output.model_dir = dir + "/model";
  absl::Status s = CheckJobResources(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find("config field data.train: " + c.data.train),
            std::string::npos)
      << s;

  // A directory is not a data file.
  c.data.train = dir;
  s = CheckJobResources(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("data.train"), std::string::npos) << s;

  // The test file is checked too.
  c.data.train = dir + "/a.train";
  WriteText(c.data.train, "1 1:1\n");
  c.data.test = dir + "/missing.test";
  s = CheckJobResources(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find("config field data.test: "), std::string::npos)
      << s;

  // An empty file has nothing to train on (issue 8: "an empty data file
  // trains 0 examples and exits 0"): found before start.
  c.data.test = dir + "/empty.test";
  WriteText(c.data.test, "");
  s = CheckJobResources(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("config field data.test: " + c.data.test +
                             ": is empty"),
            std::string::npos)
      << s;

  c.data.test = "";
  EXPECT_TRUE(CheckJobResources(c).ok()) << CheckJobResources(c);
  EXPECT_TRUE(std::filesystem::is_directory(c.output.model_dir));
  // The probe file is gone.
  EXPECT_TRUE(std::filesystem::is_empty(c.output.model_dir));
  std::filesystem::remove_all(dir);
}

TEST(ConfigTest, RegressionUnwritableModelDirFoundOnlyAfterTraining) {
  const std::string dir = FreshDir("modeldir");
  JobConfig c;  // synthetic: no data files
  // A file where the folder should be.
  WriteText(dir + "/file", "x");
  c.output.model_dir = dir + "/file";
  absl::Status s = CheckJobResources(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("config field output.model_dir: " + dir + "/file"),
            std::string::npos)
      << s;
  c.output.model_dir = dir + "/file/sub";
  EXPECT_FALSE(CheckJobResources(c).ok());

  // Too little free space.
  c.output.model_dir = dir + "/model";
  ResourceCheckOptions huge;
  huge.min_free_bytes = std::numeric_limits<int64_t>::max();
  s = CheckJobResources(c, huge);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("MiB free"), std::string::npos) << s;
  EXPECT_TRUE(CheckJobResources(c).ok());

  if (::geteuid() != 0) {  // root writes anywhere
    std::filesystem::create_directories(dir + "/ro");
    std::filesystem::permissions(dir + "/ro", std::filesystem::perms::owner_read |
                                                  std::filesystem::perms::owner_exec);
    c.output.model_dir = dir + "/ro";
    EXPECT_EQ(CheckJobResources(c).code(), absl::StatusCode::kPermissionDenied);
    c.output.model_dir = dir + "/ro/sub";
    EXPECT_EQ(CheckJobResources(c).code(), absl::StatusCode::kPermissionDenied);
    std::filesystem::permissions(dir + "/ro", std::filesystem::perms::owner_all);
  }
  std::filesystem::remove_all(dir);
}

// Group commit of replication (issue 9): milliseconds in [0, 1000].
TEST(ConfigTest, ReplicationLinger) {
  EXPECT_EQ(JobConfig().fault_tolerance.replication_linger_ms,
            kDefaultReplicationLingerMs);
  absl::StatusOr<JobConfig> c =
      ParseJobConfig("fault_tolerance: {replication_linger_ms: 0.5}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->fault_tolerance.replication_linger_ms, 0.5);
  ExpectInvalid(ParseStatus("fault_tolerance: {replication_linger_ms: -1}"),
                "config field fault_tolerance.replication_linger_ms");
  ExpectInvalid(ParseStatus("fault_tolerance: {replication_linger_ms: 5000}"),
                "config field fault_tolerance.replication_linger_ms");
}

// Replication by deltas (issue 9): on unless turned off; a boolean.
TEST(ConfigTest, ReplicateDeltas) {
  EXPECT_TRUE(JobConfig().fault_tolerance.replicate_deltas);
  absl::StatusOr<JobConfig> c =
      ParseJobConfig("fault_tolerance: {replicate_deltas: false}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->fault_tolerance.replicate_deltas);
  ExpectInvalid(ParseStatus("fault_tolerance: {replicate_deltas: 3}"),
                "config field fault_tolerance.replicate_deltas");
}

// Checkpoints (issue 9): the fault_tolerance fields a checkpoint uses.
TEST(ConfigTest, CheckpointFields) {
  absl::StatusOr<JobConfig> c = ParseJobConfig(
      "output: {model_dir: /r/model}\n"
      "fault_tolerance: {checkpoint_interval_s: 2.5, resume: true,"
      " checkpoints_kept: 3}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->fault_tolerance.checkpoint_interval_s, 2.5);
  EXPECT_TRUE(c->fault_tolerance.resume);
  EXPECT_EQ(c->fault_tolerance.checkpoints_kept, 3);
  EXPECT_EQ(CheckpointDirOf(*c), "/r/checkpoints");
  c->fault_tolerance.checkpoint_dir = "/elsewhere";
  EXPECT_EQ(CheckpointDirOf(*c), "/elsewhere");
  EXPECT_EQ(JobConfig().fault_tolerance.checkpoint_interval_s, 0);
  EXPECT_EQ(CheckpointDirOf(JobConfig()), "runs/checkpoints");

  ExpectInvalid(ParseStatus("fault_tolerance: {checkpoint_interval_s: -1}"),
                "config field fault_tolerance.checkpoint_interval_s");
  ExpectInvalid(ParseStatus("fault_tolerance: {checkpoints_kept: 0}"),
                "config field fault_tolerance.checkpoints_kept: must be >= 1");
  ExpectInvalid(ParseStatus("fault_tolerance: {resume: maybe}"),
                "config field fault_tolerance.resume");
  JobConfig both;
  both.fault_tolerance.resume = true;
  both.fault_tolerance.restore_from = "/r/checkpoints/ckpt-1";
  ExpectInvalid(Validate(both), "fault_tolerance.restore_from");
}

TEST(ConfigTest, CheckpointPathsResolveAgainstTheConfigFolder) {
  const std::string dir = FreshDir("ckpt_paths");
  std::filesystem::create_directories(dir + "/conf");
  WriteText(dir + "/conf/job.yaml",
            "fault_tolerance:\n  checkpoint_dir: ck\n"
            "  restore_from: ../old/ckpt-3\n");
  absl::StatusOr<JobConfig> c = LoadJobConfig(dir + "/conf/job.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->fault_tolerance.checkpoint_dir, dir + "/conf/ck");
  EXPECT_EQ(c->fault_tolerance.restore_from, dir + "/old/ckpt-3");
  std::filesystem::remove_all(dir);
}

// Issue 10: filters and compression.
TEST(ConfigTest, FilterFields) {
  absl::StatusOr<JobConfig> c = ParseJobConfig(
      "filters: {significant_threshold: 0.01, kkt_fraction: 0.5,"
      " value_encoding: int8, codec: zstd, error_feedback: false}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->filters.significant_threshold, 0.01);
  EXPECT_EQ(c->filters.kkt_fraction, 0.5);
  EXPECT_EQ(c->filters.value_encoding, "int8");
  EXPECT_EQ(c->filters.codec, "zstd");
  EXPECT_FALSE(c->filters.error_feedback);
  EXPECT_TRUE(c->filters.any());
  EXPECT_FALSE(JobConfig().filters.any());  // all off by default
  ExpectInvalid(ParseStatus("filters: {value_encoding: bf16}"),
                "config field filters.value_encoding");
  ExpectInvalid(ParseStatus("filters: {codec: gzip}"),
                "config field filters.codec");
  ExpectInvalid(ParseStatus("filters: {kkt_fraction: 1.5}"),
                "config field filters.kkt_fraction");
  ExpectInvalid(ParseStatus("filters: {significant_threshold: -1}"),
                "config field filters.significant_threshold");
  ExpectInvalid(ParseStatus("filters: {kkt_fraction: 0.5}\n"
                            "optimizer: {l1: 0}\n"),
                "config field filters.kkt_fraction: needs an L1 term");
  ExpectInvalid(ParseStatus("filters: {kkt_fraction: 0.5}\n"
                            "optimizer: {name: adam}\n"),
                "config field filters.kkt_fraction: needs an L1 term");
}

}  // namespace
}  // namespace ps
