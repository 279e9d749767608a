// The CPU MLP backend: gradient check by central finite differences, input
// validation and the factory.

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda_backend.h"
#include "kernels/mlp.h"

namespace ps {
namespace {

struct Model {
  MlpShape shape;
  MlpBatch batch;
  std::vector<float> emb;
  std::vector<std::vector<float>> layers;

  MlpParams params() const {
    MlpParams p;
    p.emb = emb;
    for (const auto& v : layers) p.layers.push_back(v);
    return p;
  }
};

Model RandomModel(MlpShape shape, size_t rows, size_t keys, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  Model m;
  m.shape = shape;
  for (size_t j = 0; j < keys; ++j) m.batch.keys.push_back(j * 11 + 1);
  for (size_t r = 0; r < rows; ++r) {
    for (int f = 0; f < shape.num_fields; ++f) {
      m.batch.slots.push_back(rng() % keys);
    }
    m.batch.labels.push_back(static_cast<float>(rng() % 2));
  }
  m.emb.resize(keys * shape.embedding_dim);
  for (float& x : m.emb) x = 0.7f * n(rng);
  for (int l = 0; l < shape.num_layers(); ++l) {
    m.layers.emplace_back(shape.layer_floats(l));
    for (float& x : m.layers.back()) x = n(rng) / std::sqrt(shape.fan_in(l));
  }
  return m;
}

double Loss(MlpBackend* be, const Model& m) {
  std::vector<float> gemb(m.emb.size());
  std::vector<std::vector<float>> gl;
  MlpGrads g;
  g.emb = absl::MakeSpan(gemb);
  for (const auto& v : m.layers) gl.emplace_back(v.size());
  for (auto& v : gl) g.layers.push_back(absl::MakeSpan(v));
  double loss = 0;
  EXPECT_TRUE(be->Gradient(m.shape, m.batch, m.params(), g, &loss).ok());
  return loss;
}

// Perturbs *x by +-h (h a power of two, so x +- h is exact for |x| < 2^10 h
// ... up to float rounding of x itself) and compares the slope.
void CheckEntry(MlpBackend* be, Model* m, float* x, double analytic,
                const char* what) {
  const float h = 1.0f / 512;
  const float saved = *x;
  *x = saved + h;
  const double up = Loss(be, *m);
  *x = saved - h;
  const double down = Loss(be, *m);
  *x = saved;
  const double numeric = (up - down) / (static_cast<double>(saved + h) -
                                        static_cast<double>(saved - h));
  EXPECT_NEAR(analytic, numeric, 2e-3 * std::max(1.0, std::abs(numeric)))
      << what;
}

TEST(CpuMlp, GradientMatchesFiniteDifferences) {
  auto be = CreateCpuMlpBackend();
  // Several shapes, including no hidden layer (then it is logistic
  // regression on the embeddings) and a repeated embedding row.
  for (const MlpShape& shape :
       {MlpShape{3, 2, {4}}, MlpShape{5, 3, {6, 4}}, MlpShape{2, 2, {}}}) {
    Model m = RandomModel(shape, 9, 4, 7 + shape.num_fields);
    std::vector<float> gemb(m.emb.size());
    std::vector<std::vector<float>> gl;
    MlpGrads g;
    g.emb = absl::MakeSpan(gemb);
    for (const auto& v : m.layers) gl.emplace_back(v.size());
    for (auto& v : gl) g.layers.push_back(absl::MakeSpan(v));
    double loss = 0;
    ASSERT_TRUE(be->Gradient(m.shape, m.batch, m.params(), g, &loss).ok());
    EXPECT_GT(loss, 0);
    for (size_t k = 0; k < m.emb.size(); ++k) {
      CheckEntry(be.get(), &m, &m.emb[k], gemb[k], "emb");
    }
    for (int l = 0; l < shape.num_layers(); ++l) {
      for (size_t k = 0; k < m.layers[l].size(); ++k) {
        CheckEntry(be.get(), &m, &m.layers[l][k], gl[l][k], "layer");
      }
    }
  }
}

TEST(CpuMlp, PredictMatchesLoss) {
  auto be = CreateCpuMlpBackend();
  Model m = RandomModel(MlpShape{4, 3, {5}}, 20, 6, 3);
  std::vector<float> prob(20);
  ASSERT_TRUE(be->Predict(m.shape, m.batch, m.params(), absl::MakeSpan(prob)).ok());
  double loss = 0;
  for (size_t b = 0; b < 20; ++b) {
    loss += m.batch.labels[b] > 0.5 ? -std::log(prob[b]) : -std::log(1 - prob[b]);
  }
  EXPECT_NEAR(loss, Loss(be.get(), m), 1e-4 * loss);
}

TEST(CpuMlp, RejectsBadInput) {
  auto be = CreateCpuMlpBackend();
  Model m = RandomModel(MlpShape{4, 3, {5}}, 3, 6, 3);
  std::vector<float> prob(3);
  Model bad = m;
  bad.batch.slots[2] = 6;  // out of range
  EXPECT_EQ(be->Predict(bad.shape, bad.batch, bad.params(), absl::MakeSpan(prob))
                .code(),
            absl::StatusCode::kInvalidArgument);
  bad = m;
  bad.batch.slots.pop_back();
  EXPECT_EQ(be->Predict(bad.shape, bad.batch, bad.params(), absl::MakeSpan(prob))
                .code(),
            absl::StatusCode::kInvalidArgument);
  bad = m;
  bad.layers[1].pop_back();
  EXPECT_EQ(be->Predict(bad.shape, bad.batch, bad.params(), absl::MakeSpan(prob))
                .code(),
            absl::StatusCode::kInvalidArgument);
  bad = m;
  bad.batch.labels[0] = 0.5f;
  EXPECT_EQ(be->Predict(bad.shape, bad.batch, bad.params(), absl::MakeSpan(prob))
                .code(),
            absl::StatusCode::kInvalidArgument);
  MlpShape zero{4, 0, {5}};
  EXPECT_EQ(ValidateMlpShape(zero).code(), absl::StatusCode::kInvalidArgument);
}

TEST(MlpFactory, Names) {
  auto cpu = CreateMlpBackend("cpu");
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ((*cpu)->name(), "cpu");
  auto autob = CreateMlpBackend("auto");
  ASSERT_TRUE(autob.ok());
  const bool have = CudaDeviceAvailable().ok();
  EXPECT_EQ((*autob)->name(), have ? "cuda" : "cpu");
  auto cuda = CreateMlpBackend("cuda");
  if (!have) EXPECT_EQ(cuda.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(CreateMlpBackend("tpu").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps
