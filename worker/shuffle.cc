#include "worker/shuffle.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "common/permutation.h"

namespace ps {
namespace {

class ShuffleBuffer final : public RowReader {
 public:
  ShuffleBuffer(std::unique_ptr<RowReader> source, int64_t capacity,
                uint64_t key)
      : source_(std::move(source)),
        capacity_(static_cast<size_t>(std::max<int64_t>(1, capacity))),
        key_(key),
        rng_(key) {}

  absl::StatusOr<size_t> Next(size_t max_rows, RowBlock* out) override {
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
      if (arena_.rows() >= 2 * capacity_) Compact();
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
  // Drops the rows already handed out from the arena, in place (the live
  // rows keep their relative order; the slots are renumbered to match).
  void Compact() {
    std::sort(slots_.begin(), slots_.end());
    new_ptr_.assign(1, 0);
    int64_t nnz = 0;
    for (size_t i = 0; i < slots_.size(); ++i) {
      const size_t r = slots_[i];  // r >= i: rows only move down
      const int64_t b = arena_.row_ptr[r];
      const int64_t e = arena_.row_ptr[r + 1];
      std::copy(arena_.keys.begin() + b, arena_.keys.begin() + e,
                arena_.keys.begin() + nnz);
      std::copy(arena_.vals.begin() + b, arena_.vals.begin() + e,
                arena_.vals.begin() + nnz);
      arena_.labels[i] = arena_.labels[r];
      nnz += e - b;
      new_ptr_.push_back(nnz);
      slots_[i] = i;
    }
    arena_.keys.resize(static_cast<size_t>(nnz));
    arena_.vals.resize(static_cast<size_t>(nnz));
    arena_.labels.resize(slots_.size());
    arena_.row_ptr.swap(new_ptr_);
  }

  // Constant after construction.
  const std::unique_ptr<RowReader> source_;
  const size_t capacity_;
  const uint64_t key_;

  ShuffleRng rng_;
  RowBlock arena_;             // rows read from the source, some handed out
  std::vector<size_t> slots_;  // the arena rows still in the buffer
  bool source_done_ = false;
  std::vector<int64_t> new_ptr_;  // Compact's scratch
};

}  // namespace

std::unique_ptr<RowReader> NewShuffleBuffer(std::unique_ptr<RowReader> source,
                                            int64_t capacity, uint64_t key) {
  return std::make_unique<ShuffleBuffer>(std::move(source), capacity, key);
}

}  // namespace ps
