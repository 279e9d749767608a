// The transport seam: worker and scheduler logic talk to remote nodes only
// through these interfaces. GrpcClientFactory (grpc_transport.h) is the real
// one; inproc_transport.h (no network), faulty_transport.h (fault
// injection) and fake_transport.h (scriptable test doubles) are the others.
//
// Status codes carry their retry meaning, refined by a typed reason
// (transport/errors.h, proto::ErrorReason) that every transport carries:
//   UNAVAILABLE          the peer could not be reached; retry the same request
//                        (reason VIEW_BEHIND: the server has not installed
//                        the request's epoch yet; same)
//   DEADLINE_EXCEEDED    no answer in time; retry is safe for pushes (dedup);
//                        reason CONSISTENCY_TIMEOUT: a pull's consistency
//                        wait expired on the server, final
//   FAILED_PRECONDITION  reason STALE_EPOCH: refresh the routing view,
//                        re-slice, retry
//   INVALID_ARGUMENT     the request is malformed; never retry
//   UNAUTHENTICATED      wrong or missing cluster token
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/ps.pb.h"
#include "transport/errors.h"

namespace ps {

// How long a client's channel waits at most between attempts to reach a
// peer that went away (gRPC's maximum reconnect backoff, to which gRPC adds
// up to 20 % jitter): a node's first call to a scheduler that restarted can
// come this late after it listens (SchedulerCore::kReconnectGrace).
inline constexpr int kMaxReconnectBackoffMs = 1000;

// What a push borrows instead of holding it in its fields (issue 10: a
// push that does not copy the caller's array, nor the worker's keys).
// Values: when `pieces` is not empty, they (in order) are the vals field's
// bytes (req.vals() then empty), `owner` keeping their memory alive and
// unchanged. Keys: when `keys` is not empty, it is the keys field
// (req.keys() then empty), kept alive and unchanged by `keys_owner`.
// Whoever reads the borrowed bytes holds a copy of their owner while it
// does.
struct BorrowedValues {
  std::shared_ptr<const void> owner;
  std::vector<absl::Span<const char>> pieces;
  absl::Span<const char> keys;
  std::shared_ptr<const void> keys_owner;

  // The borrowed values' bytes.
  size_t size() const {
    size_t n = 0;
    for (const absl::Span<const char>& p : pieces) n += p.size();
    return n;
  }
  // Appends the pieces' bytes to *out.
  void AppendTo(std::string* out) const {
    out->reserve(out->size() + size());
    for (const absl::Span<const char>& p : pieces) out->append(p.data(), p.size());
  }
};

// A client of one parameter server. Thread-safe. Asynchronous calls share
// ownership of the request (so a retry resends it without a copy); the
// callback runs exactly once, on an arbitrary
// thread (possibly the caller's, before the call returns), and `resp` is
// valid only during the callback (the callee may move fields out of it).
class ServerClient {
 public:
  template <typename Resp>
  using Callback = std::function<void(const absl::Status&, Resp*)>;

