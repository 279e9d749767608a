#include "worker/mlp_trainer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/hash.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace ps {

void BuildMlpBatch(const FieldBlock& block, MlpBatch* batch) {
  batch->Clear();
  batch->keys.assign(block.keys.begin(), block.keys.end());
  std::sort(batch->keys.begin(), batch->keys.end());
  batch->keys.erase(std::unique(batch->keys.begin(), batch->keys.end()),
                    batch->keys.end());
  batch->slots.resize(block.keys.size());
  for (size_t k = 0; k < block.keys.size(); ++k) {
    batch->slots[k] = static_cast<uint32_t>(
        std::lower_bound(batch->keys.begin(), batch->keys.end(),
                         block.keys[k]) -
        batch->keys.begin());
  }
  batch->labels.assign(block.labels.begin(), block.labels.end());
}

MlpTrainer::MlpTrainer(int worker_id, const JobConfig& config,
                       ParamClient* params, MlpBackend* backend)
    : worker_id_(worker_id),
      config_(config),
      params_(params),
      backend_(backend),
      shape_(MlpShapeOf(config)),
      wide_(config.mlp.wide) {
  for (int l = 0; l < shape_.num_layers(); ++l) {
    std::vector<uint64_t> keys(shape_.fan_out(l));
    for (size_t o = 0; o < keys.size(); ++o) keys[o] = o;
    layer_keys_.push_back(std::move(keys));
  }
  layers_.resize(shape_.num_layers());
  glayers_.resize(shape_.num_layers());
  for (int l = 0; l < shape_.num_layers(); ++l) {
    glayers_[l].resize(shape_.layer_floats(l));
  }
}

absl::Status MlpTrainer::PullParams(const MlpBatch& batch) {
  const absl::Time deadline = absl::Now() + absl::Seconds(600);
  std::vector<int64_t> ts;
  ts.push_back(params_->Pull(kMlpEmbeddingTable, batch.keys, &emb_));
  for (int l = 0; l < shape_.num_layers(); ++l) {
    ts.push_back(params_->Pull(kMlpFirstLayerTable + l, layer_keys_[l],
                               &layers_[l]));
  }
  if (wide_) {
    ts.push_back(params_->Pull(MlpWideTable(shape_), batch.keys, &wide_w_));
  }
  for (int64_t t : ts) PS_RETURN_IF_ERROR(params_->Wait(t, deadline));
  if (wide_) {
    const size_t F = shape_.num_fields;
    offset_.assign(batch.rows(), 0.0f);
    for (size_t b = 0; b < batch.rows(); ++b) {
      double z = 0;
      for (size_t f = 0; f < F; ++f) z += wide_w_[batch.slots[b * F + f]];
      offset_[b] = static_cast<float>(z);
    }
  }
  return absl::OkStatus();
}

MlpParams MlpTrainer::Params() const {
  MlpParams p;
  p.emb = emb_;
  for (const auto& v : layers_) p.layers.push_back(v);
  if (wide_) p.logit_offset = offset_;
  return p;
}

