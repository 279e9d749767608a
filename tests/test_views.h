// Cluster views the gRPC-level tests configure a lone ServerNode with.
#pragma once

#include "common/routing.h"
#include "proto/ps.pb.h"

namespace ps {

// One server owning every key (4 virtual nodes, epoch 1), one live worker,
// ASP, and one table of dim 1 updated by SGD with learning rate 1 (a push of
// g makes the weight -g).
inline proto::ClusterView OneServerView() {
  proto::ClusterView v;
  v.set_epoch(1);
  *v.mutable_routing() = BuildHashRing({0}, 4, 1);
  proto::NodeInfo* w = v.add_workers();
  w->set_id(0);
  w->set_state(proto::NODE_ALIVE);
  v.mutable_consistency()->set_mode(proto::MODE_ASP);
  v.mutable_consistency()->set_tau(-1);
  proto::TableConfig* t = v.add_tables();
  t->set_id(0);
  t->set_dim(1);
  t->mutable_optimizer()->set_name("sgd");
  t->mutable_optimizer()->set_learning_rate(1);
  return v;
}

}  // namespace ps
