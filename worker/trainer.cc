#include "worker/trainer.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/hash.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace ps {

proto::SkippedLines SkippedLinesOf(const std::string& path,
                                   const ReadStats& stats) {
  proto::SkippedLines s;
  s.set_path(path);
  s.set_skipped(stats.skipped);
  s.set_first_bad_line(stats.first_bad_line);
  s.set_first_bad_byte(stats.first_bad_byte);
  return s;
}

void ReportSkippedLines(const TrainerStats& stats,
                        proto::WorkerDoneRequest* done) {
  for (const proto::SkippedLines* s :
       {&stats.train_skipped, &stats.test_skipped}) {
    if (s->skipped() == 0) continue;
    // The test file is read whole: its line numbers are the file's.
    const bool test = s == &stats.test_skipped;
    PS_LOG_WARN(
        "{}{}: skipped {} malformed line(s) (data.skip_malformed); the first "
        "at byte {} (line {}{})",
        s->path(), test ? " (test set)" : "", s->skipped(),
        s->first_bad_byte(), s->first_bad_line(),
        test ? "" : " of this worker's part");
    *done->add_skipped_lines() = *s;
  }
}

absl::Status CheckTrainedExamples(int worker_id, const std::string& path,
                                  const ReadStats& stats, int64_t examples) {
  if (examples > 0) return absl::OkStatus();
  const std::string source = path.empty() ? "synthetic data" : path;
  if (stats.lines == 0) {
    // An empty shard: fine when the file itself has data for the others.
    absl::StatusOr<int64_t> size =
        path.empty() ? absl::StatusOr<int64_t>(1) : FileSize(path);
    if (size.ok() && *size > 0) {
      PS_LOG_WARN("W[{}]: my shard of {} holds no line (more workers than "
                  "lines?); trained 0 examples, the other workers train it",
                  worker_id, source);
      return absl::OkStatus();
    }
  }
  return absl::FailedPreconditionError(
      absl::StrCat("W[", worker_id, "] trained 0 examples from ", source, " (",
                   stats.skipped, " lines skipped)"));
}

proto::EvalPoint MakeEvalPoint(absl::Duration elapsed, const EvalMetrics& m,
                               int64_t examples) {
  proto::EvalPoint p;
  p.set_seconds(absl::ToDoubleSeconds(elapsed));
  p.set_logloss(m.logloss);
  p.set_auc(m.auc);
  p.set_examples(examples);
  return p;
}

template <typename Reader, typename Block>
absl::StatusOr<BatchSource::Got> EpochSource::NextFrom(Reader* reader,
                                                       size_t max_rows,
                                                       Block* out,
                                                       int64_t* unit) {
  if (reader == nullptr) {
    return absl::FailedPreconditionError(
        "this EpochSource reads the other kind of rows");
  }
  while (epoch_ < epochs_) {
    PS_ASSIGN_OR_RETURN(size_t n, reader->Next(max_rows, out));
    if (n > 0) {
      *unit = epoch_;
      return Got::kRows;
    }
    if (++epoch_ < epochs_) PS_RETURN_IF_ERROR(reader->Reset());
  }
  return Got::kDone;
}

absl::StatusOr<BatchSource::Got> EpochSource::Next(size_t max_rows,
                                                   RowBlock* out,
                                                   int64_t* unit) {
  return NextFrom(rows_, max_rows, out, unit);
}

absl::StatusOr<BatchSource::Got> EpochSource::Next(size_t max_rows,
                                                   FieldBlock* out,
                                                   int64_t* unit) {
  return NextFrom(fields_, max_rows, out, unit);
}

std::string EpochSource::path() const {
  return rows_ != nullptr ? rows_->path() : fields_->path();
}

ReadStats EpochSource::stats() const {
  return rows_ != nullptr ? rows_->stats() : fields_->stats();
}

proto::SkippedLines EpochSource::skipped() const {
  return SkippedLinesOf(path(), stats());
}

