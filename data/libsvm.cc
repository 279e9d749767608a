// Text readers: LIBSVM and Criteo TSV (as feature rows and as field rows),
// over a chunked, sharded line source.
//
// Hot path: a 4 MiB buffer is filled with read(2); lines are string_views
// into it; numbers are parsed with std::from_chars. Nothing is allocated per
// line except on the error path.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/permutation.h"
#include "common/status_macros.h"
#include "data/criteo.h"
#include "data/data.h"
#include "data/shuffle.h"

namespace ps {

void RowBlock::Clear() {
  row_ptr.assign(1, 0);
  keys.clear();
  vals.clear();
  labels.clear();
}

void RowBlock::AppendRow(const RowBlock& src, size_t row) {
  const int64_t b = src.row_ptr[row];
  const int64_t e = src.row_ptr[row + 1];
  keys.insert(keys.end(), src.keys.begin() + b, src.keys.begin() + e);
  vals.insert(vals.end(), src.vals.begin() + b, src.vals.begin() + e);
  labels.push_back(src.labels[row]);
  row_ptr.push_back(static_cast<int64_t>(keys.size()));
}

void RowBlock::KeepRows(std::vector<size_t>* rows) {
  std::vector<int64_t> ptr = {0};
  ptr.reserve(rows->size() + 1);
  int64_t nnz = 0;
  for (size_t i = 0; i < rows->size(); ++i) {
    const size_t r = (*rows)[i];  // r >= i: rows only move down
    const int64_t b = row_ptr[r];
    const int64_t e = row_ptr[r + 1];
    std::copy(keys.begin() + b, keys.begin() + e, keys.begin() + nnz);
    std::copy(vals.begin() + b, vals.begin() + e, vals.begin() + nnz);
    labels[i] = labels[r];
    nnz += e - b;
    ptr.push_back(nnz);
    (*rows)[i] = i;
  }
  keys.resize(static_cast<size_t>(nnz));
  vals.resize(static_cast<size_t>(nnz));
  labels.resize(rows->size());
  row_ptr.swap(ptr);
}

void FieldBlock::AppendRow(const FieldBlock& src, size_t row) {
  const size_t nf = static_cast<size_t>(src.num_fields);
  keys.insert(keys.end(), src.keys.begin() + row * nf,
              src.keys.begin() + (row + 1) * nf);
  labels.push_back(src.labels[row]);
}

void FieldBlock::KeepRows(std::vector<size_t>* rows) {
  const size_t nf = static_cast<size_t>(num_fields);
  for (size_t i = 0; i < rows->size(); ++i) {
    const size_t r = (*rows)[i];  // r >= i: rows only move down
    std::copy(keys.begin() + r * nf, keys.begin() + (r + 1) * nf,
              keys.begin() + i * nf);
    labels[i] = labels[r];
    (*rows)[i] = i;
  }
  keys.resize(rows->size() * nf);
  labels.resize(rows->size());
}

const ReadStats& FieldReader::stats() const {
  static const ReadStats* const kNone = new ReadStats();
  return *kNone;
}

const std::string& FieldReader::path() const {
  static const std::string* const kNone = new std::string();
  return *kNone;
}

namespace {

absl::Status IoError(const std::string& what, const std::string& path, int err) {
  std::string msg = absl::StrCat(path, ": ", what, ": ", std::strerror(err));
  if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(msg);
  return absl::UnavailableError(msg);
}

// A byte buffer that is never zero-filled: read() overwrites it anyway, and
// a 4 MiB std::vector<char> costs 4 MiB of page faults per opened shard
// (found by the fuzz targets: ~4 inputs/s).
class RawBuffer {
 public:
  explicit RawBuffer(size_t n) : data_(new char[n]), size_(n) {}
  char* data() { return data_.get(); }
  size_t size() const { return size_; }
  // Grows to `n` bytes keeping the first `keep`.
  void Grow(size_t n, size_t keep) {
    std::unique_ptr<char[]> bigger(new char[n]);
    std::memcpy(bigger.get(), data_.get(), keep);
    data_ = std::move(bigger);
    size_ = n;
  }

