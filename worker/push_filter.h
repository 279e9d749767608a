// What a worker's pushes leave out, and how their values travel (issue 10:
// the paper's sections 3.6 and 4.2; docs/filters.md).
//
// - The significantly-modified filter holds back a key's row while no
//   element of (its gradient + what was held back) exceeds a threshold.
// - f16 / int8 value encodings lose each value's rounding error, which
//   error feedback adds to the key's next push.
// Both keep what they held back per key: a residual that the key's next
// push adds to its gradient, so nothing is lost, only delayed. Residuals
// take dim floats per key this worker ever pushed with a filter or an
// encoding on (bounded by the share of the model the worker touches).
//
// The KKT filter needs the pulled weights and lives with the model
// (models/logistic.h); the general compressor is applied by KVWorker to a
// request's encoded values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/config.h"
#include "proto/ps.pb.h"

namespace ps {

struct PushFilterOptions {
  double significant_threshold = 0;  // 0: off
  // Held-back rows are sent as zeros instead of being left out: the key
  // list stays the one the pull sent, so key caching still names it, and
  // the codec squeezes the zeros. On whenever a codec is (FromConfig).
  bool zero_held_rows = false;
  // Without zero_held_rows: whether the servers keep the pull's key list
  // (cluster.key_caching). Then a push leaves rows out only when that is
  // smaller even with its keys resent (kept * (8 + 4 dim) < all * 4 dim
  // bytes), and otherwise sends the held-back rows as zeros.
  bool key_caching = true;
  proto::ValueEncoding encoding = proto::VALUES_F32;
  proto::ValueCodec codec = proto::CODEC_NONE;
  bool error_feedback = true;

  // Whether pushes need residuals (a filter, or a lossy encoding with error
  // feedback).
  bool keeps_residuals() const {
    return significant_threshold > 0 ||
           (error_feedback && encoding != proto::VALUES_F32);
  }
  // The config's `filters` section (already validated).
  static PushFilterOptions FromConfig(const FilterConfig& c);
};

// Thread-safe.
class PushFilter {
 public:
  explicit PushFilter(PushFilterOptions options) : options_(options) {}

  const PushFilterOptions& options() const { return options_; }

  // The rows of `keys` (ascending; vals: keys.size() * dim floats) to send:
  // each key's gradient plus its residual, without the rows the
  // significance filter holds back (they become the residuals), or with
  // them as zeros (zero_held_rows, or key caching when that is smaller). Replaces
  // *out_keys, *out_vals, and *out_slots (each sent key's residual slot,
  // for Encode; empty when no residuals are kept).
  void Filter(int table, int dim, absl::Span<const uint64_t> keys,
              const float* vals, std::vector<uint64_t>* out_keys,
              std::vector<float>* out_vals, std::vector<uint32_t>* out_slots);

  // Appends n rows of dim values (the keys with residual slots `slots`,
  // from Filter; may be null without residuals) to *out in the encoding.
  // Returns the int8 scale of the rows (0 for other encodings). Adds the
  // rounding errors to the keys' residuals (error feedback).
  float Encode(int table, int dim, const uint32_t* slots, size_t n,
               const float* vals, std::string* out);

  // Keys with a residual (for tests and logs).
  size_t residual_keys() const;

 private:
  struct Residuals {
    absl::flat_hash_map<uint64_t, uint32_t> slot;  // key -> row
    std::vector<float> rows;                       // dim floats per row
  };

  const PushFilterOptions options_;
  mutable absl::Mutex mu_;
  std::vector<Residuals> tables_ ABSL_GUARDED_BY(mu_);  // by table id
  std::vector<float> scratch_ ABSL_GUARDED_BY(mu_);     // Encode's errors
  std::vector<char> significant_ ABSL_GUARDED_BY(mu_);  // Filter's pass 1
};

}  // namespace ps
