#include "kernels/backend.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda_backend.h"

namespace ps {
namespace {

// A random well-formed batch: `rows` rows over `cols` columns, ~density
// non-zeros per row, distinct columns per row.
CsrBatch RandomBatch(size_t rows, size_t cols, int per_row, uint32_t seed) {
  std::mt19937 rng(seed);
  CsrBatch b;
  for (size_t j = 0; j < cols; ++j) b.keys.push_back(1000 + 7 * j);
  std::uniform_real_distribution<float> val(-1.5f, 1.5f);
  for (size_t i = 0; i < rows; ++i) {
    std::vector<bool> used(cols, false);
    const int n = static_cast<int>(rng() % (per_row + 1));
    for (int k = 0; k < n; ++k) {
      const uint32_t c = rng() % cols;
      if (used[c]) continue;
      used[c] = true;
      b.cols.push_back(c);
      b.vals.push_back(val(rng));
    }
    b.row_ptr.push_back(static_cast<int64_t>(b.cols.size()));
    b.labels.push_back(static_cast<float>(rng() % 2));
  }
  return b;
}

std::vector<float> RandomWeights(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.7f);
  std::vector<float> w(n);
  for (float& x : w) x = d(rng);
  return w;
}

// Straightforward reference: dense per-row loops, no tricks.
double NaiveLoss(const CsrBatch& b, const std::vector<double>& w) {
  double loss = 0;
  for (size_t i = 0; i < b.rows(); ++i) {
    double m = 0;
    for (int64_t k = b.row_ptr[i]; k < b.row_ptr[i + 1]; ++k) {
      m += w[b.cols[k]] * b.vals[k];
    }
    const double p = 1.0 / (1.0 + std::exp(-m));
    loss += b.labels[i] > 0.5 ? -std::log(p) : -std::log(1 - p);
  }
  return loss;
}

std::vector<double> NaiveGradient(const CsrBatch& b, const std::vector<float>& w) {
  std::vector<double> g(b.num_cols(), 0.0);
  for (size_t i = 0; i < b.rows(); ++i) {
    double m = 0;
    for (int64_t k = b.row_ptr[i]; k < b.row_ptr[i + 1]; ++k) {
      m += w[b.cols[k]] * b.vals[k];
    }
    const double r = 1.0 / (1.0 + std::exp(-m)) - b.labels[i];
    for (int64_t k = b.row_ptr[i]; k < b.row_ptr[i + 1]; ++k) {
      g[b.cols[k]] += r * b.vals[k];
    }
  }
  return g;
}

TEST(BackendFactory, Names) {
  auto cpu = CreateBackend("cpu", 2);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ((*cpu)->name(), "cpu");
  const bool have_device = CudaDeviceAvailable().ok();
  auto autob = CreateBackend("auto", 1);
  ASSERT_TRUE(autob.ok()) << autob.status();
  EXPECT_EQ((*autob)->name(), have_device ? "cuda" : "cpu");
  auto cuda = CreateBackend("cuda", 1);
  if (have_device) {
    EXPECT_TRUE(cuda.ok()) << cuda.status();
  } else {
    EXPECT_EQ(cuda.status().code(), absl::StatusCode::kUnavailable);
#ifdef PS_HAVE_CUDA
    EXPECT_NE(cuda.status().message().find("no CUDA device found"),
              std::string::npos)
        << cuda.status();
#else
    EXPECT_NE(cuda.status().message().find("built without CUDA support"),
              std::string::npos);
#endif
  }
  auto bad = CreateBackend("tpu", 1);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("tpu"), std::string::npos);
}