 private:
  std::unique_ptr<char[]> data_;
  size_t size_;
};

// The lines of one byte range of a file (see OpenLibsvm for the rule): a
// shard, or one block of a shard read in a shuffled order.
class LineSource {
 public:
  static constexpr size_t kChunk = 4 << 20;
  // Past the end of the range, read this much at a time to finish its last
  // line (not a whole chunk: a small range would read 4 MiB for nothing).
  static constexpr int64_t kMinRead = 64 << 10;

  LineSource(std::string path, int fd, int64_t begin, int64_t end)
      : path_(std::move(path)), fd_(fd), begin_(begin), end_(end),
        buf_(kChunk) {}
  ~LineSource() { ::close(fd_); }
  LineSource(const LineSource&) = delete;
  LineSource& operator=(const LineSource&) = delete;

  const std::string& path() const { return path_; }
  // 1-based number of the last line returned, counted from the range's first
  // line (file-global iff the range starts at byte 0).
  int64_t line_number() const { return line_number_; }

  // Sets the range to read (end -1: to the end of the file); call Rewind
  // before reading it.
  void SetRange(int64_t begin, int64_t end) {
    begin_ = begin;
    end_ = end;
  }

  // How many lines start before byte `offset` of the file: the number of
  // '\n' in [0, offset). Reads the file up to there (for error messages;
  // not the hot path). Errors: UNAVAILABLE naming the path.
  absl::StatusOr<int64_t> LinesBefore(int64_t offset) const {
    constexpr size_t kBuf = 64 << 10;
    std::unique_ptr<char[]> buf(new char[kBuf]);
    int64_t lines = 0;
    for (int64_t at = 0; at < offset;) {
      const size_t want =
          static_cast<size_t>(std::min<int64_t>(kBuf, offset - at));
      const ssize_t n = ::pread(fd_, buf.get(), want, at);
      if (n < 0) {
        if (errno == EINTR) continue;
        return IoError("read", path_, errno);
      }
      if (n == 0) break;
      lines += std::count(buf.get(), buf.get() + n, '\n');
      at += n;
    }
    return lines;
  }

  // Positions at the first line starting at or after begin_.
  absl::Status Rewind() {
    pos_ = len_ = 0;
    eof_ = done_ = false;
    line_number_ = 0;
    buf_offset_ = begin_ > 0 ? begin_ - 1 : 0;
    if (::lseek(fd_, buf_offset_, SEEK_SET) < 0) {
      return IoError("seek", path_, errno);
    }
    if (begin_ > 0) {
      // Drop everything through the first '\n' at or after begin_-1: the
      // line it ends started before begin_ and belongs to the previous shard.
      while (true) {
        const char* nl = static_cast<const char*>(
            std::memchr(buf_.data() + pos_, '\n', len_ - pos_));
        if (nl != nullptr) {
          pos_ = nl - buf_.data() + 1;
          break;
        }
        if (eof_) {
          pos_ = len_;
          break;
        }
        pos_ = len_;
        PS_RETURN_IF_ERROR(Fill());
      }
    }
    return absl::OkStatus();
  }

  // Sets *line (without "\n") and *offset (its first byte in the file).
  // Returns false at the end of the shard.
  absl::StatusOr<bool> NextLine(std::string_view* line, int64_t* offset) {
    if (done_) return false;
    while (true) {
      const int64_t start = buf_offset_ + static_cast<int64_t>(pos_);
      if (end_ >= 0 && start >= end_) break;
      const char* nl = static_cast<const char*>(
          std::memchr(buf_.data() + pos_, '\n', len_ - pos_));
      if (nl != nullptr) {
        *line = std::string_view(buf_.data() + pos_, nl - (buf_.data() + pos_));
        *offset = start;
        pos_ = nl - buf_.data() + 1;
        ++line_number_;
        return true;
      }
      if (eof_) {
        if (pos_ == len_) break;
        *line = std::string_view(buf_.data() + pos_, len_ - pos_);  // no final '\n'
        *offset = start;
        pos_ = len_;
        ++line_number_;
        return true;
      }
      PS_RETURN_IF_ERROR(Fill());
    }
    done_ = true;
    return false;
  }