  virtual ~ServerClient() = default;
  virtual void Push(std::shared_ptr<const proto::PushRequest> req, absl::Time deadline,
                    Callback<proto::PushResponse> done) = 0;
  // Push whose vals field is `vals`' pieces (req->vals() then empty) and
  // whose keys field is `vals.keys` (req->keys() then empty), when they
  // are not empty, as if they were in those fields. This default copies
  // them into a request and calls Push; the gRPC client sends them where
  // they lie.
  virtual void PushBorrowed(std::shared_ptr<const proto::PushRequest> req,
                            BorrowedValues vals, absl::Time deadline,
                            Callback<proto::PushResponse> done) {
    auto whole = std::make_shared<proto::PushRequest>(*req);
    if (!vals.keys.empty()) {
      whole->set_keys(vals.keys.data(), vals.keys.size());
    }
    vals.AppendTo(whole->mutable_vals());
    Push(std::move(whole), deadline, std::move(done));
  }
  virtual void Pull(std::shared_ptr<const proto::PullRequest> req, absl::Time deadline,
                    Callback<proto::PullResponse> done) = 0;
  // Pull whose answer's values come as `vals` (valid during the callback)
  // instead of in resp->vals(), so that a transport that received them in
  // its own buffer hands them over without copying them into the response
  // first (the data plane: a 4 MiB pull's values were copied twice on the
  // worker). This default calls Pull and passes resp->vals() of an answer
  // that is OK; a failed one gets no values, and this adapter does not read
  // its response (the in-process cluster fails a killed server's pulls while
  // the server may still be writing their responses; ThreadSanitizer saw
  // the read). A caller must not read a failed pull's response either.
  using ValuesCallback = std::function<void(
      const absl::Status&, proto::PullResponse*, absl::Span<const char> vals)>;
  virtual void PullValues(std::shared_ptr<const proto::PullRequest> req,
                          absl::Time deadline, ValuesCallback done) {
    Pull(std::move(req), deadline,
         [done = std::move(done)](const absl::Status& s,
                                  proto::PullResponse* resp) {
           done(s, resp,
                resp == nullptr || !s.ok()
                    ? absl::Span<const char>()
                    : absl::Span<const char>(resp->vals().data(),
                                             resp->vals().size()));
         });
  }
  // As PullValues, and `keep` keeps `vals` valid after the callback, as
  // long as the caller holds it (issue 10: KVWorker::PullInPlace): a
  // transport that received the values in memory of its own hands that
  // over (the data plane's arena slot) instead of freeing it. Null with
  // no values. This default moves the response's values out of it.
  using KeptValuesCallback = std::function<void(
      const absl::Status&, proto::PullResponse*, absl::Span<const char> vals,
      std::shared_ptr<const void> keep)>;
  virtual void PullKept(std::shared_ptr<const proto::PullRequest> req,
                        absl::Time deadline, KeptValuesCallback done) {
    Pull(std::move(req), deadline,
         [done = std::move(done)](const absl::Status& s,
                                  proto::PullResponse* resp) {
           if (resp == nullptr || !s.ok() || resp->vals().empty()) {
             done(s, resp, {}, nullptr);
             return;
           }
           auto kept =
               std::make_shared<std::string>(std::move(*resp->mutable_vals()));
           const absl::Span<const char> vals(kept->data(), kept->size());
           done(s, resp, vals, std::move(kept));
         });
  }
  virtual void Clock(std::shared_ptr<const proto::ClockRequest> req, absl::Time deadline,
                     Callback<proto::ClockResponse> done) = 0;
  virtual absl::Status Finish(const proto::FinishRequest& req,
                              absl::Time deadline) = 0;
  virtual absl::StatusOr<proto::ServerControlResponse> Control(
      const proto::ServerControlRequest& req, absl::Time deadline) = 0;
  virtual absl::StatusOr<proto::ServerStatus> GetStatus(
      absl::Time deadline) = 0;
  // Replication (issue 9): a primary's log entries for this backup.
  // UNIMPLEMENTED in transports that do not carry it.
  virtual void Replicate(std::shared_ptr<const proto::ReplicateRequest> req,
                         absl::Time deadline,
                         Callback<proto::ReplicateResponse> done) {
    (void)req;
    (void)deadline;
    proto::ReplicateResponse resp;
    done(absl::UnimplementedError("replicate: not in this transport"), &resp);
  }
};

// A client of the scheduler. Thread-safe; calls block until the answer or
// the deadline.
class SchedulerClient {
 public:
  virtual ~SchedulerClient() = default;
  virtual absl::StatusOr<proto::RegisterResponse> Register(
      const proto::RegisterRequest& req, absl::Time deadline) = 0;
  virtual absl::StatusOr<proto::GetViewResponse> GetView(
      const proto::GetViewRequest& req, absl::Time deadline) = 0;
  virtual absl::StatusOr<proto::HeartbeatResponse> Heartbeat(
      const proto::HeartbeatRequest& req, absl::Time deadline) = 0;
  // Dynamic work units (issue 9): reports finished units, gets the next.
  virtual absl::StatusOr<proto::GetWorkResponse> GetWork(
      const proto::GetWorkRequest& req, absl::Time deadline) = 0;
  virtual absl::Status Barrier(const proto::BarrierRequest& req,
                               absl::Time deadline) = 0;
  virtual absl::Status WorkerDone(const proto::WorkerDoneRequest& req,
                                  absl::Time deadline) = 0;
  virtual absl::Status ServerDone(const proto::ServerDoneRequest& req,
                                  absl::Time deadline) = 0;
  virtual absl::StatusOr<proto::SetConsistencyResponse> SetConsistency(
      const proto::SetConsistencyRequest& req, absl::Time deadline) = 0;
  virtual absl::StatusOr<proto::StatusResponse> Status(
      const proto::StatusRequest& req, absl::Time deadline) = 0;
  // Checkpoints (issue 9): takes one now (SchedulerCore::Checkpoint).
  // UNIMPLEMENTED in transports that do not carry it (only gRPC does).
  virtual absl::StatusOr<proto::CheckpointResponse> Checkpoint(
      const proto::CheckpointRequest&, absl::Time) {
    return absl::UnimplementedError("checkpoint: not in this transport");
  }
  // Elasticity (issue 9): drains a server (SchedulerCore::Drain).
  // UNIMPLEMENTED in transports that do not carry it (only gRPC does).
  virtual absl::StatusOr<proto::DrainResponse> Drain(
      const proto::DrainRequest&, absl::Time) {
    return absl::UnimplementedError("drain: not in this transport");
  }
  // Failure detection (issue 9, SessionRequest in ps.proto): opens this
  // node's session with the scheduler unless one is open or opening; a
  // broken one (a restarted scheduler) is opened again by the next call.
  // Never blocks. Nodes call it after each heartbeat the scheduler took.
  // Transports without a connection to close (in-process) do nothing.
  virtual void KeepSession(proto::Role, int) {}
};

// Makes clients for addresses found in the cluster view. Thread-safe; the
// returned clients may be shared and cached.
class ClientFactory {
 public:
  virtual ~ClientFactory() = default;
  virtual std::shared_ptr<ServerClient> Server(const std::string& address) = 0;
  virtual std::shared_ptr<SchedulerClient> Scheduler(
      const std::string& address) = 0;
  // `bytes` (> 0) of memory, 64-byte aligned, whose values a push borrows
  // (BorrowedValues) go to a same-host server without a copy (the data
  // plane's shared memory, transport/shared_arena.h); valid while the
  // returned pointer (or a copy) lives. Null where the transport has none
  // (the default), or none is left: the caller uses its own memory.
  virtual std::shared_ptr<char> SharedMemory(size_t bytes) {
    (void)bytes;
    return nullptr;
  }
};

}  // namespace ps
