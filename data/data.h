// Training data: rows streamed from LIBSVM files, Criteo TSV files or a
// seeded synthetic generator, in blocks (no per-row objects).
//
// Every reader yields rows with 0/1 labels and features as (key, value), the
// key being FeatureKey(feature_id, field) from common/hash.h. Readers never
// add a bias feature. Criteo files can also be read as field rows
// (FieldReader: one key per field, for the MLP), through the same line
// parser (data/criteo.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config.h"
#include "data/criteo.h"

namespace ps {

// A block of parsed rows in CSR layout: row i has the features
// keys/vals[row_ptr[i], row_ptr[i+1]) and the label labels[i] (0 or 1).
struct RowBlock {
  std::vector<int64_t> row_ptr{0};
  std::vector<uint64_t> keys;
  std::vector<float> vals;
  std::vector<float> labels;  // 0 or 1

  size_t rows() const { return labels.size(); }
  size_t nnz() const { return keys.size(); }
  // Empties the block, keeping the vectors' capacity.
  void Clear();
  // Appends row `row` (< src.rows()) of `src`. `src` must not be *this.
  void AppendRow(const RowBlock& src, size_t row);
  // Keeps only the rows `*rows` names (ascending, each < rows()), in their
  // order, in place; then (*rows)[i] = i. A shuffle buffer's compaction.
  void KeepRows(std::vector<size_t>* rows);
};

// What one pass over a shard read so far (Reset zeroes it: after the last
// epoch it describes one whole pass).
struct ReadStats {
  int64_t lines = 0;    // lines (or generated rows) consumed, blank ones too
  int64_t rows = 0;     // rows parsed (through a shuffle buffer: read into it)
  int64_t skipped = 0;  // malformed lines skipped (skip_malformed=true)
  // The skipped line that comes first in the file (0: none): its 1-based
  // line number, file-global when the shard starts at byte 0, counted from
  // the shard's first line otherwise; and the file offset of its first byte
  // (-1: none). In a shuffled read the line number is set once the pass has
  // read the whole shard (0 until then; the byte is set at once).
  int64_t first_bad_line = 0;
  int64_t first_bad_byte = -1;
};

// Reading a shard in a seeded random order (data.shuffle, training.seed,
// data.shuffle_buffer_rows; ShuffleOf in worker/worker_runner.h). The order
// depends only on (seed, epoch, the shard's first byte or row) and these
// sizes, never on timing, so a run is reproducible; each epoch and each seed
// gives another order. Every row of the shard is still read exactly once
// per pass.
struct ShuffleOptions {
  bool enabled = false;  // false: file (or row) order, the rest is ignored
  uint64_t seed = 0;
  int64_t epoch = 0;
  // Text formats: rows held by the shuffle buffer (data/shuffle.h), >= 1.
  int64_t buffer_rows = 10000;
  // Text formats: the size of the byte blocks the shard is cut into, >= 1.
  int64_t block_bytes = int64_t{1} << 20;
};

// Streams rows from one shard of a source. Not thread-safe: one caller.
class RowReader {
 public:
  virtual ~RowReader() = default;

  // Appends up to max_rows rows to *out (existing rows are kept). Returns the
  // number appended; 0 means the shard is exhausted (or max_rows == 0).
  // Errors: a malformed line when skip_malformed=false -> INVALID_ARGUMENT
  // "PATH:LINE: reason" (see OpenLibsvm for how LINE is written); rows parsed
  // before the bad line in this call stay in *out, and the next call resumes
  // after the bad line. A read error -> UNAVAILABLE naming the path.
  virtual absl::StatusOr<size_t> Next(size_t max_rows, RowBlock* out) = 0;

  // Rewinds to the start of the shard and zeroes stats(). Errors as Next.
  virtual absl::Status Reset() = 0;

  virtual const ReadStats& stats() const = 0;

