#include "worker/predict.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "gtest/gtest.h"
#include "server/table.h"
#include "models/logistic.h"

namespace ps {
namespace {

// A fresh folder under the test's temp dir.
std::string FreshDir(const std::string& name) {
  const std::string dir = testing::TempDir() + "/predict_test_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// Writes one server's shard of table `id` holding w[key] = value for each
// pair (sgd with lr 1: the value is minus the pushed gradient).
void WriteShard(const std::string& dir, int server, int id, int dim,
                const std::vector<std::pair<uint64_t, std::vector<float>>>& kv) {
  TableSpec spec;
  spec.id = id;
  spec.dim = dim;
  spec.optimizer.name = "sgd";
  spec.optimizer.learning_rate = 1.0;
  spec.optimizer.l1 = 0;
  spec.optimizer.l2 = 0;
  auto table = Table::Create(spec, 1);
  ASSERT_TRUE(table.ok()) << table.status();
  for (const auto& [key, v] : kv) {
    std::vector<float> g(v.size());
    for (size_t j = 0; j < v.size(); ++j) g[j] = -v[j];
    (*table)->Push(0, {&key, 1}, g.data(), 1.0f);
  }
  const std::string path =
      absl::StrCat(dir, "/table-", id, ".server-", server, ".bin");
  ASSERT_TRUE((*table)->SaveBinary(path, nullptr).ok());
}

TEST(LoadModelTest, MergesTheShardsOfEveryServer) {
  const std::string dir = FreshDir("merge");
  WriteShard(dir, 0, 0, 1, {{30, {3}}, {10, {1}}});
  WriteShard(dir, 1, 0, 1, {{20, {2}}, {40, {0}}});
  WriteShard(dir, 0, 1, 2, {{10, {5, 6}}});  // another table: not read
  WriteFile(dir + "/table-0.server-0.txt", "ignored\n");
  auto m = LoadModel(dir);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->dim, 1);
  EXPECT_EQ(m->files.size(), 2u);
  EXPECT_EQ(m->keys, (std::vector<uint64_t>{10, 20, 30, 40}));
  EXPECT_EQ(m->values, (std::vector<float>{1, 2, 3, 0}));
  ASSERT_NE(m->Find(30), nullptr);
  EXPECT_EQ(*m->Find(30), 3.0f);
  EXPECT_EQ(m->Find(31), nullptr);

  auto t1 = LoadModel(dir, 1);
  ASSERT_TRUE(t1.ok()) << t1.status();
  EXPECT_EQ(t1->dim, 2);
  EXPECT_EQ(t1->values, (std::vector<float>{5, 6}));
}

TEST(LoadModelTest, RefusesMixedJobsAndMissingOrCorruptFiles) {
  const std::string dir = FreshDir("mixed");
  EXPECT_EQ(LoadModel(dir).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(LoadModel(dir + "/nope").status().code(),
            absl::StatusCode::kNotFound);

  WriteShard(dir, 0, 0, 1, {{10, {1}}, {20, {2}}});
  WriteShard(dir, 3, 0, 1, {{20, {7}}});  // a stale shard of an older job
  absl::Status s = LoadModel(dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("key 20 is in both"), std::string::npos) << s;
  EXPECT_NE(s.message().find("table-0.server-3.bin"), std::string::npos) << s;

  WriteShard(dir, 3, 0, 2, {{50, {1, 2}}});
  s = LoadModel(dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("dim"), std::string::npos) << s;

  const std::string bin = dir + "/table-0.server-3.bin";
  std::string bytes = ReadFile(bin);
  WriteFile(bin, bytes.substr(0, bytes.size() - 3));
  s = LoadModel(dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("server-3.bin"), std::string::npos) << s;
}

TEST(PredictRowsTest, GivesTheSigmoidOfEachRowAndTheMetricsOfAllRows) {
  const std::string dir = FreshDir("predict");
  // w[1] = 0.5, w[2] = -1.5 (server 0), w[7] = 2 and the bias 0.25
  // (server 1); feature 9 is unknown (weight 0).
  WriteShard(dir, 0, 0, 1,
             {{FeatureKey(1), {0.5f}}, {FeatureKey(2), {-1.5f}}});
  WriteShard(dir, 1, 0, 1, {{FeatureKey(7), {2.0f}}, {BiasKey(), {0.25f}}});
  auto model = LoadModel(dir);
  ASSERT_TRUE(model.ok()) << model.status();

  const std::string data = dir + "/rows.libsvm";
  WriteFile(data,
            "1 1:1 7:0.5\n"
            "0 2:2\n"
            "-1 9:3\n"
            "+1 1:2 2:1 9:1\n");
  auto reader = OpenLibsvm(data, 0, -1, /*skip_malformed=*/false);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto backend = CreateBackend("cpu", 1);
  ASSERT_TRUE(backend.ok()) << backend.status();

  std::vector<float> probs, labels;
  auto m = PredictRows(*model, reader->get(), backend->get(),
                       [&](absl::Span<const float> p,
                           absl::Span<const float> l) -> absl::Status {
                         probs.insert(probs.end(), p.begin(), p.end());
                         labels.insert(labels.end(), l.begin(), l.end());
                         return absl::OkStatus();
                       });
  ASSERT_TRUE(m.ok()) << m.status();
  const double margins[] = {0.5 + 1.0 + 0.25, -3.0 + 0.25, 0.25,
                            1.0 - 1.5 + 0.25};
  ASSERT_EQ(probs.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(probs[i], 1.0 / (1.0 + std::exp(-margins[i])), 1e-6) << i;
  }
  EXPECT_EQ(labels, (std::vector<float>{1, 0, 0, 1}));
  EXPECT_EQ(m->n, 4);
  const EvalMetrics expected = Evaluate(probs, labels);
  EXPECT_EQ(m->auc, expected.auc);
  EXPECT_EQ(m->logloss, expected.logloss);
  EXPECT_EQ(m->accuracy, expected.accuracy);

  // A failing sink stops the pass with its error.
  ASSERT_TRUE((*reader)->Reset().ok());
  auto failed = PredictRows(*model, reader->get(), backend->get(),
                            [](absl::Span<const float>,
                               absl::Span<const float>) -> absl::Status {
                              return absl::UnavailableError("disk full");
                            });
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable);

  // An embedding table cannot predict.
  WriteShard(dir, 0, 1, 4, {{1, {1, 2, 3, 4}}});
  auto emb = LoadModel(dir, 1);
  ASSERT_TRUE(emb.ok()) << emb.status();
  ASSERT_TRUE((*reader)->Reset().ok());
  EXPECT_EQ(PredictRows(*emb, reader->get(), backend->get(), nullptr)
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ExportModelTest, LibsvmIndicesAscendingWithTheBiasFirst) {
  const std::string dir = FreshDir("export");
  WriteShard(dir, 0, 0, 1,
             {{FeatureKey(123456), {-0.5f}}, {FeatureKey(3), {0.125f}}});
  WriteShard(dir, 1, 0, 1,
             {{BiasKey(), {0.75f}}, {FeatureKey(40), {0.0f}},
              {FeatureKey(1), {2.0f}}});
  auto model = LoadModel(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::string out = dir + "/model.tsv";
  ASSERT_TRUE(ExportModel(*model, ExportFormat::kLibsvmIndex, out).ok());
  EXPECT_EQ(ReadFile(out), "bias\t0.75\n1\t2\n3\t0.125\n123456\t-0.5\n");

  ASSERT_TRUE(ExportModel(*model, ExportFormat::kKeys, out).ok());
  const std::string keys = ReadFile(out);
  EXPECT_EQ(std::count(keys.begin(), keys.end(), '\n'), 4);  // not the 0
  EXPECT_NE(keys.find(absl::StrCat(BiasKey(), "\t0.75\n")), std::string::npos);

  // Criteo keys (field namespaces > 0) are not LIBSVM indices.
  WriteShard(dir, 2, 0, 1, {{FeatureKey(17, 20), {1.0f}}});
  model = LoadModel(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  absl::Status s = ExportModel(*model, ExportFormat::kLibsvmIndex, out);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(ReadFile(out), keys);  // the earlier export is untouched
  EXPECT_EQ(ParseExportFormat("dense").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps
