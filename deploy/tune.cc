#include "deploy/tune.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ps {
namespace {

std::string Fmt(double v) { return absl::StrFormat("%.6g", v); }

// A uniform double in [0, 1) from the top 53 bits: the same on every
// platform (std::uniform_real_distribution is not).
double Uniform(std::mt19937_64* rng) {
  return static_cast<double>((*rng)() >> 11) * 0x1.0p-53;
}
double LogUniform(std::mt19937_64* rng, double lo, double hi) {
  return std::exp(std::log(lo) + Uniform(rng) * (std::log(hi) - std::log(lo)));
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// One setting, run on every fold; its score is the folds' mean.
struct Trial {
  TuneSetting setting;
  bool scored = false;  // every fold ran and reported both figures
  double auc = 0, logloss = 0, seconds = 0;
  std::string error;  // the first failed fold's
};

// Better first: scored before failed, then lower validation log loss, then
// higher AUC. Log loss, not AUC: on a small validation split (criteo-10k's
// 10% is about 800 rows) AUC moved by more between settings than their
// test AUCs did, and picked a step size 0.011 worse on test; log loss, a
// proper score of every probability, ranked them as the test set did.
bool Better(const Trial& a, const Trial& b) {
  if (a.scored != b.scored) return a.scored;
  if (a.logloss != b.logloss) return a.logloss < b.logloss;
  return a.auc > b.auc;
}

}  // namespace

std::vector<TuneSetting> TuneSettings(const JobConfig& config, int trials) {
  const OptimizerConfig& o = config.optimizer;
  const bool ftrl = o.name == "ftrl";
  const std::string step = ftrl ? "optimizer.alpha" : "optimizer.learning_rate";
  const double step0 = ftrl ? o.alpha : o.learning_rate;
  std::vector<TuneSetting> out;
  if (trials <= 0) {
    const std::vector<double> l2s =
        ftrl ? std::vector<double>{o.l2, 1.0, 30.0}
             : std::vector<double>{0.0, 1e-5, 1e-3};
    for (double m : {0.25, 1.0, 4.0}) {
      for (double l2 : l2s) {
        out.push_back({{absl::StrCat(step, "=", Fmt(step0 * m)),
                        absl::StrCat("optimizer.l2=", Fmt(l2))}});
      }
    }
    return out;
  }
  std::mt19937_64 rng(config.training.seed ^ 0x74756e65ULL);  // "tune"
  out.push_back({{absl::StrCat(step, "=", Fmt(step0)),
                  absl::StrCat("optimizer.l2=", Fmt(o.l2))}});
  while (static_cast<int>(out.size()) < trials) {
    TuneSetting s;
    s.sets.push_back(
        absl::StrCat(step, "=", Fmt(LogUniform(&rng, step0 / 8, step0 * 8))));
    if (ftrl) {
      s.sets.push_back(
          absl::StrCat("optimizer.l2=", Fmt(LogUniform(&rng, 1e-3, 100))));
      s.sets.push_back(
          absl::StrCat("optimizer.beta=", Fmt(LogUniform(&rng, 1, 100))));
      const double l1 = Uniform(&rng) < 0.5 ? 0 : LogUniform(&rng, 1e-3, 10);
      s.sets.push_back(absl::StrCat("optimizer.l1=", Fmt(l1)));
    } else {
      const double l2 = Uniform(&rng) < 0.25 ? 0 : LogUniform(&rng, 1e-7, 1e-2);
      s.sets.push_back(absl::StrCat("optimizer.l2=", Fmt(l2)));
    }
    out.push_back(std::move(s));
  }
  return out;
}

absl::StatusOr<double> ReportNumber(const std::string& report_text,
                                    const std::string& field) {
  const std::string key = absl::StrCat("\"", field, "\":");
  size_t at = report_text.find(key);
  if (at == std::string::npos) {
    return absl::NotFoundError(absl::StrCat("no ", field, " in the report"));
  }
  at += key.size();
  while (at < report_text.size() && report_text[at] == ' ') ++at;
  size_t end = at;
  while (end < report_text.size() &&
         std::string_view("0123456789+-.eE\"").find(report_text[end]) !=
             std::string_view::npos) {
    ++end;
  }
  std::string text = report_text.substr(at, end - at);
  text.erase(std::remove(text.begin(), text.end(), '"'), text.end());
  double v = 0;
  if (!absl::SimpleAtod(text, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " in the report is not a number: '", text, "'"));
  }
  return v;
}

