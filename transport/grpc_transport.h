// gRPC implementation of the transport interfaces, plus the helpers every
// gRPC service of the project shares (status conversion, authentication,
// channel and server settings).
#pragma once

#include <atomic>
#include <memory>
#include <string_view>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/container/flat_hash_map.h"
#include "transport/data_plane.h"
#include "transport/transport.h"
#include "grpcpp/grpcpp.h"

namespace ps {

// Metadata key carrying the cluster token.
inline constexpr char kTokenHeader[] = "x-ps-token";

// Largest message any server or channel accepts or sends, in MiB
// (cluster.max_message_mb). The largest push of the shipped configs is under
// 1 MiB (minibatch 1000 x ~40 keys x 12 bytes) and the push/pull benchmark's
// largest is 16 MiB, so 64 MiB leaves a wide margin while an oversized
// message costs at most that much before it is refused.
inline constexpr int kDefaultMaxMessageMb = 64;
// HTTP/2 streams (calls) one client connection may have open on a server;
// more wait in the client (HTTP/2 flow), they are not refused.
inline constexpr int kMaxConcurrentCallsPerConnection = 100;

grpc::Status ToGrpcStatus(const absl::Status& s);
absl::Status FromGrpcStatus(const grpc::Status& s);

// OK when `expected` is empty or the call carries it; UNAUTHENTICATED
// otherwise. The comparison takes the same time wherever the tokens differ.
absl::Status CheckToken(const grpc::ServerContextBase& ctx,
                        const std::string& expected);

// Whether `path` (a call's ":path") is a method of gRPC's health-checking
// service (grpc.health.v1.Health Check or Watch, common/health.h): the only
// calls the server credentials let through without the token.
bool IsHealthCheckMethod(std::string_view path);

// Compares in time that depends only on the lengths (token checks).
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// Settings every channel and server uses: larger flow-control windows,
// keepalive. The message size limit is set on top by ApplyMessageLimit
// (channels) and ConfigureServerBuilder (servers): cluster.max_message_mb.
grpc::ChannelArguments DefaultChannelArgs();
// The server side also sets the message limits of `max_message_mb`.
void ConfigureServerBuilder(grpc::ServerBuilder* builder,
                            int max_message_mb = kDefaultMaxMessageMb);

// The token the processes of a job share: $PS_AUTH_TOKEN, else `fallback`.
std::string TokenFromEnv(const std::string& fallback);

// ---- Limits, TLS and authentication (issue 8) ----


// Certificate files (PEM) of cluster.tls. TLS is on when `cert_file` (a
// server's certificate) or `ca_file` (the roots a peer must chain to) is set.
struct TlsFiles {
  std::string cert_file;  // this process's certificate chain
  std::string key_file;   // its private key
  std::string ca_file;    // roots that verify the peer
  // Servers only: refuse clients without a certificate signed by `ca_file`
  // (mutual TLS). Clients present `cert_file`/`key_file` when set.
  bool require_client_cert = false;

