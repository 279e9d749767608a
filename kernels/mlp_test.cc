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
  std::vector<float> offset;  // empty: no logit offset

  MlpParams params() const {
    MlpParams p;
    p.emb = emb;
    for (const auto& v : layers) p.layers.push_back(v);
    p.logit_offset = offset;
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

// Perturbs *x by +-h and compares the slope. h is a power of two (x +- h is
// then exact in float for these magnitudes) and small, so that no ReLU
// changes side between x - h and x + h (at 2^-9 some did with dropout's
// doubled activations, and the slope then is not the gradient).
void CheckEntry(MlpBackend* be, Model* m, float* x, double analytic,
                const char* what) {
  const float h = 1.0f / 8192;
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
       {MlpShape{3, 2, {4}}, MlpShape{5, 3, {6, 4}}, MlpShape{2, 2, {}},
        MlpShape{5, 3, {6, 4}, 0.5f}}) {
    Model m = RandomModel(shape, 9, 4, 7 + shape.num_fields);
    m.batch.seed = 42;  // with dropout: a fixed mask, so a smooth loss
    SCOPED_TRACE(testing::Message() << "fields " << shape.num_fields
                                    << " dropout " << shape.dropout);
    // A wide part's offset on every row but the first (which has none).
    for (size_t b = 0; b < 9; ++b) m.offset.push_back(b == 0 ? 0.0f : 0.25f * b - 1.0f);
    std::vector<float> gemb(m.emb.size()), glogit(9);
    std::vector<std::vector<float>> gl;
    MlpGrads g;
    g.logit = absl::MakeSpan(glogit);
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
    for (size_t b = 0; b < m.offset.size(); ++b) {
      CheckEntry(be.get(), &m, &m.offset[b], glogit[b], "logit");
    }
  }
}

TEST(CpuMlp, PredictMatchesLoss) {
  auto be = CreateCpuMlpBackend();
  Model m = RandomModel(MlpShape{4, 3, {5}}, 20, 6, 3);
  for (int b = 0; b < 20; ++b) m.offset.push_back(0.1f * (b - 10));
  std::vector<float> prob(20);
  ASSERT_TRUE(be->Predict(m.shape, m.batch, m.params(), absl::MakeSpan(prob)).ok());
  double loss = 0;
  for (size_t b = 0; b < 20; ++b) {
    loss += m.batch.labels[b] > 0.5 ? -std::log(prob[b]) : -std::log(1 - prob[b]);
  }
  EXPECT_NEAR(loss, Loss(be.get(), m), 1e-4 * loss);
}

// Dropout acts in Gradient only, its mask follows the batch seed, and about
// the configured share of units is dropped.
TEST(CpuMlp, DropoutMask) {
  auto be = CreateCpuMlpBackend();
  Model m = RandomModel(MlpShape{4, 3, {5}}, 20, 6, 3);
  std::vector<float> p0(20), p1(20);
  ASSERT_TRUE(be->Predict(m.shape, m.batch, m.params(), absl::MakeSpan(p0)).ok());
  Model d = m;
  d.shape.dropout = 0.5f;
  ASSERT_TRUE(be->Predict(d.shape, d.batch, d.params(), absl::MakeSpan(p1)).ok());
  EXPECT_EQ(p0, p1);
  const double plain = Loss(be.get(), m);
  const double seed0 = Loss(be.get(), d);
  EXPECT_NE(plain, seed0);
  EXPECT_EQ(seed0, Loss(be.get(), d));
  d.batch.seed = 1;
  EXPECT_NE(seed0, Loss(be.get(), d));
  int kept = 0;
  for (uint64_t k = 0; k < 100000; ++k) kept += DropoutUniform(7, 1, k) >= 0.3f;
  EXPECT_NEAR(kept / 100000.0, 0.7, 0.01);
  MlpShape bad{4, 3, {5}, 1.0f};
  EXPECT_EQ(ValidateMlpShape(bad).code(), absl::StatusCode::kInvalidArgument);
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
  bad.offset.assign(2, 0.0f);  // 3 rows
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
