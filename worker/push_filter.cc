#include "worker/push_filter.h"

#include <cmath>

#include "common/value_codec.h"

namespace ps {

PushFilterOptions PushFilterOptions::FromConfig(const FilterConfig& c) {
  PushFilterOptions o;
  o.significant_threshold = c.significant_threshold;
  // Names checked by the config parser; an unknown one stays f32 / none.
  ParseValueEncoding(c.value_encoding, &o.encoding);
  ParseValueCodec(c.codec, &o.codec);
  o.error_feedback = c.error_feedback;
  o.zero_held_rows = o.codec != proto::CODEC_NONE;
  return o;
}

void PushFilter::Filter(int table, int dim, absl::Span<const uint64_t> keys,
                        const float* vals, std::vector<uint64_t>* out_keys,
                        std::vector<float>* out_vals,
                        std::vector<uint32_t>* out_slots) {
  out_keys->clear();
  out_vals->clear();
  out_slots->clear();
  const size_t d = static_cast<size_t>(dim);
  if (!options_.keeps_residuals()) {
    out_keys->assign(keys.begin(), keys.end());
    out_vals->assign(vals, vals + keys.size() * d);
    return;
  }
  const float threshold = static_cast<float>(options_.significant_threshold);
  absl::MutexLock l(&mu_);
  if (tables_.size() <= static_cast<size_t>(table)) tables_.resize(table + 1);
  Residuals& r = tables_[table];
  // Pass 1: add each gradient to its key's residual; which rows go.
  std::vector<uint32_t>& slot = *out_slots;
  slot.resize(keys.size());
  significant_.assign(keys.size(), 0);
  size_t kept = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto [it, fresh] =
        r.slot.try_emplace(keys[i], static_cast<uint32_t>(r.rows.size() / d));
    if (fresh) r.rows.resize(r.rows.size() + d, 0.0f);
    slot[i] = it->second;
    float* res = r.rows.data() + static_cast<size_t>(slot[i]) * d;
    const float* g = vals + i * d;
    bool significant = threshold <= 0;
    for (size_t j = 0; j < d; ++j) {
      res[j] += g[j];
      significant |= std::fabs(res[j]) > threshold;
    }
    significant_[i] = significant;
    kept += significant;
  }
  // Zeros in the cached list, or only the rows that go (with their keys).
  const bool zeros =
      options_.zero_held_rows ||
      (options_.key_caching && kept * (sizeof(uint64_t) + 4 * d) >=
                                   keys.size() * 4 * d);
  // Pass 2: the rows that go leave their residual behind.
  out_keys->reserve(zeros ? keys.size() : kept);
  out_vals->reserve((zeros ? keys.size() : kept) * d);
  size_t at = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    float* res = r.rows.data() + static_cast<size_t>(slot[i]) * d;
    if (!significant_[i]) {
      if (!zeros) continue;  // held back: the residual keeps the sum
      out_vals->insert(out_vals->end(), d, 0.0f);
    } else {
      out_vals->insert(out_vals->end(), res, res + d);
      std::fill(res, res + d, 0.0f);
    }
    out_keys->push_back(keys[i]);
    slot[at++] = slot[i];
  }
  slot.resize(at);
}

float PushFilter::Encode(int table, int dim, const uint32_t* slots, size_t n,
                         const float* vals, std::string* out) {
  const size_t d = static_cast<size_t>(dim);
  const size_t count = n * d;
  const float scale = options_.encoding == proto::VALUES_INT8
                          ? Int8Scale(vals, count)
                          : 0.0f;
  const bool feedback = options_.error_feedback && slots != nullptr &&
                        options_.encoding != proto::VALUES_F32;
  if (!feedback) {
    EncodeValues(options_.encoding, vals, count, scale, out, nullptr);
    return scale;
  }
  absl::MutexLock l(&mu_);
  scratch_.assign(count, 0.0f);
  EncodeValues(options_.encoding, vals, count, scale, out, scratch_.data());
  Residuals& r = tables_[table];  // Filter made it
  for (size_t i = 0; i < n; ++i) {
    float* res = r.rows.data() + static_cast<size_t>(slots[i]) * d;
    for (size_t j = 0; j < d; ++j) res[j] += scratch_[i * d + j];
  }
  return scale;
}

size_t PushFilter::residual_keys() const {
  absl::MutexLock l(&mu_);
  size_t n = 0;
  for (const Residuals& r : tables_) n += r.slot.size();
  return n;
}

}  // namespace ps