  bool enabled() const { return !cert_file.empty() || !ca_file.empty(); }
};

// How one process talks to the others: token, message limit, TLS.
struct GrpcSecurity {
  std::string token;  // empty: no authentication
  int max_message_mb = kDefaultMaxMessageMb;
  TlsFiles tls;
};

// Reads the process-wide settings the launcher passes to its children:
// PS_AUTH_TOKEN (else `base.token`), PS_MAX_MESSAGE_MB, PS_TLS_CERT_FILE,
// PS_TLS_KEY_FILE, PS_TLS_CA_FILE and PS_TLS_REQUIRE_CLIENT_CERT (1/0); each
// variable that is set replaces the field of `base`. INVALID_ARGUMENT for a
// malformed number.
absl::StatusOr<GrpcSecurity> SecurityFromEnv(GrpcSecurity base);
// The environment entries ("NAME=value") that make SecurityFromEnv in a
// child return `s`.
std::vector<std::string> SecurityEnv(const GrpcSecurity& s);

// Server credentials for `s`: TLS (mutual when require_client_cert) or
// plaintext, and, when `s.token` is set, a check of the token on each call's
// initial metadata, before its message is read: a call without the token is
// refused with UNAUTHENTICATED without its body being buffered. Calls of the
// health-checking service (IsHealthCheckMethod) need no token.
// INVALID_ARGUMENT when a certificate file cannot be read or TLS is asked
// for without cert_file and key_file.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const GrpcSecurity& s);
// Channel credentials for `s`: TLS verifying the server against ca_file
// (presenting cert_file/key_file when set) or plaintext. INVALID_ARGUMENT
// when a file cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const GrpcSecurity& s);
// Sets the send and receive limits of `max_message_mb` (<= 0: the default).
void ApplyMessageLimit(int max_message_mb, grpc::ChannelArguments* args);

// True for 127.0.0.0/8, ::1 and "localhost": an address only this machine
// can reach.
bool IsLoopbackHost(const std::string& host);

// Whether a process may listen on `host` with `s`: FAILED_PRECONDITION when
// it has no token and `host` is not loopback, unless `insecure` (the
// --insecure flag). Logs a warning when it runs without a token at all.
absl::Status CheckBindAllowed(const std::string& host, const GrpcSecurity& s,
                              bool insecure);

// A push as gRPC sends it: the bytes of req's serialization (its keys and
// vals fields last), with keys and vals not copied but referenced as slices
// that keep `req` alive until gRPC is done with them. With `borrowed`,
// the vals field is its pieces when it has some (req->vals() then empty)
// and the keys field its keys when it has some (req->keys() then empty),
// referenced the same way, each slice holding a copy of its owner. The server parses it as any
// PushRequest. Requests under `min_zero_copy_bytes` of keys and values are
// serialized as usual (a copy is cheaper than three slices).
inline constexpr size_t kMinZeroCopyBytes = 64 * 1024;
grpc::ByteBuffer PushWire(std::shared_ptr<const proto::PushRequest> req,
                          const BorrowedValues* borrowed = nullptr,
                          size_t min_zero_copy_bytes = kMinZeroCopyBytes);

// A pull reply as gRPC sends it: `resp` (its vals empty) followed by `vals`
// as its vals field, the slice sent as is (the server writes the values
// straight into it: no zero-fill, no serialized copy).
grpc::ByteBuffer PullReplyWire(const proto::PullResponse& resp,
                               grpc::Slice vals);

// A gRPC channel argument set on top of DefaultChannelArgs(): an integer
// when the value parses as one, a string otherwise.
struct GrpcArg {
  std::string name;
  std::string value;
};
void ApplyGrpcArgs(const std::vector<GrpcArg>& args,
                   grpc::ChannelArguments* base);
void ApplyGrpcArgs(const std::vector<GrpcArg>& args,
                   grpc::ServerBuilder* builder);

struct GrpcTransportOptions {
  std::string token;
  int channels_per_server = 2;  // separate TCP connections, round-robin
  std::vector<GrpcArg> extra_channel_args;  // for server channels (tuning)
  int max_message_mb = kDefaultMaxMessageMb;
  TlsFiles tls;  // TLS when tls.enabled()
  // Push, pull and clock over the servers' data planes
  // (transport/data_plane.h) where they have one; never with TLS.
  bool data_plane = true;
  // With the data plane: reach a server on this host (in this network
  // namespace) over its same-host Unix-domain socket rather than loopback
  // TCP (cluster.local_socket).
  bool local_socket = true;
};

// The data plane's switches, shared by a factory's server clients.
struct DataPlaneSwitches {
  std::atomic<bool> on{true};
  std::atomic<bool> local{true};

  // The arena every same-host connection offers (transport/shared_arena.h):
  // one for the process's connections to all its servers, so that memory
  // lent from it (ClientFactory::SharedMemory) goes to any of them without
  // a copy. Made at first use; null when `bytes` is 0 or it cannot be made
  // (logged once). A new size makes a new arena for the connections made
  // from then on.
  std::shared_ptr<SharedArena> Arena() const;
  void SetArenaBytes(size_t bytes);

 private:
  mutable absl::Mutex mu_;
  size_t arena_bytes_ ABSL_GUARDED_BY(mu_) = data_plane::kDefaultArenaBytes;
  mutable std::shared_ptr<SharedArena> arena_ ABSL_GUARDED_BY(mu_);
  mutable bool arena_failed_ ABSL_GUARDED_BY(mu_) = false;
};

class GrpcClientFactory : public ClientFactory {
 public:
  // A certificate file that cannot be read makes the clients use TLS with
  // the system roots, so their calls fail (UNAVAILABLE) rather than going
  // out in plaintext; check with MakeChannelCredentials first.
  explicit GrpcClientFactory(GrpcTransportOptions options);
  // The options of `s`.
  static GrpcTransportOptions Options(const GrpcSecurity& s,
                                      int channels_per_server);
  std::shared_ptr<ServerClient> Server(const std::string& address) override;
  std::shared_ptr<SchedulerClient> Scheduler(
      const std::string& address) override;
  // Turns the data plane on or off for every server client, made or to be
  // made (cluster.data_plane, once the config is known). Never on with TLS.
  void SetDataPlane(bool on);
  // Same-host sockets on or off (cluster.local_socket) for connections made
  // from now on (one already open stays as it is).
  void SetLocalSocket(bool on);
  // The shared memory each same-host connection made from now on offers
  // its server for large values (cluster.shared_memory_mb; 0: none).
  void SetSharedMemory(size_t bytes);
  // Lent from that shared memory, while the data plane and same-host
  // sockets are on (ClientFactory::SharedMemory).
  std::shared_ptr<char> SharedMemory(size_t bytes) override;

 private:
  const GrpcTransportOptions options_;
  const std::shared_ptr<DataPlaneSwitches> data_plane_;
  std::shared_ptr<grpc::ChannelCredentials> creds_;  // null: unreadable files
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<ServerClient>> servers_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<SchedulerClient>>
      schedulers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps
