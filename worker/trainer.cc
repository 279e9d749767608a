#include "worker/trainer.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/hash.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace ps {

uint64_t BiasKey() { return FeatureKey(0, 0xb1a5); }

void BuildBatch(const RowBlock& block, size_t first, size_t last,
                CsrBatch* batch) {
  batch->Clear();
  const int64_t nz_begin = block.row_ptr[first];
  const int64_t nz_end = block.row_ptr[last];
  const uint64_t bias = BiasKey();
  batch->keys.assign(block.keys.begin() + nz_begin,
                     block.keys.begin() + nz_end);
  batch->keys.push_back(bias);
  std::sort(batch->keys.begin(), batch->keys.end());
  batch->keys.erase(std::unique(batch->keys.begin(), batch->keys.end()),
                    batch->keys.end());
  const auto col_of = [&](uint64_t k) {
    return static_cast<uint32_t>(
        std::lower_bound(batch->keys.begin(), batch->keys.end(), k) -
        batch->keys.begin());
  };
  const uint32_t bias_col = col_of(bias);
  batch->row_ptr.assign(1, 0);
  batch->cols.reserve(nz_end - nz_begin + (last - first));
  batch->vals.reserve(nz_end - nz_begin + (last - first));
  for (size_t r = first; r < last; ++r) {
    for (int64_t j = block.row_ptr[r]; j < block.row_ptr[r + 1]; ++j) {
      batch->cols.push_back(col_of(block.keys[j]));
      batch->vals.push_back(block.vals[j]);
    }
    batch->cols.push_back(bias_col);
    batch->vals.push_back(1.0f);
    batch->row_ptr.push_back(static_cast<int64_t>(batch->cols.size()));
    batch->labels.push_back(block.labels[r]);
  }
}

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

Trainer::Trainer(int worker_id, const JobConfig& config, KVWorker* kv,
                 ComputeBackend* backend)
    : worker_id_(worker_id), config_(config), kv_(kv), backend_(backend) {}

