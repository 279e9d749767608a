#include "models/tables.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace ps {
namespace {

proto::OptimizerConfig MlpOptimizer(const MlpConfig& m, float init_scale) {
  proto::OptimizerConfig o;
  o.set_name(m.optimizer);
  o.set_learning_rate(static_cast<float>(m.learning_rate));
  o.set_l2(static_cast<float>(m.l2));
  o.set_initial_accumulator(0.1f);  // adagrad
  o.set_init_scale(init_scale);
  return o;
}

}  // namespace

MlpShape MlpShapeOf(const JobConfig& config) {
  MlpShape s;
  s.num_fields = kCriteoNumFields;
  s.embedding_dim = config.mlp.embedding_dim;
  s.hidden = config.mlp.hidden;
  s.dropout = static_cast<float>(config.mlp.dropout);
  return s;
}

std::vector<proto::TableConfig> MlpTables(const JobConfig& config) {
  const MlpShape shape = MlpShapeOf(config);
  std::vector<proto::TableConfig> tables;
  proto::TableConfig emb;
  emb.set_id(kMlpEmbeddingTable);
  emb.set_name("mlp_embeddings");
  emb.set_dim(shape.embedding_dim);
  *emb.mutable_optimizer() =
      MlpOptimizer(config.mlp, static_cast<float>(config.mlp.embedding_init));
  tables.push_back(emb);
  for (int l = 0; l < shape.num_layers(); ++l) {
    proto::TableConfig t;
    t.set_id(kMlpFirstLayerTable + l);
    t.set_name(absl::StrCat("mlp_layer", l));
    t.set_dim(shape.fan_in(l) + 1);
    const float scale = static_cast<float>(
        std::sqrt(6.0 / (shape.fan_in(l) + shape.fan_out(l))));
    *t.mutable_optimizer() = MlpOptimizer(config.mlp, scale);
    tables.push_back(t);
  }
  if (config.mlp.wide) {
    proto::TableConfig t;
    t.set_id(MlpWideTable(shape));
    t.set_name("mlp_wide");
    t.set_dim(1);
    *t.mutable_optimizer() = OptimizerProto(config.optimizer);
    tables.push_back(t);
  }
  return tables;
}

std::vector<proto::TableConfig> ModelTables(const JobConfig& config) {
  if (config.training.model == "mlp") return MlpTables(config);
  proto::TableConfig t;
  t.set_id(kLrWeightsTable);
  t.set_name("weights");
  t.set_dim(1);
  *t.mutable_optimizer() = OptimizerProto(config.optimizer);
  t.set_dense_ids(static_cast<uint64_t>(DenseFeatures(config)));
  return {t};
}

}  // namespace ps