namespace {

// One evaluation at a time, on a thread of its own (the test curve, the
// validation split): evaluating inline stalled this worker's clock for the
// whole data set, and in BSP/SSP every other worker with it (in the
// 4x-straggler benchmark, where worker 0 both straggles and draws the
// curve, that was most of the others' waiting).
class BackgroundEval {
 public:
  // Joins; an error was the training's to report (Join), or it failed.
  ~BackgroundEval() { Join().IgnoreError(); }
  // Runs `fn` on the thread unless an evaluation is still running; then
  // returns false and drops it. `fn` returns its error.
  bool Start(std::function<absl::Status()> fn) {
    absl::MutexLock l(&mu_);
    if (busy_) return false;
    if (thread_.joinable()) thread_.join();  // it is done
    busy_ = true;
    thread_ = std::thread([this, fn = std::move(fn)] {
      absl::Status s = fn();
      absl::MutexLock l(&mu_);
      if (!s.ok() && status_.ok()) status_ = std::move(s);
      busy_ = false;
    });
    return true;
  }
  // Waits for the running evaluation; the first error any returned.
  absl::Status Join() {
    std::thread t;
    {
      absl::MutexLock l(&mu_);
      t = std::move(thread_);
    }
    if (t.joinable()) t.join();
    absl::MutexLock l(&mu_);
    return status_;
  }

 private:
  absl::Mutex mu_;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::thread thread_ ABSL_GUARDED_BY(mu_);
};

// SSP catch-up in the middle of a minibatch (issue 9): a thread keeps one
// ParamClient::WatchOthers outstanding, armed `ahead` clocks past this
// worker's clock, and when the servers answer that the other workers got
// there it runs `skip` (the trainer's catch-up) and arms again. Between
// minibatches the trainer checks as well, but a straggler checking only
// there held the others for as long as its minibatch lasted once they were
// tau ahead: with a 4x straggler at tau 8 on a 2-vCPU VM its minibatch
// lasted 5-8 of theirs, and they were held 5-11 % of the time.
class CatchUpWatch {
 public:
  // `params` and `skip` must outlive the watch; `skip` may run on the
  // watch's thread at any time until the destructor returns.
  CatchUpWatch(ParamClient* params, std::pair<int, uint64_t> key, int64_t ahead,
               std::function<void()> skip)
      : params_(params),
        key_(key),
        ahead_(ahead),
        skip_(std::move(skip)),
        signal_(std::make_shared<Signal>()) {}
  // Stops the thread. A watch still outstanding is answered when this
  // worker finishes (or at its wait) to a callback that only sets a flag.
  ~CatchUpWatch() {
    {
      absl::MutexLock l(&signal_->mu);
      signal_->stop = true;
    }
    if (thread_.joinable()) thread_.join();
  }
  // Starts the thread; false (and nothing started) where the client
  // cannot watch.
  bool Start() {
    if (!Arm()) return false;
    thread_ = std::thread([this] { Run(); });
    return true;
  }

 private:
  // What the watch's callback sets; shared with it, since an answer may
  // come after the watch is gone.
  struct Signal {
    absl::Mutex mu;
    bool fired ABSL_GUARDED_BY(mu) = false;
    bool ok ABSL_GUARDED_BY(mu) = false;
    bool stop ABSL_GUARDED_BY(mu) = false;
  };
  // How long the servers hold a watch nobody gets ahead of (then it is
  // answered and armed again: about one request a second).
  static constexpr absl::Duration kWatchWait = absl::Seconds(1);
  // After a failed watch (a server failing over, say), before the next.
  static constexpr absl::Duration kRetryPause = absl::Milliseconds(100);

  static bool FiredOrStopped(Signal* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
    return s->fired || s->stop;
  }

  bool Arm() {
    // The callback never calls into the client: it may run on this thread,
    // inside WatchOthers, or inside a skip's Clock.
    return params_->WatchOthers(key_.first, key_.second,
                                params_->clock() + ahead_, kWatchWait,
                                [signal = signal_](const absl::Status& s) {
                                  absl::MutexLock l(&signal->mu);
                                  signal->fired = true;
                                  signal->ok = s.ok();
                                });
  }

  void Run() {
    Signal& sig = *signal_;
    for (;;) {
      bool ok;
      {
        absl::MutexLock l(&sig.mu);
        sig.mu.Await(absl::Condition(&FiredOrStopped, &sig));
        if (sig.stop) return;
        ok = sig.ok;
        sig.fired = false;
        if (!ok) {
          sig.mu.AwaitWithTimeout(absl::Condition(&sig.stop), kRetryPause);
          if (sig.stop) return;
        }
      }
      if (ok) skip_();
      if (!Arm()) return;
    }
  }

  ParamClient* const params_;
  const std::pair<int, uint64_t> key_;
  const int64_t ahead_;
  const std::function<void()> skip_;
  const std::shared_ptr<Signal> signal_;
  std::thread thread_;
};

}  // namespace

Trainer::Trainer(int worker_id, const JobConfig& config, ParamClient* params,
                 Model* model)
    : worker_id_(worker_id),
      config_(config),
      params_(params),
      model_(model) {}