absl::Status Trainer::Train(WorkSource* work, RowReader* eval) {
  const TrainingConfig& tc = config_.training;
  PS_RETURN_IF_ERROR(CheckMinibatchResolved(tc));
  const absl::Time start = absl::Now();
  absl::Time last_report = start;
  absl::Time last_eval = start;
  int64_t report_examples = 0;
  double report_loss = 0, report_compute = 0, report_wait = 0;
  const absl::Duration timeout = absl::Seconds(600);
  // Before `curve`: its thread uses it until the curve's destructor joins.
  std::unique_ptr<ComputeBackend> curve_backend;
  // The test curve is evaluated beside training, on a thread of its own
  // with a CPU backend of its own: evaluating inline stalled this worker's
  // clock for the whole test set, and in BSP/SSP every other worker with it
  // (in the 4x-straggler benchmark, where worker 0 both straggles and draws
  // the curve, that was most of the others' waiting). One evaluation at a
  // time; a point is stamped with the time and examples when it began.
  struct Curve {
    absl::Mutex mu;
    bool busy ABSL_GUARDED_BY(mu) = false;
    std::vector<proto::EvalPoint> points ABSL_GUARDED_BY(mu);
    absl::Status status ABSL_GUARDED_BY(mu);
    std::thread thread;
    ~Curve() {
      if (thread.joinable()) thread.join();
    }
  } curve;
  // Epoch-start validation (set_validation), on a thread of its own with a
  // CPU backend of its own, as the curve.
  std::unique_ptr<ComputeBackend> validation_backend;
  struct Validation {
    absl::Mutex mu;
    bool busy ABSL_GUARDED_BY(mu) = false;
    absl::Status status ABSL_GUARDED_BY(mu);
    int last_epoch = 0;  // the training thread's: the last epoch started
    std::thread thread;
    ~Validation() {
      if (thread.joinable()) thread.join();
    }
  } validation;
  // With a staleness bound of at least one clock, the pull of the next
  // minibatch is sent before this one is computed (declared at the next
  // clock, so the bound still holds); BSP cannot prefetch.
  const bool prefetch = config_.EffectiveTau() != 0;
  // A backend that computes while this thread goes on (CUDA's streams).
  const bool pipelined = backend_->pipelined();
  // Whether the next minibatch is read before this one's gradient is done.
  const bool read_ahead = prefetch || pipelined;

  struct Slot {
    CsrBatch batch;
    std::vector<float> w;
    int64_t ts = -1;
    size_t rows = 0;
    int64_t unit = -1;
  };
  Slot slots[2];
  RowBlock block;
  std::vector<float> idle_w;
  const std::vector<uint64_t> idle_keys = {BiasKey()};
  // An idle step while no unit is free: an empty clock, then a pull at the
  // new clock (which waits as any pull would: BSP/SSP keep this worker in
  // step with the others instead of blocked by it), then a short pause so
  // an ASP worker does not hammer the scheduler.
  auto idle = [&]() -> absl::Status {
    const absl::Time t0 = absl::Now();
    kv_->Clock(0);
    const int64_t ts = kv_->Pull(0, idle_keys, &idle_w);
    PS_RETURN_IF_ERROR(kv_->Wait(ts, absl::Now() + timeout));
    absl::SleepFor(absl::Milliseconds(10));
    stats_.wait_seconds += absl::ToDoubleSeconds(absl::Now() - t0);
    return absl::OkStatus();
  };
  // SSP: skip ahead of a far-behind clock (see the header).
  const bool catch_up = config_.consistency.mode == Mode::kSsp;
  const int64_t slack = std::max<int64_t>(1, config_.EffectiveTau() / 2);
  // To the reported clock, never beyond: an extrapolated estimate (as
  // 7b820f6 had) overshot, the other workers saw the skipped clocks as
  // progress and skipped further, and the clocks ran away (a9a SSP: 4456
  // clocks for 815 minibatches, jobs 3-5x slower).
  auto skip_ahead = [&]() {
    if (!catch_up) return;
    int64_t floor = work->others_min_clock();
    if (others_min_clock_ != nullptr) {
      floor = std::max(floor, others_min_clock_->load());
    }
    if (floor - kv_->clock() <= slack) return;
    // At most 256 clocks in flight at once: a server refuses a clock more
    // than 1000 ahead of this worker's completed ones (CLOCK_TOO_FAR).
    floor = std::min(floor, kv_->clock() + 256);
    while (kv_->clock() < floor) kv_->Clock(0);
  };
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
  // Reads the next minibatch into `s`. With `may_idle` (nothing of this
  // worker's is still unpushed), waits out WorkSource::kWait with idle
  // steps; without it, returns kWaiting.
  auto next = [&](Slot* s, bool may_idle) -> absl::StatusOr<Fill> {
    for (;;) {
      block.Clear();
      PS_ASSIGN_OR_RETURN(WorkSource::Got got,
                          work->Next(tc.minibatch, &block, &s->unit));
      if (got == WorkSource::Got::kRows) {
        BuildBatch(block, 0, block.rows(), &s->batch);
        s->rows = block.rows();
        count_update(s->rows);
        return Fill::kHave;
      }
      if (got == WorkSource::Got::kDone) return Fill::kDone;
      if (!may_idle) return Fill::kWaiting;
      PS_RETURN_IF_ERROR(idle());
    }
  };
  std::vector<float> grad;
  int cur = 0;
  PS_ASSIGN_OR_RETURN(Fill first, next(&slots[cur], /*may_idle=*/true));
  bool have = first == Fill::kHave;
  if (have) slots[cur].ts = kv_->Pull(0, slots[cur].batch.keys, &slots[cur].w);
  while (have) {
    Slot& s = slots[cur];
    Slot& n = slots[1 - cur];
    absl::Time t0 = absl::Now();
    // ts < 0: its pull was already waited for (before an evaluation).
    if (s.ts >= 0) PS_RETURN_IF_ERROR(kv_->Wait(s.ts, absl::Now() + timeout));
    absl::Time t1 = absl::Now();
    // On a pipelined backend the gradient is submitted first and collected
    // after the worker's own work for the next minibatch (reading and
    // parsing it, sending its prefetch pull), which then overlaps the
    // device's copy and kernels. The same weights and batch either way.
    int64_t ticket = -1;
    if (pipelined) {
      PS_ASSIGN_OR_RETURN(ticket, backend_->SubmitGradient(s.batch, s.w));
    }
    bool have_next = false;
    Fill ahead = Fill::kWaiting;
    if (read_ahead) {
      PS_ASSIGN_OR_RETURN(ahead, next(&n, /*may_idle=*/false));
      have_next = ahead == Fill::kHave;
      if (prefetch && have_next) {
        n.ts = kv_->Pull(0, n.batch.keys, &n.w, kv_->clock() + 1);
      }
    }
    grad.assign(s.batch.keys.size(), 0.0f);
    double loss = 0;
    if (pipelined) {
      PS_RETURN_IF_ERROR(
          backend_->CollectGradient(ticket, absl::MakeSpan(grad), &loss));
    } else {
      PS_RETURN_IF_ERROR(backend_->LogisticGradient(
          s.batch, s.w, absl::MakeSpan(grad), &loss));
    }
    absl::Time t3 = absl::Now();
    // The clock rides on the push: one round trip per server.
    work->Pushed(s.unit, kv_->PushAndClock(0, s.batch.keys, grad,
                                           static_cast<int>(s.rows)));
    skip_ahead();
    if (ahead == Fill::kWaiting) {
      // Nothing read ahead (or no unit was free then): read now, after
      // this minibatch's push, idling while no unit is free.
      PS_ASSIGN_OR_RETURN(ahead, next(&n, /*may_idle=*/true));
      have_next = ahead == Fill::kHave;
      if (have_next) n.ts = kv_->Pull(0, n.batch.keys, &n.w);
      t3 = absl::Now();  // reading the next minibatch is worker-local work
    } else if (!prefetch && have_next) {
      n.ts = kv_->Pull(0, n.batch.keys, &n.w);
      t3 = absl::Now();
    }
    if (worker_id_ == 0 && tc.straggler_factor > 1.0) {
      // A straggler is slower at all of its local work (data and gradient).
      absl::SleepFor((t3 - t1) * (tc.straggler_factor - 1.0));
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
    cur = 1 - cur;
    have = have_next;

    const absl::Time now = absl::Now();
    if (now - last_report >= absl::Seconds(tc.progress_interval_s)) {
      const double secs = absl::ToDoubleSeconds(now - last_report);
      const double busy = report_compute + report_wait;
      PS_LOG_INFO(
          "epoch {} clock {}: {:.0f} examples/s, train loss {:.4f}, "
          "compute {:.0f}% / wait {:.0f}%",
          work->epoch(), kv_->clock(),
          report_examples / secs,
          report_loss / std::max<int64_t>(1, report_examples),
          busy > 0 ? 100 * report_compute / busy : 0,
          busy > 0 ? 100 * report_wait / busy : 0);
      last_report = now;
      report_examples = 0;
      report_loss = report_compute = report_wait = 0;
    }
    if (validation_ != nullptr && work->epoch() > validation.last_epoch) {
      validation.last_epoch = work->epoch();
      absl::MutexLock l(&validation.mu);
      if (!validation.busy) {
        if (validation.thread.joinable()) validation.thread.join();
        if (validation_backend == nullptr) {
          PS_ASSIGN_OR_RETURN(validation_backend, CreateBackend("cpu", 1));
        }
        validation.busy = true;
        ComputeBackend* backend = validation_backend.get();
        const int epoch = work->epoch();
        validation.thread = std::thread([this, &validation, backend, epoch] {
          const absl::Status reset = validation_->Reset();
          absl::StatusOr<EvalMetrics> m =
              reset.ok() ? EvaluateOn(validation_, backend)
                         : absl::StatusOr<EvalMetrics>(reset);
          if (m.ok()) {
            PS_LOG_INFO("validation after {} epochs: AUC {:.4f}, log loss "
                        "{:.4f} ({} rows)",
                        epoch, m->auc, m->logloss, m->n);
            absl::MutexLock v(&validation_mu_);
            validation_point_ = {epoch, m->auc, m->logloss, m->n};
          }
          absl::MutexLock l(&validation.mu);
          if (!m.ok() && validation.status.ok()) validation.status = m.status();
          validation.busy = false;
        });
      }
    }
    if (eval != nullptr && tc.eval_interval_s > 0 &&
        now - last_eval >= absl::Seconds(tc.eval_interval_s)) {
      absl::MutexLock l(&curve.mu);
      if (!curve.busy) {
        if (curve.thread.joinable()) curve.thread.join();  // it is done
        if (curve_backend == nullptr) {
          PS_ASSIGN_OR_RETURN(curve_backend, CreateBackend("cpu", 1));
        }
        curve.busy = true;
        last_eval = now;
        const absl::Duration at = now - start;
        const int64_t examples = stats_.examples;
        ComputeBackend* backend = curve_backend.get();
        curve.thread = std::thread([this, &curve, eval, backend, at,
                                    examples] {
          const absl::Status reset = eval->Reset();
          absl::StatusOr<EvalMetrics> m =
              reset.ok() ? EvaluateOn(eval, backend)
                         : absl::StatusOr<EvalMetrics>(reset);
          absl::MutexLock l(&curve.mu);
          if (m.ok()) {
            curve.points.push_back(MakeEvalPoint(at, *m, examples));
          } else if (curve.status.ok()) {
            curve.status = m.status();
          }
          curve.busy = false;
        });
      }
    }
  }
  check_updates();  // a one-epoch job, or no later unit came
  if (curve.thread.joinable()) curve.thread.join();
  if (validation.thread.joinable()) validation.thread.join();
  {
    absl::MutexLock l(&validation.mu);
    PS_RETURN_IF_ERROR(validation.status);
  }
  {
    absl::MutexLock l(&curve.mu);
    PS_RETURN_IF_ERROR(curve.status);
    for (proto::EvalPoint& p : curve.points) {
      stats_.curve.push_back(std::move(p));
    }
  }
  stats_.wall_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  stats_.train_skipped = work->skipped();
  return absl::OkStatus();
}

absl::StatusOr<EvalMetrics> Trainer::Evaluate(RowReader* reader) {
  PS_ASSIGN_OR_RETURN(EvalMetrics m, EvaluateOn(reader, backend_));
  stats_.test_skipped = SkippedLinesOf(reader->path(), reader->stats());
  return m;
}

absl::StatusOr<EvalMetrics> Trainer::EvaluateOn(RowReader* reader,
                                                ComputeBackend* backend) {
  RowBlock block;
  CsrBatch batch;
  std::vector<float> w, prob, all_prob, all_labels;
  for (;;) {
    block.Clear();
    PS_ASSIGN_OR_RETURN(size_t n, reader->Next(20000, &block));
    if (n == 0) break;
    BuildBatch(block, 0, block.rows(), &batch);
    int64_t ts = kv_->Pull(0, batch.keys, &w);
    PS_RETURN_IF_ERROR(kv_->Wait(ts, absl::Now() + absl::Seconds(600)));
    prob.assign(batch.rows(), 0.0f);
    PS_RETURN_IF_ERROR(
        backend->LogisticPredict(batch, w, absl::MakeSpan(prob)));
    all_prob.insert(all_prob.end(), prob.begin(), prob.end());
    all_labels.insert(all_labels.end(), batch.labels.begin(),
                      batch.labels.end());
  }
  return ps::Evaluate(all_prob, all_labels);
}

}  // namespace ps
