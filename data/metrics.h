// Evaluation metrics for binary classifiers.
#pragma once

#include <cstdint>

#include "absl/types/span.h"

namespace ps {

struct EvalMetrics {
  double logloss = 0;   // mean log loss, probabilities clamped to [1e-7, 1-1e-7]
  double auc = 0;       // ROC AUC, ties counted as half (average ranks)
  double accuracy = 0;  // share of rows with (prob >= 0.5) == (label == 1)
  int64_t n = 0;        // rows evaluated
};

// Metrics of predicted probabilities `prob` against labels (0 or 1; > 0.5
// counts as positive). The two spans must have the same size; if they do not,
// only the first min(prob.size(), labels.size()) rows are used (n says how
// many). With n == 0 every metric is NaN; with only one class present, auc is
// NaN. O(n log n); allocates O(n).
EvalMetrics Evaluate(absl::Span<const float> prob, absl::Span<const float> labels);

}  // namespace ps