absl::Status Trainer::Train(BatchSource* work, EvalFn curve_fn) {
  const TrainingConfig& tc = config_.training;
  PS_RETURN_IF_ERROR(CheckMinibatchResolved(tc));
  const absl::Time start = absl::Now();
  absl::Time last_report = start;
  absl::Time last_eval = start;
  int64_t report_examples = 0;
  double report_loss = 0, report_compute = 0, report_wait = 0;
  const absl::Duration timeout = absl::Seconds(600);
  absl::Mutex curve_mu;
  std::vector<proto::EvalPoint> curve_points;  // guarded by curve_mu
  // Declared after what their threads use: destroyed (joined) first.
  BackgroundEval curve, validation;
  int validation_epoch = 0;  // the last epoch started
  // With a staleness bound of at least one clock, the pull of the next
  // minibatch is sent before this one is computed (declared at the next
  // clock, so the bound still holds); BSP cannot prefetch.
  const bool prefetch = config_.EffectiveTau() != 0;
  // A model that computes while this thread goes on (CUDA's streams).
  const bool pipelined = model_->pipelined();
  // Whether the next minibatch is read before this one's gradient is done.
  const bool read_ahead = prefetch || pipelined;

  struct Slot {
    bool pulled = false;  // a pull was sent and not yet waited for
    size_t rows = 0;
    int64_t unit = -1;
  };
  Slot slots[Model::kSlots];
  std::vector<float> idle_w;
  // Not a structured binding: clang 14 cannot capture one in a lambda.
  const int idle_table = model_->idle_key().first;
  const std::vector<uint64_t> idle_keys = {model_->idle_key().second};
  // An idle step while no unit is free: an empty clock, then a pull at the
  // new clock (which waits as any pull would: BSP/SSP keep this worker in
  // step with the others instead of blocked by it), then a short pause so
  // an ASP worker does not hammer the scheduler.
  auto idle = [&]() -> absl::Status {
    const absl::Time t0 = absl::Now();
    params_->Clock(0);
    const int64_t ts = params_->Pull(idle_table, idle_keys, &idle_w);
    PS_RETURN_IF_ERROR(params_->Wait(ts, absl::Now() + timeout));
    absl::SleepFor(absl::Milliseconds(10));
    stats_.wait_seconds += absl::ToDoubleSeconds(absl::Now() - t0);
    return absl::OkStatus();
  };
  // SSP: skip ahead of a far-behind clock (see the header). An eighth of
  // tau (at least 1): with half (as until 2026-11-25) a 4x straggler let
  // the others get slack + its own step ahead, past tau at 8, and they were
  // held 5-7 % of the time once GetWork stopped waiting for
  // acknowledgements; a quarter held them 2-4 % on the AMD machines but
  // 3.5-10.7 % (median 5.95) on a machine training at half their speed,
  // where the clock the catch-up reads is staler; an eighth 4.4-5.8 % but
  // for one run of 16.3 (median 4.75), same AUC (docs/benchmarks.md,
  // "Where the goals stand"). Only tau >= 8 differs from a quarter.
  const bool catch_up = config_.consistency.mode == Mode::kSsp;
  const int64_t slack = std::max<int64_t>(1, config_.EffectiveTau() / 8);
  // To the reported clock, never beyond: an extrapolated estimate (as
  // 7b820f6 had) overshot, the other workers saw the skipped clocks as
  // progress and skipped further, and the clocks ran away (a9a SSP: 4456
  // clocks for 815 minibatches, jobs 3-5x slower). `from_work` is the
  // scheduler's last GetWork answer (read on this thread only); the
  // heartbeat's and the servers' answers are read here.
  absl::Mutex skip_mu;  // one skip at a time: this thread's or the watch's
  auto skip_to = [&](int64_t from_work) {
    int64_t floor = std::max(from_work, params_->others_min_clock());
    if (others_min_clock_ != nullptr) {
      floor = std::max(floor, others_min_clock_->load());
    }
    absl::MutexLock l(&skip_mu);
    if (floor - params_->clock() <= slack) return;
    // At most 256 clocks in flight at once: a server refuses a clock more
    // than 1000 ahead of this worker's completed ones (CLOCK_TOO_FAR).
    floor = std::min(floor, params_->clock() + 256);
    while (params_->clock() < floor) params_->Clock(0);
  };
  auto skip_ahead = [&]() {
    if (catch_up) skip_to(work->others_min_clock());
  };
  // And in the middle of a minibatch, as soon as the servers say the
  // others are more than `slack` clocks ahead (CatchUpWatch). Declared
  // after what its thread uses: destroyed (joined) first.
  std::optional<CatchUpWatch> watch;
  if (catch_up) {
    watch.emplace(params_, model_->idle_key(), slack + 1,
                  [&skip_to] { skip_to(-1); });
    if (!watch->Start()) watch.reset();
  }
  // Issue 12: a worker that makes few updates per epoch trains a poor model
  // (minibatch 1000 on a small set gave each worker 1 to 7), so the first
  // epoch this worker finishes is checked once: the rows and updates of
  // its units of that epoch.
  struct EpochCount {
    int epoch = -1;
    int64_t updates = 0, rows = 0;
    bool checked = false;
  } counted;
  auto check_updates = [&]() {
    if (counted.checked || counted.epoch < 0) return;
    counted.checked = true;
    stats_.first_epoch = counted.epoch;
    stats_.first_epoch_updates = counted.updates;
    if (counted.updates >= kFewUpdatesPerEpoch) return;
    PS_LOG_WARN(
        "W[{}] made {} updates in epoch {} ({} rows, training.minibatch "
        "{}): with fewer than {} updates per epoch per worker a model "
        "trains poorly; a training.minibatch of at most {} gives {}",
        worker_id_, counted.updates, counted.epoch, counted.rows,
        tc.minibatch, kFewUpdatesPerEpoch,
        std::max<int64_t>(1, counted.rows / kFewUpdatesPerEpoch),
        kFewUpdatesPerEpoch);
  };
  auto count_update = [&](size_t rows) {
    if (counted.checked) return;
    if (counted.epoch >= 0 && work->epoch() != counted.epoch) {
      check_updates();  // the first epoch is over for this worker
      return;
    }
    counted.epoch = work->epoch();
    ++counted.updates;
    counted.rows += static_cast<int64_t>(rows);
  };
  enum class Fill { kHave, kWaiting, kDone };
  // Reads the next minibatch into slot `i`. With `may_idle` (nothing of
  // this worker's is still unpushed), waits out BatchSource::Got::kWait
  // with idle steps; without it, returns kWaiting.
  auto next = [&](int i, bool may_idle) -> absl::StatusOr<Fill> {
    for (;;) {
      PS_ASSIGN_OR_RETURN(
          BatchSource::Got got,
          model_->Read(work, tc.minibatch, i, &slots[i].unit, &slots[i].rows));
      if (got == BatchSource::Got::kRows) {
        count_update(slots[i].rows);
        return Fill::kHave;
      }
      if (got == BatchSource::Got::kDone) return Fill::kDone;
      if (!may_idle) return Fill::kWaiting;
      PS_RETURN_IF_ERROR(idle());
    }
  };
  auto pull = [&](int i, int64_t at_clock) {
    model_->Pull(i, at_clock);
    slots[i].pulled = true;
  };
  int cur = 0;
  PS_ASSIGN_OR_RETURN(Fill first, next(cur, /*may_idle=*/true));
  bool have = first == Fill::kHave;
  if (have) pull(cur, -1);
  while (have) {
    Slot& s = slots[cur];
    const int n = 1 - cur;
    absl::Time t0 = absl::Now();
    if (s.pulled) {
      s.pulled = false;
      PS_RETURN_IF_ERROR(model_->WaitPull(cur, absl::Now() + timeout));
    }
    absl::Time t1 = absl::Now();
    // The worker's own work for the next minibatch (reading and parsing
    // it, sending its prefetch pull) goes before this one's gradient, so
    // the prefetch is in flight while the gradient is computed; on a
    // pipelined model the gradient is submitted first and collected after
    // it, so that work also overlaps the device's copy and kernels. The
    // same weights and batch either way.
    const int64_t clock = params_->clock();
    if (pipelined) PS_RETURN_IF_ERROR(model_->Submit(cur, clock));
    bool have_next = false;
    Fill ahead = Fill::kWaiting;
    if (read_ahead) {
      PS_ASSIGN_OR_RETURN(ahead, next(n, /*may_idle=*/false));
      have_next = ahead == Fill::kHave;
      if (prefetch && have_next) pull(n, clock + 1);
    }
    if (!pipelined) PS_RETURN_IF_ERROR(model_->Submit(cur, clock));
    double loss = 0;
    PS_RETURN_IF_ERROR(model_->Collect(cur, &loss));
    absl::Time t3 = absl::Now();
    work->Pushed(s.unit,
                 model_->PushAndClock(cur, static_cast<int>(s.rows)));
    skip_ahead();
    if (ahead == Fill::kWaiting) {
      // Nothing read ahead (or no unit was free then): read now, after
      // this minibatch's push, idling while no unit is free.
      PS_ASSIGN_OR_RETURN(ahead, next(n, /*may_idle=*/true));
      have_next = ahead == Fill::kHave;
      if (have_next) pull(n, -1);
      t3 = absl::Now();  // reading the next minibatch is worker-local work
    } else if (!prefetch && have_next) {
      pull(n, -1);
      t3 = absl::Now();
    }
    if (worker_id_ == 0 &&
        (tc.straggler_factor > 1.0 || tc.straggler_delay_ms > 0)) {
      // A straggler is slower at all of its local work (data and gradient),
      // by a factor and by a fixed delay per minibatch.
      absl::SleepFor((t3 - t1) * (tc.straggler_factor - 1.0) +
                     absl::Milliseconds(tc.straggler_delay_ms));
      t3 = absl::Now();
    }

    const double wait_s = absl::ToDoubleSeconds(t1 - t0);
    const double compute_s = absl::ToDoubleSeconds(t3 - t1);  // data too
    stats_.wait_seconds += wait_s;
    stats_.compute_seconds += compute_s;
    stats_.examples += s.rows;
    stats_.loss_sum += loss;
    examples_.store(stats_.examples);
    wait_ns_.store(static_cast<int64_t>(stats_.wait_seconds * 1e9));
    compute_ns_.store(static_cast<int64_t>(stats_.compute_seconds * 1e9));
    loss_sum_.store(stats_.loss_sum);
    report_examples += s.rows;
    report_loss += loss;
    report_compute += compute_s;
    report_wait += wait_s;
    cur = n;
    have = have_next;

    const absl::Time now = absl::Now();
    if (now - last_report >= absl::Seconds(tc.progress_interval_s)) {
      const double secs = absl::ToDoubleSeconds(now - last_report);
      const double busy = report_compute + report_wait;
      PS_LOG_INFO(
          "epoch {} clock {}: {:.0f} examples/s, train loss {:.4f}, "
          "compute {:.0f}% / wait {:.0f}%",
          work->epoch(), params_->clock(), report_examples / secs,
          report_loss / std::max<int64_t>(1, report_examples),
          busy > 0 ? 100 * report_compute / busy : 0,
          busy > 0 ? 100 * report_wait / busy : 0);
      last_report = now;
      report_examples = 0;
      report_loss = report_compute = report_wait = 0;
    }
    if (validation_ && work->epoch() > validation_epoch) {
      validation_epoch = work->epoch();
      const int epoch = validation_epoch;
      validation.Start([this, epoch]() -> absl::Status {
        PS_ASSIGN_OR_RETURN(EvalMetrics m, validation_());
        PS_LOG_INFO("validation after {} epochs: AUC {:.4f}, log loss "
                    "{:.4f} ({} rows)",
                    epoch, m.auc, m.logloss, m.n);
        absl::MutexLock v(&validation_mu_);
        validation_point_ = {epoch, m.auc, m.logloss, m.n};
        return absl::OkStatus();
      });
    }
    if (curve_fn && tc.eval_interval_s > 0 &&
        now - last_eval >= absl::Seconds(tc.eval_interval_s)) {
      // A point is stamped with the time and examples when it began.
      const absl::Duration at = now - start;
      const int64_t examples = stats_.examples;
      if (curve.Start([&curve_fn, &curve_mu, &curve_points, at,
                       examples]() -> absl::Status {
            PS_ASSIGN_OR_RETURN(EvalMetrics m, curve_fn());
            absl::MutexLock l(&curve_mu);
            curve_points.push_back(MakeEvalPoint(at, m, examples));
            return absl::OkStatus();
          })) {
        last_eval = now;
      }
    }
  }
  watch.reset();    // no empty clock after the last minibatch's
  check_updates();  // a one-epoch job, or no later unit came
  PS_RETURN_IF_ERROR(validation.Join());
  PS_RETURN_IF_ERROR(curve.Join());
  {
    absl::MutexLock l(&curve_mu);
    for (proto::EvalPoint& p : curve_points) {
      stats_.curve.push_back(std::move(p));
    }
  }
  stats_.wall_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  stats_.train_skipped = work->skipped();
  return absl::OkStatus();
}

}  // namespace ps
