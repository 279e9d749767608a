#include "data/data.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "data/metrics.h"
#include "data/shuffle.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

std::string DataPath(const std::string& rel) {
  return std::string(PS_SOURCE_DIR) + "/../shared/data/" + rel;
}

#define SKIP_IF_MISSING(path)                                   \
  if (!FileSize(path).ok()) GTEST_SKIP() << "data set missing: " << (path)

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// Reads the whole reader in blocks of `block` rows.
RowBlock ReadAll(RowReader* reader, size_t block = 1000) {
  RowBlock all;
  while (true) {
    auto n = reader->Next(block, &all);
    EXPECT_TRUE(n.ok()) << n.status();
    if (!n.ok() || *n == 0) break;
  }
  return all;
}

void ExpectSameBlocks(const RowBlock& a, const RowBlock& b) {
  EXPECT_EQ(a.row_ptr, b.row_ptr);
  EXPECT_EQ(a.keys, b.keys);
  EXPECT_EQ(a.vals, b.vals);
  EXPECT_EQ(a.labels, b.labels);
}

TEST(RowBlock, AppendRowAndClear) {
  RowBlock src;
  src.keys = {1, 2, 3};
  src.vals = {1, 2, 3};
  src.row_ptr = {0, 2, 2, 3};
  src.labels = {1, 0, 1};
  RowBlock dst;
  dst.AppendRow(src, 2);
  dst.AppendRow(src, 1);
  dst.AppendRow(src, 0);
  EXPECT_EQ(dst.rows(), 3u);
  EXPECT_EQ(dst.row_ptr, (std::vector<int64_t>{0, 1, 1, 3}));
  EXPECT_EQ(dst.keys, (std::vector<uint64_t>{3, 1, 2}));
  EXPECT_EQ(dst.labels, (std::vector<float>{1, 0, 1}));
  dst.Clear();
  EXPECT_EQ(dst.rows(), 0u);
  EXPECT_EQ(dst.row_ptr, std::vector<int64_t>{0});
}

TEST(Libsvm, ParsesNormalAndEdgeLines) {
  const std::string path = WriteTemp(
      "edge.libsvm",
      "+1 1:0.5 3:2\n"
      "-1 2:1   \n"
      "1 4:1\r\n"
      "0\n"
      "# only a comment\n"
      "\n"
      "   \t \n"
      "1 qid:3 5:1 # trailing comment 6:1\n"
      "-1\t7:-1.5e-1  8:+2\n"
      "0.0 9:1");  // no final newline
  auto reader = OpenLibsvm(path, 0, -1, false);
  ASSERT_TRUE(reader.ok()) << reader.status();
  RowBlock b = ReadAll(reader->get());
  ASSERT_EQ(b.rows(), 7u);
  EXPECT_EQ(b.labels, (std::vector<float>{1, 0, 1, 0, 1, 0, 0}));
  EXPECT_EQ(b.row_ptr, (std::vector<int64_t>{0, 2, 3, 4, 4, 5, 7, 8}));
  EXPECT_EQ(b.keys, (std::vector<uint64_t>{
                        FeatureKey(1, 0), FeatureKey(3, 0), FeatureKey(2, 0),
                        FeatureKey(4, 0), FeatureKey(5, 0), FeatureKey(7, 0),
                        FeatureKey(8, 0), FeatureKey(9, 0)}));
  EXPECT_EQ(b.vals, (std::vector<float>{0.5f, 2, 1, 1, 1, -0.15f, 2, 1}));
  const ReadStats& s = (*reader)->stats();
  EXPECT_EQ(s.lines, 10);
  EXPECT_EQ(s.rows, 7);
  EXPECT_EQ(s.skipped, 0);

  // Reset rewinds and zeroes the stats.
  ASSERT_TRUE((*reader)->Reset().ok());
  EXPECT_EQ((*reader)->stats().rows, 0);
  ExpectSameBlocks(ReadAll(reader->get(), 3), b);
}

TEST(Libsvm, MalformedLineNamesFileAndLine) {
  const std::string path = WriteTemp(
      "bad.libsvm", "1 1:1\n1 x:1\n1 2:abc\nfoo 1:1\n1 3:1\n1 4:nan\n1 5\n");
  auto reader = OpenLibsvm(path, 0, -1, false);
  ASSERT_TRUE(reader.ok());
  RowBlock b;
  auto n = (*reader)->Next(100, &b);
  ASSERT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(n.status().message(), path + ":2: bad feature 'x:1'");
  EXPECT_EQ(b.rows(), 1u);  // the good row before it stays
  n = (*reader)->Next(100, &b);
  EXPECT_EQ(n.status().message(), path + ":3: bad feature '2:abc'");
  n = (*reader)->Next(100, &b);
  EXPECT_EQ(n.status().message(), path + ":4: bad label 'foo'");
  EXPECT_EQ(b.nnz(), 1u);  // nothing of the bad rows leaked in

  auto skip = OpenLibsvm(path, 0, -1, true);
  ASSERT_TRUE(skip.ok());
  RowBlock all = ReadAll(skip->get());
  EXPECT_EQ(all.rows(), 2u);
  EXPECT_EQ(all.keys, (std::vector<uint64_t>{FeatureKey(1, 0), FeatureKey(3, 0)}));
  EXPECT_EQ((*skip)->stats().skipped, 5);
  EXPECT_EQ((*skip)->stats().rows, 2);
  EXPECT_EQ((*skip)->stats().lines, 7);

  // A shard not starting at 0 names the byte offset of the bad line.
  auto shard = OpenLibsvm(path, 3, -1, false);  // starts at line 2 (byte 6)
  ASSERT_TRUE(shard.ok());
  RowBlock c;
  n = (*shard)->Next(100, &c);
  EXPECT_EQ(n.status().message(), path + ":byte 6: bad feature 'x:1'");
}

TEST(Libsvm, OpenErrors) {
  const std::string missing = ::testing::TempDir() + "/no_such_file.libsvm";
  auto r = OpenLibsvm(missing, 0, -1, false);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find(missing), std::string::npos);
  EXPECT_EQ(FileSize(missing).status().code(), absl::StatusCode::kNotFound);
  const std::string path = WriteTemp("x.libsvm", "1 1:1\n");
  EXPECT_EQ(OpenLibsvm(path, -1, -1, false).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenLibsvm(path, 5, 4, false).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto size = FileSize(path);
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, 6);
  // A shard past the end is empty.
  auto past = OpenLibsvm(path, 100, -1, false);
  ASSERT_TRUE(past.ok());
  EXPECT_EQ(ReadAll(past->get()).rows(), 0u);
}

// Every two-way split point of a small file with awkward lines.
TEST(Libsvm, EveryTwoWaySplitCoversEachLineOnce) {
  const std::string text = "1 1:1\n\n0 2:1\r\n1\n# c\n0 3:1 4:2\n1 5:1";
  const std::string path = WriteTemp("split.libsvm", text);
  auto whole = OpenLibsvm(path, 0, -1, false);
  ASSERT_TRUE(whole.ok());
  RowBlock expected = ReadAll(whole->get());
  ASSERT_EQ(expected.rows(), 5u);
  for (int64_t cut = 0; cut <= static_cast<int64_t>(text.size()) + 1; ++cut) {
    auto a = OpenLibsvm(path, 0, cut, false);
    auto b = OpenLibsvm(path, cut, -1, false);
    ASSERT_TRUE(a.ok() && b.ok());
    RowBlock got = ReadAll(a->get());
    RowBlock tail = ReadAll(b->get());
    for (size_t i = 0; i < tail.rows(); ++i) got.AppendRow(tail, i);
    SCOPED_TRACE(cut);
    ExpectSameBlocks(got, expected);
  }
}

TEST(Libsvm, A9aShardsGiveTheSameRows) {
  const std::string path = DataPath("a9a/a9a.train");
  SKIP_IF_MISSING(path);
  const int64_t size = *FileSize(path);
  auto whole = OpenLibsvm(path, 0, -1, false);
  ASSERT_TRUE(whole.ok());
  RowBlock expected = ReadAll(whole->get(), 4096);
  ASSERT_EQ(expected.rows(), 32561u);
  EXPECT_EQ((*whole)->stats().rows, 32561);
  for (int shards = 1; shards <= 7; ++shards) {
    RowBlock got;
    int64_t rows = 0;
    for (int s = 0; s < shards; ++s) {
      const int64_t begin = size * s / shards;
      const int64_t end = s + 1 == shards ? -1 : size * (s + 1) / shards;
      auto r = OpenLibsvm(path, begin, end, false);
      ASSERT_TRUE(r.ok()) << r.status();
      RowBlock part = ReadAll(r->get(), 777);
      rows += (*r)->stats().rows;
      for (size_t i = 0; i < part.rows(); ++i) got.AppendRow(part, i);
    }
    EXPECT_EQ(rows, 32561) << shards;
    ExpectSameBlocks(got, expected);
  }
}

TEST(Criteo, ParsesFieldsAndBuckets) {
  // label, 13 integers, 26 categoricals.
  std::string line = "1\t5\t\t-3\t2\t0\t1000";
  for (int i = 6; i < 13; ++i) line += "\t";
  line += "\tabc";
  for (int j = 1; j < 26; ++j) line += "\t";
  const std::string path = WriteTemp("c.tsv", line + "\r\n" + line + "\n");
  auto r = OpenCriteo(path, 0, -1, false);
  ASSERT_TRUE(r.ok()) << r.status();
  RowBlock b = ReadAll(r->get());
  ASSERT_EQ(b.rows(), 2u);
  EXPECT_EQ(b.labels[0], 1.0f);
  const std::vector<uint64_t> want = {
      FeatureKey(2, 0),                        // floor(ln(5)^2) = 2
      FeatureKey(static_cast<uint64_t>(-3), 2),  // negative: own bucket
      FeatureKey(2, 3),                        // v <= 2 kept
      FeatureKey(0, 4),
      FeatureKey(47, 5),                       // floor(ln(1000)^2) = 47
      FeatureKey(HashBytes("abc"), 13)};
  EXPECT_EQ(std::vector<uint64_t>(b.keys.begin(), b.keys.begin() + 6), want);
  EXPECT_EQ(b.row_ptr, (std::vector<int64_t>{0, 6, 12}));
  EXPECT_EQ(b.vals, std::vector<float>(12, 1.0f));
}

