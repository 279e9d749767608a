// The one Criteo line parser (data/criteo.h) and the field-row reader and
// shuffle buffer built on it (OpenCriteoFields, NewFieldShuffleBuffer):
// both Criteo readers accept the same lines with the same reasons.
//
// Reads ../shared/data/criteo-10k; the tests that need it skip when missing.

#include "data/criteo.h"

#include <algorithm>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/hash.h"
#include "data/data.h"
#include "data/shuffle.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

std::string DataPath(const std::string& rel) {
  return std::string(PS_SOURCE_DIR) + "/../shared/data/" + rel;
}

bool Exists(const std::string& p) { return std::ifstream(p).good(); }

// A line of `fields` tab-separated fields, all empty but the label "0" and
// the (index, text) pairs of `set`.
std::string Line(int fields,
                 const std::vector<std::pair<int, std::string>>& set = {}) {
  std::vector<std::string> f(fields);
  if (fields > 0) f[0] = "0";
  for (const auto& [i, v] : set) f[i] = v;
  std::string s;
  for (int i = 0; i < fields; ++i) s += (i ? "\t" : "") + f[i];
  return s;
}

TEST(CriteoLine, SplitsAndValidates) {
  CriteoLine c;
  std::string reason;
  // The views in `c` point into `line`: it outlives every check below.
  const std::string line =
      Line(40, {{0, "+1"}, {1, "5"}, {3, "-3"}, {14, "abc"}, {39, "z"}}) +
      "\r";
  ASSERT_EQ(ParseCriteoLine(line, &c, &reason), CriteoParse::kRow);
  EXPECT_EQ(c.label, 1.0f);
  EXPECT_TRUE(c.present(0));
  EXPECT_FALSE(c.present(1));
  EXPECT_EQ(c.ints[0], 5);
  EXPECT_EQ(c.ints[2], -3);
  EXPECT_EQ(c.fields[13], "abc");
  EXPECT_EQ(c.fields[38], "z");  // no '\r'
  EXPECT_EQ(CriteoFieldKey(c, 0), FeatureKey(2, 0));  // floor(ln(5)^2)
  EXPECT_EQ(CriteoFieldKey(c, 2), FeatureKey(static_cast<uint64_t>(-3), 2));
  EXPECT_EQ(CriteoFieldKey(c, 13), FeatureKey(HashBytes("abc"), 13));
  EXPECT_EQ(CriteoBucket(2), 2);
  EXPECT_EQ(CriteoBucket(1000), 47);
  EXPECT_NE(MissingFieldKey(0), MissingFieldKey(1));
  EXPECT_EQ(ParseCriteoLine("", &c, &reason), CriteoParse::kBlank);
  EXPECT_EQ(ParseCriteoLine("\r", &c, &reason), CriteoParse::kBlank);
}

// The reasons, and which comes first when a line has several faults: the
// field count, then the label, then the integers in field order.
TEST(CriteoLine, MalformedReasons) {
  const std::string long_label(70, 'y');
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"x", "expected 40 tab-separated fields, got 1"},
      {Line(39, {{0, "x"}}), "expected 40 tab-separated fields, got 39"},
      {Line(42, {{2, "1.5"}}), "expected 40 tab-separated fields, got 42"},
      {Line(40, {{0, "x"}, {2, "1.5"}}), "bad label 'x'"},
      {Line(40, {{0, ""}}), "bad label ''"},
      {Line(40, {{0, "++1"}}), "bad label '++1'"},
      {Line(40, {{0, long_label}}),
       "bad label '" + std::string(64, 'y') + "...'"},
      {Line(40, {{2, "1.5"}, {1, "q"}}), "bad integer 'q' in field I1"},
      {Line(40, {{13, "+"}}), "bad integer '+' in field I13"},
      {Line(40, {{13, "99999999999999999999"}}),
       "bad integer '99999999999999999999' in field I13"},
  };
  for (const auto& [line, want] : cases) {
    CriteoLine c;
    std::string reason;
    EXPECT_EQ(ParseCriteoLine(line, &c, &reason), CriteoParse::kBad) << line;
    EXPECT_EQ(reason, want) << line;
  }
}