absl::StatusOr<int64_t> MlpTrainer::Step(const FieldBlock& block,
                                         MlpBatch* batch, double* loss) {
  const TrainingConfig& tc = config_.training;
  const size_t n = block.rows();
  BuildMlpBatch(block, batch);
  // Each (worker, clock) its own dropout mask, the same on every run.
  batch->seed = Mix64(tc.seed ^ Mix64((static_cast<uint64_t>(worker_id_) << 40) ^
                                      static_cast<uint64_t>(params_->clock())));
  const absl::Time t0 = absl::Now();
  PS_RETURN_IF_ERROR(PullParams(*batch));
  const absl::Time t1 = absl::Now();
  gemb_.resize(emb_.size());
  MlpGrads g;
  g.emb = absl::MakeSpan(gemb_);
  for (int l = 0; l < shape_.num_layers(); ++l) {
    g.layers.push_back(absl::MakeSpan(glayers_[l]));
  }
  if (wide_) {
    dlogit_.resize(batch->rows());
    g.logit = absl::MakeSpan(dlogit_);
  }
  *loss = 0;
  PS_RETURN_IF_ERROR(backend_->Gradient(shape_, *batch, Params(), g, loss));
  if (wide_) {
    // d loss / d w_key = sum over the rows holding key of d loss / d logit.
    const size_t F = shape_.num_fields;
    wide_g_.assign(batch->keys.size(), 0.0f);
    for (size_t b = 0; b < batch->rows(); ++b) {
      for (size_t f = 0; f < F; ++f) {
        wide_g_[batch->slots[b * F + f]] += dlogit_[b];
      }
    }
  }
  absl::Time t2 = absl::Now();
  if (worker_id_ == 0 && tc.straggler_factor > 1.0) {
    absl::SleepFor((t2 - t1) * (tc.straggler_factor - 1.0));
    t2 = absl::Now();
  }
  const int rows = static_cast<int>(n);
  // The embedding, each layer, the wide part; the last push carries the
  // clock (one round trip per server, not two).
  struct Gradient {
    int table;
    absl::Span<const uint64_t> keys;
    absl::Span<const float> vals;
  };
  std::vector<Gradient> grads = {{kMlpEmbeddingTable, batch->keys, gemb_}};
  for (int l = 0; l < shape_.num_layers(); ++l) {
    grads.push_back({kMlpFirstLayerTable + l, layer_keys_[l], glayers_[l]});
  }
  if (wide_) grads.push_back({MlpWideTable(shape_), batch->keys, wide_g_});
  for (size_t i = 0; i + 1 < grads.size(); ++i) {
    params_->Push(grads[i].table, grads[i].keys, grads[i].vals, rows);
  }
  const int64_t ts = params_->PushAndClock(
      grads.back().table, grads.back().keys, grads.back().vals, rows);

  stats_.wait_seconds += absl::ToDoubleSeconds(t1 - t0);
  stats_.compute_seconds += absl::ToDoubleSeconds(t2 - t1);
  stats_.examples += rows;
  stats_.loss_sum += *loss;
  examples_.store(stats_.examples);
  wait_ns_.store(static_cast<int64_t>(stats_.wait_seconds * 1e9));
  compute_ns_.store(static_cast<int64_t>(stats_.compute_seconds * 1e9));
  loss_sum_.store(stats_.loss_sum);
  return ts;
}

// Progress lines and the test curve, shared by both ways of training.
struct MlpTrainer::Progress {
  absl::Time start = absl::Now();
  absl::Time last_report = start;
  absl::Time last_eval = start;
  int64_t examples = 0;
  double loss = 0;
};

absl::Status MlpTrainer::AfterStep(int epoch, size_t rows, double loss,
                                   FieldReader* eval, Progress* p) {
  const TrainingConfig& tc = config_.training;
  p->examples += static_cast<int64_t>(rows);
  p->loss += loss;
  const absl::Time now = absl::Now();
  if (now - p->last_report >= absl::Seconds(tc.progress_interval_s)) {
    PS_LOG_INFO("mlp epoch {} clock {}: {:.0f} examples/s, train loss {:.4f}",
                epoch, params_->clock(),
                p->examples / absl::ToDoubleSeconds(now - p->last_report),
                p->loss / std::max<int64_t>(1, p->examples));
    p->last_report = now;
    p->examples = 0;
    p->loss = 0;
  }
  if (eval != nullptr && tc.eval_interval_s > 0 &&
      now - p->last_eval >= absl::Seconds(tc.eval_interval_s)) {
    PS_RETURN_IF_ERROR(eval->Reset());
    PS_ASSIGN_OR_RETURN(EvalMetrics m, Evaluate(eval));
    stats_.curve.push_back(
        MakeEvalPoint(absl::Now() - p->start, m, stats_.examples));
    p->last_eval = absl::Now();
  }
  return absl::OkStatus();
}