 private:
  // Keeps the unread bytes [pos_, len_), moving them to the front (growing
  // the buffer when a single line fills it), and reads more after them.
  absl::Status Fill() {
    if (pos_ > 0) {
      std::memmove(buf_.data(), buf_.data() + pos_, len_ - pos_);
      buf_offset_ += static_cast<int64_t>(pos_);
      len_ -= pos_;
      pos_ = 0;
    }
    if (len_ == buf_.size()) buf_.Grow(buf_.size() * 2, len_);
    size_t want = buf_.size() - len_;
    if (end_ >= 0) {
      const int64_t ahead = end_ - (buf_offset_ + static_cast<int64_t>(len_));
      want = std::min(want,
                      static_cast<size_t>(std::max<int64_t>(ahead, kMinRead)));
    }
    while (true) {
      const ssize_t n = ::read(fd_, buf_.data() + len_, want);
      if (n < 0) {
        if (errno == EINTR) continue;
        return IoError("read", path_, errno);
      }
      if (n == 0) eof_ = true;
      len_ += static_cast<size_t>(n);
      return absl::OkStatus();
    }
  }

  // Constant after construction.
  const std::string path_;
  const int fd_;

  // The range being read (SetRange).
  int64_t begin_;
  int64_t end_;  // -1: end of file

  RawBuffer buf_;
  size_t pos_ = 0;          // next unread byte in buf_
  size_t len_ = 0;          // valid bytes in buf_
  int64_t buf_offset_ = 0;  // file offset of buf_[0]
  bool eof_ = false;
  bool done_ = false;
  int64_t line_number_ = 0;
};

enum class LineKind { kRow, kBlank, kBad };

// A parse function appends one row to *out (returning kRow), returns kBlank
// for a line that holds no row, or kBad with *reason set (and *out untouched).
template <typename Block>
using ParseFn = LineKind (*)(std::string_view line, Block* out,
                             std::string* reason);

inline bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\r'; }

std::string Quote(std::string_view sv) {
  constexpr size_t kMax = 64;
  // absl::string_view is not std::string_view in this Abseil build.
  const absl::string_view s(sv.data(), std::min(sv.size(), kMax));
  return absl::StrCat("'", s, sv.size() > kMax ? "...'" : "'");
}

// Parses all of [b, e) as a finite float (an optional leading '+' allowed).
inline bool ParseFloat(const char* b, const char* e, float* v) {
  // Fast path for one digit ("1", "0"): one-hot data sets are mostly that.
  if (e - b == 1 && *b >= '0' && *b <= '9') {
    *v = static_cast<float>(*b - '0');
    return true;
  }
  if (b < e && *b == '+') ++b;
  if (b == e || *b == '+') return false;
  auto [p, ec] = std::from_chars(b, e, *v);
  return ec == std::errc() && p == e && std::isfinite(*v);
}

// Parses all of [b, e) as an integer (an optional leading '+' allowed).
template <typename Int>
inline bool ParseInt(const char* b, const char* e, Int* v) {
  if (b < e && *b == '+') ++b;
  if (b == e || *b == '+') return false;
  auto [p, ec] = std::from_chars(b, e, *v);
  return ec == std::errc() && p == e;
}

void Rollback(RowBlock* out, size_t nnz) {
  out->keys.resize(nnz);
  out->vals.resize(nnz);
}

LineKind ParseLibsvmLine(std::string_view line, RowBlock* out,
                         std::string* reason) {
  const char* p = line.data();
  const char* e = p + line.size();
  if (const void* hash = std::memchr(p, '#', line.size())) {
    e = static_cast<const char*>(hash);
  }
  while (p < e && IsSpace(*p)) ++p;
  if (p == e) return LineKind::kBlank;
  const char* t = p;
  while (p < e && !IsSpace(*p)) ++p;
  float label;
  if (!ParseFloat(t, p, &label)) {
    *reason = absl::StrCat("bad label ", Quote(std::string_view(t, p - t)));
    return LineKind::kBad;
  }
  const size_t nnz0 = out->keys.size();
  while (true) {
    while (p < e && IsSpace(*p)) ++p;
    if (p == e) break;
    t = p;
    while (p < e && !IsSpace(*p)) ++p;
    const std::string_view tok(t, p - t);
    const char* colon = static_cast<const char*>(std::memchr(t, ':', p - t));
    uint64_t idx;
    float val;
    if (colon == nullptr || !ParseInt(t, colon, &idx) ||
        !ParseFloat(colon + 1, p, &val)) {
      if (colon != nullptr && tok.substr(0, 4) == "qid:") continue;
      Rollback(out, nnz0);
      *reason = absl::StrCat("bad feature ", Quote(tok));
      return LineKind::kBad;
    }
    out->keys.push_back(FeatureKey(idx, 0));
    out->vals.push_back(val);
  }
  out->labels.push_back(label > 0 ? 1.0f : 0.0f);
  out->row_ptr.push_back(static_cast<int64_t>(out->keys.size()));
  return LineKind::kRow;
}

// Criteo as LR's feature rows: the present fields' keys, value 1.
LineKind ParseCriteoRow(std::string_view line, RowBlock* out,
                        std::string* reason) {
  CriteoLine c;
  switch (ParseCriteoLine(line, &c, reason)) {
    case CriteoParse::kBlank:
      return LineKind::kBlank;
    case CriteoParse::kBad:
      return LineKind::kBad;
    case CriteoParse::kRow:
      break;
  }
  for (int f = 0; f < kCriteoNumFields; ++f) {
    if (!c.present(f)) continue;
    out->keys.push_back(CriteoFieldKey(c, f));
    out->vals.push_back(1.0f);
  }
  out->labels.push_back(c.label);
  out->row_ptr.push_back(static_cast<int64_t>(out->keys.size()));
  return LineKind::kRow;
}

// Criteo as the MLP's field rows: a key for every field, present or not.
LineKind ParseCriteoFieldRow(std::string_view line, FieldBlock* out,
                             std::string* reason) {
  CriteoLine c;
  switch (ParseCriteoLine(line, &c, reason)) {
    case CriteoParse::kBlank:
      return LineKind::kBlank;
    case CriteoParse::kBad:
      return LineKind::kBad;
    case CriteoParse::kRow:
      break;
  }
  for (int f = 0; f < kCriteoNumFields; ++f) {
    out->keys.push_back(c.present(f) ? CriteoFieldKey(c, f)
                                     : MissingFieldKey(f));
  }
  out->labels.push_back(c.label);
  return LineKind::kRow;
}

// The lines of a shard cut into blocks (bounds[i], bounds[i+1]) in file
// order (the last bound may be -1: to the end of the file), visited in
// `order` (position -> block; unset: file order).
// Reader is RowReader or FieldReader, Block its block type.
template <typename Reader, typename Block>
class TextReader final : public Reader {
 public:
  TextReader(std::unique_ptr<LineSource> src, ParseFn<Block> parse,
             bool skip_malformed, std::vector<int64_t> bounds,
             std::optional<SeededPermutation> order)
      : src_(std::move(src)),
        parse_(parse),
        skip_malformed_(skip_malformed),
        bounds_(std::move(bounds)),
        order_(std::move(order)),
        block_lines_(bounds_.size() - 1, 0) {}