// Both readers of a file: the same rows, and each malformed line stops both
// with the same message.
TEST(CriteoFields, SameRowsAndErrorsAsOpenCriteo) {
  const std::string good = Line(40, {{0, "1"}, {2, "7"}, {20, "k"}});
  const std::string text =
      good + "\n\n" + Line(40, {{0, "x"}, {2, "1.5"}}) + "\n" + good +
      "\r\n" + Line(39, {{0, "x"}}) + "\n" + Line(40, {{5, "-"}}) + "\n" +
      Line(41) + "\n" + good;
  const std::string path = ::testing::TempDir() + "/criteo_both.tsv";
  std::ofstream(path) << text;
  auto rows = OpenCriteo(path, 0, -1, false);
  auto fields = OpenCriteoFields(path, 0, -1, false);
  ASSERT_TRUE(rows.ok() && fields.ok());
  RowBlock rb;
  FieldBlock fb;
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<size_t> a = (*rows)->Next(100, &rb);
    absl::StatusOr<size_t> b = (*fields)->Next(100, &fb);
    EXPECT_EQ(a.status(), b.status()) << i;
    if (a.ok()) EXPECT_EQ(*a, *b);
  }
  EXPECT_EQ(rb.rows(), 3u);
  EXPECT_EQ(fb.rows(), 3u);
  EXPECT_EQ(rb.labels, fb.labels);
  EXPECT_EQ((*rows)->stats().lines, (*fields)->stats().lines);
  EXPECT_EQ((*rows)->stats().rows, (*fields)->stats().rows);
}