TEST(BackendFactory, AutoIsTheCpuForSmallLrMinibatches) {
  // The GPU's fixed costs outweigh a small minibatch's gradient.
  EXPECT_EQ(AutoLrBackend("auto", 0), "cpu");
  EXPECT_EQ(AutoLrBackend("auto", 1000), "cpu");
  EXPECT_EQ(AutoLrBackend("auto", kAutoCudaMinLrRows - 1), "cpu");
  EXPECT_EQ(AutoLrBackend("auto", kAutoCudaMinLrRows), "auto");
  EXPECT_EQ(AutoLrBackend("auto", 100000), "auto");
  // Named backends are the user's choice, whatever the minibatch.
  EXPECT_EQ(AutoLrBackend("cuda", 10), "cuda");
  EXPECT_EQ(AutoLrBackend("cpu", 100000), "cpu");
  EXPECT_EQ(AutoLrBackend("tpu", 10), "tpu");
}

TEST(CpuBackend, GradientMatchesNaiveAndLossMatches) {
  CsrBatch b = RandomBatch(200, 50, 8, 1);
  std::vector<float> w = RandomWeights(50, 2);
  auto backend = CreateCpuBackend(1, 0);
  std::vector<float> grad(50);
  double loss = -1;
  ASSERT_TRUE(backend->LogisticGradient(b, w, absl::MakeSpan(grad), &loss).ok());
  std::vector<double> ref = NaiveGradient(b, w);
  for (size_t j = 0; j < 50; ++j) EXPECT_NEAR(grad[j], ref[j], 1e-4) << j;
  std::vector<double> wd(w.begin(), w.end());
  EXPECT_NEAR(loss, NaiveLoss(b, wd), 1e-6 * loss);
}

