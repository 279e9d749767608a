#include "data/holdout.h"

#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace ps {
namespace {

// Rows i = 0..n-1: label i % 2, features {i, i + 1000000} with value 1.
class CountingReader : public RowReader {
 public:
  explicit CountingReader(int64_t n) : n_(n) {}
  absl::StatusOr<size_t> Next(size_t max_rows, RowBlock* out) override {
    size_t k = 0;
    while (k < max_rows && next_ < n_) {
      out->keys.push_back(static_cast<uint64_t>(next_));
      out->keys.push_back(static_cast<uint64_t>(next_ + 1000000));
      out->vals.push_back(1.0f);
      out->vals.push_back(1.0f);
      out->labels.push_back(static_cast<float>(next_ % 2));
      out->row_ptr.push_back(static_cast<int64_t>(out->keys.size()));
      ++next_;
      ++k;
    }
    stats_.rows += static_cast<int64_t>(k);
    return k;
  }
  absl::Status Reset() override {
    next_ = 0;
    stats_ = ReadStats();
    return absl::OkStatus();
  }
  const ReadStats& stats() const override { return stats_; }
  const std::string& path() const override { return path_; }

 private:
  const int64_t n_;
  int64_t next_ = 0;
  ReadStats stats_;
  std::string path_;
};

// The first key of every row `reader` yields, read in blocks of `max_rows`.
std::vector<uint64_t> FirstKeys(RowReader* reader, size_t max_rows) {
  std::vector<uint64_t> ids;
  RowBlock block;
  for (;;) {
    block.Clear();
    absl::StatusOr<size_t> n = reader->Next(max_rows, &block);
    EXPECT_TRUE(n.ok()) << n.status();
    if (!n.ok() || *n == 0) break;
    EXPECT_EQ(*n, block.rows());
    for (size_t i = 0; i < block.rows(); ++i) {
      ids.push_back(block.keys[block.row_ptr[i]]);
    }
  }
  return ids;
}

TEST(Holdout, TrainingAndValidationRowsPartitionTheData) {
  const int64_t kRows = 20000;
  auto train = NewHoldoutReader(std::make_unique<CountingReader>(kRows),
                                /*seed=*/7, 0.1, /*keep_validation=*/false);
  auto valid = NewHoldoutReader(std::make_unique<CountingReader>(kRows),
                                /*seed=*/7, 0.1, /*keep_validation=*/true);
  const std::vector<uint64_t> t = FirstKeys(train.get(), 64);
  const std::vector<uint64_t> v = FirstKeys(valid.get(), 1000);
  std::set<uint64_t> all(t.begin(), t.end());
  for (uint64_t id : v) EXPECT_TRUE(all.insert(id).second) << id;
  EXPECT_EQ(all.size(), static_cast<size_t>(kRows));
  // About 10%: 2000 expected, sd ~42.
  EXPECT_GT(v.size(), 1800u);
  EXPECT_LT(v.size(), 2200u);
  // Order kept.
  EXPECT_TRUE(std::is_sorted(t.begin(), t.end()));
  EXPECT_TRUE(std::is_sorted(v.begin(), v.end()));
}

TEST(Holdout, TheSplitDependsOnTheRowAndTheSeedOnly) {
  auto a = NewHoldoutReader(std::make_unique<CountingReader>(5000), 7, 0.2,
                            true);
  auto b = NewHoldoutReader(std::make_unique<CountingReader>(5000), 7, 0.2,
                            true);
  auto c = NewHoldoutReader(std::make_unique<CountingReader>(5000), 8, 0.2,
                            true);
  const std::vector<uint64_t> va = FirstKeys(a.get(), 1);
  EXPECT_EQ(va, FirstKeys(b.get(), 333));  // any block size
  EXPECT_NE(va, FirstKeys(c.get(), 333));  // another seed, another split
  ASSERT_TRUE(a->Reset().ok());
  EXPECT_EQ(va, FirstKeys(a.get(), 50));   // every pass the same
}

TEST(Holdout, FractionZeroHoldsOutNothing) {
  auto valid = NewHoldoutReader(std::make_unique<CountingReader>(1000), 1, 0,
                                true);
  EXPECT_TRUE(FirstKeys(valid.get(), 100).empty());
  auto train = NewHoldoutReader(std::make_unique<CountingReader>(1000), 1, 0,
                                false);
  EXPECT_EQ(FirstKeys(train.get(), 100).size(), 1000u);
}

// Field rows i = 0..n-1 (the mlp model's): label i % 2, field f's key
// i * 100 + f.
class CountingFieldReader : public FieldReader {
 public:
  explicit CountingFieldReader(int64_t n) : n_(n) {}
  absl::StatusOr<size_t> Next(size_t max_rows, FieldBlock* out) override {
    size_t k = 0;
    for (; k < max_rows && next_ < n_; ++k, ++next_) {
      for (int f = 0; f < out->num_fields; ++f) {
        out->keys.push_back(static_cast<uint64_t>(next_ * 100 + f));
      }
      out->labels.push_back(static_cast<float>(next_ % 2));
    }
    return k;
  }
  absl::Status Reset() override {
    next_ = 0;
    return absl::OkStatus();
  }

 private:
  const int64_t n_;
  int64_t next_ = 0;
};

std::vector<uint64_t> RowIds(FieldReader* reader, size_t max_rows) {
  std::vector<uint64_t> ids;
  FieldBlock block;
  for (;;) {
    block.Clear();
    absl::StatusOr<size_t> n = reader->Next(max_rows, &block);
    EXPECT_TRUE(n.ok()) << n.status();
    if (!n.ok() || *n == 0) break;
    for (size_t i = 0; i < block.rows(); ++i) {
      ids.push_back(block.keys[i * block.num_fields] / 100);
    }
  }
  return ids;
}

TEST(Holdout, FieldRowsSplitTheSameWay) {
  const int64_t kRows = 20000;
  auto train = NewFieldHoldoutReader(
      std::make_unique<CountingFieldReader>(kRows), 7, 0.1, false);
  auto valid = NewFieldHoldoutReader(
      std::make_unique<CountingFieldReader>(kRows), 7, 0.1, true);
  const std::vector<uint64_t> t = RowIds(train.get(), 64);
  const std::vector<uint64_t> v = RowIds(valid.get(), 1000);
  std::set<uint64_t> all(t.begin(), t.end());
  for (uint64_t id : v) EXPECT_TRUE(all.insert(id).second) << id;
  EXPECT_EQ(all.size(), static_cast<size_t>(kRows));
  EXPECT_GT(v.size(), 1800u);
  EXPECT_LT(v.size(), 2200u);
  ASSERT_TRUE(valid->Reset().ok());
  EXPECT_EQ(v, RowIds(valid.get(), 7));  // any block size, every pass
  auto other = NewFieldHoldoutReader(
      std::make_unique<CountingFieldReader>(kRows), 8, 0.1, true);
  EXPECT_NE(v, RowIds(other.get(), 1000));  // another seed, another split
}

}  // namespace
}  // namespace ps