absl::Status MlpTrainer::Train(FieldReader* reader, FieldReader* eval) {
  const TrainingConfig& tc = config_.training;
  PS_RETURN_IF_ERROR(CheckMinibatchResolved(tc));
  PS_RETURN_IF_ERROR(ValidateMlpShape(shape_));
  Progress progress;
  FieldBlock block;
  MlpBatch batch;
  for (int epoch = 0; epoch < tc.epochs; ++epoch) {
    if (epoch > 0) PS_RETURN_IF_ERROR(reader->Reset());
    for (;;) {
      block.Clear();
      PS_ASSIGN_OR_RETURN(size_t n, reader->Next(tc.minibatch, &block));
      if (n == 0) break;
      double loss = 0;
      PS_RETURN_IF_ERROR(Step(block, &batch, &loss).status());
      PS_RETURN_IF_ERROR(AfterStep(epoch, n, loss, eval, &progress));
    }
  }
  stats_.wall_seconds = absl::ToDoubleSeconds(absl::Now() - progress.start);
  stats_.train_skipped = SkippedLinesOf(reader->path(), reader->stats());
  return CheckTrainedExamples(worker_id_, reader->path(), reader->stats(),
                              stats_.examples);
}

absl::Status MlpTrainer::Train(WorkSource* work, FieldReader* eval) {
  const TrainingConfig& tc = config_.training;
  PS_RETURN_IF_ERROR(CheckMinibatchResolved(tc));
  PS_RETURN_IF_ERROR(ValidateMlpShape(shape_));
  Progress progress;
  FieldBlock block;
  MlpBatch batch;
  std::vector<float> idle_w;
  const std::vector<uint64_t> idle_key = {0};
  for (;;) {
    block.Clear();
    int64_t unit = -1;
    PS_ASSIGN_OR_RETURN(WorkSource::Got got,
                        work->Next(tc.minibatch, &block, &unit));
    if (got == WorkSource::Got::kDone) break;
    if (got == WorkSource::Got::kWait) {
      // No unit free now (others finish theirs; one may come back from a
      // dead worker): keep step with an empty clock and a pull at the new
      // clock (which waits as any pull would), as the LR trainer does.
      const absl::Time t0 = absl::Now();
      params_->Clock(0);
      const int64_t ts = params_->Pull(kMlpFirstLayerTable, idle_key, &idle_w);
      PS_RETURN_IF_ERROR(params_->Wait(ts, absl::Now() + absl::Seconds(600)));
      absl::SleepFor(absl::Milliseconds(10));
      stats_.wait_seconds += absl::ToDoubleSeconds(absl::Now() - t0);
      continue;
    }
    double loss = 0;
    PS_ASSIGN_OR_RETURN(const int64_t ts, Step(block, &batch, &loss));
    work->Pushed(unit, ts);
    PS_RETURN_IF_ERROR(
        AfterStep(work->epoch(), block.rows(), loss, eval, &progress));
  }
  stats_.wall_seconds = absl::ToDoubleSeconds(absl::Now() - progress.start);
  // Whether the job trained any example is the scheduler's check.
  stats_.train_skipped = work->skipped();
  return absl::OkStatus();
}

absl::StatusOr<EvalMetrics> MlpTrainer::Evaluate(FieldReader* reader) {
  FieldBlock block;
  MlpBatch batch;
  std::vector<float> prob, all_prob, all_labels;
  for (;;) {
    block.Clear();
    PS_ASSIGN_OR_RETURN(size_t n, reader->Next(5000, &block));
    if (n == 0) break;
    BuildMlpBatch(block, &batch);
    PS_RETURN_IF_ERROR(PullParams(batch));
    prob.assign(batch.rows(), 0.0f);
    PS_RETURN_IF_ERROR(
        backend_->Predict(shape_, batch, Params(), absl::MakeSpan(prob)));
    all_prob.insert(all_prob.end(), prob.begin(), prob.end());
    all_labels.insert(all_labels.end(), batch.labels.begin(), batch.labels.end());
  }
  stats_.test_skipped = SkippedLinesOf(reader->path(), reader->stats());
  return ps::Evaluate(all_prob, all_labels);
}

}  // namespace ps