TEST(Criteo, MalformedLines) {
  const std::string good = "0" + std::string(39, '\t');
  const std::string path = WriteTemp(
      "cbad.tsv", good + "\n" + "0" + std::string(38, '\t') + "\n" +  // 39 fields
                      "x" + std::string(39, '\t') + "\n" +               // bad label
                      "0\t1.5" + std::string(38, '\t') + "\n" +          // bad integer
                      good + "\t\n" + good + "\n");                      // 41 fields
  auto r = OpenCriteo(path, 0, -1, false);
  ASSERT_TRUE(r.ok());
  RowBlock b;
  auto n = (*r)->Next(100, &b);
  EXPECT_EQ(n.status().message(), path + ":2: expected 40 tab-separated fields, got 39");
  n = (*r)->Next(100, &b);
  EXPECT_EQ(n.status().message(), path + ":3: bad label 'x'");
  n = (*r)->Next(100, &b);
  EXPECT_EQ(n.status().message(), path + ":4: bad integer '1.5' in field I1");
  n = (*r)->Next(100, &b);
  EXPECT_EQ(n.status().message(), path + ":5: expected 40 tab-separated fields, got 41");
  auto skip = OpenCriteo(path, 0, -1, true);
  ASSERT_TRUE(skip.ok());
  EXPECT_EQ(ReadAll(skip->get()).rows(), 2u);
  EXPECT_EQ((*skip)->stats().skipped, 4);
}

// Issue 8: "skipped malformed lines are never counted". The reader counts
// them per pass and remembers where the first one was.
TEST(Libsvm, RegressionSkippedLinesNeverCounted) {
  const std::string text = "1 1:1\n\n1 x:1\n0 2:1\nfoo\n";
  const std::string path = WriteTemp("skipcount.libsvm", text);
  auto r = OpenLibsvm(path, 0, -1, true);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->path(), path);
  EXPECT_EQ((*r)->stats().first_bad_line, 0);
  EXPECT_EQ((*r)->stats().first_bad_byte, -1);
  EXPECT_EQ(ReadAll(r->get()).rows(), 2u);
  EXPECT_EQ((*r)->stats().skipped, 2);
  EXPECT_EQ((*r)->stats().first_bad_line, 3);  // the blank line counts
  EXPECT_EQ((*r)->stats().first_bad_byte, 7);
  // One pass: Reset starts the count again, and the same pass counts the same.
  ASSERT_TRUE((*r)->Reset().ok());
  EXPECT_EQ((*r)->stats().skipped, 0);
  EXPECT_EQ(ReadAll(r->get()).rows(), 2u);
  EXPECT_EQ((*r)->stats().skipped, 2);
  EXPECT_EQ((*r)->stats().first_bad_line, 3);

  // A shard starting inside the file: the line counts from the shard and the
  // byte offset is file-global.
  auto shard = OpenLibsvm(path, 8, -1, true);  // starts at "0 2:1" (byte 13)
  ASSERT_TRUE(shard.ok());
  EXPECT_EQ(ReadAll(shard->get()).rows(), 1u);
  EXPECT_EQ((*shard)->stats().skipped, 1);
  EXPECT_EQ((*shard)->stats().first_bad_line, 2);
  EXPECT_EQ((*shard)->stats().first_bad_byte, 19);
}

TEST(Criteo, RegressionSkippedLinesNeverCounted) {
  const std::string good = "0" + std::string(39, '\t');
  const std::string path =
      WriteTemp("cskipcount.tsv", good + "\n" + "x\n" + good + "\n" + "y\n");
  auto r = OpenCriteo(path, 0, -1, true);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(ReadAll(r->get()).rows(), 2u);
  EXPECT_EQ((*r)->stats().skipped, 2);
  EXPECT_EQ((*r)->stats().first_bad_line, 2);
  EXPECT_EQ((*r)->stats().first_bad_byte, 41);
}

TEST(Synthetic, HasNoPath) {
  SyntheticConfig cfg;
  auto r = OpenSynthetic(cfg, 0, 10, false);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->path(), "");
}

TEST(Criteo, ReadsCriteo10k) {
  const std::string path = DataPath("criteo-10k/train.tsv");
  SKIP_IF_MISSING(path);
  auto r = OpenCriteo(path, 0, -1, false);
  ASSERT_TRUE(r.ok());
  RowBlock b = ReadAll(r->get());
  ASSERT_EQ(b.rows(), 8000u);
  int64_t max_nnz = 0, positives = 0;
  for (size_t i = 0; i < b.rows(); ++i) {
    max_nnz = std::max(max_nnz, b.row_ptr[i + 1] - b.row_ptr[i]);
    positives += b.labels[i] > 0.5f;
  }
  EXPECT_EQ(max_nnz, 39);
  EXPECT_GT(positives, 500);   // ~25% clicks in Criteo
  EXPECT_LT(positives, 4000);
  // Sharded read gives the same rows.
  const int64_t size = *FileSize(path);
  RowBlock got;
  for (int s = 0; s < 3; ++s) {
    auto part = OpenCriteo(path, size * s / 3, s == 2 ? -1 : size * (s + 1) / 3, false);
    ASSERT_TRUE(part.ok());
    RowBlock p = ReadAll(part->get());
    for (size_t i = 0; i < p.rows(); ++i) got.AppendRow(p, i);
  }
  ExpectSameBlocks(got, b);
}

