#include "worker/worker_runner.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "transport/grpc_transport.h"
#include "common/clock.h"
#include "common/health.h"
#include "common/logging.h"
#include "common/metrics_http.h"
#include "common/membership.h"
#include "common/permutation.h"
#include "common/status_macros.h"
#include "data/holdout.h"
#include "data/shuffle.h"
#include "kernels/backend.h"
#include "kernels/mlp.h"
#include "worker/kv_worker.h"
#include "models/logistic.h"
#include "models/wide_deep.h"
#include "worker/trainer.h"
#include "worker/work_source.h"
#include "transport/errors.h"
#include "absl/synchronization/mutex.h"

namespace ps {
namespace {
absl::Status WorkerDoneWithRetry(SchedulerClient* scheduler,
                                 const proto::WorkerDoneRequest& done,
                                 absl::Time deadline);
absl::Status ShardBytes(const proto::DataShard& shard, int64_t* begin,
                        int64_t* end);
}  // namespace

ShuffleOptions ShuffleOf(const JobConfig& config, int64_t epoch) {
  ShuffleOptions s;
  s.enabled = config.data.shuffle;
  s.seed = config.training.seed;
  s.epoch = epoch;
  s.buffer_rows = config.data.shuffle_buffer_rows;
  return s;
}

namespace {
absl::StatusOr<std::unique_ptr<RowReader>> OpenTrainRows(
    const JobConfig& config, const proto::DataShard& shard, int64_t epoch);
}  // namespace

absl::StatusOr<std::unique_ptr<RowReader>> OpenTrainShard(
    const JobConfig& config, const proto::DataShard& shard, int64_t epoch) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<RowReader> rows,
                      OpenTrainRows(config, shard, epoch));
  const double fraction = config.data.validation_fraction;
  if (fraction <= 0) return rows;
  return NewHoldoutReader(std::move(rows), config.training.seed, fraction,
                          /*keep_validation=*/false);
}

absl::StatusOr<std::unique_ptr<RowReader>> OpenValidationSet(
    const JobConfig& config) {
  const DataConfig& d = config.data;
  const double fraction = d.validation_fraction;
  if (fraction <= 0) return std::unique_ptr<RowReader>();
  proto::DataShard whole;
  if (d.format == "synthetic") {
    whole.set_row_begin(0);
    whole.set_row_end(d.synthetic.train_rows);
  } else {
    whole.set_path(d.train);
    whole.set_begin_byte(0);
    whole.set_end_byte(-1);
  }
  JobConfig in_order = config;
  in_order.data.shuffle = false;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<RowReader> rows,
                      OpenTrainRows(in_order, whole, 0));
  return NewHoldoutReader(std::move(rows), config.training.seed, fraction,
                          /*keep_validation=*/true);
}

namespace {
absl::StatusOr<std::unique_ptr<RowReader>> OpenTrainRows(
    const JobConfig& config, const proto::DataShard& shard, int64_t epoch) {
  const DataConfig& d = config.data;
  const ShuffleOptions shuffle = ShuffleOf(config, epoch);
  if (d.format == "synthetic") {
    return OpenSynthetic(d.synthetic, shard.row_begin(), shard.row_end(),
                         /*test=*/false, shuffle);
  }
  int64_t begin, end;
  PS_RETURN_IF_ERROR(ShardBytes(shard, &begin, &end));
  if (d.format == "libsvm") {
    return OpenLibsvm(shard.path(), begin, end, d.skip_malformed, shuffle);
  }
  if (d.format == "criteo") {
    return OpenCriteo(shard.path(), begin, end, d.skip_malformed, shuffle);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("config field data.format: unknown format '", d.format,
                   "'"));
}
}  // namespace

