#include "data/metrics.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(Evaluate, HandComputedNoTies) {
  // Positives at 0.8, 0.4; negatives at 0.6, 0.2. Pairs (pos > neg):
  // (0.8,0.6) (0.8,0.2) (0.4,0.2) yes, (0.4,0.6) no -> AUC 3/4.
  std::vector<float> prob = {0.8f, 0.4f, 0.6f, 0.2f};
  std::vector<float> y = {1, 1, 0, 0};
  EvalMetrics m = Evaluate(prob, y);
  EXPECT_EQ(m.n, 4);
  EXPECT_DOUBLE_EQ(m.auc, 0.75);
  const double ll = -(std::log(0.8f) + std::log(0.4f) + std::log(1 - 0.6f) +
                      std::log(1 - 0.2f)) / 4;
  EXPECT_NEAR(m.logloss, ll, 1e-7);
  EXPECT_DOUBLE_EQ(m.accuracy, 0.5);  // 0.8 right, 0.4 wrong, 0.6 wrong, 0.2 right
}

TEST(Evaluate, TiesCountHalf) {
  // pos {0.5, 0.7}, neg {0.5, 0.3}: pairs 0.5v0.5 = 1/2, 0.5v0.3 = 1,
  // 0.7v0.5 = 1, 0.7v0.3 = 1 -> 3.5/4.
  std::vector<float> prob = {0.5f, 0.7f, 0.5f, 0.3f};
  std::vector<float> y = {1, 1, 0, 0};
  EXPECT_DOUBLE_EQ(Evaluate(prob, y).auc, 0.875);
  // All equal: 0.5.
  std::vector<float> same(6, 0.42f);
  std::vector<float> y2 = {1, 0, 1, 0, 0, 1};
  EXPECT_DOUBLE_EQ(Evaluate(same, y2).auc, 0.5);
}

TEST(Evaluate, PerfectAndReversed) {
  std::vector<float> prob = {0.1f, 0.2f, 0.9f, 0.95f};
  EXPECT_DOUBLE_EQ(Evaluate(prob, std::vector<float>{0, 0, 1, 1}).auc, 1.0);
  EXPECT_DOUBLE_EQ(Evaluate(prob, std::vector<float>{1, 1, 0, 0}).auc, 0.0);
  EXPECT_DOUBLE_EQ(Evaluate(prob, std::vector<float>{0, 0, 1, 1}).accuracy, 1.0);
}

TEST(Evaluate, LogLossIsClamped) {
  std::vector<float> prob = {0.0f, 1.0f};
  std::vector<float> y = {1, 0};  // confidently wrong
  EvalMetrics m = Evaluate(prob, y);
  EXPECT_TRUE(std::isfinite(m.logloss));
  EXPECT_NEAR(m.logloss, -std::log(1e-7), 1e-3);
  EXPECT_DOUBLE_EQ(m.accuracy, 0.0);
}

TEST(Evaluate, DegenerateInputs) {
  EvalMetrics empty = Evaluate({}, {});
  EXPECT_EQ(empty.n, 0);
  EXPECT_TRUE(std::isnan(empty.auc));
  EXPECT_TRUE(std::isnan(empty.logloss));
  std::vector<float> prob = {0.3f, 0.6f};
  std::vector<float> ones = {1, 1};
  EvalMetrics one_class = Evaluate(prob, ones);
  EXPECT_TRUE(std::isnan(one_class.auc));
  EXPECT_DOUBLE_EQ(one_class.accuracy, 0.5);
  std::vector<float> longer = {1, 0, 1};
  EXPECT_EQ(Evaluate(prob, longer).n, 2);
}

}  // namespace
}  // namespace ps