// Issue 12: every backend has SubmitGradient / CollectGradient (the
// trainer's one code path); the CPU one computes at Submit and overlaps
// nothing, with the CUDA backend's ticket rules.
TEST(CpuBackend, SubmitAndCollectAsLogisticGradient) {
  auto backend = CreateCpuBackend(1, 0);
  EXPECT_FALSE(backend->pipelined());
  CsrBatch a = RandomBatch(200, 50, 8, 1), b = RandomBatch(100, 20, 6, 3);
  std::vector<float> wa = RandomWeights(50, 2), wb = RandomWeights(20, 4);
  std::vector<float> want_a(50), want_b(20);
  double loss_a = 0, loss_b = 0;
  ASSERT_TRUE(
      backend->LogisticGradient(a, wa, absl::MakeSpan(want_a), &loss_a).ok());
  ASSERT_TRUE(
      backend->LogisticGradient(b, wb, absl::MakeSpan(want_b), &loss_b).ok());
  for (int round = 0; round < 2; ++round) {  // slots are reused
    auto ta = backend->SubmitGradient(a, wa);
    auto tb = backend->SubmitGradient(b, wb);
    ASSERT_TRUE(ta.ok() && tb.ok());
    EXPECT_NE(*ta, *tb);
    auto third = backend->SubmitGradient(a, wa);
    EXPECT_EQ(third.status().code(), absl::StatusCode::kFailedPrecondition);
    std::vector<float> grad(19);
    EXPECT_EQ(backend->CollectGradient(*tb, absl::MakeSpan(grad), nullptr)
                  .code(),
              absl::StatusCode::kInvalidArgument);  // wrong size: kept
    grad.assign(20, -1);
    double loss = 0;
    ASSERT_TRUE(backend->CollectGradient(*tb, absl::MakeSpan(grad), &loss).ok());
    EXPECT_EQ(grad, want_b);  // collected out of order
    EXPECT_EQ(loss, loss_b);
    grad.assign(50, -1);
    ASSERT_TRUE(backend->CollectGradient(*ta, absl::MakeSpan(grad), &loss).ok());
    EXPECT_EQ(grad, want_a);
    EXPECT_EQ(loss, loss_a);
    EXPECT_EQ(backend->CollectGradient(*ta, absl::MakeSpan(grad), &loss).code(),
              absl::StatusCode::kInvalidArgument);  // each once
  }
  CsrBatch bad = a;
  bad.cols[0] = 999;
  EXPECT_EQ(backend->SubmitGradient(bad, wa).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CpuBackend, GradientMatchesFiniteDifferences) {
  CsrBatch b = RandomBatch(100, 20, 6, 3);
  std::vector<float> w = RandomWeights(20, 4);
  auto backend = CreateCpuBackend(1, 0);
  std::vector<float> grad(20);
  ASSERT_TRUE(backend->LogisticGradient(b, w, absl::MakeSpan(grad), nullptr).ok());
  std::vector<double> wd(w.begin(), w.end());
  const double h = 1e-5;
  for (size_t j = 0; j < 20; ++j) {
    std::vector<double> wp = wd, wm = wd;
    wp[j] += h;
    wm[j] -= h;
    const double fd = (NaiveLoss(b, wp) - NaiveLoss(b, wm)) / (2 * h);
    EXPECT_NEAR(grad[j], fd, 1e-3 * std::max(1.0, std::abs(fd))) << j;
  }
}

TEST(CpuBackend, LossIsStableForHugeMargins) {
  CsrBatch b;
  b.keys = {1};
  b.cols = {0, 0};
  b.vals = {1.0f, 1.0f};
  b.row_ptr = {0, 1, 2};
  b.labels = {1.0f, 0.0f};
  std::vector<float> w = {1000.0f};  // margin 1000: row 0 right, row 1 wrong
  auto backend = CreateCpuBackend(1, 0);
  std::vector<float> grad(1);
  double loss = 0;
  ASSERT_TRUE(backend->LogisticGradient(b, w, absl::MakeSpan(grad), &loss).ok());
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_NEAR(loss, 1000.0, 1e-9);
  EXPECT_NEAR(grad[0], 1.0f, 1e-6);  // (1-1)*1 + (1-0)*1
  EXPECT_NEAR(LogisticLoss(0.0, 1.0f), std::log(2.0), 1e-12);
  EXPECT_NEAR(LogisticLoss(-800.0, 1.0f), 800.0, 1e-9);
}

TEST(CpuBackend, EmptyRowsAndEmptyBatch) {
  auto backend = CreateCpuBackend(4, 0);
  CsrBatch empty;
  double loss = -1;
  ASSERT_TRUE(backend->LogisticGradient(empty, {}, {}, &loss).ok());
  EXPECT_EQ(loss, 0.0);
  CsrBatch b;
  b.keys = {5};
  b.row_ptr = {0, 0, 0};  // two rows, no features: margin 0
  b.labels = {1, 0};
  std::vector<float> w = {3.0f}, grad = {9.0f}, prob(2);
  ASSERT_TRUE(backend->LogisticGradient(b, w, absl::MakeSpan(grad), &loss).ok());
  EXPECT_EQ(grad[0], 0.0f);
  EXPECT_NEAR(loss, 2 * std::log(2.0), 1e-12);
  ASSERT_TRUE(backend->LogisticPredict(b, w, absl::MakeSpan(prob)).ok());
  EXPECT_FLOAT_EQ(prob[0], 0.5f);
}

TEST(CpuBackend, PredictMatchesSigmoid) {
  CsrBatch b = RandomBatch(50, 10, 5, 5);
  std::vector<float> w = RandomWeights(10, 6);
  auto backend = CreateCpuBackend(1, 0);
  std::vector<float> prob(50);
  ASSERT_TRUE(backend->LogisticPredict(b, w, absl::MakeSpan(prob)).ok());
  for (size_t i = 0; i < 50; ++i) {
    double m = 0;
    for (int64_t k = b.row_ptr[i]; k < b.row_ptr[i + 1]; ++k) {
      m += w[b.cols[k]] * b.vals[k];
    }
    EXPECT_NEAR(prob[i], 1.0 / (1.0 + std::exp(-m)), 1e-6);
  }
}

TEST(CpuBackend, MultithreadedEqualsSingleThreadedExactly) {
  CsrBatch b = RandomBatch(5000, 3000, 30, 7);
  std::vector<float> w = RandomWeights(3000, 8);
  auto one = CreateCpuBackend(1, 0);
  std::vector<float> g1(3000), p1(5000);
  double l1 = 0;
  ASSERT_TRUE(one->LogisticGradient(b, w, absl::MakeSpan(g1), &l1).ok());
  ASSERT_TRUE(one->LogisticPredict(b, w, absl::MakeSpan(p1)).ok());
  for (int threads : {2, 3, 4, 7, 16}) {
    auto many = CreateCpuBackend(threads, 0);  // always parallel
    std::vector<float> g(3000), p(5000);
    double l = 0;
    for (int rep = 0; rep < 2; ++rep) {  // scratch reuse must not matter
      ASSERT_TRUE(many->LogisticGradient(b, w, absl::MakeSpan(g), &l).ok());
      ASSERT_TRUE(many->LogisticPredict(b, w, absl::MakeSpan(p)).ok());
      EXPECT_EQ(l, l1) << threads;
      EXPECT_EQ(g, g1) << threads;
      EXPECT_EQ(p, p1) << threads;
    }
  }
  // The factory's default threshold gives the same answer too.
  auto def = CreateBackend("cpu", 4);
  ASSERT_TRUE(def.ok());
  std::vector<float> g(3000);
  double l = 0;
  ASSERT_TRUE((*def)->LogisticGradient(b, w, absl::MakeSpan(g), &l).ok());
  EXPECT_EQ(g, g1);
  EXPECT_EQ(l, l1);
}

TEST(CpuBackend, SizeMismatchIsInvalidArgument) {
  CsrBatch b = RandomBatch(10, 5, 3, 9);
  auto backend = CreateCpuBackend(2, 0);
  std::vector<float> w(5), grad(5), prob(10), short_w(4), short_grad(6),
      short_prob(9);
  EXPECT_EQ(backend->LogisticGradient(b, short_w, absl::MakeSpan(grad), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend->LogisticGradient(b, w, absl::MakeSpan(short_grad), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend->LogisticPredict(b, w, absl::MakeSpan(short_prob)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend->LogisticPredict(b, short_w, absl::MakeSpan(prob)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CpuBackend, MalformedBatchIsInvalidArgument) {
  auto backend = CreateCpuBackend(1, 0);
  std::vector<float> w(5), grad(5);
  CsrBatch b = RandomBatch(10, 5, 3, 10);
  b.labels.pop_back();
  EXPECT_EQ(backend->LogisticGradient(b, w, absl::MakeSpan(grad), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  b = RandomBatch(10, 5, 3, 10);
  b.cols.push_back(0);  // cols longer than vals and row_ptr.back()
  EXPECT_EQ(backend->LogisticGradient(b, w, absl::MakeSpan(grad), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  b = RandomBatch(10, 5, 3, 10);
  b.keys.pop_back();
  w.resize(4);
  grad.resize(4);
  b.cols.assign(b.cols.size(), 4);  // column 4 of 4
  EXPECT_EQ(backend->LogisticGradient(b, w, absl::MakeSpan(grad), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  b = RandomBatch(10, 5, 3, 10);
  b.labels[3] = -1.0f;
  w.resize(5);
  grad.resize(5);
  EXPECT_EQ(backend->LogisticGradient(b, w, absl::MakeSpan(grad), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CsrBatch, ClearKeepsOneRowPtr) {
  CsrBatch b = RandomBatch(10, 5, 3, 11);
  b.Clear();
  EXPECT_EQ(b.rows(), 0u);
  EXPECT_EQ(b.nnz(), 0u);
  EXPECT_EQ(b.num_cols(), 0u);
  EXPECT_TRUE(ValidateCsrBatch(b).ok());
}

}  // namespace
}  // namespace ps