absl::StatusOr<std::unique_ptr<RowReader>> OpenTestSet(
    const JobConfig& config) {
  const DataConfig& d = config.data;
  if (d.format == "synthetic") {
    if (d.synthetic.test_rows == 0) return std::unique_ptr<RowReader>();
    return OpenSynthetic(d.synthetic, 0, d.synthetic.test_rows, /*test=*/true);
  }
  if (d.test.empty()) return std::unique_ptr<RowReader>();
  if (d.format == "libsvm") return OpenLibsvm(d.test, 0, -1, d.skip_malformed);
  if (d.format == "criteo") return OpenCriteo(d.test, 0, -1, d.skip_malformed);
  return absl::InvalidArgumentError(
      absl::StrCat("config field data.format: unknown format '", d.format,
                   "'"));
}

namespace {

// Trains, finishes, waits for the other workers, evaluates (when
// `final_test` gives a function: this worker evaluates) and reports to the
// scheduler: the part every model shares. `curve` (may be empty) is
// evaluated during training every training.eval_interval_s;
// `final_validation` (may be empty) is the validation split, evaluated at
// the end by the worker that evaluates the test set.
absl::Status TrainAndReport(
    int worker_id, const JobConfig& config, KVWorker* kv, Trainer* trainer,
    WorkSource* train, EvalFn curve,
    const std::function<absl::StatusOr<EvalFn>()>& final_test,
    SchedulerClient* scheduler,
    std::atomic<int64_t>* others_min_clock = nullptr,
    EvalFn final_validation = nullptr) {
  // Heartbeats carry the clock and progress, for ps_status and failure
  // detection; their replies tell when the job has ended, and how.
  absl::Notification stop;
  absl::Notification job_ended;
  absl::Mutex outcome_mu;
  absl::Status outcome;  // guarded by outcome_mu; the job's failure
  const absl::Duration every = absl::Milliseconds(config.cluster.heartbeat_ms);
  std::atomic<int64_t> last_ok_ns{absl::ToUnixNanos(absl::Now())};
  // The session from the start, not from the first heartbeat a period
  // later: a worker killed before it (MultiProcessTest
  // DeadWorkerIsFoundByItsClosedSessionOverGrpc once killed it 0.45 s after
  // the cluster was ready) is found by its closed session too, not at the
  // heartbeat timeout.
  scheduler->KeepSession(proto::ROLE_WORKER, worker_id);
  std::thread heartbeat([&] {
    while (!stop.WaitForNotificationWithTimeout(every)) {
      proto::HeartbeatRequest hb;
      hb.set_role(proto::ROLE_WORKER);
      hb.set_id(worker_id);
      hb.set_clock(kv->clock());
      hb.set_examples(trainer->examples_so_far());
      hb.set_wait_seconds(trainer->wait_seconds_so_far());
      hb.set_compute_seconds(trainer->compute_seconds_so_far());
      hb.set_loss_sum(trainer->loss_sum_so_far());
      const Trainer::ValidationPoint v = trainer->validation_so_far();
      if (v.rows > 0) {
        hb.set_validation_epoch(v.epoch);
        hb.set_validation_auc(v.auc);
        hb.set_validation_logloss(v.logloss);
        hb.set_validation_rows(v.rows);
      }
      auto r = scheduler->Heartbeat(hb, absl::Now() + every * 4);
      if (!r.ok()) {
        PS_LOG_DEBUG("heartbeat: {}", r.status().ToString());
        if (r.status().code() == absl::StatusCode::kFailedPrecondition) {
          // Declared dead (issue 9)? The view says: fetched now, it fences
          // the worker when it marks it dead (KVWorker::Fence).
          kv->OnSchedulerEpoch(std::numeric_limits<int64_t>::max());
        }
        continue;
      }
      last_ok_ns.store(absl::ToUnixNanos(absl::Now()));
      // Its session tells the scheduler the moment this process is gone
      // (issue 9); opened again here after the scheduler restarted.
      scheduler->KeepSession(proto::ROLE_WORKER, worker_id);
      // A newer view (a failover): fetched now, not when a call to the
      // failed server gives up, which for a hung server is its deadline.
      kv->OnSchedulerEpoch(r->epoch());
      if (others_min_clock != nullptr) {
        others_min_clock->store(r->others_min_clock());
      }
      if (r->shutdown() && !job_ended.HasBeenNotified()) {
        if (r->failed()) {
          absl::MutexLock l(&outcome_mu);
          outcome = ErrorWithReason(absl::StatusCode::kAborted,
                                    proto::REASON_JOB_FAILED,
                                    absl::StrCat("the job failed: ", r->error()));
        }
        job_ended.Notify();
      }
    }
  });
  // Issue 9: the servers this worker has heard nothing from for a while
  // are asked for their status, so that one that is only slow to answer
  // (in BSP, behind a straggler) is not named a suspect, and then those
  // still silent are named to the scheduler: on a thread of their own, as
  // an unreachable server makes the ask wait its timeout and each naming
  // waits on the scheduler (on the heartbeat thread they delayed the
  // heartbeats), and in this order, so that no server is named before it
  // was asked.
  std::thread reach([&] {
    const absl::Duration timeout =
        absl::Milliseconds(config.fault_tolerance.probe_timeout_ms);
    while (!stop.WaitForNotificationWithTimeout(every)) {
      kv->PingSilentServers(timeout);
      kv->SuspectSilentServers();
    }
  });
  // A local error after the job failed elsewhere is a consequence: report
  // the job's failure (reason JOB_FAILED) instead.
  auto finish = [&](absl::Status s) {
    stop.Notify();
    heartbeat.join();
    reach.join();
    absl::MutexLock l(&outcome_mu);
    if (!outcome.ok()) {
      if (!s.ok()) PS_LOG_INFO("after the job failed: {}", s.ToString());
      return outcome;
    }
    return s;
  };

  absl::Status s = trainer->Train(train, std::move(curve));
  if (s.ok()) s = kv->Finish(absl::Now() + absl::Seconds(600));
  if (!s.ok()) return finish(s);
  const TrainerStats& st = trainer->stats();
  PS_LOG_INFO(
      "trained {} examples in {:.2f}s (compute {:.2f}s, wait {:.2f}s; "
      "pulls held for consistency {:.3f}s, {:.3f}s of it waited for)",
      st.examples, st.wall_seconds, st.compute_seconds, st.wait_seconds,
      kv->consistency_wait_seconds(), kv->held_wait_seconds());

  // Evaluate once every worker has pushed everything.
  proto::BarrierRequest b;
  b.set_name("trained");
  b.set_role(proto::ROLE_WORKER);
  b.set_id(worker_id);
  s = scheduler->Barrier(b, absl::Now() + absl::Seconds(3600));
  if (!s.ok()) return finish(s);

  proto::WorkerDoneRequest done;
  done.set_worker_id(worker_id);
  done.set_compute_seconds(st.compute_seconds);
  done.set_wait_seconds(st.wait_seconds);
  // The holds the trainer waited through (a prefetched pull held while it
  // computed cost it nothing).
  done.set_consistency_wait_seconds(
      std::min(st.wait_seconds, kv->held_wait_seconds()));
  done.set_examples(st.examples);
  done.set_train_loss(st.examples > 0 ? st.loss_sum / st.examples : 0);
  done.set_wall_seconds(st.wall_seconds);
  done.set_first_epoch_updates(st.first_epoch_updates);
  done.set_push_bytes(kv->push_bytes());
  done.set_push_raw_bytes(kv->push_raw_bytes() +
                          trainer->model().filtered_push_bytes());
  done.set_first_epoch(st.first_epoch);
  for (const auto& p : st.curve) *done.add_curve() = p;
  absl::StatusOr<EvalFn> test_or = final_test();
  if (!test_or.ok()) return finish(test_or.status());
  const EvalFn test = *std::move(test_or);
  // The validation split: by the worker that evaluates, as the test set.
  if (final_validation && train->evaluate()) {
    auto m = final_validation();
    if (!m.ok()) return finish(m.status());
    PS_LOG_INFO("validation: AUC {:.4f}, log loss {:.4f} ({} rows)", m->auc,
                m->logloss, m->n);
    done.set_validation_auc(m->auc);
    done.set_validation_logloss(m->logloss);
    done.set_validation_rows(m->n);
  }
  if (test) {
    auto m = test();
    if (!m.ok()) return finish(m.status());
    PS_LOG_INFO("test: AUC {:.4f}, log loss {:.4f}, accuracy {:.4f} ({} rows)",
                m->auc, m->logloss, m->accuracy, m->n);
    done.set_has_eval(true);
    done.set_test_auc(m->auc);
    done.set_test_logloss(m->logloss);
    done.set_test_accuracy(m->accuracy);
    done.set_test_rows(m->n);
  }
  ReportSkippedLines(trainer->stats(), &done);
  s = WorkerDoneWithRetry(scheduler, done, absl::Now() + absl::Seconds(600));
  if (!s.ok()) return finish(s);
  // Every process reports the job's outcome: wait for the end (worker 0 may
  // still be evaluating, the model may still fail to save) for as long as
  // the scheduler keeps answering heartbeats (or is away for less than
  // cluster.scheduler_timeout_ms: a restarted one takes the job over).
  const absl::Duration scheduler_timeout = config.cluster.SchedulerTimeout();
  while (!job_ended.WaitForNotificationWithTimeout(every)) {
    const absl::Time last = absl::FromUnixNanos(last_ok_ns.load());
    if (absl::Now() - last > scheduler_timeout) {
      return finish(absl::UnavailableError(absl::StrCat(
          "the scheduler stopped answering for ",
          absl::FormatDuration(absl::Now() - last),
          " before the end of the job")));
    }
  }
  return finish(absl::OkStatus());
}

// WorkerDone, resent with backoff while the scheduler is unreachable or
// slow (it is idempotent) until `deadline`; other errors are final.
absl::Status WorkerDoneWithRetry(SchedulerClient* scheduler,
                                 const proto::WorkerDoneRequest& done,
                                 absl::Time deadline) {
  Clock* clock = Clock::Real();
  absl::Duration backoff = absl::Milliseconds(50);
  for (;;) {
    absl::Status s = scheduler->WorkerDone(done, deadline);
    const bool retryable = (s.code() == absl::StatusCode::kUnavailable ||
                            s.code() == absl::StatusCode::kDeadlineExceeded) &&
                           ReasonOf(s) != proto::REASON_JOB_FAILED;
    if (s.ok() || !retryable || clock->Now() + backoff >= deadline) return s;
    PS_LOG_WARN("WorkerDone failed, retrying in {}: {}",
                absl::FormatDuration(backoff), s.ToString());
    clock->SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
}

// A collector of `metrics` (when not null) for as long as this lives.
class ScopedCollector {
 public:
  ScopedCollector(const WorkerMetrics* metrics,
                  MetricsRegistry::Collector collector)
      : registry_(metrics == nullptr ? nullptr : metrics->registry),
        id_(registry_ == nullptr ? 0
                                 : registry_->AddCollector(std::move(collector))) {
  }
  ~ScopedCollector() {
    if (registry_ != nullptr) registry_->RemoveCollector(id_);
  }
  ScopedCollector(const ScopedCollector&) = delete;
  ScopedCollector& operator=(const ScopedCollector&) = delete;

 private:
  MetricsRegistry* const registry_;
  const int id_;
};

void WriteExamples(int64_t examples, ExpositionWriter* w) {
  w->AddCounter("ps_worker_examples_total",
                "examples trained (rate(): examples/s)", {},
                static_cast<double>(examples));
}

// The byte range of a file shard; cut here when the scheduler could not.
absl::Status ShardBytes(const proto::DataShard& shard, int64_t* begin,
                        int64_t* end) {
  *begin = shard.begin_byte();
  *end = shard.end_byte();
  if (*begin < 0) {
    PS_ASSIGN_OR_RETURN(int64_t size, FileSize(shard.path()));
    *begin = size * shard.part() / shard.num_parts();
    *end = shard.part() + 1 == shard.num_parts()
               ? -1
               : size * (shard.part() + 1) / shard.num_parts();
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunWorkerWith(int worker_id, const proto::ClusterView& view,
                           ClientFactory* clients, SchedulerClient* scheduler,
                           const WorkerMetrics* metrics) {
  PS_ASSIGN_OR_RETURN(JobConfig config, ParseJobConfig(view.job_config_yaml()));
  KVWorkerOptions ko;
  ko.worker_id = worker_id;
  ko.pull_wait = absl::Milliseconds(config.consistency.pull_timeout_ms);
  ko.request_timeout = ko.pull_wait + absl::Seconds(30);
  // Issue 9: a server that leaves a push or clock unanswered for four
  // heartbeats (at least 2 s) is probed by the scheduler, so a hung one is
  // failed over in seconds, not after cluster.heartbeat_timeout_ms. Only
  // where failover is possible (a replica): without one, a failover fails
  // the job, and the heartbeat timeout stays the only judge.
  if (config.fault_tolerance.EffectiveReplicas(
          view.routing().servers_size()) > 0) {
    ko.suspect_after = config.cluster.SuspectAfter();
  }
  if (!config.cluster.key_caching) ko.key_lists_per_server = 0;
  ko.filters = PushFilterOptions::FromConfig(config.filters);  // issue 10
  ko.filters.key_caching = config.cluster.key_caching;
  Counter* wait_ns = nullptr;
  if (metrics != nullptr) {
    ko.metrics = metrics->push_pull;
    wait_ns = metrics->registry->GetCounter(
        "ps_worker_wait_seconds_total",
        "seconds the worker's threads spent blocked waiting for pushes and "
        "pulls (rate(): the share of time spent waiting on the network)",
        {}, 1e-9);
    ko.wait_ns = wait_ns;
  }
  KVWorker kv(ko, view, clients, scheduler);
  // The clock and the wait share, read at scrape time while `kv` lives.
  const int64_t started_ns = MonotonicNanos();
  ScopedCollector kv_metrics(metrics, [&kv, wait_ns,
                                       started_ns](ExpositionWriter* w) {
    w->AddGauge("ps_worker_clock", "clocks completed", {},
                static_cast<double>(kv.clock()));
    const double elapsed = static_cast<double>(MonotonicNanos() - started_ns);
    w->AddGauge("ps_worker_wait_share",
                "share of the time since training began spent waiting on the "
                "network (ps_worker_wait_seconds_total over wall time)",
                {},
                elapsed > 0 ? static_cast<double>(wait_ns->raw()) / elapsed
                            : 0);
    w->AddCounter("ps_worker_consistency_wait_seconds_total",
                  "seconds servers held this worker's pulls for the "
                  "consistency bound (BSP/SSP)",
                  {}, kv.consistency_wait_seconds());
  });

  // Evaluations on a thread beside training (the curve, epoch-start
  // validation) read with CPU backends of their own; the final ones use
  // the training backend. Each resets its reader first.
  if (config.training.model == "mlp") {
    // Work units too (issue 9), read as criteo field rows.
    const DataConfig& d = config.data;
    if (d.format != "criteo") {
      return absl::InvalidArgumentError(
          "config field data.format: the mlp model needs criteo data");
    }
    WorkSourceOptions wo;
    wo.worker_id = worker_id;
    wo.retry_for =
        std::max(wo.retry_for, config.cluster.SchedulerTimeout());
    WorkSource work(
        wo, scheduler, &kv,
        [&config, &d](const proto::WorkUnit& unit)
            -> absl::StatusOr<std::unique_ptr<FieldReader>> {
          // data.shuffle: the scheduler's seeded unit order, and each unit's
          // rows through a seeded shuffle buffer (a unit of at most
          // shuffle_buffer_rows rows is permuted whole).
          int64_t begin, end;
          PS_RETURN_IF_ERROR(ShardBytes(unit.data(), &begin, &end));
          PS_ASSIGN_OR_RETURN(std::unique_ptr<FieldReader> reader,
                              OpenCriteoFields(unit.data().path(), begin, end,
                                               d.skip_malformed));
          if (d.validation_fraction > 0) {
            reader = NewFieldHoldoutReader(std::move(reader),
                                           config.training.seed,
                                           d.validation_fraction,
                                           /*keep_validation=*/false);
          }
          if (!d.shuffle) return reader;
          return NewFieldShuffleBuffer(
              std::move(reader), d.shuffle_buffer_rows,
              ShuffleKey(config.training.seed, ShufflePurpose::kBuffer,
                         unit.epoch(), static_cast<uint64_t>(begin)));
        });
    PS_ASSIGN_OR_RETURN(std::unique_ptr<MlpBackend> backend,
                        CreateMlpBackend(config.training.backend));
    WideDeepModel model(worker_id, config, &kv, backend.get());
    PS_RETURN_IF_ERROR(model.Validate());
    Trainer trainer(worker_id, config, &kv, &model);
    std::unique_ptr<FieldReader> test;
    std::unique_ptr<MlpBackend> curve_backend;
    EvalFn curve;
    if (worker_id == 0 && !d.test.empty()) {
      PS_ASSIGN_OR_RETURN(test,
                          OpenCriteoFields(d.test, 0, -1, d.skip_malformed));
      curve_backend = CreateCpuMlpBackend();
      curve = [&]() -> absl::StatusOr<EvalMetrics> {
        PS_RETURN_IF_ERROR(test->Reset());
        return model.Evaluate(curve_backend.get(), test.get());
      };
    }
    std::function<absl::StatusOr<EvalFn>()> final_test =
        [&]() -> absl::StatusOr<EvalFn> {
      if (!work.evaluate() || d.test.empty()) return EvalFn();
      if (test == nullptr) {
        PS_ASSIGN_OR_RETURN(test,
                            OpenCriteoFields(d.test, 0, -1, d.skip_malformed));
      }
      return EvalFn([&]() -> absl::StatusOr<EvalMetrics> {
        PS_RETURN_IF_ERROR(test->Reset());
        PS_ASSIGN_OR_RETURN(EvalMetrics m,
                            model.Evaluate(backend.get(), test.get()));
        trainer.set_test_skipped(SkippedLinesOf(test->path(), test->stats()));
        return m;
      });
    };
    // data.validation_fraction: as for logistic regression below.
    std::unique_ptr<FieldReader> validation;
    std::unique_ptr<MlpBackend> validation_backend;
    EvalFn final_validation;
    if (d.validation_fraction > 0) {
      PS_ASSIGN_OR_RETURN(validation,
                          OpenCriteoFields(d.train, 0, -1, d.skip_malformed));
      validation = NewFieldHoldoutReader(
          std::move(validation), config.training.seed, d.validation_fraction,
          /*keep_validation=*/true);
      if (worker_id == 0) {
        validation_backend = CreateCpuMlpBackend();
        trainer.set_validation([&]() -> absl::StatusOr<EvalMetrics> {
          PS_RETURN_IF_ERROR(validation->Reset());
          return model.Evaluate(validation_backend.get(), validation.get());
        });
      }
      final_validation = [&]() -> absl::StatusOr<EvalMetrics> {
        PS_RETURN_IF_ERROR(validation->Reset());
        return model.Evaluate(backend.get(), validation.get());
      };
    }
    ScopedCollector examples(metrics, [&trainer](ExpositionWriter* w) {
      WriteExamples(trainer.examples_so_far(), w);
    });
    PS_LOG_INFO("training mlp: {} epochs, minibatch {}",
                config.training.epochs, config.training.minibatch);
    std::atomic<int64_t> others_min_clock{-1};  // from heartbeat replies
    trainer.set_others_min_clock(&others_min_clock);
    return TrainAndReport(worker_id, config, &kv, &trainer, &work,
                          std::move(curve), final_test, scheduler,
                          &others_min_clock, std::move(final_validation));
  }

  // Every other model trains on dynamic work units (issue 9).
  WorkSourceOptions wo;
  wo.worker_id = worker_id;
  // GetWork waits out a scheduler restart (cluster.scheduler_timeout_ms).
  wo.retry_for = std::max(wo.retry_for, config.cluster.SchedulerTimeout());
  WorkSource work(wo, scheduler, &kv,
                  [&config](const proto::WorkUnit& unit) {
                    return OpenTrainShard(config, unit.data(), unit.epoch());
                  });
  const std::string backend_name =
      AutoLrBackend(config.training.backend, config.training.minibatch);
  if (backend_name != config.training.backend) {
    PS_LOG_INFO("training.backend auto: the CPU for minibatches of {} rows "
                "(logistic regression uses a GPU from {} rows)",
                config.training.minibatch, kAutoCudaMinLrRows);
  }
  PS_ASSIGN_OR_RETURN(
      std::unique_ptr<ComputeBackend> backend,
      CreateBackend(backend_name, config.training.threads));
  LogisticModel model(&kv, backend.get(), KktFilter::FromConfig(config));
  Trainer trainer(worker_id, config, &kv, &model);
  // Worker 0 draws the test curve during training (when configured); the
  // worker the scheduler names evaluates at the end (worker 0 unless it
  // died).
  std::unique_ptr<RowReader> test;
  std::unique_ptr<ComputeBackend> curve_backend;
  EvalFn curve;
  if (worker_id == 0) {
    PS_ASSIGN_OR_RETURN(test, OpenTestSet(config));
    if (test != nullptr) {
      PS_ASSIGN_OR_RETURN(curve_backend, CreateBackend("cpu", 1));
      curve = [&]() -> absl::StatusOr<EvalMetrics> {
        PS_RETURN_IF_ERROR(test->Reset());
        return EvaluateLogistic(&kv, curve_backend.get(), test.get());
      };
    }
  }
  std::function<absl::StatusOr<EvalFn>()> final_test =
      [&]() -> absl::StatusOr<EvalFn> {
    if (!work.evaluate()) return EvalFn();
    if (test == nullptr) {
      PS_ASSIGN_OR_RETURN(test, OpenTestSet(config));
      if (test == nullptr) return EvalFn();
    }
    return EvalFn([&]() -> absl::StatusOr<EvalMetrics> {
      PS_RETURN_IF_ERROR(test->Reset());
      PS_ASSIGN_OR_RETURN(EvalMetrics m,
                          EvaluateLogistic(&kv, backend.get(), test.get()));
      trainer.set_test_skipped(SkippedLinesOf(test->path(), test->stats()));
      return m;
    });
  };
  ScopedCollector examples(metrics, [&trainer](ExpositionWriter* w) {
    WriteExamples(trainer.examples_so_far(), w);
  });
  PS_LOG_INFO("training: {} epochs, minibatch {}, backend {}",
              config.training.epochs, config.training.minibatch,
              backend->name());
  std::atomic<int64_t> others_min_clock{-1};  // from heartbeat replies
  trainer.set_others_min_clock(&others_min_clock);
  // data.validation_fraction: worker 0 evaluates the held-out rows at each
  // epoch start (the progress line, early stopping) and at the end (the
  // report; the worker that evaluates the test set, or worker 0).
  PS_ASSIGN_OR_RETURN(std::unique_ptr<RowReader> validation,
                      OpenValidationSet(config));
  std::unique_ptr<ComputeBackend> validation_backend;
  EvalFn final_validation;
  if (validation != nullptr) {
    if (worker_id == 0) {
      PS_ASSIGN_OR_RETURN(validation_backend, CreateBackend("cpu", 1));
      trainer.set_validation([&]() -> absl::StatusOr<EvalMetrics> {
        PS_RETURN_IF_ERROR(validation->Reset());
        return EvaluateLogistic(&kv, validation_backend.get(),
                                validation.get());
      });
    }
    // Its skipped lines are the training file's, already counted.
    final_validation = [&]() -> absl::StatusOr<EvalMetrics> {
      PS_RETURN_IF_ERROR(validation->Reset());
      return EvaluateLogistic(&kv, backend.get(), validation.get());
    };
  }
  return TrainAndReport(worker_id, config, &kv, &trainer, &work,
                        std::move(curve), final_test, scheduler,
                        &others_min_clock, std::move(final_validation));
}

absl::Status RunWorker(const WorkerRunOptions& options) {
  UseFastGrpcBackupPolling();  // before any gRPC object
  PS_ASSIGN_OR_RETURN(const GrpcSecurity security,
                      SecurityFromEnv(GrpcSecurity()));
  PS_RETURN_IF_ERROR(MakeChannelCredentials(security).status());
  // Metrics and health (issue 11): a worker serves no gRPC, so its
  // endpoint's /healthz is its health check (starting until registered,
  // serving while it trains, stopping once it is done).
  std::string bind_host = options.bind_host;
  if (bind_host.empty()) {
    const char* env = std::getenv("PS_BIND_HOST");
    bind_host = env != nullptr && *env != '\0' ? env : "127.0.0.1";
  }
  PS_ASSIGN_OR_RETURN(const int metrics_port,
                      ResolveMetricsPort(options.metrics_port));
  NodeHealth health;
  NodeMetrics node_metrics("worker", &health);
  PushPullMetrics push_pull(
      node_metrics.registry(), "ps_worker",
      "seconds from a push to its last answer (all its servers, retries "
      "included)",
      "seconds from a pull to its last answer (all its servers, the "
      "consistency wait and retries included)");
  const WorkerMetrics metrics{node_metrics.registry(), &push_pull};
  PS_RETURN_IF_ERROR(node_metrics.Serve(bind_host, metrics_port));

  GrpcClientFactory clients(GrpcClientFactory::Options(security, 2));
  std::shared_ptr<SchedulerClient> scheduler =
      clients.Scheduler(options.scheduler);
  proto::RegisterRequest reg;
  reg.set_role(proto::ROLE_WORKER);
  reg.set_requested_id(options.requested_id);
  PS_ASSIGN_OR_RETURN(
      Membership m,
      JoinCluster(scheduler.get(), options.scheduler, reg,
                  absl::Now() +
                      absl::Milliseconds(options.register_timeout_ms)));
  const int id = m.id;
  const proto::ClusterView& view = m.view;
  InitLogging(absl::StrCat("W[", id, "]"));
  auto config = ParseJobConfig(view.job_config_yaml());
  if (config.ok()) {
    InitLogging(absl::StrCat("W[", id, "]"), config->output.log_level);
    clients.SetDataPlane(config->cluster.data_plane);
    clients.SetLocalSocket(config->cluster.local_socket);
    clients.SetSharedMemory(size_t{static_cast<unsigned>(
                                config->cluster.shared_memory_mb)}
                            << 20);
  }
  node_metrics.SetName(absl::StrCat("W[", id, "]"));
  if (metrics_port < 0 && config.ok()) {
    PS_RETURN_IF_ERROR(
        node_metrics.Serve(bind_host, config->observability.metrics_port));
  }
  health.Set(Serving::kServing, absl::StrCat("registered as W[", id, "]"));
  absl::Status s =
      RunWorkerWith(id, view, &clients, scheduler.get(), &metrics);
  health.Set(Serving::kStopping,
             s.ok() ? "the job is over" : std::string(s.message()));
  return s;
}

}  // namespace ps
