// Joining a job: the steps every server and worker takes against the
// scheduler before it can work.
#pragma once

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/transport.h"
#include "proto/ps.pb.h"

namespace ps {

// Bug "A ~5 s stall while connecting": gRPC notices some connection
// attempts (a reconnect started from its timer thread after the first
// connect was refused because the peer was not listening yet) only when
// its client-channel backup poller runs, every 5 s by default. Sets
// GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS to 100 ms unless the
// environment already sets it. gRPC reads it once, at its first
// initialisation: call at the start of a process, before any gRPC object
// exists.
void UseFastGrpcBackupPolling();

// Registers, retrying while the scheduler is unreachable (it may not be up
// yet) until `deadline`, then waits for a ready cluster view. Returns the
// assigned id and the view; errors name the scheduler address. While it
// stays unreachable, warns after 5 s and then every 15 s; UNAVAILABLE at
// the deadline asks whether the scheduler runs there and whether the TLS
// settings match (a TLS mismatch is indistinguishable from no scheduler).
struct Membership {
  int id = -1;
  proto::ClusterView view;
};
absl::StatusOr<Membership> JoinCluster(SchedulerClient* scheduler,
                                       const std::string& scheduler_address,
                                       const proto::RegisterRequest& req,
                                       absl::Time deadline);

}  // namespace ps