int RunTune(const LaunchOptions& options, const Launcher::Output& out,
            const std::atomic<int>* stop) {
  auto say = [&](const std::string& line) {
    out(absl::StrCat("ps_launch: ", line));
  };
  absl::StatusOr<JobConfig> base = CheckLaunch(options, false);
  if (!base.ok()) {
    say(std::string(base.status().message()));
    return kExitUsage;
  }
  if (base->training.model != "logistic_regression") {
    say(absl::StrCat("--tune: tunes logistic_regression, not ",
                     base->training.model));
    return kExitUsage;
  }
  std::string run_dir = options.run_dir;
  if (run_dir.empty()) {
    run_dir = absl::StrCat(
        "runs/tune-",
        absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::LocalTimeZone()),
        "-", getpid());
  }
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  if (ec) {
    say(absl::StrCat("cannot create run dir ", run_dir, ": ", ec.message()));
    return kExitSetupError;
  }
  const double fraction = base->data.validation_fraction > 0
                              ? base->data.validation_fraction
                              : 0.1;
  const std::vector<TuneSetting> settings =
      TuneSettings(*base, options.tune_trials);
  say(absl::StrCat("--tune: ", settings.size(), " trials of ",
                   base->optimizer.name, ", each on ", options.tune_folds,
                   " validation split(s) of ", Fmt(fraction),
                   " of the training rows (", run_dir,
                   "/trial-*/fold-*), best by mean validation log loss"));

  const int folds = std::max(1, options.tune_folds);
  std::vector<Trial> trials;
  for (size_t i = 0; i < settings.size(); ++i) {
    Trial t;
    t.setting = settings[i];
    double auc_sum = 0, logloss_sum = 0;
    int scored_folds = 0;
    std::vector<std::string> fold_figures;
    for (int f = 0; f < folds; ++f) {
      if (stop != nullptr && stop->load() != 0) return 128 + stop->load();
      LaunchOptions o = options;
      o.tune = false;
      o.plot_path.clear();
      o.kills.clear();
      o.restart = false;
      o.add_servers.clear();
      o.add_workers.clear();
      o.drains.clear();
      const std::string dir = absl::StrCat(run_dir, "/trial-", i, "/fold-", f);
      o.run_dir = absl::StrCat(dir, "/run");
      o.report_path = absl::StrCat(dir, "/report.json");
      for (const std::string& s : t.setting.sets) o.overrides.push_back(s);
      o.overrides.push_back(
          absl::StrCat("data.validation_fraction=", Fmt(fraction)));
      // Fold f: its own validation split (and shuffle), seeded seed + f.
      o.overrides.push_back(
          absl::StrCat("training.seed=", base->training.seed + f));
      o.overrides.push_back(absl::StrCat("output.model_dir=", dir, "/model"));
      std::filesystem::create_directories(dir, ec);
      std::ofstream log(absl::StrCat(dir, "/launch.log"));
      const absl::Time t0 = absl::Now();
      int rc;
      {
        Launcher launcher(o, [&log](absl::string_view line) {
          log << line << '\n';
        });
        rc = launcher.Run(stop);
      }
      log.flush();
      t.seconds += absl::ToDoubleSeconds(absl::Now() - t0);
      if (stop != nullptr && stop->load() != 0) return 128 + stop->load();
      const std::string report = ReadText(o.report_path);
      absl::StatusOr<double> auc = ReportNumber(report, "validation_auc");
      absl::StatusOr<double> logloss =
          ReportNumber(report, "validation_logloss");
      if (rc == 0 && auc.ok() && logloss.ok() && std::isfinite(*auc) &&
          std::isfinite(*logloss)) {
        ++scored_folds;
        auc_sum += *auc;
        logloss_sum += *logloss;
        fold_figures.push_back(absl::StrFormat("%.4f/%.4f", *auc, *logloss));
      } else if (t.error.empty()) {
        t.error = rc != 0 ? absl::StrCat("exit ", rc, ", see ", dir,
                                         "/launch.log")
                          : std::string((auc.ok() ? logloss : auc)
                                            .status()
                                            .message());
      }
    }
    t.scored = scored_folds == folds;
    if (t.scored) {
      t.auc = auc_sum / folds;
      t.logloss = logloss_sum / folds;
    }
    say(absl::StrCat(
        "--tune: trial ", i + 1, "/", settings.size(), " ",
        absl::StrJoin(t.setting.sets, " "), ": ",
        t.scored ? absl::StrFormat("validation AUC %.4f, log loss %.4f",
                                   t.auc, t.logloss)
                 : absl::StrCat("failed (", t.error, ")"),
        folds > 1 && t.scored
            ? absl::StrCat(" (mean of ", folds, " splits, AUC/log loss ",
                           absl::StrJoin(fold_figures, " "), ")")
            : "",
        absl::StrFormat(" (%.1fs)", t.seconds)));
    trials.push_back(std::move(t));
  }

  std::vector<size_t> order(trials.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return Better(trials[a], trials[b]);
  });
  say("--tune: trials, best first:");
  out(absl::StrFormat("  %-5s  %-12s  %-12s  %s", "trial", "val AUC",
                      "val logloss", "setting"));
  for (size_t i : order) {
    const Trial& t = trials[i];
    out(absl::StrFormat("  %-5d  %-12s  %-12s  %s", i + 1,
                        t.scored ? absl::StrFormat("%.4f", t.auc) : "failed",
                        t.scored ? absl::StrFormat("%.4f", t.logloss) : "-",
                        absl::StrJoin(t.setting.sets, " ")));
  }
  const Trial& best = trials[order.front()];
  if (!best.scored) {
    say("--tune: every trial failed; no config written");
    return 1;
  }

  LaunchOptions final_options = options;
  final_options.tune = false;
  for (const std::string& s : best.setting.sets) {
    final_options.overrides.push_back(s);
  }
  absl::StatusOr<JobConfig> tuned = CheckLaunch(final_options, false);
  if (!tuned.ok()) {
    say(std::string(tuned.status().message()));
    return kExitUsage;
  }
  const std::string tune_out = options.tune_out.empty()
                                   ? absl::StrCat(run_dir, "/tuned.yaml")
                                   : options.tune_out;
  {
    std::ofstream f(tune_out);
    f << "# Written by ps_launch --tune: " << options.config_path << " with "
      << absl::StrJoin(best.setting.sets, " ") << " (validation AUC "
      << absl::StrFormat("%.4f", best.auc) << ", log loss "
      << absl::StrFormat("%.4f", best.logloss) << ")\n"
      << ToYaml(*tuned);
    if (!f) {
      say(absl::StrCat("--tune: cannot write ", tune_out));
      return kExitSetupError;
    }
  }
  say(absl::StrCat("--tune: best ", absl::StrJoin(best.setting.sets, " "),
                   "; config written to ", tune_out,
                   "; training with it in ", run_dir, "/final"));
  final_options.run_dir = absl::StrCat(run_dir, "/final");
  Launcher launcher(final_options, out);
  return launcher.Run(stop);
}

}  // namespace ps
