#include "data/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

namespace ps {

EvalMetrics Evaluate(absl::Span<const float> prob, absl::Span<const float> labels) {
  EvalMetrics m;
  const size_t n = std::min(prob.size(), labels.size());
  m.n = static_cast<int64_t>(n);
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  if (n == 0) {
    m.logloss = m.auc = m.accuracy = kNaN;
    return m;
  }
  constexpr double kEps = 1e-7;
  double loss = 0;
  int64_t correct = 0;
  int64_t positives = 0;
  for (size_t i = 0; i < n; ++i) {
    const bool y = labels[i] > 0.5f;
    const double p = std::clamp<double>(prob[i], kEps, 1.0 - kEps);
    loss -= y ? std::log(p) : std::log1p(-p);
    correct += ((prob[i] >= 0.5f) == y);
    positives += y;
  }
  m.logloss = loss / static_cast<double>(n);
  m.accuracy = static_cast<double>(correct) / static_cast<double>(n);

  const int64_t negatives = static_cast<int64_t>(n) - positives;
  if (positives == 0 || negatives == 0) {
    m.auc = kNaN;
    return m;
  }
  // Mann-Whitney U: sum of the positives' (1-based, tie-averaged) ranks.
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(),
            [&](uint32_t a, uint32_t b) { return prob[a] < prob[b]; });
  double rank_sum = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    int64_t pos_in_group = 0;
    while (j < n && prob[order[j]] == prob[order[i]]) {
      pos_in_group += labels[order[j]] > 0.5f;
      ++j;
    }
    const double avg_rank = 0.5 * static_cast<double>(i + 1 + j);  // (i+1 + j)/2
    rank_sum += avg_rank * static_cast<double>(pos_in_group);
    i = j;
  }
  const double p = static_cast<double>(positives);
  m.auc = (rank_sum - p * (p + 1) / 2) / (p * static_cast<double>(negatives));
  return m;
}

}  // namespace ps
