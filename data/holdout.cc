#include "data/holdout.h"

#include <bit>
#include <utility>

#include "common/hash.h"

namespace ps {

bool IsValidationRow(const RowBlock& block, size_t row, uint64_t seed,
                     double fraction) {
  if (fraction <= 0) return false;
  uint64_t h = Mix64(seed ^ 0x76616c6964617465ULL);  // "validate"
  h = Mix64(h ^ std::bit_cast<uint32_t>(block.labels[row]));
  for (int64_t i = block.row_ptr[row]; i < block.row_ptr[row + 1]; ++i) {
    h = Mix64(h ^ block.keys[i]);
    h = Mix64(h ^ std::bit_cast<uint32_t>(block.vals[i]));
  }
  // The top 53 bits as a uniform double in [0, 1).
  return static_cast<double>(h >> 11) * 0x1.0p-53 < fraction;
}

namespace {

class HoldoutReader : public RowReader {
 public:
  HoldoutReader(std::unique_ptr<RowReader> inner, uint64_t seed,
                double fraction, bool keep_validation)
      : inner_(std::move(inner)),
        seed_(seed),
        fraction_(fraction),
        keep_validation_(keep_validation) {}

  absl::StatusOr<size_t> Next(size_t max_rows, RowBlock* out) override {
    size_t appended = 0;
    while (appended == 0 && max_rows > 0) {
      buf_.Clear();
      absl::StatusOr<size_t> n = inner_->Next(max_rows, &buf_);
      // Rows parsed before a bad line still come out, as inner's contract.
      for (size_t i = 0; i < buf_.rows(); ++i) {
        if (IsValidationRow(buf_, i, seed_, fraction_) == keep_validation_) {
          out->AppendRow(buf_, i);
          ++appended;
        }
      }
      if (!n.ok()) return n.status();
      if (*n == 0) break;
    }
    return appended;
  }
  absl::Status Reset() override { return inner_->Reset(); }
  const ReadStats& stats() const override { return inner_->stats(); }
  const std::string& path() const override { return inner_->path(); }

 private:
  const std::unique_ptr<RowReader> inner_;
  const uint64_t seed_;
  const double fraction_;
  const bool keep_validation_;
  RowBlock buf_;
};

}  // namespace

std::unique_ptr<RowReader> NewHoldoutReader(std::unique_ptr<RowReader> inner,
                                            uint64_t seed, double fraction,
                                            bool keep_validation) {
  return std::make_unique<HoldoutReader>(std::move(inner), seed, fraction,
                                         keep_validation);
}

}  // namespace ps