TEST(CriteoFields, SameKeysAsOpenCriteoAndShardsPartition) {
  const std::string path = DataPath("criteo-10k/test.tsv");
  if (!Exists(path)) GTEST_SKIP() << "missing " << path;
  auto rows = OpenCriteo(path, 0, -1, false);
  ASSERT_TRUE(rows.ok()) << rows.status();
  auto fields = OpenCriteoFields(path, 0, -1, false);
  ASSERT_TRUE(fields.ok()) << fields.status();
  RowBlock rb;
  FieldBlock fb;
  ASSERT_EQ(*(*rows)->Next(100000, &rb), 2000u);
  ASSERT_EQ(*(*fields)->Next(100000, &fb), 2000u);
  for (size_t r = 0; r < rb.rows(); ++r) {
    EXPECT_EQ(rb.labels[r], fb.labels[r]);
    // The present fields' keys, in field order, are OpenCriteo's keys.
    std::vector<uint64_t> present;
    for (int f = 0; f < kCriteoNumFields; ++f) {
      const uint64_t k = fb.keys[r * kCriteoNumFields + f];
      if (k != MissingFieldKey(f)) present.push_back(k);
    }
    std::vector<uint64_t> want(rb.keys.begin() + rb.row_ptr[r],
                               rb.keys.begin() + rb.row_ptr[r + 1]);
    ASSERT_EQ(present, want) << "row " << r;
  }
  // Any byte split gives each row to exactly one shard.
  const int64_t size = *FileSize(path);
  size_t total = 0;
  for (int64_t cut : {int64_t{1}, size / 3, size / 2 + 17}) {
    total = 0;
    for (auto [b, e] : {std::pair<int64_t, int64_t>{0, cut}, {cut, -1}}) {
      auto s = OpenCriteoFields(path, b, e, false);
      ASSERT_TRUE(s.ok());
      FieldBlock x;
      total += *(*s)->Next(100000, &x);
    }
    EXPECT_EQ(total, 2000u) << "cut " << cut;
  }
  EXPECT_EQ(OpenCriteoFields("/no/such/file", 0, -1, false).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(CriteoFields, MalformedLine) {
  const std::string path = ::testing::TempDir() + "/mlp_bad.tsv";
  std::ofstream(path) << "1\t2\n";
  auto r = OpenCriteoFields(path, 0, -1, false);
  ASSERT_TRUE(r.ok());
  FieldBlock b;
  absl::StatusOr<size_t> n = (*r)->Next(10, &b);
  EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(n.status().message().find("expected 40 tab-separated fields"),
            std::string::npos);
  auto s = OpenCriteoFields(path, 0, -1, true);
  EXPECT_EQ(*(*s)->Next(10, &b), 0u);
}

// Issue 8: the MLP's reader names file and line of a malformed line and,
// with skip_malformed, counts the skipped ones like OpenCriteo.
TEST(CriteoFields, RegressionSkippedLinesNeverCounted) {
  const std::string good = "0" + std::string(39, '\t');
  const std::string path = ::testing::TempDir() + "/mlp_skipcount.tsv";
  std::ofstream(path) << good << "\n" << "x\n" << good << "\n" << "y\n";
  auto strict = OpenCriteoFields(path, 0, -1, false);
  ASSERT_TRUE(strict.ok());
  FieldBlock b;
  EXPECT_EQ((*strict)->Next(10, &b).status().message(),
            path + ":2: expected 40 tab-separated fields, got 1");
  auto r = OpenCriteoFields(path, 0, -1, true);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*(*r)->Next(10, &b), 2u);
  EXPECT_EQ((*r)->path(), path);
  EXPECT_EQ((*r)->stats().skipped, 2);
  EXPECT_EQ((*r)->stats().rows, 2);
  EXPECT_EQ((*r)->stats().lines, 4);
  EXPECT_EQ((*r)->stats().first_bad_line, 2);
  EXPECT_EQ((*r)->stats().first_bad_byte, 41);
  ASSERT_TRUE((*r)->Reset().ok());
  EXPECT_EQ((*r)->stats().skipped, 0);
}

// data.shuffle for the mlp (issue 12): rows numbered 0..n-1 (field f of
// row r holds key r * 100 + f) through the field shuffle buffer.
class NumberedRows final : public FieldReader {
 public:
  explicit NumberedRows(int n) : n_(n) {}
  absl::StatusOr<size_t> Next(size_t max_rows, FieldBlock* out) override {
    size_t k = 0;
    for (; k < max_rows && next_ < n_; ++k, ++next_) {
      for (int f = 0; f < kCriteoNumFields; ++f) {
        out->keys.push_back(static_cast<uint64_t>(next_) * 100 + f);
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
  const int n_;
  int next_ = 0;
};

// The row numbers one pass of `reader` gives, read `batch` rows at a time;
// every row's fields and label must be intact.
std::vector<int> RowOrder(FieldReader* reader, size_t batch) {
  std::vector<int> order;
  FieldBlock b;
  for (;;) {
    b.Clear();
    absl::StatusOr<size_t> n = reader->Next(batch, &b);
    EXPECT_TRUE(n.ok()) << n.status();
    if (!n.ok() || *n == 0) break;
    EXPECT_EQ(b.keys.size(), *n * kCriteoNumFields);
    for (size_t r = 0; r < *n; ++r) {
      const int row = static_cast<int>(b.keys[r * kCriteoNumFields] / 100);
      for (int f = 0; f < kCriteoNumFields; ++f) {
        EXPECT_EQ(b.keys[r * kCriteoNumFields + f],
                  static_cast<uint64_t>(row) * 100 + f);
      }
      EXPECT_EQ(b.labels[r], static_cast<float>(row % 2));
      order.push_back(row);
    }
  }
  return order;
}

TEST(FieldShuffle, EveryRowOnceInASeededOrder) {
  constexpr int kRows = 1000;
  std::vector<int> identity(kRows);
  for (int i = 0; i < kRows; ++i) identity[i] = i;
  for (const int64_t capacity : {int64_t{1}, int64_t{7}, int64_t{10000}}) {
    SCOPED_TRACE(capacity);
    auto a = NewFieldShuffleBuffer(std::make_unique<NumberedRows>(kRows),
                                   capacity, /*key=*/11);
    const std::vector<int> order = RowOrder(a.get(), 64);
    std::vector<int> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, identity);  // each row exactly once
    if (capacity == 1) {
      EXPECT_EQ(order, identity);  // a buffer of one: the source's order
      continue;
    }
    EXPECT_NE(order, identity);
    // No row comes out more than capacity - 1 places before its own.
    for (int i = 0; i < kRows; ++i) EXPECT_LE(order[i], i + (capacity - 1));
    // Reset replays it; the same key gives the same order, another key
    // another one, whatever the batch sizes.
    ASSERT_TRUE(a->Reset().ok());
    EXPECT_EQ(RowOrder(a.get(), 5), order);
    auto same = NewFieldShuffleBuffer(std::make_unique<NumberedRows>(kRows),
                                      capacity, 11);
    EXPECT_EQ(RowOrder(same.get(), 1000), order);
    auto other = NewFieldShuffleBuffer(std::make_unique<NumberedRows>(kRows),
                                       capacity, 12);
    EXPECT_NE(RowOrder(other.get(), 64), order);
  }
}

}  // namespace
}  // namespace ps
