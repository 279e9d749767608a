// ps_launch --tune's search space and report reading (the trials themselves
// run real jobs: MultiProcessTest.TuneWritesTheBestConfigAndTrainsWithIt).
#include "deploy/tune.h"

#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(TuneSettingsTest, DefaultGridCrossesStepSizeAndL2) {
  JobConfig c;  // ftrl, alpha 0.5, l2 0.03
  const std::vector<TuneSetting> grid = TuneSettings(c, 0);
  ASSERT_EQ(grid.size(), 9u);
  std::set<std::string> seen;
  for (const TuneSetting& s : grid) {
    ASSERT_EQ(s.sets.size(), 2u);
    EXPECT_TRUE(absl::StartsWith(s.sets[0], "optimizer.alpha="));
    EXPECT_TRUE(absl::StartsWith(s.sets[1], "optimizer.l2="));
    seen.insert(absl::StrJoin(s.sets, " "));
  }
  EXPECT_EQ(seen.size(), 9u);  // no setting twice
  EXPECT_TRUE(seen.contains("optimizer.alpha=0.5 optimizer.l2=0.03"));
  EXPECT_TRUE(seen.contains("optimizer.alpha=0.125 optimizer.l2=30"));
  EXPECT_TRUE(seen.contains("optimizer.alpha=2 optimizer.l2=1"));

  c.optimizer.name = "adagrad";
  c.optimizer.learning_rate = 0.1;
  const std::vector<TuneSetting> other = TuneSettings(c, 0);
  ASSERT_EQ(other.size(), 9u);
  EXPECT_EQ(absl::StrJoin(other[0].sets, " "),
            "optimizer.learning_rate=0.025 optimizer.l2=0");
}

TEST(TuneSettingsTest, RandomTrialsAreSeededAndStartFromTheConfig) {
  JobConfig c;
  c.training.seed = 3;
  const std::vector<TuneSetting> a = TuneSettings(c, 6);
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(absl::StrJoin(a[0].sets, " "),
            "optimizer.alpha=0.5 optimizer.l2=0.03");
  for (size_t i = 1; i < a.size(); ++i) {
    ASSERT_EQ(a[i].sets.size(), 4u);  // alpha, l2, beta, l1
  }
  const std::vector<TuneSetting> b = TuneSettings(c, 6);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].sets, b[i].sets);
  c.training.seed = 4;
  const std::vector<TuneSetting> d = TuneSettings(c, 6);
  EXPECT_NE(a[1].sets, d[1].sets);
}

TEST(ReportNumberTest, ReadsNumbersAndSaysWhatIsMissing) {
  const std::string r =
      "{\n  \"validation_auc\": 0.91234567890123,\n"
      "  \"validation_logloss\": 3.5e-1,\n  \"name\": \"x\"\n}\n";
  absl::StatusOr<double> auc = ReportNumber(r, "validation_auc");
  ASSERT_TRUE(auc.ok()) << auc.status();
  EXPECT_DOUBLE_EQ(*auc, 0.91234567890123);
  absl::StatusOr<double> ll = ReportNumber(r, "validation_logloss");
  ASSERT_TRUE(ll.ok());
  EXPECT_DOUBLE_EQ(*ll, 0.35);
  EXPECT_EQ(ReportNumber(r, "test_auc").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ReportNumber(r, "name").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps
