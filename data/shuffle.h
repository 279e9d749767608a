// The shuffle buffer the file readers are read through when data.shuffle is
// on (data/data.h, ShuffleOptions): the in-memory half of shuffling data
// larger than memory, after the block-level half (a shard's byte ranges
// visited in a seeded order).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/permutation.h"
#include "data/data.h"

namespace ps {

// Reads `source` through a shuffle buffer of `capacity` rows (>= 1), as
// tf.data's shuffle does: the buffer is kept full from the source, and each
// row handed out is drawn uniformly from it (ShuffleRng(key)). Every row of
// the source comes out exactly once per pass, and none comes out more than
// capacity - 1 places before its place in the source (capacity 1: the
// source's order).
//
// Memory: at most 2 * capacity parsed rows, whatever the source's size (the
// holes rows handed out leave are compacted once there are `capacity` of
// them). Next's errors are the source's; rows the source read before an
// error stay in the buffer and come out later, so a caller that goes on
// after an error (as it may with the source) loses no row. Reset resets the
// source and replays the same order. stats() and path() are the source's:
// stats count rows read from the source, of which up to `capacity` may still
// be in the buffer until the pass ends. Not thread-safe: one caller.
std::unique_ptr<RowReader> NewShuffleBuffer(std::unique_ptr<RowReader> source,
                                            int64_t capacity, uint64_t key);

// The same for field rows (FieldReader): the mlp's half of data.shuffle. A
// source of at most `capacity` rows (a work unit, by default) is permuted
// whole.
std::unique_ptr<FieldReader> NewFieldShuffleBuffer(
    std::unique_ptr<FieldReader> source, int64_t capacity, uint64_t key);

// The buffer itself, for any reader of blocks of rows: Reader has
// Next(size_t, Block*), Reset(), stats() and path() (RowReader,
// FieldReader); Block has rows(), Clear(), AppendRow(const Block&, size_t)
// and KeepRows(std::vector<size_t>*) (RowBlock, FieldBlock).
template <typename Reader, typename Block>
class ShuffleBuffer final : public Reader {
 public:
  ShuffleBuffer(std::unique_ptr<Reader> source, int64_t capacity,
                uint64_t key)
      : source_(std::move(source)),
        capacity_(static_cast<size_t>(std::max<int64_t>(1, capacity))),
        key_(key),
        rng_(key) {}

  absl::StatusOr<size_t> Next(size_t max_rows, Block* out) override {
    size_t appended = 0;
    while (appended < max_rows) {
      if (!source_done_ && slots_.size() < capacity_) {
        // Top the buffer up straight into the arena: no copy per row.
        const size_t before = arena_.rows();
        absl::StatusOr<size_t> n =
            source_->Next(capacity_ - slots_.size(), &arena_);
        for (size_t r = before; r < arena_.rows(); ++r) slots_.push_back(r);
        if (!n.ok()) return n.status();
        if (*n == 0) source_done_ = true;
        continue;
      }
      if (slots_.empty()) break;
      const size_t j = static_cast<size_t>(rng_.Below(slots_.size()));
      out->AppendRow(arena_, slots_[j]);
      slots_[j] = slots_.back();
      slots_.pop_back();
      ++appended;
      if (arena_.rows() >= 2 * capacity_) {
        // Drop the rows already handed out (the live ones keep their
        // relative order; the slots are renumbered to match).
        std::sort(slots_.begin(), slots_.end());
        arena_.KeepRows(&slots_);
      }
    }
    return appended;
  }

  absl::Status Reset() override {
    arena_.Clear();
    slots_.clear();
    source_done_ = false;
    rng_ = ShuffleRng(key_);
    return source_->Reset();
  }

  const ReadStats& stats() const override { return source_->stats(); }
  const std::string& path() const override { return source_->path(); }

 private:
  // Constant after construction.
  const std::unique_ptr<Reader> source_;
  const size_t capacity_;
  const uint64_t key_;

  ShuffleRng rng_;
  Block arena_;                // rows read from the source, some handed out
  std::vector<size_t> slots_;  // the arena rows still in the buffer
  bool source_done_ = false;
};

}  // namespace ps
