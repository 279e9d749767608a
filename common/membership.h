// Joining a job: the steps every server and worker takes against the
// scheduler before it can work.
#pragma once

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/transport.h"
#include "proto/ps.pb.h"

namespace ps {

// Registers, retrying while the scheduler is unreachable (it may not be up
// yet) until `deadline`, then waits for a ready cluster view. Returns the
// assigned id and the view; errors name the scheduler address.
struct Membership {
  int id = -1;
  proto::ClusterView view;
};
absl::StatusOr<Membership> JoinCluster(SchedulerClient* scheduler,
                                       const std::string& scheduler_address,
                                       const proto::RegisterRequest& req,
                                       absl::Time deadline);

}  // namespace ps
