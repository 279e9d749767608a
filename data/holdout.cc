#include "data/holdout.h"

#include <bit>
#include <utility>

#include "common/hash.h"

namespace ps {

namespace {
// The top 53 bits of `h` as a uniform double in [0, 1), below `fraction`.
bool Below(uint64_t h, double fraction) {
  return static_cast<double>(h >> 11) * 0x1.0p-53 < fraction;
}
}  // namespace

bool IsValidationRow(const RowBlock& block, size_t row, uint64_t seed,
                     double fraction) {
  if (fraction <= 0) return false;
  uint64_t h = Mix64(seed ^ 0x76616c6964617465ULL);  // "validate"
  h = Mix64(h ^ std::bit_cast<uint32_t>(block.labels[row]));
  for (int64_t i = block.row_ptr[row]; i < block.row_ptr[row + 1]; ++i) {
    h = Mix64(h ^ block.keys[i]);
    h = Mix64(h ^ std::bit_cast<uint32_t>(block.vals[i]));
  }
  return Below(h, fraction);
}

bool IsValidationRow(const FieldBlock& block, size_t row, uint64_t seed,
                     double fraction) {
  if (fraction <= 0) return false;
  uint64_t h = Mix64(seed ^ 0x76616c6964617465ULL);  // "validate"
  h = Mix64(h ^ std::bit_cast<uint32_t>(block.labels[row]));
  const size_t f = static_cast<size_t>(block.num_fields);
  for (size_t i = row * f; i < (row + 1) * f; ++i) h = Mix64(h ^ block.keys[i]);
  return Below(h, fraction);
}

namespace {

// One side of the split of `Reader`'s rows (RowReader, FieldReader).
template <typename Reader, typename Block>
class HoldoutReader : public Reader {
 public:
  HoldoutReader(std::unique_ptr<Reader> inner, uint64_t seed,
                double fraction, bool keep_validation)
      : inner_(std::move(inner)),
        seed_(seed),
        fraction_(fraction),
        keep_validation_(keep_validation) {}

  absl::StatusOr<size_t> Next(size_t max_rows, Block* out) override {
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
  const std::unique_ptr<Reader> inner_;
  const uint64_t seed_;
  const double fraction_;
  const bool keep_validation_;
  Block buf_;
};

}  // namespace

std::unique_ptr<RowReader> NewHoldoutReader(std::unique_ptr<RowReader> inner,
                                            uint64_t seed, double fraction,
                                            bool keep_validation) {
  return std::make_unique<HoldoutReader<RowReader, RowBlock>>(
      std::move(inner), seed, fraction, keep_validation);
}

std::unique_ptr<FieldReader> NewFieldHoldoutReader(
    std::unique_ptr<FieldReader> inner, uint64_t seed, double fraction,
    bool keep_validation) {
  return std::make_unique<HoldoutReader<FieldReader, FieldBlock>>(
      std::move(inner), seed, fraction, keep_validation);
}

}  // namespace ps