SyntheticConfig SmallConfig() {
  SyntheticConfig cfg;
  cfg.features = 10000;
  cfg.nnz_per_row = 20;
  cfg.seed = 7;
  return cfg;
}

TEST(Synthetic, DeterministicAndShardable) {
  const SyntheticConfig cfg = SmallConfig();
  auto a = OpenSynthetic(cfg, 0, 3000, false);
  auto b = OpenSynthetic(cfg, 0, 3000, false);
  ASSERT_TRUE(a.ok() && b.ok());
  RowBlock ra = ReadAll(a->get(), 512);
  ExpectSameBlocks(ra, ReadAll(b->get(), 1000));
  ASSERT_EQ(ra.rows(), 3000u);
  EXPECT_EQ((*a)->stats().rows, 3000);

  RowBlock got;
  const int64_t cuts[] = {0, 1, 1000, 2999, 3000};
  for (int s = 0; s + 1 < 5; ++s) {
    auto r = OpenSynthetic(cfg, cuts[s], cuts[s + 1], false);
    ASSERT_TRUE(r.ok());
    RowBlock p = ReadAll(r->get(), 333);
    for (size_t i = 0; i < p.rows(); ++i) got.AppendRow(p, i);
  }
  ExpectSameBlocks(got, ra);

  // Reset replays; the test stream and another seed differ.
  ASSERT_TRUE((*a)->Reset().ok());
  ExpectSameBlocks(ReadAll(a->get()), ra);
  auto t = OpenSynthetic(cfg, 0, 3000, true);
  ASSERT_TRUE(t.ok());
  EXPECT_NE(ReadAll(t->get()).keys, ra.keys);
  SyntheticConfig other = cfg;
  other.seed = 8;
  auto o = OpenSynthetic(other, 0, 3000, false);
  ASSERT_TRUE(o.ok());
  EXPECT_NE(ReadAll(o->get()).keys, ra.keys);
}

// The generated data is pinned: a job's rows, and so every figure measured
// on them, must not change when the generator is made faster. Fingerprints
// of the keys and labels of 5000 rows, for a row short enough to be drawn
// unsorted and one long enough to be kept sorted (SyntheticReader::Insert),
// with ids crowded so that repeats are frequent.
uint64_t Fingerprint(const RowBlock& b) {
  uint64_t h = 0;
  for (uint64_t k : b.keys) h = Mix64(h ^ k);
  for (float y : b.labels) h = Mix64(h ^ static_cast<uint64_t>(y));
  for (int64_t p : b.row_ptr) h = Mix64(h ^ static_cast<uint64_t>(p));
  return h;
}

TEST(Synthetic, RowsArePinned) {
  SyntheticConfig short_rows = SmallConfig();
  short_rows.features = 200;  // 20 of 200 popular ids: many repeats
  SyntheticConfig long_rows = SmallConfig();
  long_rows.features = 300;
  long_rows.nnz_per_row = 100;  // beyond the scan: kept sorted
  uint64_t got[2];
  int i = 0;
  for (const SyntheticConfig& cfg : {short_rows, long_rows}) {
    auto r = OpenSynthetic(cfg, 0, 5000, false);
    ASSERT_TRUE(r.ok());
    const RowBlock b = ReadAll(r->get(), 1000);
    ASSERT_EQ(b.rows(), 5000u);
    got[i++] = Fingerprint(b);
  }
  // Computed before Insert scanned short rows (at 35d5883).
  EXPECT_EQ(got[0], 15072955466819223087u);
  EXPECT_EQ(got[1], 6286254003751132899u);
}

