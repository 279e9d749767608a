#include "models/wide_deep.h"

#include <algorithm>

#include "absl/time/clock.h"
#include "common/hash.h"
#include "common/radix_sort.h"
#include "common/status_macros.h"

namespace ps {

void BuildMlpBatch(const FieldBlock& block, MlpBatch* batch) {
  batch->Clear();
  SortUnique(block.keys, {}, &batch->keys, &batch->slots);
  batch->labels.assign(block.labels.begin(), block.labels.end());
}

WideDeepModel::WideDeepModel(int worker_id, const JobConfig& config,
                             ParamClient* params, MlpBackend* backend)
    : worker_id_(worker_id),
      config_(config),
      params_(params),
      backend_(backend),
      shape_(MlpShapeOf(config)),
      wide_(config.mlp.wide),
      wide_table_(MlpWideTable(shape_)) {
  for (int l = 0; l < shape_.num_layers(); ++l) {
    std::vector<uint64_t> keys(shape_.fan_out(l));
    for (size_t o = 0; o < keys.size(); ++o) keys[o] = o;
    layer_keys_.push_back(std::move(keys));
  }
  for (Slot& s : slots_) s.v.layers.resize(shape_.num_layers());
  glayers_.resize(shape_.num_layers());
  for (int l = 0; l < shape_.num_layers(); ++l) {
    glayers_[l].resize(shape_.layer_floats(l));
  }
}

absl::Status WideDeepModel::Validate() const {
  return ValidateMlpShape(shape_);
}

void WideDeepModel::SendPulls(const MlpBatch& batch, int64_t at_clock,
                              Values* v) const {
  v->layers.resize(shape_.num_layers());
  v->ts.clear();
  v->ts.push_back(
      params_->Pull(kMlpEmbeddingTable, batch.keys, &v->emb, at_clock));
  for (int l = 0; l < shape_.num_layers(); ++l) {
    v->ts.push_back(params_->Pull(kMlpFirstLayerTable + l, layer_keys_[l],
                                  &v->layers[l], at_clock));
  }
  if (wide_) {
    v->ts.push_back(
        params_->Pull(wide_table_, batch.keys, &v->wide_w, at_clock));
  }
}

absl::Status WideDeepModel::WaitPulls(const MlpBatch& batch,
                                      absl::Time deadline, Values* v) const {
  // Every timestamp is waited for, even after an error (each once).
  absl::Status status;
  for (int64_t t : v->ts) {
    absl::Status s = params_->Wait(t, deadline);
    if (status.ok()) status = s;
  }
  v->ts.clear();
  PS_RETURN_IF_ERROR(status);
  if (wide_) {
    const size_t F = shape_.num_fields;
    v->offset.assign(batch.rows(), 0.0f);
    for (size_t b = 0; b < batch.rows(); ++b) {
      double z = 0;
      for (size_t f = 0; f < F; ++f) z += v->wide_w[batch.slots[b * F + f]];
      v->offset[b] = static_cast<float>(z);
    }
  }
  return absl::OkStatus();
}

MlpParams WideDeepModel::Params(const Values& v) const {
  MlpParams p;
  p.emb = v.emb;
  for (const auto& l : v.layers) p.layers.push_back(l);
  if (wide_) p.logit_offset = v.offset;
  return p;
}

absl::StatusOr<BatchSource::Got> WideDeepModel::Read(BatchSource* source,
                                                     size_t max_rows, int slot,
                                                     int64_t* unit,
                                                     size_t* rows) {
  block_.Clear();
  PS_ASSIGN_OR_RETURN(BatchSource::Got got,
                      source->Next(max_rows, &block_, unit));
  if (got == BatchSource::Got::kRows) {
    BuildMlpBatch(block_, &slots_[slot].batch);
    *rows = block_.rows();
  }
  return got;
}

void WideDeepModel::Pull(int slot, int64_t at_clock) {
  SendPulls(slots_[slot].batch, at_clock, &slots_[slot].v);
}

absl::Status WideDeepModel::WaitPull(int slot, absl::Time deadline) {
  return WaitPulls(slots_[slot].batch, deadline, &slots_[slot].v);
}

absl::Status WideDeepModel::Submit(int slot, int64_t clock) {
  Slot& s = slots_[slot];
  // Each (worker, clock) its own dropout mask, the same on every run.
  s.batch.seed = Mix64(config_.training.seed ^
                       Mix64((static_cast<uint64_t>(worker_id_) << 40) ^
                             static_cast<uint64_t>(clock)));
  gemb_.resize(s.v.emb.size());
  MlpGrads g;
  g.emb = absl::MakeSpan(gemb_);
  for (int l = 0; l < shape_.num_layers(); ++l) {
    g.layers.push_back(absl::MakeSpan(glayers_[l]));
  }
  if (wide_) {
    dlogit_.resize(s.batch.rows());
    g.logit = absl::MakeSpan(dlogit_);
  }
  loss_ = 0;
  PS_RETURN_IF_ERROR(
      backend_->Gradient(shape_, s.batch, Params(s.v), g, &loss_));
  if (wide_) {
    // d loss / d w_key = sum over the rows holding key of d loss / d logit.
    const size_t F = shape_.num_fields;
    wide_g_.assign(s.batch.keys.size(), 0.0f);
    for (size_t b = 0; b < s.batch.rows(); ++b) {
      for (size_t f = 0; f < F; ++f) {
        wide_g_[s.batch.slots[b * F + f]] += dlogit_[b];
      }
    }
  }
  return absl::OkStatus();
}

absl::Status WideDeepModel::Collect(int /*slot*/, double* loss) {
  *loss = loss_;
  return absl::OkStatus();
}

int64_t WideDeepModel::PushAndClock(int slot, int rows) {
  const MlpBatch& batch = slots_[slot].batch;
  // The embedding, each layer, the wide part; the last push carries the
  // clock (one round trip per server, not two).
  struct Gradient {
    int table;
    absl::Span<const uint64_t> keys;
    absl::Span<const float> vals;
  };
  std::vector<Gradient> grads = {{kMlpEmbeddingTable, batch.keys, gemb_}};
  for (int l = 0; l < shape_.num_layers(); ++l) {
    grads.push_back({kMlpFirstLayerTable + l, layer_keys_[l], glayers_[l]});
  }
  if (wide_) grads.push_back({wide_table_, batch.keys, wide_g_});
  for (size_t i = 0; i + 1 < grads.size(); ++i) {
    params_->Push(grads[i].table, grads[i].keys, grads[i].vals, rows);
  }
  return params_->PushAndClock(grads.back().table, grads.back().keys,
                               grads.back().vals, rows);
}

absl::StatusOr<EvalMetrics> WideDeepModel::Evaluate(MlpBackend* backend,
                                                    FieldReader* reader) const {
  FieldBlock block;
  MlpBatch batch;
  Values v;
  std::vector<float> prob, all_prob, all_labels;
  for (;;) {
    block.Clear();
    PS_ASSIGN_OR_RETURN(size_t n, reader->Next(5000, &block));
    if (n == 0) break;
    BuildMlpBatch(block, &batch);
    SendPulls(batch, -1, &v);
    PS_RETURN_IF_ERROR(WaitPulls(batch, absl::Now() + absl::Seconds(600), &v));
    prob.assign(batch.rows(), 0.0f);
    PS_RETURN_IF_ERROR(
        backend->Predict(shape_, batch, Params(v), absl::MakeSpan(prob)));
    all_prob.insert(all_prob.end(), prob.begin(), prob.end());
    all_labels.insert(all_labels.end(), batch.labels.begin(),
                      batch.labels.end());
  }
  return ps::Evaluate(all_prob, all_labels);
}

}  // namespace ps
