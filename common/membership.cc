#include "common/membership.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "transport/errors.h"

namespace ps {

void UseFastGrpcBackupPolling() {
  ::setenv("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", "100",
           /*overwrite=*/0);
}

absl::StatusOr<Membership> JoinCluster(SchedulerClient* scheduler,
                                       const std::string& scheduler_address,
                                       const proto::RegisterRequest& req,
                                       absl::Time deadline) {
  // Unreachable looks the same whether the scheduler is not up yet, the
  // address is wrong, or TLS settings differ (gRPC only says "failed to
  // connect"): say so while retrying, not only at the deadline.
  constexpr char kUnreachableHint[] =
      "is the scheduler running at that address, and do this node's "
      "PS_TLS_* settings match the scheduler's?";
  absl::StatusOr<proto::RegisterResponse> r;
  absl::Time next_warning = absl::Now() + absl::Seconds(5);
  for (;;) {
    r = scheduler->Register(req, absl::Now() + absl::Seconds(5));
    if (r.ok() || r.status().code() != absl::StatusCode::kUnavailable ||
        absl::Now() > deadline) {
      break;
    }
    if (absl::Now() >= next_warning) {
      PS_LOG_WARN("scheduler {} not reachable yet ({}); retrying for {} "
                  "more ({})",
                  scheduler_address, std::string(r.status().message()),
                  absl::FormatDuration(absl::Trunc(deadline - absl::Now(),
                                                   absl::Seconds(1))),
                  kUnreachableHint);
      next_warning = absl::Now() + absl::Seconds(15);
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  if (!r.ok()) {
    const bool unreachable =
        r.status().code() == absl::StatusCode::kUnavailable;
    return absl::Status(
        r.status().code(),
        absl::StrCat("register with scheduler ", scheduler_address, ": ",
                     r.status().message(),
                     unreachable ? absl::StrCat(" (", kUnreachableHint, ")")
                                 : std::string()));
  }
  Membership m;
  m.id = r->id();
  m.view = r->view();
  while (m.view.epoch() == 0) {
    proto::GetViewRequest gv;
    gv.set_wait_ms(1000);
    // Lets the scheduler start this node's heartbeat deadline when the
    // reply carries the ready view.
    gv.set_role(req.role());
    gv.set_id(m.id);
    auto v = scheduler->GetView(gv, absl::Now() + absl::Seconds(5));
    if (v.ok() && v->ready()) {
      m.view = v->view();
    } else if (!v.ok() && ReasonOf(v.status()) == proto::REASON_NOT_REGISTERED) {
      // The scheduler was restarted before the cluster was ready: register
      // with the new one, asking for the same id.
      PS_LOG_WARN("{}", std::string(v.status().message()));
      proto::RegisterRequest again = req;
      again.set_requested_id(m.id);
      auto rr = scheduler->Register(again, absl::Now() + absl::Seconds(5));
      if (rr.ok()) {
        m.id = rr->id();
        m.view = rr->view();
      } else if (rr.status().code() != absl::StatusCode::kUnavailable) {
        return absl::Status(rr.status().code(),
                            absl::StrCat("register again with scheduler ",
                                         scheduler_address, ": ",
                                         rr.status().message()));
      }
    } else if (!v.ok() &&
               v.status().code() != absl::StatusCode::kUnavailable &&
               v.status().code() != absl::StatusCode::kDeadlineExceeded) {
      return v.status();
    }
    if (m.view.epoch() == 0 && absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the cluster view from ", scheduler_address, " never became ready"));
    }
  }
  // A worker that joined the running job (issue 9) waits until the
  // scheduler has fixed the clock it starts at (KVWorker reads it).
  auto joining = [&m]() {
    return m.id >= 0 && m.id < m.view.workers_size() &&
           m.view.workers(m.id).joining();
  };
  while (joining()) {
    proto::GetViewRequest gv;
    gv.set_known_epoch(m.view.epoch());
    gv.set_wait_ms(1000);
    gv.set_role(req.role());
    gv.set_id(m.id);
    auto v = scheduler->GetView(gv, absl::Now() + absl::Seconds(5));
    if (v.ok() && v->ready()) {
      if (v->view().epoch() > m.view.epoch()) m.view = v->view();
    } else if (!v.ok() &&
               v.status().code() != absl::StatusCode::kUnavailable &&
               v.status().code() != absl::StatusCode::kDeadlineExceeded) {
      return v.status();
    }
    if (joining() && absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "joined the running job at ", scheduler_address,
          " as worker ", m.id, " but was never given a start clock"));
    }
  }
  return m;
}

}  // namespace ps
