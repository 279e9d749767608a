// ps_launch --tune (issue 12): a small search over the optimizer's step size
// and regularisation, scored on a validation split of the training data,
// then the final job with the best setting.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config.h"
#include "deploy/launcher.h"

namespace ps {

// One setting tried: the --set overrides that make it ("optimizer.alpha=2").
struct TuneSetting {
  std::vector<std::string> sets;
};

// The settings `--tune[=trials]` tries for `config`'s optimizer. trials 0:
// a grid of 9, the step size (ftrl: alpha; others: learning_rate) times
// 1/4, 1 and 4 by l2 at the config's value, 1 and 30 (ftrl: l2 weighs
// against the summed loss, LIBLINEAR's 1/C) or 0, 1e-5 and 1e-3 (the
// others: against the mean loss). trials N > 0: N settings drawn
// log-uniformly around those ranges (ftrl also beta and l1), seeded by
// training.seed, the config's own setting first. Deterministic.
std::vector<TuneSetting> TuneSettings(const JobConfig& config, int trials);

// A number field of a report ("validation_auc"); NOT_FOUND when absent.
absl::StatusOr<double> ReportNumber(const std::string& report_text,
                                    const std::string& field);

// Runs ps_launch --tune: every TuneSetting as its own jobs, one per fold
// (options.tune_folds): fold f in RUN_DIR/trial-<i>/fold-<f> (its output in
// launch.log there) with data.validation_fraction 0.1 unless the config
// sets one and training.seed the config's plus f, so each fold holds out
// other rows. A setting scores the mean of its folds' validation log loss
// (lower first; ties: mean validation AUC); prints one line per setting and
// the table, writes the best config (the user's config with the best
// setting; ToYaml) to options.tune_out (default RUN_DIR/tuned.yaml), then
// runs the final job with it in RUN_DIR/final, as ps_launch would, and
// returns that job's exit code. A setting with a failed fold is reported
// and scored last; when every setting fails, returns 1 without a final job.
// Stops (and returns 128+signal) when `*stop` becomes a signal number.
int RunTune(const LaunchOptions& options, const Launcher::Output& out,
            const std::atomic<int>* stop);

}  // namespace ps
