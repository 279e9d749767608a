// The seeded synthetic data generator (see OpenSynthetic in data.h).
//
// Everything is counter-based: row r's random stream is seeded by
// Mix64(seed, r), and feature f's true weight by Mix64(seed, f), so any shard
// can be generated independently and nothing grows with the feature count.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/permutation.h"
#include "data/data.h"

namespace ps {
namespace {

constexpr int64_t kTestRowOffset = int64_t{1} << 40;
constexpr uint64_t kRowSalt = 0x5eed0f00d1234567ULL;
constexpr uint64_t kWeightSalt = 0x7a11e5c0ffee0001ULL;
// Scale of the true margin x . w_true: the weights' sigma is this over
// sqrt(expected non-zero weights per row). Measured with the default config,
// 3.5 gives a Bayes-optimal AUC of about 0.86 (data_test prints it).
constexpr double kMarginStd = 3.5;

// A splitmix64 stream.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    return Mix64(state_);
  }
  // Uniform in [0, 1).
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

inline double ToUniform(uint64_t h) {
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

double WeightScale(const SyntheticConfig& cfg) {
  const double per_row =
      std::min<double>(cfg.nnz_per_row, static_cast<double>(cfg.features)) *
      cfg.true_sparsity;
  return kMarginStd / std::sqrt(std::max(per_row, 1e-9));
}

float TrueWeight(const SyntheticConfig& cfg, double scale, int64_t feature) {
  const uint64_t h = Mix64(Mix64(cfg.seed ^ kWeightSalt) ^
                           Mix64(static_cast<uint64_t>(feature)));
  if (ToUniform(h) >= cfg.true_sparsity) return 0.0f;
  // Box-Muller from two more hashes.
  const double u1 = ToUniform(Mix64(h ^ 1)) + 0x1.0p-54;  // (0, 1)
  const double u2 = ToUniform(Mix64(h ^ 2));
  const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  return static_cast<float>(scale * z);
}

class SyntheticReader final : public RowReader {
 public:
  // `order` (unset: row order) permutes [0, row_end - row_begin).
  SyntheticReader(const SyntheticConfig& cfg, int64_t row_begin,
                  int64_t row_end, bool test,
                  std::optional<SeededPermutation> order)
      : cfg_(cfg),
        row_begin_(row_begin),
        row_end_(row_end),
        stream_offset_(test ? kTestRowOffset : 0),
        order_(std::move(order)),
        k_(static_cast<int>(std::min<int64_t>(cfg.nnz_per_row, cfg.features))),
        scale_(WeightScale(cfg)),
        next_row_(row_begin) {
    const double n = static_cast<double>(cfg.features);
    one_minus_s_ = 1.0 - cfg.zipf_exponent;
    log_span_ = std::log(n + 1.0);
    if (std::abs(one_minus_s_) > 1e-9) {
      span_ = std::pow(n + 1.0, one_minus_s_) - 1.0;
    }
    ids_.reserve(k_);
  }

  absl::StatusOr<size_t> Next(size_t max_rows, RowBlock* out) override {
    size_t appended = 0;
    while (appended < max_rows && (row_end_ < 0 || next_row_ < row_end_)) {
      const int64_t row =
          order_.has_value()
              ? row_begin_ + static_cast<int64_t>(order_->At(
                                 static_cast<uint64_t>(next_row_ - row_begin_)))
              : next_row_;
      GenerateRow(row + stream_offset_, out);
      ++next_row_;
      ++appended;
    }
    stats_.lines += static_cast<int64_t>(appended);
    stats_.rows += static_cast<int64_t>(appended);
    return appended;
  }

  absl::Status Reset() override {
    next_row_ = row_begin_;
    stats_ = ReadStats();
    return absl::OkStatus();
  }

  const ReadStats& stats() const override { return stats_; }
  const std::string& path() const override {
    static const std::string* const kNone = new std::string();
    return *kNone;
  }

 private:
  // A feature id from the power law: a continuous density x^-s on
  // [1, features+1), inverted in closed form, floored to a rank.
  int64_t DrawFeature(Rng* rng) const {
    const double u = rng->Uniform();
    double x;
    if (std::abs(one_minus_s_) > 1e-9) {
      x = std::pow(1.0 + u * span_, 1.0 / one_minus_s_);
    } else {
      x = std::exp(u * log_span_);
    }
    const int64_t id = static_cast<int64_t>(x) - 1;
    return std::clamp<int64_t>(id, 0, cfg_.features - 1);
  }

  // Rows of at most this many ids are drawn unsorted (a scan of the ids so
  // far finds a repeat) and sorted once drawn; longer ones are kept sorted
  // while drawn (a binary search finds a repeat). The same ids either way:
  // the scan was cheaper than a sorted insert per id (7 % of a scale.yaml
  // job's CPU).
  static constexpr int kScanIds = 64;

  // Adds id to ids_ unless present.
  void Insert(int64_t id) {
    if (k_ <= kScanIds) {
      bool present = false;  // no early exit: the loop vectorises
      for (int64_t x : ids_) present |= x == id;
      if (!present) ids_.push_back(id);
      return;
    }
    auto it = std::lower_bound(ids_.begin(), ids_.end(), id);
    if (it != ids_.end() && *it == id) return;
    ids_.insert(it, id);
  }

  void GenerateRow(int64_t global_row, RowBlock* out) {
    Rng rng(Mix64(cfg_.seed ^ kRowSalt) ^ Mix64(static_cast<uint64_t>(global_row)));
    ids_.clear();
    // Popular ids repeat; after enough tries fill up with the next free ids
    // after a random one, which always terminates (k_ <= features).
    for (int tries = 0; static_cast<int>(ids_.size()) < k_ && tries < 16 * k_;
         ++tries) {
      Insert(DrawFeature(&rng));
    }
    int64_t probe = static_cast<int64_t>(rng.Next() % cfg_.features);
    while (static_cast<int>(ids_.size()) < k_) {
      Insert(probe);
      probe = probe + 1 == cfg_.features ? 0 : probe + 1;
    }
    if (k_ <= kScanIds) std::sort(ids_.begin(), ids_.end());
    double margin = 0;
    for (int64_t id : ids_) {
      margin += TrueWeight(cfg_, scale_, id);
      out->keys.push_back(FeatureKey(static_cast<uint64_t>(id), 0));
      out->vals.push_back(1.0f);
    }
    const double p = margin >= 0 ? 1.0 / (1.0 + std::exp(-margin))
                                 : std::exp(margin) / (1.0 + std::exp(margin));
    bool y = rng.Uniform() < p;
    if (rng.Uniform() < cfg_.label_noise) y = !y;
    out->labels.push_back(y ? 1.0f : 0.0f);
    out->row_ptr.push_back(static_cast<int64_t>(out->keys.size()));
  }

  // Constant after construction.
  const SyntheticConfig cfg_;
  const int64_t row_begin_;
  const int64_t row_end_;  // -1: unbounded
  const int64_t stream_offset_;
  const std::optional<SeededPermutation> order_;
  const int k_;
  const double scale_;
  double one_minus_s_ = 0;
  double span_ = 0;
  double log_span_ = 0;

  int64_t next_row_;
  std::vector<int64_t> ids_;  // scratch: the current row's ids (see Insert)
  ReadStats stats_;
};

}  // namespace

float SyntheticTrueWeight(const SyntheticConfig& cfg, int64_t feature) {
  return TrueWeight(cfg, WeightScale(cfg), feature);
}

absl::StatusOr<std::unique_ptr<RowReader>> OpenSynthetic(
    const SyntheticConfig& cfg, int64_t row_begin, int64_t row_end, bool test,
    const ShuffleOptions& shuffle) {
  if (cfg.features < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("synthetic.features: must be >= 1, got ", cfg.features));
  }
  if (cfg.nnz_per_row < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "synthetic.nnz_per_row: must be >= 1, got ", cfg.nnz_per_row));
  }
  if (!(cfg.zipf_exponent >= 0) || !std::isfinite(cfg.zipf_exponent)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "synthetic.zipf_exponent: must be >= 0, got ", cfg.zipf_exponent));
  }
  if (!(cfg.true_sparsity >= 0 && cfg.true_sparsity <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "synthetic.true_sparsity: must be in [0, 1], got ", cfg.true_sparsity));
  }
  if (!(cfg.label_noise >= 0 && cfg.label_noise <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "synthetic.label_noise: must be in [0, 1], got ", cfg.label_noise));
  }
  if (row_begin < 0 || (row_end != -1 && row_end < row_begin) ||
      row_begin >= kTestRowOffset || row_end > kTestRowOffset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "synthetic: bad row range [", row_begin, ", ", row_end, ")"));
  }
  std::optional<SeededPermutation> order;
  if (shuffle.enabled) {
    if (row_end < 0) {
      return absl::InvalidArgumentError(
          "synthetic: an unbounded row range cannot be shuffled");
    }
    order.emplace(ShuffleKey(shuffle.seed, ShufflePurpose::kRowOrder,
                             shuffle.epoch, static_cast<uint64_t>(row_begin)),
                  static_cast<uint64_t>(row_end - row_begin));
  }
  return std::unique_ptr<RowReader>(std::make_unique<SyntheticReader>(
      cfg, row_begin, row_end, test, std::move(order)));
}

}  // namespace ps