  absl::StatusOr<size_t> Next(size_t max_rows, Block* out) override {
    size_t appended = 0;
    std::string_view line;
    int64_t offset = 0;
    while (appended < max_rows && !pass_done_) {
      PS_ASSIGN_OR_RETURN(bool more, src_->NextLine(&line, &offset));
      if (!more) {
        PS_RETURN_IF_ERROR(NextBlock());
        continue;
      }
      ++stats_.lines;
      switch (parse_(line, out, &reason_)) {
        case LineKind::kRow:
          ++appended;
          ++stats_.rows;
          break;
        case LineKind::kBlank:
          break;
        case LineKind::kBad:
          if (skip_malformed_) {
            ++stats_.skipped;
            NoteSkipped(offset);
            break;
          }
          return absl::InvalidArgumentError(
              absl::StrCat(Position(offset), ": ", reason_));
      }
    }
    return appended;
  }

  absl::Status Reset() override {
    stats_ = ReadStats();
    visit_ = 0;
    pass_done_ = false;
    bad_block_ = -1;
    return StartBlock();
  }

  const ReadStats& stats() const override { return stats_; }
  const std::string& path() const override { return src_->path(); }

 private:
  size_t blocks() const { return block_lines_.size(); }
  // The block (in file order) at visit position visit_.
  size_t current() const {
    return order_.has_value() ? static_cast<size_t>(order_->At(visit_))
                              : visit_;
  }

  absl::Status StartBlock() {
    const size_t b = current();
    src_->SetRange(bounds_[b], bounds_[b + 1]);
    return src_->Rewind();
  }

  // The current block is read: counts its lines, moves to the next one.
  absl::Status NextBlock() {
    block_lines_[current()] = src_->line_number();
    if (++visit_ < blocks()) return StartBlock();
    pass_done_ = true;
    if (bad_block_ > 0) {
      // Now every block's line count is known.
      int64_t before = 0;
      for (int64_t b = 0; b < bad_block_; ++b) before += block_lines_[b];
      stats_.first_bad_line = before + bad_line_in_block_;
    }
    return absl::OkStatus();
  }

  // A skipped line starting at `offset` of the current block: remembered
  // when it is the earliest in the file so far.
  void NoteSkipped(int64_t offset) {
    if (stats_.first_bad_byte >= 0 && offset > stats_.first_bad_byte) return;
    stats_.first_bad_byte = offset;
    bad_block_ = static_cast<int64_t>(current());
    bad_line_in_block_ = src_->line_number();
    // In the shard's first block the block's count is the shard's; in
    // another it is set when the pass ends (NextBlock).
    stats_.first_bad_line = bad_block_ == 0 ? bad_line_in_block_ : 0;
  }

  // "PATH:LINE" (shard at byte 0) or "PATH:byte N" for the line starting at
  // `offset` of the current block.
  std::string Position(int64_t offset) const {
    if (bounds_[0] != 0) return absl::StrCat(path(), ":byte ", offset);
    if (current() == 0) return absl::StrCat(path(), ":", src_->line_number());
    absl::StatusOr<int64_t> before = src_->LinesBefore(offset);
    if (!before.ok()) return absl::StrCat(path(), ":byte ", offset);
    return absl::StrCat(path(), ":", *before + 1);
  }

  // Constant after construction.
  const std::unique_ptr<LineSource> src_;
  const ParseFn<Block> parse_;
  const bool skip_malformed_;
  const std::vector<int64_t> bounds_;
  const std::optional<SeededPermutation> order_;

