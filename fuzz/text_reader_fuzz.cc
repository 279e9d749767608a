// Fuzz targets for the LIBSVM and Criteo readers (data/data.h): the input
// is a whole data file. Checks, besides "no crash, no sanitizer report":
//   * every row is well formed (row_ptr grows, labels 0/1, LIBSVM values
//     finite, at most 39 Criteo features);
//   * stats add up (rows + skipped <= lines);
//   * the sharding promise: for a split point k taken from the input, the
//     shards [0, k) and [k, end) hold exactly the rows of the whole file;
//   * Reset() replays the same rows;
//   * a shuffled read (data.shuffle: tiny blocks and buffer from the input)
//     holds the same rows as the file-order read, the same counts and the
//     same first bad line.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "data/data.h"
#include "fuzz/fuzz_util.h"

namespace ps::fuzz {
namespace {

using OpenFn = absl::StatusOr<std::unique_ptr<RowReader>> (*)(
    const std::string&, int64_t, int64_t, bool);
using ShuffledOpenFn = absl::StatusOr<std::unique_ptr<RowReader>> (*)(
    const std::string&, int64_t, int64_t, bool, const ShuffleOptions&);

// A temp file holding the input, removed on destruction.
class TempFile {
 public:
  TempFile(const uint8_t* data, size_t size) {
    const char* dir = std::getenv("TMPDIR");
    path_ = std::string(dir != nullptr ? dir : "/tmp") + "/ps_fuzz_XXXXXX";
    int fd = ::mkstemp(path_.data());
    PS_FUZZ_CHECK(fd >= 0);
    size_t off = 0;
    while (off < size) {
      ssize_t n = ::write(fd, data + off, size - off);
      PS_FUZZ_CHECK(n > 0);
      off += static_cast<size_t>(n);
    }
    ::close(fd);
  }
  ~TempFile() { ::unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void CheckBlock(const RowBlock& b, bool criteo) {
  PS_FUZZ_CHECK(b.row_ptr.size() == b.rows() + 1);
  PS_FUZZ_CHECK(b.row_ptr.front() == 0);
  PS_FUZZ_CHECK(static_cast<size_t>(b.row_ptr.back()) == b.nnz());
  PS_FUZZ_CHECK(b.vals.size() == b.keys.size());
  for (size_t i = 0; i < b.rows(); ++i) {
    PS_FUZZ_CHECK(b.row_ptr[i] <= b.row_ptr[i + 1]);
    PS_FUZZ_CHECK(b.labels[i] == 0.0f || b.labels[i] == 1.0f);
    if (criteo) PS_FUZZ_CHECK(b.row_ptr[i + 1] - b.row_ptr[i] <= 39);
  }
  for (float v : b.vals) PS_FUZZ_CHECK(std::isfinite(v));
}

// Reads a shard to the end in blocks of `step` rows. With
// skip_malformed=false an INVALID_ARGUMENT ends the read (*bad = true);
// any other error is a finding (the file exists and is readable).
RowBlock ReadAll(OpenFn open, const std::string& path, int64_t begin,
                 int64_t end, bool skip, size_t step, bool criteo, bool* bad,
                 ReadStats* stats) {
  RowBlock all;
  *bad = false;
  auto r = open(path, begin, end, skip);
  PS_FUZZ_CHECK(r.ok());
  for (int pass = 0; pass < 2; ++pass) {
    RowBlock block;
    while (true) {
      auto n = (*r)->Next(step, &block);
      if (!n.ok()) {
        PS_FUZZ_CHECK(!skip);
        PS_FUZZ_CHECK(n.status().code() == absl::StatusCode::kInvalidArgument);
        *bad = true;
        break;
      }
      PS_FUZZ_CHECK(*n <= step);
      if (*n == 0) break;
    }
    CheckBlock(block, criteo);
    const ReadStats& s = (*r)->stats();
    PS_FUZZ_CHECK(s.rows == static_cast<int64_t>(block.rows()));
    PS_FUZZ_CHECK(s.rows + s.skipped <= s.lines);
    if (pass == 0) {
      all = std::move(block);
      *stats = s;
      PS_FUZZ_CHECK((*r)->Reset().ok());
    } else {
      // Reset() replays the shard.
      PS_FUZZ_CHECK(block.keys == all.keys && block.labels == all.labels &&
                    block.row_ptr == all.row_ptr);
      PS_FUZZ_CHECK(s.lines == stats->lines && s.skipped == stats->skipped);
    }
  }
  return all;
}

bool SameRows(const RowBlock& whole, const RowBlock& a, const RowBlock& b) {
  if (whole.rows() != a.rows() + b.rows()) return false;
  RowBlock joined = a;
  for (size_t i = 0; i < b.rows(); ++i) joined.AppendRow(b, i);
  return joined.keys == whole.keys && joined.labels == whole.labels &&
         joined.row_ptr == whole.row_ptr;
}

// The rows of `b` as sortable values, to compare orders-free.
std::vector<std::tuple<float, std::vector<uint64_t>, std::vector<float>>>
SortedRows(const RowBlock& b) {
  std::vector<std::tuple<float, std::vector<uint64_t>, std::vector<float>>>
      rows;
  for (size_t i = 0; i < b.rows(); ++i) {
    rows.emplace_back(
        b.labels[i],
        std::vector<uint64_t>(b.keys.begin() + b.row_ptr[i],
                              b.keys.begin() + b.row_ptr[i + 1]),
        std::vector<float>(b.vals.begin() + b.row_ptr[i],
                           b.vals.begin() + b.row_ptr[i + 1]));
  }
  std::sort(rows.begin(), rows.end());
  return rows;
}

int RunText(const uint8_t* data, size_t size, OpenFn open,
            ShuffledOpenFn open_shuffled, bool criteo) {
  // The first byte picks the split point and block size; the rest is the
  // file.
  if (size < 1) return 0;
  const uint8_t ctl = data[0];
  ++data;
  --size;
  TempFile file(data, size);
  const int64_t split = size == 0 ? 0 : (ctl * 7919) % (size + 1);
  const size_t step = 1 + (ctl % 5);
  bool bad = false;
  ReadStats ws, as, bs;
  RowBlock whole = ReadAll(open, file.path(), 0, -1, true, step, criteo,
                           &bad, &ws);
  RowBlock a = ReadAll(open, file.path(), 0, split, true, step, criteo, &bad,
                       &as);
  RowBlock b = ReadAll(open, file.path(), split, -1, true, step, criteo, &bad,
                       &bs);
  PS_FUZZ_CHECK(SameRows(whole, a, b));
  PS_FUZZ_CHECK(as.lines + bs.lines == ws.lines);
  PS_FUZZ_CHECK(as.skipped + bs.skipped == ws.skipped);
  // Strict mode: stops at the first bad line, and only there.
  ReadStats ss;
  RowBlock strict = ReadAll(open, file.path(), 0, -1, false, step, criteo,
                            &bad, &ss);
  PS_FUZZ_CHECK(bad == (ws.skipped > 0));
  // Shuffled, in blocks of 1-17 bytes through a buffer of 1-7 rows.
  ShuffleOptions so;
  so.enabled = true;
  so.seed = ctl;
  so.block_bytes = 1 + ctl % 17;
  so.buffer_rows = 1 + ctl % 7;
  auto sr = open_shuffled(file.path(), 0, -1, true, so);
  PS_FUZZ_CHECK(sr.ok());
  RowBlock shuffled;
  while (true) {
    auto got = (*sr)->Next(step, &shuffled);
    PS_FUZZ_CHECK(got.ok());
    if (*got == 0) break;
  }
  CheckBlock(shuffled, criteo);
  PS_FUZZ_CHECK(SortedRows(shuffled) == SortedRows(whole));
  const ReadStats& ss2 = (*sr)->stats();
  PS_FUZZ_CHECK(ss2.lines == ws.lines && ss2.skipped == ws.skipped &&
                ss2.rows == ws.rows);
  PS_FUZZ_CHECK(ss2.first_bad_byte == ws.first_bad_byte &&
                ss2.first_bad_line == ws.first_bad_line);
  // An empty or out-of-range shard is empty, not an error.
  auto past = open(file.path(), static_cast<int64_t>(size) + 1, -1, true);
  PS_FUZZ_CHECK(past.ok());
  RowBlock none;
  auto n = (*past)->Next(4, &none);
  PS_FUZZ_CHECK(n.ok() && *n == 0);
  return 0;
}

}  // namespace

int Libsvm(const uint8_t* data, size_t size) {
  return RunText(data, size, &OpenLibsvm, &OpenLibsvm, /*criteo=*/false);
}

int Criteo(const uint8_t* data, size_t size) {
  return RunText(data, size, &OpenCriteo, &OpenCriteo, /*criteo=*/true);
}

}  // namespace ps::fuzz
