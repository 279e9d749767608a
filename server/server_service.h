// gRPC face of a ServerNode: converts between the wire and ServerNode calls,
// checks the cluster token, nothing else.
#pragma once

#include <atomic>
#include <functional>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "proto/ps.grpc.pb.h"
#include "server/server_node.h"
#include "transport/data_plane.h"

namespace ps {

// Push and Pull are raw methods. A push's keys and values and a pull's keys
// are read where gRPC received them (WireFields), never parsed into protobuf
// strings; a pull reply's values are written by the node straight into the
// slice gRPC sends (PullReplyWire).
class ServerService final
    : public proto::Server::WithRawCallbackMethod_Push<
          proto::Server::WithRawCallbackMethod_Pull<
              proto::Server::CallbackService>> {
 public:
  // `node` must outlive the service. `on_save_and_exit` runs (on an RPC
  // thread, after the reply is sent) when the scheduler asks the server to
  // write its model and leave. `metrics` (may be null; must outlive the
  // service) gets every push and pull (issue 11): a push's latency is the
  // time in its handler (applying it; a replicated push's wait for its
  // backups comes after), a pull's from arrival to answer (its consistency
  // wait included).
  ServerService(ServerNode* node, std::string token,
                std::function<void()> on_save_and_exit,
                PushPullMetrics* metrics = nullptr);

  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* ctx,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* ctx,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Clock(grpc::CallbackServerContext* ctx,
                                  const proto::ClockRequest* req,
                                  proto::ClockResponse* resp) override;
  grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* ctx,
                                   const proto::FinishRequest* req,
                                   proto::FinishResponse* resp) override;
  grpc::ServerUnaryReactor* Control(grpc::CallbackServerContext* ctx,
                                    const proto::ServerControlRequest* req,
                                    proto::ServerControlResponse* resp) override;
  grpc::ServerUnaryReactor* Replicate(grpc::CallbackServerContext* ctx,
                                      const proto::ReplicateRequest* req,
                                      proto::ReplicateResponse* resp) override;
  grpc::ServerBidiReactor<proto::ReplicateRequest, proto::ReplicateResponse>*
  ReplicateStream(grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* ctx,
                                      const proto::ServerStatusRequest* req,
                                      proto::ServerStatus* resp) override;

  // Ends the replication streams peers keep open (a server's Shutdown
  // would otherwise wait its whole grace period for them): call before it.
  void EndStreams();

  // The data plane's port (0: none) and same-host socket name (empty:
  // none), which GetStatus tells clients.
  void set_data_plane(int port, std::string socket) {
    absl::MutexLock l(&data_mu_);
    data_port_ = port;
    data_socket_ = std::move(socket);
  }

 private:
  class ReplicateStreamReactor;
  void Forget(ReplicateStreamReactor* r);

  ServerNode* const node_;
  const std::string token_;
  std::function<void()> on_save_and_exit_;
  PushPullMetrics* const metrics_;
  absl::Mutex data_mu_;
  int data_port_ ABSL_GUARDED_BY(data_mu_) = 0;
  std::string data_socket_ ABSL_GUARDED_BY(data_mu_);
  absl::Mutex streams_mu_;
  absl::flat_hash_set<ReplicateStreamReactor*> streams_
      ABSL_GUARDED_BY(streams_mu_);
};

// The data plane's requests (transport/data_plane.h) handed to `node` as
// ServerService hands gRPC's: the same checks, answers and metrics. The
// cluster token is checked once per connection, by the data plane's hello.
class DataService final : public DataHandler {
 public:
  // `node` and `metrics` (may be null) must outlive the service.
  explicit DataService(ServerNode* node, PushPullMetrics* metrics = nullptr)
      : node_(node), metrics_(metrics) {}
  void Push(const proto::PushRequest& req, absl::Span<const char> keys,
            absl::Span<const char> vals, DataReplyTo reply) override;
  void Pull(const proto::PullRequest& req, absl::Span<const char> keys,
            absl::Duration wait, DataReplyTo reply) override;
  void Clock(const proto::ClockRequest& req, DataReplyTo reply) override;
  void Replicate(const proto::ReplicateRequest& req,
                 absl::Span<const char> vals, DataReplyTo reply) override;
  void PeerClosed(int32_t worker_id) override {
    node_->NoteWorkerGone(worker_id);
  }

 private:
  ServerNode* const node_;
  PushPullMetrics* const metrics_;
};

}  // namespace ps
