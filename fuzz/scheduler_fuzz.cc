// Fuzz target for the scheduler's request handlers (scheduler/scheduler.h):
// a SchedulerCore on a fake clock, whose servers are fakes that answer
// every control call with OK, gets the Register/Heartbeat/GetWork/Barrier/
// WorkerDone/SetConsistency/GetView calls of a ps.fuzz.SchedulerInput
// (fuzz_input.proto) parsed from the input, with fake-clock advances and
// CheckHeartbeats() in between. Barrier and GetView get a deadline that has
// already passed, so no call blocks. Checks, besides "no crash": no error
// has code UNKNOWN/INTERNAL; the report is produced in every state.
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/logging.h"
#include "fuzz/fuzz_input.pb.h"
#include "fuzz/fuzz_util.h"
#include "scheduler/scheduler.h"

namespace ps::fuzz {
namespace {

class OkServer : public ServerClient {
 public:
  void Push(std::shared_ptr<const proto::PushRequest>, absl::Time,
            Callback<proto::PushResponse> done) override {
    proto::PushResponse r;
    done(absl::OkStatus(), &r);
  }
  void Pull(std::shared_ptr<const proto::PullRequest>, absl::Time,
            Callback<proto::PullResponse> done) override {
    proto::PullResponse r;
    done(absl::OkStatus(), &r);
  }
  void Clock(std::shared_ptr<const proto::ClockRequest>, absl::Time,
             Callback<proto::ClockResponse> done) override {
    proto::ClockResponse r;
    done(absl::OkStatus(), &r);
  }
  absl::Status Finish(const proto::FinishRequest&, absl::Time) override {
    return absl::OkStatus();
  }
  absl::StatusOr<proto::ServerControlResponse> Control(
      const proto::ServerControlRequest&, absl::Time) override {
    return proto::ServerControlResponse();
  }
  absl::StatusOr<proto::ServerStatus> GetStatus(absl::Time) override {
    return proto::ServerStatus();
  }
};

class OkFactory : public ClientFactory {
 public:
  std::shared_ptr<ServerClient> Server(const std::string&) override {
    return std::make_shared<OkServer>();
  }
  std::shared_ptr<SchedulerClient> Scheduler(const std::string&) override {
    return nullptr;  // the scheduler never calls itself
  }
};

void CheckCode(const absl::Status& s) {
  PS_FUZZ_CHECK(s.code() != absl::StatusCode::kUnknown &&
                s.code() != absl::StatusCode::kInternal);
}

}  // namespace

int Scheduler(const uint8_t* data, size_t size) {
  static bool quiet = (InitLogging("fuzz", "off"), QuietProtobuf(), true);
  (void)quiet;
  SchedulerInput in;
  if (!in.ParseFromArray(data, static_cast<int>(size))) return 0;
  FakeClock clock;
  OkFactory factory;
  SchedulerOptions opts;
  opts.config.cluster.num_servers = 1 + static_cast<int>(in.servers() % 3);
  opts.config.cluster.num_workers = 1 + static_cast<int>(in.workers() % 4);
  opts.clock = &clock;
  opts.clients = &factory;
  SchedulerCore core(std::move(opts));
  for (const SchedulerCall& call : in.calls()) {
    switch (call.call_case()) {
      case SchedulerCall::kRegister:
        CheckCode(core.Register(call.register_()).status());
        break;
      case SchedulerCall::kHeartbeat:
        CheckCode(core.Heartbeat(call.heartbeat()).status());
        break;
      case SchedulerCall::kGetWork:
        CheckCode(core.GetWork(call.get_work()).status());
        break;
      case SchedulerCall::kBarrier: {
        proto::BarrierRequest req = call.barrier();
        req.set_timeout_ms(0);  // the deadline below bounds it
        CheckCode(core.Barrier(req, absl::Now()));
        break;
      }
      case SchedulerCall::kWorkerDone:
        CheckCode(core.WorkerDone(call.worker_done()));
        break;
      case SchedulerCall::kSetConsistency:
        CheckCode(core.SetConsistency(call.set_consistency()).status());
        break;
      case SchedulerCall::kGetView: {
        proto::GetViewRequest req = call.get_view();
        req.set_wait_ms(0);
        CheckCode(core.GetView(req, absl::Now()).status());
        break;
      }
      case SchedulerCall::kOpenSession:
        CheckCode(core.OpenSession(call.open_session().role(),
                                   call.open_session().id()));
        break;
      case SchedulerCall::kCloseSession:
        core.CloseSession(call.close_session().role(),
                          call.close_session().id());
        break;
      case SchedulerCall::kAdvanceMs:
        clock.Advance(absl::Milliseconds(call.advance_ms() % 100000));
        core.CheckHeartbeats();
        break;
      case SchedulerCall::CALL_NOT_SET:
        break;
    }
  }
  CheckCode(core.Status().status());
  (void)core.ReportJson();
  core.Fail(absl::CancelledError("fuzz: end"));
  CheckCode(core.WaitForEnd(absl::Now()));
  return 0;
}

}  // namespace ps::fuzz