TEST(Synthetic, RowsHaveDistinctPowerLawFeaturesAndSaneLabels) {
  SyntheticConfig cfg;  // defaults
  auto r = OpenSynthetic(cfg, 0, 20000, false);
  ASSERT_TRUE(r.ok());
  RowBlock b = ReadAll(r->get(), 4096);
  ASSERT_EQ(b.rows(), 20000u);
  std::unordered_map<uint64_t, int64_t> id_of;
  for (int64_t f = 0; f < cfg.features; ++f) id_of[FeatureKey(f, 0)] = f;
  std::vector<int64_t> count(cfg.features, 0);
  std::vector<float> prob(b.rows());
  int64_t positives = 0;
  for (size_t i = 0; i < b.rows(); ++i) {
    ASSERT_EQ(b.row_ptr[i + 1] - b.row_ptr[i], cfg.nnz_per_row);
    std::unordered_set<uint64_t> seen;
    double margin = 0;
    for (int64_t k = b.row_ptr[i]; k < b.row_ptr[i + 1]; ++k) {
      ASSERT_TRUE(seen.insert(b.keys[k]).second) << "duplicate key in row " << i;
      ASSERT_EQ(b.vals[k], 1.0f);
      auto it = id_of.find(b.keys[k]);
      ASSERT_NE(it, id_of.end());
      ++count[it->second];
      margin += SyntheticTrueWeight(cfg, it->second);
    }
    prob[i] = static_cast<float>(1.0 / (1.0 + std::exp(-margin)));
    positives += b.labels[i] > 0.5f;
  }
  const double pos_share = static_cast<double>(positives) / b.rows();
  EXPECT_GT(pos_share, 0.3);
  EXPECT_LT(pos_share, 0.7);
  // Power law: low ids far more popular than high ones.
  EXPECT_GT(count[0], 10 * (count[5000] + 1));
  EXPECT_GT(count[10], count[1000]);
  // About true_sparsity of the features carry weight.
  int nonzero = 0;
  for (int64_t f = 0; f < cfg.features; ++f) nonzero += SyntheticTrueWeight(cfg, f) != 0;
  EXPECT_NEAR(nonzero / static_cast<double>(cfg.features), cfg.true_sparsity, 0.01);
  // The Bayes-optimal classifier's AUC is in the intended range.
  const EvalMetrics m = Evaluate(prob, b.labels);
  std::printf("synthetic defaults: positives %.3f, Bayes AUC %.4f, logloss %.4f\n",
              pos_share, m.auc, m.logloss);
  EXPECT_GT(m.auc, 0.8);
  EXPECT_LT(m.auc, 0.92);
}

TEST(Synthetic, SmallFeatureSpaceAndNoise) {
  SyntheticConfig cfg = SmallConfig();
  cfg.features = 5;
  cfg.nnz_per_row = 8;  // capped at 5 distinct
  cfg.label_noise = 1.0;
  auto r = OpenSynthetic(cfg, 0, 100, false);
  ASSERT_TRUE(r.ok());
  RowBlock b = ReadAll(r->get());
  for (size_t i = 0; i < b.rows(); ++i) EXPECT_EQ(b.row_ptr[i + 1] - b.row_ptr[i], 5);
}