  std::vector<int64_t> block_lines_;  // lines per block (file order)
  size_t visit_ = 0;
  bool pass_done_ = false;
  int64_t bad_block_ = -1;  // the block of stats_.first_bad_byte
  int64_t bad_line_in_block_ = 0;
  ReadStats stats_;
  std::string reason_;  // scratch for the error path
};

// The reader, unbuffered: a shuffled one still needs its shuffle buffer.
template <typename Reader, typename Block>
absl::StatusOr<std::unique_ptr<Reader>> OpenText(
    const std::string& path, int64_t begin_byte, int64_t end_byte,
    bool skip_malformed, const ShuffleOptions& shuffle, ParseFn<Block> parse) {
  if (begin_byte < 0 || (end_byte != -1 && end_byte < begin_byte)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": bad byte range [", begin_byte, ", ", end_byte, ")"));
  }
  if (shuffle.enabled && (shuffle.buffer_rows < 1 || shuffle.block_bytes < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": shuffle buffer_rows and block_bytes must be >= 1, got ",
        shuffle.buffer_rows, " and ", shuffle.block_bytes));
  }
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return IoError("open", path, errno);
  auto src = std::make_unique<LineSource>(path, fd, begin_byte, end_byte);
  std::vector<int64_t> bounds = {begin_byte};
  std::optional<SeededPermutation> order;
  if (shuffle.enabled) {
    int64_t end = end_byte;
    if (end < 0) {
      struct stat st;
      if (::fstat(fd, &st) != 0) return IoError("stat", path, errno);
      end = static_cast<int64_t>(st.st_size);
    }
    for (int64_t b = begin_byte + shuffle.block_bytes; b < end;
         b += shuffle.block_bytes) {
      bounds.push_back(b);
    }
    order.emplace(ShuffleKey(shuffle.seed, ShufflePurpose::kBlockOrder,
                             shuffle.epoch, static_cast<uint64_t>(begin_byte)),
                  bounds.size());
  }
  bounds.push_back(end_byte);
  auto reader = std::make_unique<TextReader<Reader, Block>>(
      std::move(src), parse, skip_malformed, std::move(bounds),
      std::move(order));
  PS_RETURN_IF_ERROR(reader->Reset());
  return std::unique_ptr<Reader>(std::move(reader));
}

// Feature rows, through the shuffle buffer when shuffled.
absl::StatusOr<std::unique_ptr<RowReader>> OpenRows(
    const std::string& path, int64_t begin_byte, int64_t end_byte,
    bool skip_malformed, const ShuffleOptions& shuffle,
    ParseFn<RowBlock> parse) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<RowReader> reader,
                      (OpenText<RowReader, RowBlock>(path, begin_byte, end_byte,
                                                     skip_malformed, shuffle,
                                                     parse)));
  if (!shuffle.enabled) return reader;
  return NewShuffleBuffer(
      std::move(reader), shuffle.buffer_rows,
      ShuffleKey(shuffle.seed, ShufflePurpose::kBuffer, shuffle.epoch,
                 static_cast<uint64_t>(begin_byte)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<RowReader>> OpenLibsvm(
    const std::string& path, int64_t begin_byte, int64_t end_byte,
    bool skip_malformed, const ShuffleOptions& shuffle) {
  return OpenRows(path, begin_byte, end_byte, skip_malformed, shuffle,
                  &ParseLibsvmLine);
}

absl::StatusOr<std::unique_ptr<RowReader>> OpenLibsvm(const std::string& path,
                                                      int64_t begin_byte,
                                                      int64_t end_byte,
                                                      bool skip_malformed) {
  return OpenLibsvm(path, begin_byte, end_byte, skip_malformed,
                    ShuffleOptions());
}

absl::StatusOr<std::unique_ptr<RowReader>> OpenCriteo(
    const std::string& path, int64_t begin_byte, int64_t end_byte,
    bool skip_malformed, const ShuffleOptions& shuffle) {
  return OpenRows(path, begin_byte, end_byte, skip_malformed, shuffle,
                  &ParseCriteoRow);
}

absl::StatusOr<std::unique_ptr<RowReader>> OpenCriteo(const std::string& path,
                                                      int64_t begin_byte,
                                                      int64_t end_byte,
                                                      bool skip_malformed) {
  return OpenCriteo(path, begin_byte, end_byte, skip_malformed,
                    ShuffleOptions());
}

absl::StatusOr<std::unique_ptr<FieldReader>> OpenCriteoFields(
    const std::string& path, int64_t begin_byte, int64_t end_byte,
    bool skip_malformed) {
  return OpenText<FieldReader, FieldBlock>(path, begin_byte, end_byte,
                                           skip_malformed, ShuffleOptions(),
                                           &ParseCriteoFieldRow);
}

absl::StatusOr<int64_t> FileSize(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return IoError("stat", path, errno);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  return static_cast<int64_t>(st.st_size);
}

}  // namespace ps
