// CUDA vs CPU parity for the sparse-LR backend (both gradient algorithms,
// the Submit/Collect pipeline) and the MLP backend. Every test skips with
// "no CUDA device found" when the process has no usable device.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cuda_backend.h"
#include "kernels/mlp.h"

namespace ps {
namespace {

#define PS_SKIP_WITHOUT_CUDA()                                       \
  do {                                                               \
    absl::Status ps_dev_ = CudaDeviceAvailable();                    \
    if (!ps_dev_.ok()) GTEST_SKIP() << ps_dev_.message();            \
  } while (0)

CsrBatch RandomBatch(size_t rows, size_t cols, int per_row, uint32_t seed) {
  std::mt19937 rng(seed);
  CsrBatch b;
  for (size_t j = 0; j < cols; ++j) b.keys.push_back(1000 + 7 * j);
  std::uniform_real_distribution<float> val(-1.5f, 1.5f);
  // A power law over columns, as real data: a few columns in most rows.
  std::vector<double> weights(cols);
  for (size_t j = 0; j < cols; ++j) weights[j] = 1.0 / std::pow(j + 1.0, 1.1);
  std::discrete_distribution<uint32_t> col(weights.begin(), weights.end());
  for (size_t i = 0; i < rows; ++i) {
    std::vector<uint32_t> row;
    const int n = static_cast<int>(rng() % (per_row + 1));
    for (int k = 0; k < n; ++k) row.push_back(col(rng));
    std::sort(row.begin(), row.end());
    row.erase(std::unique(row.begin(), row.end()), row.end());
    for (uint32_t c : row) {
      b.cols.push_back(c);
      b.vals.push_back(val(rng));
    }
    b.row_ptr.push_back(static_cast<int64_t>(b.cols.size()));
    b.labels.push_back(static_cast<float>(rng() % 2));
  }
  return b;
}

std::vector<float> RandomVector(size_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> w(n);
  for (float& x : w) x = d(rng);
  return w;
}

// |a - b| <= rel * max(|b|, floor) element-wise; floor keeps entries that
// cancel to ~0 from demanding impossible relative accuracy.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want,
                 double rel, double floor, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t j = 0; j < got.size(); ++j) {
    const double tol = rel * std::max<double>(std::abs(want[j]), floor);
    if (std::abs(static_cast<double>(got[j]) - want[j]) > tol && ++bad <= 5) {
      ADD_FAILURE() << what << "[" << j << "]: got " << got[j] << " want "
                    << want[j];
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

// The relative error of the whole vector: ||got - want|| / ||want|| <= rel
// (the "1e-5 relative" for gradients, which element-wise would ask
// sums that cancel to ~0 for digits FP32 does not carry).
void ExpectNormClose(const std::vector<float>& got,
                     const std::vector<float>& want, double rel,
                     const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double diff = 0, norm = 0;
  for (size_t j = 0; j < got.size(); ++j) {
    const double d = static_cast<double>(got[j]) - want[j];
    diff += d * d;
    norm += static_cast<double>(want[j]) * want[j];
  }
  EXPECT_LE(std::sqrt(diff), rel * std::sqrt(norm)) << what;
}

class LrParity : public ::testing::TestWithParam<GradientAlgo> {};

TEST_P(LrParity, GradientAndLossMatchCpu) {
  PS_SKIP_WITHOUT_CUDA();
  auto cpu = CreateCpuBackend(1, 0);
  auto gpu = CreateCudaBackend(GetParam());
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  struct Case {
    size_t rows, cols;
    int per_row;
  };
  for (Case c : {Case{1, 1, 1}, Case{7, 3, 2}, Case{1000, 500, 30},
                 Case{20000, 100000, 40}, Case{5000, 10, 8}}) {
    SCOPED_TRACE(testing::Message() << c.rows << "x" << c.cols);
    CsrBatch b = RandomBatch(c.rows, c.cols, c.per_row, 17 + c.rows);
    std::vector<float> w = RandomVector(c.cols, 0.3f, 5);
    std::vector<float> g_cpu(c.cols), g_gpu(c.cols, -7.0f);
    double l_cpu = 0, l_gpu = 0;
    ASSERT_TRUE(cpu->LogisticGradient(b, w, absl::MakeSpan(g_cpu), &l_cpu).ok());
    ASSERT_TRUE(
        (*gpu)->LogisticGradient(b, w, absl::MakeSpan(g_gpu), &l_gpu).ok());
    // Both sum in double; only float rounding of the result differs.
    ExpectClose(g_gpu, g_cpu, 1e-5, 1e-6, "gradient");
    EXPECT_NEAR(l_gpu, l_cpu, 1e-9 * std::max(1.0, std::abs(l_cpu)));

    std::vector<float> p_cpu(c.rows), p_gpu(c.rows);
    ASSERT_TRUE(cpu->LogisticPredict(b, w, absl::MakeSpan(p_cpu)).ok());
    ASSERT_TRUE((*gpu)->LogisticPredict(b, w, absl::MakeSpan(p_gpu)).ok());
    ExpectClose(p_gpu, p_cpu, 1e-6, 1e-6, "prob");
  }
}

TEST_P(LrParity, EmptyBatchAndErrors) {
  PS_SKIP_WITHOUT_CUDA();
  auto gpu = CreateCudaBackend(GetParam());
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  CsrBatch empty;
  double loss = -1;
  EXPECT_TRUE((*gpu)->LogisticGradient(empty, {}, {}, &loss).ok());
  EXPECT_EQ(loss, 0.0);
  CsrBatch b = RandomBatch(10, 5, 3, 1);
  std::vector<float> w(4), g(5);
  EXPECT_EQ((*gpu)->LogisticGradient(b, w, absl::MakeSpan(g), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  b.cols[0] = 99;
  w.resize(5);
  EXPECT_EQ((*gpu)->LogisticGradient(b, w, absl::MakeSpan(g), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(LrParity, PipelinedSubmitCollect) {
  PS_SKIP_WITHOUT_CUDA();
  auto cpu = CreateCpuBackend(1, 0);
  auto gpu = CreateCudaBackend(GetParam());
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::vector<CsrBatch> batches;
  std::vector<std::vector<float>> ws;
  for (int i = 0; i < 6; ++i) {
    batches.push_back(RandomBatch(2000 + 100 * i, 3000 + i, 20, 100 + i));
    ws.push_back(RandomVector(batches.back().num_cols(), 0.2f, 200 + i));
  }
  // Keep two in flight: submit i+1, then collect i.
  auto t0 = (*gpu)->SubmitGradient(batches[0], ws[0]);
  ASSERT_TRUE(t0.ok()) << t0.status();
  int64_t pending = *t0;
  for (int i = 0; i < 6; ++i) {
    int64_t next = -1;
    if (i + 1 < 6) {
      auto t = (*gpu)->SubmitGradient(batches[i + 1], ws[i + 1]);
      ASSERT_TRUE(t.ok()) << t.status();
      next = *t;
      // A third submit must be refused while two are in flight.
      EXPECT_EQ((*gpu)->SubmitGradient(batches[0], ws[0]).status().code(),
                absl::StatusCode::kFailedPrecondition);
    }
    std::vector<float> g_gpu(batches[i].num_cols()), g_cpu(batches[i].num_cols());
    double l_gpu = 0, l_cpu = 0;
    ASSERT_TRUE(
        (*gpu)->CollectGradient(pending, absl::MakeSpan(g_gpu), &l_gpu).ok());
    ASSERT_TRUE(
        cpu->LogisticGradient(batches[i], ws[i], absl::MakeSpan(g_cpu), &l_cpu)
            .ok());
    ExpectClose(g_gpu, g_cpu, 1e-5, 1e-6, "pipelined gradient");
    EXPECT_NEAR(l_gpu, l_cpu, 1e-9 * std::abs(l_cpu));
    pending = next;
  }
  std::vector<float> g(1);
  EXPECT_EQ((*gpu)->CollectGradient(12345, absl::MakeSpan(g), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Algos, LrParity,
                         ::testing::Values(GradientAlgo::kScatter,
                                           GradientAlgo::kSegmented),
                         [](const auto& info) {
                           return std::string(GradientAlgoName(info.param));
                         });

TEST(CudaFactory, NamesOrSkip) {
  PS_SKIP_WITHOUT_CUDA();
  auto b = CreateBackend("cuda", 1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->name(), "cuda");
  auto m = CreateMlpBackend("auto");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->name(), "cuda");
}

// ------------------------------------------------------------------ MLP

MlpBatch RandomMlpBatch(const MlpShape& shape, size_t rows, size_t keys,
                        uint32_t seed) {
  std::mt19937 rng(seed);
  MlpBatch b;
  for (size_t j = 0; j < keys; ++j) b.keys.push_back(10 + 3 * j);
  for (size_t r = 0; r < rows; ++r) {
    for (int f = 0; f < shape.num_fields; ++f) b.slots.push_back(rng() % keys);
    b.labels.push_back(static_cast<float>(rng() % 2));
  }
  return b;
}

TEST(MlpParity, GradientAndPredictMatchCpu) {
  PS_SKIP_WITHOUT_CUDA();
  auto gpu = CreateCudaMlpBackend();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto cpu = CreateCpuMlpBackend();
  for (const MlpShape& shape :
       {MlpShape{3, 2, {5}}, MlpShape{39, 8, {256, 128}}, MlpShape{4, 3, {}},
        MlpShape{39, 8, {256, 128}, 0.5f}}) {
    for (size_t rows : {size_t{1}, size_t{64}, size_t{1000}}) {
      SCOPED_TRACE(testing::Message() << "fields " << shape.num_fields
                                      << " rows " << rows << " dropout "
                                      << shape.dropout);
      MlpBatch b = RandomMlpBatch(shape, rows, 50 + rows, 3 + rows);
      b.seed = 77 + rows;  // the dropout mask, where shape.dropout > 0
      std::vector<float> emb =
          RandomVector(b.num_embeddings() * shape.embedding_dim, 0.5f, 9);
      std::vector<std::vector<float>> layers;
      for (int l = 0; l < shape.num_layers(); ++l) {
        layers.push_back(RandomVector(shape.layer_floats(l),
                                      1.0f / std::sqrt(shape.fan_in(l)), 10 + l));
      }
      // A wide part's logit offset, and its gradient back.
      const std::vector<float> offset = RandomVector(rows, 1.0f, 11);
      MlpParams p;
      p.emb = emb;
      for (auto& v : layers) p.layers.push_back(v);
      p.logit_offset = offset;
      std::vector<float> dlogit_c(rows), dlogit_g(rows);
      auto run = [&](MlpBackend* be, std::vector<float>* gemb,
                     std::vector<std::vector<float>>* gl,
                     std::vector<float>* dlogit, double* loss) {
        gemb->assign(emb.size(), 0);
        gl->clear();
        MlpGrads g;
        g.logit = absl::MakeSpan(*dlogit);
        g.emb = absl::MakeSpan(*gemb);
        for (int l = 0; l < shape.num_layers(); ++l) {
          gl->emplace_back(shape.layer_floats(l));
        }
        for (auto& v : *gl) g.layers.push_back(absl::MakeSpan(v));
        return be->Gradient(shape, b, p, g, loss);
      };
      std::vector<float> ge_c, ge_g;
      std::vector<std::vector<float>> gl_c, gl_g;
      double l_c = 0, l_g = 0;
      ASSERT_TRUE(run(cpu.get(), &ge_c, &gl_c, &dlogit_c, &l_c).ok());
      absl::Status s = run(gpu->get(), &ge_g, &gl_g, &dlogit_g, &l_g);
      ASSERT_TRUE(s.ok()) << s;
      // FP32 GEMMs vs double loops: compare against the largest entry
      // (sums that cancel carry absolute, not relative, error).
      auto check = [](const std::vector<float>& got,
                      const std::vector<float>& want, const char* what) {
        double mx = 0;
        for (float x : want) mx = std::max(mx, std::abs(static_cast<double>(x)));
        ExpectClose(got, want, 1e-4, mx, what);
        ExpectNormClose(got, want, 1e-5, what);
      };
      check(dlogit_g, dlogit_c, "logit grad");
      check(ge_g, ge_c, "emb grad");
      for (int l = 0; l < shape.num_layers(); ++l) check(gl_g[l], gl_c[l], "layer grad");
      EXPECT_NEAR(l_g, l_c, 1e-5 * std::max(1.0, l_c));
      std::vector<float> pc(rows), pg(rows);
      ASSERT_TRUE(cpu->Predict(shape, b, p, absl::MakeSpan(pc)).ok());
      ASSERT_TRUE((*gpu)->Predict(shape, b, p, absl::MakeSpan(pg)).ok());
      ExpectClose(pg, pc, 1e-5, 1e-3, "prob");
    }
  }
}

}  // namespace
}  // namespace ps