TEST(Synthetic, InvalidConfig) {
  SyntheticConfig cfg = SmallConfig();
  cfg.features = 0;
  auto r = OpenSynthetic(cfg, 0, 10, false);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("features"), std::string::npos);
  cfg = SmallConfig();
  cfg.true_sparsity = 1.5;
  EXPECT_EQ(OpenSynthetic(cfg, 0, 10, false).status().code(),
            absl::StatusCode::kInvalidArgument);
  cfg = SmallConfig();
  cfg.label_noise = -0.1;
  EXPECT_EQ(OpenSynthetic(cfg, 0, 10, false).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenSynthetic(SmallConfig(), 10, 5, false).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenSynthetic(SmallConfig(), -1, 5, false).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ------------------------------------------------------------- shuffling

// A LIBSVM file whose row i is "<i % 2> <i + 1>:1", so each row is known by
// its one key; a comment line after every 7th row, so line numbers are not
// row numbers.
std::string NumberedRows(const std::string& name, int rows) {
  std::string text;
  for (int i = 0; i < rows; ++i) {
    text += absl::StrCat(i % 2, " ", i + 1, ":1\n");
    if (i % 7 == 6) text += "# a comment\n";
  }
  return WriteTemp(name, text);
}

// The row numbers of `b` (rows of NumberedRows).
std::vector<int64_t> RowIds(const RowBlock& b) {
  static const auto* id_of = [] {
    auto* m = new std::unordered_map<uint64_t, int64_t>;
    for (int64_t i = 0; i < 100000; ++i) (*m)[FeatureKey(i + 1, 0)] = i;
    return m;
  }();
  std::vector<int64_t> ids;
  for (size_t r = 0; r < b.rows(); ++r) {
    EXPECT_EQ(b.row_ptr[r + 1] - b.row_ptr[r], 1);
    auto it = id_of->find(b.keys[b.row_ptr[r]]);
    ids.push_back(it == id_of->end() ? -1 : it->second);
    EXPECT_EQ(b.labels[r], static_cast<float>(ids.back() % 2));
  }
  return ids;
}

ShuffleOptions Shuffled(uint64_t seed, int64_t epoch, int64_t buffer_rows,
                        int64_t block_bytes) {
  ShuffleOptions o;
  o.enabled = true;
  o.seed = seed;
  o.epoch = epoch;
  o.buffer_rows = buffer_rows;
  o.block_bytes = block_bytes;
  return o;
}

// The row numbers of a shuffled read of [begin, end), in blocks of 37 rows.
std::vector<int64_t> ShuffledIds(const std::string& path, int64_t begin,
                                 int64_t end, const ShuffleOptions& o) {
  auto r = OpenLibsvm(path, begin, end, false, o);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return {};
  return RowIds(ReadAll(r->get(), 37));
}

void ExpectPermutation(std::vector<int64_t> ids, int64_t n) {
  std::sort(ids.begin(), ids.end());
  std::vector<int64_t> all(n);
  for (int64_t i = 0; i < n; ++i) all[i] = i;
  EXPECT_EQ(ids, all) << "not every row exactly once";
}

std::vector<int64_t> Iota(int64_t n) {
  std::vector<int64_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

TEST(Shuffle, OrderDependsOnlyOnSeedAndEpoch) {
  const std::string path = NumberedRows("shuffle_order.libsvm", 3000);
  // Small blocks and buffer: both halves of the shuffle matter.
  const std::vector<int64_t> a =
      ShuffledIds(path, 0, -1, Shuffled(1, 0, 100, 2048));
  ExpectPermutation(a, 3000);
  EXPECT_NE(a, Iota(3000));
  EXPECT_EQ(ShuffledIds(path, 0, -1, Shuffled(1, 0, 100, 2048)), a);
  const std::vector<int64_t> seed2 =
      ShuffledIds(path, 0, -1, Shuffled(2, 0, 100, 2048));
  const std::vector<int64_t> epoch1 =
      ShuffledIds(path, 0, -1, Shuffled(1, 1, 100, 2048));
  ExpectPermutation(seed2, 3000);
  ExpectPermutation(epoch1, 3000);
  EXPECT_NE(seed2, a);
  EXPECT_NE(epoch1, a);
  EXPECT_NE(epoch1, seed2);
  // Reset replays the same order; the block size of a Next call does not
  // change it.
  auto r = OpenLibsvm(path, 0, -1, false, Shuffled(1, 0, 100, 2048));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(RowIds(ReadAll(r->get(), 1000)), a);
  ASSERT_TRUE((*r)->Reset().ok());
  EXPECT_EQ(RowIds(ReadAll(r->get(), 1)), a);
  EXPECT_EQ((*r)->stats().rows, 3000);
  EXPECT_EQ((*r)->stats().lines, 3000 + 3000 / 7);
  // A buffer larger than the shard shuffles it whole, in one block too.
  const std::vector<int64_t> whole =
      ShuffledIds(path, 0, -1, Shuffled(1, 0, 10000, int64_t{1} << 20));
  ExpectPermutation(whole, 3000);
  EXPECT_NE(whole, Iota(3000));
}

// An epoch of work units: each unit (a byte range, cut anywhere) read
// shuffled; together they give every row of the file exactly once.
TEST(Shuffle, UnitsOfAnEpochTogetherReadEveryRowOnce) {
  const std::string path = NumberedRows("shuffle_units.libsvm", 2000);
  const int64_t size = *FileSize(path);
  for (int units : {1, 3, 7}) {
    for (int64_t epoch : {0, 1}) {
      SCOPED_TRACE(absl::StrCat(units, " units, epoch ", epoch));
      std::vector<int64_t> all;
      for (int u = 0; u < units; ++u) {
        const int64_t begin = size * u / units;
        const int64_t end = u + 1 == units ? -1 : size * (u + 1) / units;
        std::vector<int64_t> ids =
            ShuffledIds(path, begin, end, Shuffled(5, epoch, 64, 1000));
        all.insert(all.end(), ids.begin(), ids.end());
      }
      ExpectPermutation(all, 2000);
      EXPECT_NE(all, Iota(2000));
    }
  }
}

// A source of rows 0, 1, 2, ... (row i: one key, i), counting how many it
// handed out.
class CountingSource : public RowReader {
 public:
  explicit CountingSource(int64_t rows) : rows_(rows) {}
  absl::StatusOr<size_t> Next(size_t max_rows, RowBlock* out) override {
    size_t n = 0;
    for (; n < max_rows && next_ < rows_; ++n, ++next_) {
      out->keys.push_back(static_cast<uint64_t>(next_));
      out->vals.push_back(1.0f);
      out->labels.push_back(0.0f);
      out->row_ptr.push_back(static_cast<int64_t>(out->keys.size()));
    }
    stats_.rows += static_cast<int64_t>(n);
    return n;
  }
  absl::Status Reset() override {
    next_ = 0;
    stats_ = ReadStats();
    return absl::OkStatus();
  }
  const ReadStats& stats() const override { return stats_; }
  const std::string& path() const override { return path_; }

 private:
  const int64_t rows_;
  int64_t next_ = 0;
  ReadStats stats_;
  std::string path_;
};

TEST(Shuffle, BufferHoldsAtMostItsCapacity) {
  constexpr int64_t kRows = 5000, kCapacity = 64;
  auto owned = std::make_unique<CountingSource>(kRows);
  CountingSource* source = owned.get();
  std::unique_ptr<RowReader> buf =
      NewShuffleBuffer(std::move(owned), kCapacity, /*key=*/3);
  std::vector<int64_t> out;
  RowBlock b;
  for (;;) {
    b.Clear();
    auto n = buf->Next(7, &b);
    ASSERT_TRUE(n.ok());
    if (*n == 0) break;
    for (size_t r = 0; r < b.rows(); ++r) out.push_back(b.keys[r]);
    // Never more than kCapacity rows read ahead of those handed out.
    EXPECT_LE(source->stats().rows, static_cast<int64_t>(out.size()) + kCapacity);
  }
  ExpectPermutation(out, kRows);  // across many compactions
  EXPECT_NE(out, Iota(kRows));
  // No row comes out more than kCapacity - 1 places early.
  for (size_t p = 0; p < out.size(); ++p) {
    EXPECT_GE(static_cast<int64_t>(p), out[p] - (kCapacity - 1)) << out[p];
  }
  // Reset replays the same order.
  ASSERT_TRUE(buf->Reset().ok());
  RowBlock again = ReadAll(buf.get(), 500);
  ASSERT_EQ(again.rows(), static_cast<size_t>(kRows));
  for (size_t r = 0; r < again.rows(); ++r) {
    ASSERT_EQ(static_cast<int64_t>(again.keys[r]), out[r]) << r;
  }
  // Capacity 1: the source's order.
  auto one = NewShuffleBuffer(std::make_unique<CountingSource>(100), 1, 3);
  RowBlock in_order = ReadAll(one.get(), 9);
  for (size_t r = 0; r < in_order.rows(); ++r) EXPECT_EQ(in_order.keys[r], r);
}

// On a real file: a shuffled reader of a 3000-row shard holds only its
// buffer's rows, not the shard.
TEST(Shuffle, FileReaderReadsOnlyABufferAhead) {
  const std::string path = NumberedRows("shuffle_bounded.libsvm", 3000);
  auto r = OpenLibsvm(path, 0, -1, false, Shuffled(1, 0, 100, 4096));
  ASSERT_TRUE(r.ok());
  RowBlock b;
  ASSERT_EQ(*(*r)->Next(10, &b), 10u);
  EXPECT_LE((*r)->stats().rows, 110);
}

// The error for a malformed line still names the file's own line (shard
// at byte 0) or byte (other shards), wherever the shuffle met it; skipped
// lines are reported by the earliest in the file.
TEST(Shuffle, MalformedLinesKeepTheirFilePosition) {
  std::string text;
  int64_t bad_byte[2] = {0, 0};
  for (int i = 0; i < 3000; ++i) {
    if (i == 1234 || i == 2500) {  // i % 7 != 6: no comment after them
      bad_byte[i == 2500] = static_cast<int64_t>(text.size());
      text += absl::StrCat("1 ", i + 1, ":x\n");
      continue;
    }
    text += absl::StrCat(i % 2, " ", i + 1, ":1\n");
    if (i % 7 == 6) text += "# a comment\n";
  }
  const std::string path = WriteTemp("shuffle_bad.libsvm", text);
  // Row i is on line i + 1 + (comment lines before it) = i + 1 + i / 7.
  const int64_t line_1234 = 1234 + 1 + 1234 / 7;
  const int64_t line_2500 = 2500 + 1 + 2500 / 7;
  // Blocks of 2 KiB: the bad lines are far from the first block.
  for (uint64_t seed : {1, 2, 3}) {
    SCOPED_TRACE(seed);
    auto r = OpenLibsvm(path, 0, -1, false, Shuffled(seed, 0, 50, 2048));
    ASSERT_TRUE(r.ok());
    std::vector<std::string> errors;
    RowBlock b;
    for (int calls = 0; calls < 10000; ++calls) {
      auto n = (*r)->Next(100, &b);
      if (!n.ok()) {
        EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
        errors.emplace_back(n.status().message());
        continue;  // resumes after the bad line
      }
      if (*n == 0) break;
    }
    std::sort(errors.begin(), errors.end());
    EXPECT_EQ(errors, (std::vector<std::string>{
                          absl::StrCat(path, ":", line_1234,
                                       ": bad feature '1235:x'"),
                          absl::StrCat(path, ":", line_2500,
                                       ": bad feature '2501:x'")}));
    EXPECT_EQ(b.rows(), 2998u);  // no good row lost to the errors

    // skip_malformed: the earliest bad line in the file, once the pass ends.
    auto skip = OpenLibsvm(path, 0, -1, true, Shuffled(seed, 0, 50, 2048));
    ASSERT_TRUE(skip.ok());
    EXPECT_EQ(ReadAll(skip->get()).rows(), 2998u);
    EXPECT_EQ((*skip)->stats().skipped, 2);
    EXPECT_EQ((*skip)->stats().first_bad_byte, bad_byte[0]);
    EXPECT_EQ((*skip)->stats().first_bad_line, line_1234);
  }
  // A shard not at byte 0: the byte offset, as in file order; its skipped
  // line counted from the shard's first line.
  const int64_t from = bad_byte[0] - 5000;  // inside an earlier line
  auto shard = OpenLibsvm(path, from, -1, false, Shuffled(1, 0, 50, 2048));
  ASSERT_TRUE(shard.ok());
  RowBlock c;
  absl::Status first;
  for (int calls = 0; calls < 10000 && first.ok(); ++calls) {
    auto n = (*shard)->Next(100, &c);
    if (!n.ok()) first = n.status();
    if (n.ok() && *n == 0) break;
  }
  EXPECT_TRUE(
      first.message() == absl::StrCat(path, ":byte ", bad_byte[0],
                                      ": bad feature '1235:x'") ||
      first.message() == absl::StrCat(path, ":byte ", bad_byte[1],
                                      ": bad feature '2501:x'"))
      << first;
  auto plain = OpenLibsvm(path, from, -1, true);
  auto shuffled = OpenLibsvm(path, from, -1, true, Shuffled(1, 0, 50, 2048));
  ASSERT_TRUE(plain.ok() && shuffled.ok());
  ReadAll(plain->get());
  ReadAll(shuffled->get());
  EXPECT_GT((*plain)->stats().first_bad_line, 1);
  EXPECT_EQ((*shuffled)->stats().first_bad_line,
            (*plain)->stats().first_bad_line);
  EXPECT_EQ((*shuffled)->stats().first_bad_byte, bad_byte[0]);
}

TEST(Shuffle, CriteoShardsShuffleToo) {
  std::string text;
  for (int i = 0; i < 500; ++i) {
    text += absl::StrCat(i % 2, "\t", i, std::string(38, '\t'), "\n");
  }
  const std::string path = WriteTemp("shuffle.tsv", text);
  auto plain = OpenCriteo(path, 0, -1, false);
  auto shuffled = OpenCriteo(path, 0, -1, false, Shuffled(1, 0, 32, 1024));
  ASSERT_TRUE(plain.ok() && shuffled.ok());
  RowBlock a = ReadAll(plain->get()), b = ReadAll(shuffled->get());
  ASSERT_EQ(a.rows(), 500u);
  ASSERT_EQ(b.rows(), 500u);
  EXPECT_NE(a.keys, b.keys);
  std::sort(a.keys.begin(), a.keys.end());
  std::sort(b.keys.begin(), b.keys.end());
  EXPECT_EQ(a.keys, b.keys);
}

TEST(Shuffle, SyntheticRowsComeInASeededPermutation) {
  const SyntheticConfig cfg = SmallConfig();
  auto plain = OpenSynthetic(cfg, 100, 1100, false);
  ASSERT_TRUE(plain.ok());
  const RowBlock rows = ReadAll(plain->get());
  // Row identity: its keys.
  auto ids = [&](const RowBlock& b) {
    std::map<std::vector<uint64_t>, int64_t> index;
    for (size_t r = 0; r < rows.rows(); ++r) {
      index[std::vector<uint64_t>(rows.keys.begin() + rows.row_ptr[r],
                                  rows.keys.begin() + rows.row_ptr[r + 1])] = r;
    }
    std::vector<int64_t> out;
    for (size_t r = 0; r < b.rows(); ++r) {
      auto it = index.find(std::vector<uint64_t>(
          b.keys.begin() + b.row_ptr[r], b.keys.begin() + b.row_ptr[r + 1]));
      out.push_back(it == index.end() ? -1 : it->second);
    }
    return out;
  };
  auto read = [&](uint64_t seed, int64_t epoch) {
    auto r = OpenSynthetic(cfg, 100, 1100, false, Shuffled(seed, epoch, 1, 1));
    EXPECT_TRUE(r.ok());
    return ids(ReadAll(r->get(), 33));
  };
  const std::vector<int64_t> a = read(1, 0);
  ExpectPermutation(a, 1000);
  EXPECT_NE(a, Iota(1000));
  EXPECT_EQ(read(1, 0), a);
  EXPECT_NE(read(2, 0), a);
  EXPECT_NE(read(1, 1), a);
  EXPECT_EQ(OpenSynthetic(cfg, 0, -1, false, Shuffled(1, 0, 1, 1))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// Not a correctness test: prints parse throughput for information.
TEST(ParseSpeed, PrintsMegabytesPerSecond) {
  for (const char* rel : {"a9a/a9a.train", "news20-compsci/train.libsvm"}) {
    const std::string path = DataPath(rel);
    if (!FileSize(path).ok()) continue;
    const double mb = static_cast<double>(*FileSize(path)) / (1 << 20);
    // In file order, and shuffled with the defaults (1 MiB blocks, a
    // 10000-row buffer) over the whole file as one shard.
    ShuffleOptions shuffled;
    shuffled.enabled = true;
    for (const ShuffleOptions& o : {ShuffleOptions(), shuffled}) {
      auto r = OpenLibsvm(path, 0, -1, false, o);
      ASSERT_TRUE(r.ok());
      RowBlock block;
      double best = 1e9;
      for (int rep = 0; rep < 3; ++rep) {
        ASSERT_TRUE((*r)->Reset().ok());
        const auto t0 = std::chrono::steady_clock::now();
        while (true) {
          block.Clear();
          auto n = (*r)->Next(4096, &block);
          ASSERT_TRUE(n.ok());
          if (*n == 0) break;
        }
        best = std::min(best, std::chrono::duration<double>(
                                  std::chrono::steady_clock::now() - t0).count());
      }
      std::printf("parse %s%s: %.1f MB in %.3f s = %.0f MB/s (%lld rows)\n",
                  rel, o.enabled ? " shuffled" : "", mb, best, mb / best,
                  static_cast<long long>((*r)->stats().rows));
    }
  }
}

}  // namespace
}  // namespace ps
