// The parameter-server tables of each model (training.model), as the
// scheduler publishes them in the cluster view and the workers and
// ps_predict address them. Shared by the scheduler, the workers and the
// tools, so that none of them needs another's library (issue 12's split of
// worker/ into data, models and the client).
//
// logistic regression (training.model: lr): table 0 "weights", dim 1, one
// weight per feature key, updated by the `optimizer` section's rule.
//
// mlp (wide & deep on Criteo fields; models/wide_deep.h has the model):
// table 0 "mlp_embeddings", dim embedding_dim, one key per (field, value);
// tables 1..L "mlp_layer<l>", dim fan_in + 1, key o = output unit o, value =
// [weights..., bias] (kernels/mlp.h's layout), initialised Glorot-uniform;
// with mlp.wide, table L+1 "mlp_wide", dim 1, with the `optimizer` section's
// rule.
#pragma once

#include <vector>

#include "common/config.h"
#include "data/criteo.h"  // kCriteoNumFields
#include "kernels/mlp.h"
#include "proto/ps.pb.h"

namespace ps {

inline constexpr int kLrWeightsTable = 0;
inline constexpr int kMlpEmbeddingTable = 0;
// Layer l is table kMlpFirstLayerTable + l.
inline constexpr int kMlpFirstLayerTable = 1;
// The wide part's table (mlp.wide), after the last layer.
inline int MlpWideTable(const MlpShape& shape) {
  return kMlpFirstLayerTable + shape.num_layers();
}

// The model shape of an mlp job: 39 fields, mlp.embedding_dim, mlp.hidden,
// mlp.dropout.
MlpShape MlpShapeOf(const JobConfig& config);

// The tables of an mlp job (above), with mlp.optimizer / learning_rate / l2
// as their update rule and init scales: embeddings mlp.embedding_init,
// layer l sqrt(6 / (fan_in + fan_out)) (Glorot uniform); with mlp.wide, the
// wide table with the `optimizer` section's rule.
std::vector<proto::TableConfig> MlpTables(const JobConfig& config);

// The tables of the job's model (training.model): MlpTables for mlp, the
// one "weights" table otherwise.
std::vector<proto::TableConfig> ModelTables(const JobConfig& config);

}  // namespace ps