  // The file the rows come from ("" for generated data), for messages.
  virtual const std::string& path() const = 0;
};

// LIBSVM text: "label [qid:N] idx:val idx:val ... [# comment]". Labels are
// numbers, > 0 -> 1, otherwise 0 (so both +1/-1 and 1/0 work). Blank lines and
// comment-only lines are skipped (not rows, not errors); "\r\n" line ends and
// any run of spaces/tabs are accepted; a line with a label and no features is
// a row with no features. Feature key = FeatureKey(idx, 0); values must be
// finite.
//
// Sharding: the reader covers the lines that START in bytes
// [begin_byte, end_byte) of the file (end_byte = -1: to the end of the file).
// For any split of [0, size) into consecutive shards, each line lands in
// exactly one shard. A shard starting past the end of the file is empty.
//
// Error positions: when begin_byte == 0 the line number is file-global and
// 1-based ("a9a.train:17: bad feature 'x:1'"); in other shards the start of the
// line is given as a file-global byte offset ("a9a.train:byte 81234: ...").
//
// Shuffled (`shuffle.enabled`): the shard is cut into blocks of
// shuffle.block_bytes (a line belongs to the block it starts in, as to a
// shard), the blocks are visited in a seeded order (SeededPermutation in
// common/permutation.h), and their rows come out through a shuffle buffer of
// shuffle.buffer_rows rows (NewShuffleBuffer in data/shuffle.h). Memory:
// the 4 MiB read buffer, at most 2 * buffer_rows parsed rows and 8 bytes per
// block; never the whole shard. The error positions are the same (with
// begin_byte == 0 the reader counts the lines before the bad one, reading
// the shard up to it, on the error path only).
//
// Errors from Open: NOT_FOUND (no such file) or UNAVAILABLE (other IO error)
// naming the path; INVALID_ARGUMENT for begin_byte < 0, an end_byte that is
// neither -1 nor >= begin_byte, or (shuffled) buffer_rows or block_bytes < 1.
absl::StatusOr<std::unique_ptr<RowReader>> OpenLibsvm(
    const std::string& path, int64_t begin_byte, int64_t end_byte,
    bool skip_malformed, const ShuffleOptions& shuffle);
// In file order.
absl::StatusOr<std::unique_ptr<RowReader>> OpenLibsvm(const std::string& path,
                                                      int64_t begin_byte,
                                                      int64_t end_byte,
                                                      bool skip_malformed);

// Criteo raw TSV: "label \t I1..I13 \t C1..C26", exactly 40 tab-separated
// fields, any of I/C may be empty (ParseCriteoLine in data/criteo.h). Label:
// 0 or 1 (an integer; > 0 -> 1).
// Integer field i (0-based, 0..12) with value v:
//   key = FeatureKey(bucket, i), value 1, where bucket = v > 2 ?
//   floor(ln(v)^2) : v (negative values keep their own bucket v, as a
//   two's-complement uint64).
// Categorical field j (0-based, 0..25), non-empty string s:
//   key = FeatureKey(HashBytes(s), 13 + j), value 1.
// (CriteoFieldKey.) Empty fields give no feature, so a row has at most 39
// features. Wrong field count, a bad label or a bad integer is a malformed
// line; the reasons are ParseCriteoLine's. Sharding, shuffling, error
// positions and Open errors are as for OpenLibsvm.
absl::StatusOr<std::unique_ptr<RowReader>> OpenCriteo(
    const std::string& path, int64_t begin_byte, int64_t end_byte,
    bool skip_malformed, const ShuffleOptions& shuffle);
// In file order.
absl::StatusOr<std::unique_ptr<RowReader>> OpenCriteo(const std::string& path,
                                                      int64_t begin_byte,
                                                      int64_t end_byte,
                                                      bool skip_malformed);

// Criteo rows WITH field identity, for the MLP: a row has exactly num_fields
// keys, row b's field f being keys[b * num_fields + f].
struct FieldBlock {
  int num_fields = kCriteoNumFields;
  std::vector<uint64_t> keys;
  std::vector<float> labels;  // 0 or 1

  size_t rows() const { return labels.size(); }
  void Clear() {
    keys.clear();
    labels.clear();
  }
  // As RowBlock's: the shuffle buffer's row operations.
  void AppendRow(const FieldBlock& src, size_t row);
  void KeepRows(std::vector<size_t>* rows);
};

// Streams field rows from one shard. Not thread-safe. Semantics of Next and
// Reset as RowReader's: Next appends up to max_rows rows and returns how
// many (0 at the end of the shard).
class FieldReader {
 public:
  virtual ~FieldReader() = default;
  virtual absl::StatusOr<size_t> Next(size_t max_rows, FieldBlock* out) = 0;
  virtual absl::Status Reset() = 0;
  // As RowReader's: counts of the pass so far (Reset zeroes them), and the
  // file read ("" when none). The defaults are for in-memory test readers.
  virtual const ReadStats& stats() const;
  virtual const std::string& path() const;
};

// Criteo TSV as field rows: 39 keys per row, the same keys OpenCriteo gives
// for the present fields (CriteoFieldKey) and MissingFieldKey(f) for an
// empty field f. The same lines are rows, and the same are malformed with
// the same reasons, as for OpenCriteo; sharding, error positions and Open
// errors are as for OpenLibsvm (in file order: shuffling field rows is
// NewFieldShuffleBuffer's, in data/shuffle.h).
absl::StatusOr<std::unique_ptr<FieldReader>> OpenCriteoFields(
    const std::string& path, int64_t begin_byte, int64_t end_byte,
    bool skip_malformed);

// Seeded synthetic data: rows [row_begin, row_end) (row_end = -1: unbounded)
// of an infinite deterministic sequence. Row r depends only on (cfg.seed, r,
// test) and the distribution fields of cfg (not on train_rows/test_rows), so
// shards are reproducible and disjoint, and concatenating the shards of a
// range gives the range. `test` selects a disjoint stream (rows offset by
// 2^40) drawn from the same distribution and true weights.
//
// Each row has min(nnz_per_row, features) distinct feature ids drawn from a
// power law (Zipf-like, exponent zipf_exponent, id 0 the most popular), keys
// FeatureKey(id, 0) in ascending id order, values 1.0. The label is
// Bernoulli(sigmoid(x . w_true)), flipped with probability label_noise, where
// w_true (see SyntheticTrueWeight) has a true_sparsity share of non-zero
// features; the weight scale keeps the Bayes-optimal AUC around 0.85.
//
// Shuffled (`shuffle.enabled`): the same rows in the order of a seeded
// permutation of [row_begin, row_end) (rows are generated by index, so this
// is a uniform shuffle of the whole range in O(1) memory; buffer_rows and
// block_bytes do not apply).
//
// Errors: INVALID_ARGUMENT naming the field for features < 1, nnz_per_row < 1,
// zipf_exponent < 0, true_sparsity or label_noise outside [0, 1], row_begin < 0
// or row_end neither -1 nor >= row_begin, or row_end -1 when shuffled.
absl::StatusOr<std::unique_ptr<RowReader>> OpenSynthetic(
    const SyntheticConfig& cfg, int64_t row_begin, int64_t row_end, bool test,
    const ShuffleOptions& shuffle = {});

// The ground-truth weight of feature id `feature` (in [0, cfg.features)) of
// the synthetic data set cfg; 0 for most features. Deterministic, O(1).
float SyntheticTrueWeight(const SyntheticConfig& cfg, int64_t feature);

// Byte size of a file. NOT_FOUND (missing) or UNAVAILABLE, naming the path.
absl::StatusOr<int64_t> FileSize(const std::string& path);

}  // namespace ps
