// pushpull_bench: push/pull throughput and latency of the real system over
// real gRPC on loopback, next to one iperf3 TCP stream on the same machine.
//
//   pushpull_bench [--cases=bulk,dense,latency,sparse] [--topologies=1x1,2x2]
//                  [--ops=push,pull] [--seconds=1] [--inflight=4]
//                  [--bulk_mib=1,4] [--bulk_keys=40] [--bulk_inflight=0]
//                  [--csv=out.csv] [--optimizer=sgd|ftrl]
//                  [--channels=2] [--client_grpc_args=name=v,...]
//                  [--server_grpc_args=name=v,...] [--chunk_kib=0]
//                  [--replicas=0]
//
// The cases:
//   bulk     bulk transfer, the equivalent of ps-lite's dense benchmark
//            (the efa branch's tests/test_benchmark.cc): per size in
//            --bulk_mib, a table of dim MiB * 2^18 floats, --bulk_keys keys
//            per server, one key per request, all of them in flight
//            (--bulk_inflight), push and pull.
//   dense    one float per key of a dim-1 table, --dense_mib MiB of values
//            per request: per-key overhead, not bulk transfer.
//   latency  one synchronous request of --latency_kib KiB, then Wait, in a
//            loop; p50 and p99. The values are --latency_keys keys (1: one
//            key of a table of dim latency_kib * 256, as ps-lite's test).
//   sparse   --sparse_keys random keys of the dim-1 table per request; with
//            --sparse_dense_ids=N, the keys of random feature ids below N
//            (FeatureKey(id), as the LR readers make them), stored in the
//            servers' dense-id layout (TableSpec::dense_ids = N; the CSV's
//            case then reads sparse_dense_ids).
// Each throughput figure is the requests completed in --seconds after a
// --warmup_seconds warm-up, with --inflight requests outstanding per worker
// (bulk: --bulk_inflight). Its CPU is this process's getrusage(RUSAGE_SELF)
// plus every server child's utime + stime (/proc/PID/stat) over the
// measured phase; "GB" is 1e9 bytes of values (keys not counted).
//
// --replicas=K gives every key range K backups on the next servers of the
// ring (issue 9; capped at servers - 1): a push is then acknowledged once
// it is on every backup, as in a replicated job, and the servers replicate
// to each other over their ReplicateStream calls.
//
// --csv writes exactly one row per (topology, case, op, size) under the
// header topology,case,op,size,gbit_s,cpu_s_per_gb,mkeys_s,p50_us,p99_us;
// a cell that does not apply (p50 of a throughput case, Gbit/s of a latency
// case) is empty. The rest (iperf3, req/s, ps-lite references) is printed on
// stdout only.
//
// Each server is a child process: this binary re-executed with --serve. The
// child runs a ServerNode behind a ServerService on 127.0.0.1:0, writes
// "PORT <n>" on stdout, reads its id and the ClusterView (built here:
// BuildHashRing over S servers, W workers, table 0 of dim 1 for the dense,
// latency and sparse cases, then with --cases containing bulk one table per
// --bulk_mib size, ids 1.., ASP so pulls never wait) from stdin, configures
// itself and answers "READY". It exits when its stdin closes, so it never
// outlives the benchmark. The W workers are threads of this process, each
// with its own KVWorker and its own client factory (own TCP connections),
// as separate worker processes would.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "bench/tuned_transport.h"
#include "common/hash.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/process.h"
#include "common/routing.h"
#include "common/status_macros.h"
#include "server/server_node.h"
#include "server/server_service.h"
#include "transport/grpc_transport.h"
#include "worker/kv_worker.h"

extern char** environ;

ABSL_FLAG(bool, serve, false,
          "internal: run as a benchmark server child (see the file comment)");
ABSL_FLAG(std::string, cases, "bulk,dense,latency,sparse",
          "comma list of: bulk, dense, latency, sparse (see the file comment)");
ABSL_FLAG(std::string, ops, "push,pull",
          "comma list of: push, pull (every case runs these)");
ABSL_FLAG(std::string, topologies, "1x1,2x2",
          "comma list of SxW (servers x workers)");
ABSL_FLAG(std::string, dense_mib, "1,4,16",
          "dense request sizes, MiB of values per request");
ABSL_FLAG(std::string, bulk_mib, "1,4",
          "bulk request sizes: MiB of values of the one key per request "
          "(a table of dim MiB * 2^18 each)");
ABSL_FLAG(int, bulk_keys, 40, "bulk keys per server (ps-lite's 40)");
ABSL_FLAG(int, bulk_inflight, 0,
          "bulk requests in flight per worker; 0: one per key, all at once");
ABSL_FLAG(std::string, sparse_keys, "10000,100000,1000000",
          "sparse request sizes, keys per request");
ABSL_FLAG(uint64_t, sparse_dense_ids, 0,
          "sparse case: keys of feature ids below this, in the dense-id "
          "layout (0: random 64-bit keys, hash maps)");
ABSL_FLAG(int, inflight, 4, "requests in flight per worker (throughput)");
ABSL_FLAG(double, seconds, 1.0, "measured seconds per throughput figure");
ABSL_FLAG(double, warmup_seconds, 0.2, "unmeasured seconds before each");
ABSL_FLAG(double, latency_seconds, 1.0, "seconds per latency figure");
ABSL_FLAG(int, latency_kib, 4, "values per synchronous round trip, KiB");
ABSL_FLAG(int, latency_keys, 1,
          "keys per latency round trip, dividing the latency_kib * 256 "
          "floats: 1 (the default) is one key of a table of that dim, as "
          "ps-lite's tests/test_latency sends 4 KiB; 1024 (with 4 KiB) is "
          "1024 keys of the dim-1 table, which adds the per-key work");
ABSL_FLAG(std::string, optimizer, "sgd", "server update rule: sgd or ftrl");
ABSL_FLAG(int, virtual_nodes, 64,
          "key ranges per server on the hash ring (cluster.virtual_nodes): "
          "a replicated push ships one delta per range it touches");
ABSL_FLAG(int, replicas, 0,
          "backups per key range (capped at servers - 1): pushes are "
          "acknowledged once on every backup");
ABSL_FLAG(double, replication_linger_ms, ps::kDefaultReplicationLingerMs,
          "with --replicas: how long a server's entries for a backup wait "
          "for more to share a batch (fault_tolerance.replication_linger_ms)");
ABSL_FLAG(bool, replicate_deltas, true,
          "with --replicas, ASP: backups get deltas (changed rows and range "
          "state, once a linger) instead of every push to replay "
          "(fault_tolerance.replicate_deltas)");
ABSL_FLAG(bool, noop_server, false,
          "servers answer without touching any table (pull: zeros), which "
          "isolates transport and client costs; ps-lite's sparse reference "
          "was measured like this");
ABSL_FLAG(bool, zero_copy, true,
          "throughput pushes use KVWorker::ZPush, which sends the values from "
          "the benchmark's array without copying them (as ps-lite's test uses "
          "ZPush); false: Push, which copies them into the request first");
ABSL_FLAG(bool, lent_values, false,
          "with --zero_copy, throughput pushes send values the benchmark "
          "wrote once in memory from KVWorker::NewPushBuffer: a same-host "
          "server reads them where they lie in the data plane's shared "
          "memory, where otherwise the worker copies them into a slot of it "
          "first");
ABSL_FLAG(bool, pull_in_place, false,
          "throughput pulls use KVWorker::PullInPlace: the values are left "
          "where they arrived (from a same-host server with shared memory, "
          "the slot it wrote them into) instead of copied into a vector");
ABSL_FLAG(bool, key_caching, false,
          "workers name key lists a server keeps instead of resending them "
          "(KVWorkerOptions::key_lists_per_server 16, the product default); "
          "the sparse case, which alternates two fixed key lists per worker, "
          "is then reported as sparse_cached. Off: every request carries "
          "its keys. Never with --noop_server (it keeps nothing)");
ABSL_FLAG(bool, key_sets, false,
          "workers push and pull each fixed key list as a KeySet "
          "(KVWorker::ZPush and Pull of a KeySet): its parts are cut and "
          "compared with the lists sent before once, not per request. "
          "Pushes with --zero_copy only");
ABSL_FLAG(int, apply_threads, 0,
          "server threads that apply one large push or pull together, as "
          "ps_server --apply_threads (0: the cores, at most 4)");
ABSL_FLAG(int, channels, 2,
          "gRPC channels (TCP connections) per server per worker");
ABSL_FLAG(std::string, client_grpc_args, "",
          "extra client channel args name=value,... "
          "(GrpcTransportOptions.extra_channel_args)");
ABSL_FLAG(std::string, server_grpc_args, "",
          "extra server channel args name=value,...");
ABSL_FLAG(int, chunk_kib, 0,
          "split each dense/sparse request into KVWorker requests of at most "
          "this many KiB of values, all in flight (0: no split)");
ABSL_FLAG(bool, data_plane, true,
          "push, pull and clock over the servers' data planes (plain TCP, "
          "transport/data_plane.h) instead of gRPC; never with --noop_server");
ABSL_FLAG(bool, local_socket, true,
          "with --data_plane: workers and servers reach the servers over "
          "their same-host Unix-domain sockets (cluster.local_socket); "
          "false: loopback TCP");
ABSL_FLAG(int, shared_memory_mb, 128,
          "with --local_socket: the shared memory each worker connection "
          "offers its server for values of 64 KiB or more "
          "(cluster.shared_memory_mb); 0: none, every value through the "
          "socket");
ABSL_FLAG(bool, iperf, true, "measure one iperf3 loopback stream first");
ABSL_FLAG(int, iperf_seconds, 3, "iperf3 -t");
ABSL_FLAG(std::string, csv, "", "also write the results as CSV here");
ABSL_FLAG(std::string, log_level, "warn", "log level of all processes");

namespace ps::bench {
namespace {

using SteadyClock = std::chrono::steady_clock;

double SecondsSince(SteadyClock::time_point t0) {
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

SteadyClock::time_point After(double seconds) {
  return SteadyClock::now() + std::chrono::duration_cast<SteadyClock::duration>(
                                  std::chrono::duration<double>(seconds));
}

// ------------------------------------------------------------ pipe helpers

absl::Status WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      return absl::UnavailableError(absl::StrCat("write: ", strerror(errno)));
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

// Blocking read of exactly n bytes; UNAVAILABLE on EOF.
absl::Status ReadAll(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return absl::UnavailableError("end of input");
    p += r;
    n -= static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

// One '\n'-terminated line from `fd`, waiting at most until `deadline`.
absl::StatusOr<std::string> ReadLine(int fd, absl::Time deadline) {
  std::string line;
  for (;;) {
    const int ms = static_cast<int>(std::max<int64_t>(
        0, absl::ToInt64Milliseconds(deadline - absl::Now())));
    pollfd p{fd, POLLIN, 0};
    int rc = poll(&p, 1, ms);
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) return absl::DeadlineExceededError("no line before deadline");
    char c;
    ssize_t r = read(fd, &c, 1);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return absl::UnavailableError("child closed its output");
    if (c == '\n') return line;
    line.push_back(c);
  }
}

// Spawns argv[0] with stdin/stdout connected to pipes (either may be null:
// then /dev/null) and stderr inherited.
absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, int* to_child,
                            int* from_child) {
  int in[2] = {-1, -1}, out[2] = {-1, -1};
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (to_child != nullptr) {
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  } else {
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  }
  if (from_child != nullptr) {
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  } else {
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  }
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid;
  int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(in[0]);
  close(out[1]);
  if (to_child != nullptr)
    *to_child = in[1];
  else
    close(in[1]);
  if (from_child != nullptr)
    *from_child = out[0];
  else
    close(out[0]);
  if (rc != 0) {
    if (to_child != nullptr) close(*to_child);
    if (from_child != nullptr) close(*from_child);
    return absl::InternalError(
        absl::StrCat("spawn ", argv[0], ": ", strerror(rc)));
  }
  return pid;
}

// Waits for `pid` up to `timeout`, then kills it.
void Reap(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (waitpid(pid, nullptr, WNOHANG) == pid) return;
    absl::SleepFor(absl::Milliseconds(20));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

std::string SelfExe() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "pushpull_bench";
  return std::string(buf, static_cast<size_t>(n));
}

// ------------------------------------------------------------ server child

// --noop_server: the wire side of a server only. Push is acknowledged, Pull
// answers zeros of the right size, nothing is stored or checked.
class NoopService final : public proto::Server::CallbackService {
 public:
  // The dims of the view's tables, by id. Called once, before the child
  // answers READY (no request arrives before that).
  void SetDims(std::vector<int> dims) { dims_ = std::move(dims); }

  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* ctx,
                                 const proto::PushRequest*,
                                 proto::PushResponse*) override {
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* ctx,
                                 const proto::PullRequest* req,
                                 proto::PullResponse* resp) override {
    const int dim =
        req->table() >= 0 && req->table() < static_cast<int>(dims_.size())
            ? dims_[req->table()]
            : 1;
    resp->mutable_vals()->resize(req->keys().size() / sizeof(uint64_t) * dim *
                                 sizeof(float));
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }

 private:
  std::vector<int> dims_;
};

int ServeMain() {
  InitLogging("S[?]", absl::GetFlag(FLAGS_log_level));
  auto extra = ParseGrpcArgs(absl::GetFlag(FLAGS_server_grpc_args));
  if (!extra.ok()) {
    PS_LOG_ERROR("{}", extra.status().ToString());
    return 2;
  }
  // The other servers, for replication (--replicas; before the node, which
  // uses it until it is gone).
  GrpcTransportOptions peer_options;
  peer_options.local_socket = absl::GetFlag(FLAGS_local_socket);
  GrpcClientFactory peers(peer_options);
  const int apply_threads = absl::GetFlag(FLAGS_apply_threads);
  ServerNode node(Clock::Real(), ServerLimits(),
                  apply_threads > 0 ? apply_threads
                                    : ParallelRunner::DefaultParallelism());
  node.SetPeers(&peers);
  node.SetReplicationLinger(
      absl::Milliseconds(absl::GetFlag(FLAGS_replication_linger_ms)));
  node.SetReplicationDeltas(absl::GetFlag(FLAGS_replicate_deltas));
  ServerService service(&node, /*token=*/"", nullptr);
  DataService data_service(&node);
  std::unique_ptr<DataPlaneServer> data_plane;
  if (absl::GetFlag(FLAGS_data_plane) && !absl::GetFlag(FLAGS_noop_server)) {
    auto d = DataPlaneServer::Start(DataPlaneServerOptions(), &data_service);
    if (!d.ok()) {
      std::printf("ERROR %s\n", d.status().ToString().c_str());
      std::fflush(stdout);
      return 1;
    }
    data_plane = std::move(*d);
    service.set_data_plane(data_plane->port(), data_plane->local_name());
  }
  NoopService noop;
  grpc::ServerBuilder builder;
  ConfigureServerBuilder(&builder);
  ApplyGrpcArgs(*extra, &builder);
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  if (absl::GetFlag(FLAGS_noop_server)) {
    builder.RegisterService(&noop);
  } else {
    builder.RegisterService(&service);
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::printf("ERROR cannot listen\n");
    std::fflush(stdout);
    return 1;
  }
  std::printf("PORT %d\n", port);
  std::fflush(stdout);

  // Bootstrap: int32 id, uint32 length, serialized ClusterView. The read
  // has no deadline on purpose: the parent closing the pipe (or dying) ends
  // it.
  int32_t id = -1;
  uint32_t len = 0;
  std::string bytes;
  absl::Status s = ReadAll(0, &id, sizeof(id));
  if (s.ok()) s = ReadAll(0, &len, sizeof(len));
  if (s.ok()) {
    bytes.resize(len);
    s = ReadAll(0, bytes.data(), len);
  }
  proto::ClusterView view;
  if (s.ok() && !view.ParseFromString(bytes)) {
    s = absl::InvalidArgumentError("unparsable view");
  }
  if (s.ok()) s = node.Configure(id, view);
  if (s.ok()) {
    std::vector<int> dims;
    for (const proto::TableConfig& t : view.tables()) dims.push_back(t.dim());
    noop.SetDims(std::move(dims));
  }
  if (!s.ok()) {
    std::printf("ERROR %s\n", s.ToString().c_str());
    std::fflush(stdout);
    server->Shutdown();
    return 1;
  }
  InitLogging(absl::StrCat("S[", id, "]"), absl::GetFlag(FLAGS_log_level));
  std::printf("READY\n");
  std::fflush(stdout);

  absl::Notification stop;
  std::thread ticker([&] {
    while (!stop.WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
      node.Tick();
    }
  });
  for (;;) {
    char c;
    const ssize_t r = read(0, &c, 1);
    if (r == 0 || (r < 0 && errno != EINTR)) break;
  }
  stop.Notify();
  ticker.join();
  node.CancelAll(absl::CancelledError("benchmark over"));
  service.EndStreams();
  if (data_plane != nullptr) data_plane->Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return 0;
}

// One server child, seen from the parent.
class ServerProcess {
 public:
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(
      const std::vector<std::string>& argv) {
    auto p = std::unique_ptr<ServerProcess>(new ServerProcess);
    PS_ASSIGN_OR_RETURN(p->pid_, Spawn(argv, &p->to_child_, &p->from_child_));
    PS_ASSIGN_OR_RETURN(
        std::string line,
        ReadLine(p->from_child_, absl::Now() + absl::Seconds(20)));
    if (!absl::StartsWith(line, "PORT ") ||
        !absl::SimpleAtoi(line.substr(5), &p->port_)) {
      return absl::InternalError(absl::StrCat("server child said: ", line));
    }
    return p;
  }

  ~ServerProcess() {
    if (to_child_ >= 0) close(to_child_);  // the child's signal to exit
    if (from_child_ >= 0) close(from_child_);
    if (pid_ > 0) Reap(pid_, absl::Seconds(5));
  }

  int port() const { return port_; }
  pid_t pid() const { return pid_; }

  absl::Status Configure(int32_t id, const proto::ClusterView& view) {
    const std::string bytes = view.SerializeAsString();
    const uint32_t len = static_cast<uint32_t>(bytes.size());
    PS_RETURN_IF_ERROR(WriteAll(to_child_, &id, sizeof(id)));
    PS_RETURN_IF_ERROR(WriteAll(to_child_, &len, sizeof(len)));
    PS_RETURN_IF_ERROR(WriteAll(to_child_, bytes.data(), bytes.size()));
    PS_ASSIGN_OR_RETURN(std::string line,
                        ReadLine(from_child_, absl::Now() + absl::Seconds(20)));
    if (line != "READY") {
      return absl::InternalError(absl::StrCat("server ", id, " said: ", line));
    }
    return absl::OkStatus();
  }

 private:
  ServerProcess() = default;
  pid_t pid_ = -1;
  int to_child_ = -1;
  int from_child_ = -1;
  int port_ = 0;
};

// ------------------------------------------------------------------ iperf3

// Bits per second of one default iperf3 TCP stream on loopback.
absl::StatusOr<double> MeasureIperf(int seconds) {
  PS_ASSIGN_OR_RETURN(int port, PickFreePort("127.0.0.1"));
  const std::string p = absl::StrCat(port);
  PS_ASSIGN_OR_RETURN(pid_t server,
                      Spawn({"iperf3", "-s", "-1", "-p", p, "-B", "127.0.0.1"},
                            nullptr, nullptr));
  std::string json;
  absl::Status result = absl::UnavailableError("iperf3 client never connected");
  for (int attempt = 0; attempt < 50; ++attempt) {
    absl::SleepFor(absl::Milliseconds(100));
    const std::string cmd = absl::StrCat("iperf3 -c 127.0.0.1 -p ", p, " -t ",
                                         seconds, " -J 2>/dev/null");
    FILE* f = popen(cmd.c_str(), "r");
    if (f == nullptr) break;
    json.clear();
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) json.append(buf, n);
    pclose(f);
    const size_t at = json.find("\"sum_received\"");
    if (at == std::string::npos) continue;  // server not listening yet
    const size_t bps = json.find("\"bits_per_second\"", at);
    const size_t colon = bps == std::string::npos ? bps : json.find(':', bps);
    if (colon == std::string::npos) {
      result = absl::InternalError("iperf3 JSON without bits_per_second");
      break;
    }
    Reap(server, absl::Seconds(5));
    return std::strtod(json.c_str() + colon + 1, nullptr);
  }
  kill(server, SIGTERM);
  Reap(server, absl::Seconds(2));
  return result;
}

// ---------------------------------------------------------------- cluster

struct Topology {
  int servers = 1;
  int workers = 1;
  std::string name() const { return absl::StrCat(servers, "S", workers, "W"); }
};

// Table 0 has dim 1; tables 1.. have `extra_dims`.
proto::ClusterView MakeView(const Topology& t,
                            const std::vector<std::string>& addresses,
                            const std::vector<int>& extra_dims) {
  proto::ClusterView v;
  v.set_epoch(1);
  std::vector<int> ids;
  for (int i = 0; i < t.servers; ++i) ids.push_back(i);
  const int replicas =
      std::max(0, std::min(absl::GetFlag(FLAGS_replicas), t.servers - 1));
  *v.mutable_routing() =
      BuildHashRing(ids, std::max(1, absl::GetFlag(FLAGS_virtual_nodes)),
                    v.epoch(), replicas);
  for (int i = 0; i < t.servers; ++i) {
    proto::NodeInfo* s = v.mutable_routing()->add_servers();
    s->set_id(i);
    s->set_role(proto::ROLE_SERVER);
    s->set_address(addresses[i]);
    s->set_state(proto::NODE_ALIVE);
  }
  for (int i = 0; i < t.workers; ++i) {
    proto::NodeInfo* w = v.add_workers();
    w->set_id(i);
    w->set_role(proto::ROLE_WORKER);
    w->set_state(proto::NODE_ALIVE);
  }
  v.mutable_consistency()->set_mode(proto::MODE_ASP);
  v.mutable_consistency()->set_tau(-1);
  std::vector<int> dims = {1};
  dims.insert(dims.end(), extra_dims.begin(), extra_dims.end());
  for (size_t i = 0; i < dims.size(); ++i) {
    proto::TableConfig* table = v.add_tables();
    table->set_id(static_cast<int>(i));
    table->set_name(absl::StrCat("bench", i));
    table->set_dim(dims[i]);
    if (i == 0) table->set_dense_ids(absl::GetFlag(FLAGS_sparse_dense_ids));
    proto::OptimizerConfig* o = table->mutable_optimizer();
    o->set_name(absl::GetFlag(FLAGS_optimizer));
    o->set_learning_rate(0.01f);
    o->set_alpha(0.1f);
    o->set_beta(1.0f);
  }
  return v;
}

// Servers (children) plus W KVWorkers, alive for one topology. The view's
// tables: 0 of dim 1, then `extra_dims` (see MakeView).
class Cluster {
 public:
  static absl::StatusOr<std::unique_ptr<Cluster>> Start(
      const Topology& t, const std::vector<int>& extra_dims) {
    auto c = std::unique_ptr<Cluster>(new Cluster);
    const std::vector<std::string> argv = {
        SelfExe(), "--serve",
        absl::StrCat("--server_grpc_args=",
                     absl::GetFlag(FLAGS_server_grpc_args)),
        absl::StrCat("--log_level=", absl::GetFlag(FLAGS_log_level)),
        absl::StrCat("--noop_server=", absl::GetFlag(FLAGS_noop_server)),
        absl::StrCat("--data_plane=", absl::GetFlag(FLAGS_data_plane)),
        absl::StrCat("--local_socket=", absl::GetFlag(FLAGS_local_socket)),
        absl::StrCat("--apply_threads=", absl::GetFlag(FLAGS_apply_threads)),
        absl::StrCat("--replication_linger_ms=",
                     absl::GetFlag(FLAGS_replication_linger_ms)),
        absl::StrCat("--replicate_deltas=",
                     absl::GetFlag(FLAGS_replicate_deltas))};
    std::vector<std::string> addresses;
    for (int i = 0; i < t.servers; ++i) {
      PS_ASSIGN_OR_RETURN(auto s, ServerProcess::Start(argv));
      addresses.push_back(absl::StrCat("127.0.0.1:", s->port()));
      c->servers_.push_back(std::move(s));
    }
    const proto::ClusterView view = MakeView(t, addresses, extra_dims);
    for (int i = 0; i < t.servers; ++i) {
      PS_RETURN_IF_ERROR(c->servers_[i]->Configure(i, view));
    }
    PS_ASSIGN_OR_RETURN(auto extra,
                        ParseGrpcArgs(absl::GetFlag(FLAGS_client_grpc_args)));
    const int channels = absl::GetFlag(FLAGS_channels);
    for (int i = 0; i < t.workers; ++i) {
      GrpcTransportOptions to{"", channels, extra};
      to.data_plane = absl::GetFlag(FLAGS_data_plane);
      to.local_socket = absl::GetFlag(FLAGS_local_socket);
      auto factory = std::make_unique<GrpcClientFactory>(to);
      factory->SetSharedMemory(
          size_t{static_cast<unsigned>(
              std::max(0, absl::GetFlag(FLAGS_shared_memory_mb)))}
          << 20);
      c->factories_.push_back(std::move(factory));
      KVWorkerOptions o;
      o.worker_id = i;
      o.request_timeout = absl::Seconds(60);
      o.key_lists_per_server =
          absl::GetFlag(FLAGS_key_caching) && !absl::GetFlag(FLAGS_noop_server)
              ? 16
              : 0;
      c->workers_.push_back(std::make_unique<KVWorker>(
          o, view, c->factories_.back().get(), &c->scheduler_));
    }
    return c;
  }

  ~Cluster() {
    workers_.clear();  // before the servers go away
    // The client factories (and so their gRPC channels) are kept until the
    // process exits, on purpose. GrpcServerClient deletes each call's
    // ClientContext on gRPC's callback thread *after* running the callback
    // that completes a KVWorker op; destroying the factory right after the
    // last Wait can therefore leave that delete holding the channel's last
    // reference, and gRPC 1.51 crashes when a channel is destroyed on its
    // own callback thread (grpc/grpc#32584; seen here as a SIGSEGV in
    // grpc_completion_queue_next about one run in three). Idle channels to
    // exited servers cost nothing.
    static auto* graveyard = new std::vector<std::unique_ptr<ClientFactory>>;
    for (auto& f : factories_) graveyard->push_back(std::move(f));
    servers_.clear();
  }

  int num_workers() const { return static_cast<int>(workers_.size()); }
  std::vector<pid_t> server_pids() const {
    std::vector<pid_t> p;
    for (const auto& s : servers_) p.push_back(s->pid());
    return p;
  }
  KVWorker* worker(int i) { return workers_[i].get(); }

 private:
  Cluster() = default;
  std::vector<std::unique_ptr<ServerProcess>> servers_;
  UnreachableScheduler scheduler_;
  std::vector<std::unique_ptr<ClientFactory>> factories_;
  std::vector<std::unique_ptr<KVWorker>> workers_;
};

// -------------------------------------------------------------- workloads

// Table 0 (dim 1) carries the dense, latency and sparse cases; the bulk
// case's tables follow it.
constexpr int kTable = 0;

// What one throughput case moves: which table, its dim, requests in flight
// per worker, and how requests are split (chunk_keys keys per KVWorker
// request, 0: not split).
struct Load {
  int table = kTable;
  size_t dim = 1;
  int inflight = 1;
  size_t chunk_keys = 0;
};

// n "dense" keys: FeatureKey(0..n-1), ascending.
std::vector<uint64_t> DenseKeys(size_t n) {
  std::vector<uint64_t> k(n);
  for (size_t i = 0; i < n; ++i) k[i] = FeatureKey(i);
  std::sort(k.begin(), k.end());
  return k;
}

// n random 64-bit keys, ascending and unique.
std::vector<uint64_t> RandomKeys(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> k(n);
  for (auto& x : k) x = rng();
  std::sort(k.begin(), k.end());
  k.erase(std::unique(k.begin(), k.end()), k.end());
  return k;
}

// The keys of n distinct random feature ids below `ids` (n <= ids),
// ascending.
std::vector<uint64_t> RandomFeatureKeys(size_t n, uint64_t ids,
                                        uint64_t seed) {
  std::mt19937_64 rng(seed);
  absl::flat_hash_set<uint64_t> chosen;
  std::vector<uint64_t> k;
  k.reserve(n);
  while (k.size() < n) {
    const uint64_t id = rng() % ids;
    if (chosen.insert(id).second) k.push_back(FeatureKey(id));
  }
  std::sort(k.begin(), k.end());
  return k;
}

// CPU seconds (user + system) used so far by this process and by `pids`.
// With the machine shared, wall-clock figures swing with other load; CPU
// per byte does not, and on an otherwise idle machine it bounds throughput.
double CpuSeconds(const std::vector<pid_t>& pids) {
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  double s = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 +
             ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  for (pid_t pid : pids) {
    std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
    std::string stat((std::istreambuf_iterator<char>(f)),
                     std::istreambuf_iterator<char>());
    // Fields after the ")" that ends the command name: state is field 3,
    // utime 14 and stime 15.
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::vector<std::string> fields =
        absl::StrSplit(stat.substr(close + 2), ' ');
    double ut = 0, st = 0;
    if (fields.size() > 12 && absl::SimpleAtod(fields[11], &ut) &&
        absl::SimpleAtod(fields[12], &st)) {
      s += (ut + st) / tick;
    }
  }
  return s;
}

struct Throughput {
  int64_t requests = 0;  // whole requests (all chunks) completed
  int64_t keys = 0;
  double seconds = 0;
  double cpu_seconds = 0;  // benchmark process + servers, measured phase
};

// Keeps load.inflight requests outstanding on `w` until `until`, rotating
// over `sets`, then drains. Counts only what completed. `vals` holds at
// least (largest set) * load.dim floats.
absl::Status RunWindow(KVWorker* w,
                       const std::vector<std::vector<uint64_t>>& sets,
                       const std::shared_ptr<const std::vector<float>>& vals,
                       bool push,
                       const Load& load, SteadyClock::time_point until,
                       Throughput* out) {
  struct Slot {
    std::vector<int64_t> ts;
    std::vector<std::vector<float>> outs;  // pull destinations, per chunk
    std::vector<KVWorker::PulledValues> kept;  // --pull_in_place's
    size_t keys = 0;
  };
  std::vector<Slot> slots(std::max(1, load.inflight));
  const size_t dim = load.dim;
  const bool zero_copy = absl::GetFlag(FLAGS_zero_copy);
  const bool in_place = absl::GetFlag(FLAGS_pull_in_place);
  // The values pushed, and what keeps them.
  absl::Span<const float> all = *vals;
  std::shared_ptr<const void> owner = vals;
  if (push && zero_copy && absl::GetFlag(FLAGS_lent_values)) {
    KVWorker::PushBuffer b = w->NewPushBuffer(vals->size());
    std::copy(vals->begin(), vals->end(), b.vals.begin());
    all = b.vals;
    owner = std::move(b.owner);
  }
  const int window = static_cast<int>(slots.size());
  auto step_of = [&](const std::vector<uint64_t>& keys) {
    return load.chunk_keys > 0 ? load.chunk_keys
                               : std::max<size_t>(1, keys.size());
  };
  // key_sets[i][c]: chunk c of set i as a KeySet (--key_sets).
  std::vector<std::vector<std::unique_ptr<KeySet>>> key_sets;
  if (absl::GetFlag(FLAGS_key_sets)) {
    for (const std::vector<uint64_t>& keys : sets) {
      key_sets.emplace_back();
      const size_t step = step_of(keys);
      for (size_t f = 0; f < keys.size(); f += step) {
        key_sets.back().push_back(std::make_unique<KeySet>(
            absl::MakeConstSpan(keys).subspan(
                f, std::min(step, keys.size() - f))));
      }
    }
  }
  auto issue = [&](Slot& s, size_t set) {
    const std::vector<uint64_t>& keys = sets[set];
    s.ts.clear();
    s.keys = keys.size();
    const size_t step = step_of(keys);
    // Sized before any pull starts: KVWorker keeps pointers to these.
    if (!push && in_place) {
      s.kept.resize((keys.size() + step - 1) / step);
    } else if (!push) {
      s.outs.resize((keys.size() + step - 1) / step);
    }
    size_t c = 0;
    for (size_t f = 0; f < keys.size(); f += step, ++c) {
      const size_t n = std::min(step, keys.size() - f);
      auto k = absl::MakeConstSpan(keys).subspan(f, n);
      const KeySet* ks = key_sets.empty() ? nullptr : key_sets[set][c].get();
      if (push) {
        const auto v = all.subspan(f * dim, n * dim);
        if (ks != nullptr && zero_copy) {
          s.ts.push_back(w->ZPush(load.table, *ks, v, owner, 1));
        } else {
          s.ts.push_back(zero_copy ? w->ZPush(load.table, k, v, owner, 1)
                                   : w->Push(load.table, k, v, 1));
        }
      } else if (in_place) {
        s.ts.push_back(w->PullInPlace(load.table, k, &s.kept[c]));
      } else if (ks != nullptr) {
        s.ts.push_back(w->Pull(load.table, *ks, &s.outs[c]));
      } else {
        s.ts.push_back(w->Pull(load.table, k, &s.outs[c]));
      }
    }
  };
  auto finish = [&](Slot& s) -> absl::Status {
    for (int64_t ts : s.ts) {
      PS_RETURN_IF_ERROR(w->Wait(ts, absl::Now() + absl::Seconds(120)));
    }
    // Pulled in place: let go of, as a caller done with them would.
    for (KVWorker::PulledValues& k : s.kept) k.pieces.clear();
    ++out->requests;
    out->keys += static_cast<int64_t>(s.keys);
    return absl::OkStatus();
  };
  int next = 0, pending = 0;
  size_t k = 0;
  while (SteadyClock::now() < until) {
    Slot& s = slots[next];
    if (pending == window) {
      PS_RETURN_IF_ERROR(finish(s));
      --pending;
    }
    issue(s, k++ % sets.size());
    ++pending;
    next = (next + 1) % window;
  }
  for (int i = (next + window - pending) % window; pending > 0;
       i = (i + 1) % window, --pending) {
    PS_RETURN_IF_ERROR(finish(slots[i]));
  }
  return absl::OkStatus();
}

// Runs RunWindow on every worker at once (after a warm-up each); the figure
// is the sum over workers divided by the time until the last one drained.
absl::StatusOr<Throughput> MeasureThroughput(
    Cluster* c, const std::vector<std::vector<std::vector<uint64_t>>>& sets,
    const std::shared_ptr<const std::vector<float>>& vals, bool push,
    const Load& load) {
  const int nw = c->num_workers();
  std::vector<Throughput> per(nw);
  std::vector<absl::Status> status(nw);
  std::vector<double> end(nw, 0);
  absl::BlockingCounter ready(nw);
  absl::Notification go;
  SteadyClock::time_point t0, until;
  std::vector<std::thread> threads;
  for (int i = 0; i < nw; ++i) {
    threads.emplace_back([&, i] {
      Throughput warm;
      status[i] = RunWindow(c->worker(i), sets[i], vals, push, load,
                            After(absl::GetFlag(FLAGS_warmup_seconds)), &warm);
      ready.DecrementCount();
      if (!go.WaitForNotificationWithTimeout(absl::Seconds(300))) return;
      if (!status[i].ok()) return;
      status[i] =
          RunWindow(c->worker(i), sets[i], vals, push, load, until, &per[i]);
      end[i] = SecondsSince(t0);
    });
  }
  ready.Wait();
  const std::vector<pid_t> pids = c->server_pids();
  const double cpu0 = CpuSeconds(pids);
  t0 = SteadyClock::now();
  until = After(absl::GetFlag(FLAGS_seconds));
  go.Notify();
  for (auto& t : threads) t.join();
  Throughput total;
  total.cpu_seconds = CpuSeconds(pids) - cpu0;
  for (int i = 0; i < nw; ++i) {
    PS_RETURN_IF_ERROR(status[i]);
    total.requests += per[i].requests;
    total.keys += per[i].keys;
    total.seconds = std::max(total.seconds, end[i]);
  }
  return total;
}

struct Latency {
  double p50_us = 0, p99_us = 0;
  int64_t samples = 0;
};

// Every worker does one request, then Wait, in a loop; percentiles over all
// samples.
absl::StatusOr<Latency> MeasureLatency(Cluster* c, int table,
                                       const std::vector<uint64_t>& keys,
                                       const std::vector<float>& vals,
                                       bool push) {
  const int nw = c->num_workers();
  std::vector<std::vector<double>> samples(nw);
  std::vector<absl::Status> status(nw);
  std::vector<std::thread> threads;
  const SteadyClock::time_point until =
      After(absl::GetFlag(FLAGS_latency_seconds));
  for (int i = 0; i < nw; ++i) {
    threads.emplace_back([&, i] {
      KVWorker* w = c->worker(i);
      std::vector<float> out;
      for (int it = 0;; ++it) {
        const bool warm = it < 50;
        if (!warm && SteadyClock::now() >= until) break;
        const auto t = SteadyClock::now();
        const int64_t ts =
            push ? w->Push(table, keys, vals, 1) : w->Pull(table, keys, &out);
        status[i] = w->Wait(ts, absl::Now() + absl::Seconds(60));
        if (!status[i].ok()) return;
        if (!warm) samples[i].push_back(SecondsSince(t) * 1e6);
      }
    });
  }
  for (auto& t : threads) t.join();
  std::vector<double> all;
  for (int i = 0; i < nw; ++i) {
    PS_RETURN_IF_ERROR(status[i]);
    all.insert(all.end(), samples[i].begin(), samples[i].end());
  }
  Latency l;
  l.samples = static_cast<int64_t>(all.size());
  if (all.empty()) return l;
  std::sort(all.begin(), all.end());
  l.p50_us = all[all.size() / 2];
  l.p99_us = all[std::min(all.size() - 1, all.size() * 99 / 100)];
  return l;
}

// ------------------------------------------------------------------ report

struct Row {
  std::string topo, kase, op, size;
  bool latency = false;  // p50/p99 apply; throughput figures do not
  double req_per_s = 0, mkeys_per_s = 0;
  double gbit_vals = 0, gbit_total = 0;  // Gbit/s: values; keys + values
  double p50_us = 0, p99_us = 0;
  double cpu_ns_per_key = 0;  // all processes' CPU over keys moved
  double cpu_s_per_gb = 0;    // all processes' CPU over 1e9 value bytes
  std::string ref;            // the ps-lite reference, where there is one
};

std::string Reference(const std::string& topo, const std::string& kase,
                      const std::string& op, const std::string& size) {
  // bulk: ps-lite's own figures, 1 server + 1 worker, quiet machine
  // (/work/shared/peers/ps-lite.md; bench/vs_pslite.sh measures both).
  if (kase == "bulk" && topo == "1S1W" && size == "1MiB") return "8.9Gb/s";
  if (kase == "bulk" && topo == "1S1W" && size == "4MiB")
    return op == "push" ? "20.4Gb/s" : "15.4Gb/s";
  if (kase == "dense" && size == "4MiB")
    return op == "push" ? "1.47x" : "1.00x";
  if (kase == "dense" && size == "1MiB")
    return op == "push" ? "0.87x" : "0.66x";
  if (kase == "latency" && op == "push" && size == "4KiB") return "178us";
  if (kase == "sparse" && op == "push" && size == "100k") return "303Mkeys/s";
  return "";
}

std::string KeysLabel(size_t n) {
  if (n % 1000000 == 0) return absl::StrCat(n / 1000000, "M");
  if (n % 1000 == 0) return absl::StrCat(n / 1000, "k");
  return absl::StrCat(n);
}

// iperf_gbytes: one iperf3 stream, GB/s (0: not measured).
void PrintTable(const std::vector<Row>& rows, double iperf_gbytes) {
  std::printf(
      "\n%-6s %-7s %-5s %-6s %9s %9s %8s %8s %7s %7s %7s %7s %9s %8s %10s\n",
      "topo", "case", "op", "size", "req/s", "Mkeys/s", "Gb/s val", "Gb/s tot",
      "x iperf", "(tot)", "p50 us", "p99 us", "cpu ns/k", "cpu s/GB",
      "ps-lite");
  for (const Row& r : rows) {
    const bool lat = r.latency;
    std::string ratio = "-", ratio_tot = "-";
    if (iperf_gbytes > 0 && !lat) {
      ratio = absl::StrFormat("%.3f", r.gbit_vals / 8 / iperf_gbytes);
      ratio_tot = absl::StrFormat("%.3f", r.gbit_total / 8 / iperf_gbytes);
    }
    std::printf(
        "%-6s %-7s %-5s %-6s %9.1f %9s %8s %8s %7s %7s %7s %7s %9s %8s %10s\n",
        r.topo.c_str(), r.kase.c_str(), r.op.c_str(), r.size.c_str(),
        r.req_per_s, lat ? "-" : absl::StrFormat("%.4g", r.mkeys_per_s).c_str(),
        lat ? "-" : absl::StrFormat("%.3f", r.gbit_vals).c_str(),
        lat ? "-" : absl::StrFormat("%.3f", r.gbit_total).c_str(),
        ratio.c_str(), ratio_tot.c_str(),
        lat ? absl::StrFormat("%.0f", r.p50_us).c_str() : "-",
        lat ? absl::StrFormat("%.0f", r.p99_us).c_str() : "-",
        lat ? "-" : absl::StrFormat("%.4g", r.cpu_ns_per_key).c_str(),
        lat ? "-" : absl::StrFormat("%.3f", r.cpu_s_per_gb).c_str(),
        r.ref.c_str());
  }
}

// A CSV cell: the figure, or empty where it does not apply.
std::string Cell(bool applies, double v) {
  return applies ? absl::StrFormat("%.6g", v) : std::string();
}

// The header and one row per (topology, case, op, size); nothing else (the
// file comment).
absl::Status WriteCsv(const std::string& path, const std::vector<Row>& rows) {
  std::ofstream f(path);
  if (!f) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  f << "topology,case,op,size,gbit_s,cpu_s_per_gb,mkeys_s,p50_us,p99_us\n";
  for (const Row& r : rows) {
    const bool tp = !r.latency;
    f << absl::StrJoin({r.topo, r.kase, r.op, r.size, Cell(tp, r.gbit_vals),
                        Cell(tp, r.cpu_s_per_gb), Cell(tp, r.mkeys_per_s),
                        Cell(r.latency, r.p50_us), Cell(r.latency, r.p99_us)},
                       ",")
      << "\n";
  }
  return f.good() ? absl::OkStatus()
                  : absl::UnavailableError(absl::StrCat("writing ", path));
}

absl::StatusOr<std::vector<size_t>> ParseSizes(const std::string& flag,
                                               const std::string& spec) {
  std::vector<size_t> out;
  for (absl::string_view p : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    size_t v;
    if (!absl::SimpleAtoi(p, &v) || v == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": bad size ", p));
    }
    out.push_back(v);
  }
  return out;
}

absl::StatusOr<std::vector<Topology>> ParseTopologies(const std::string& spec) {
  std::vector<Topology> out;
  for (absl::string_view p : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    std::vector<std::string> sw = absl::StrSplit(p, 'x');
    Topology t;
    if (sw.size() != 2 || !absl::SimpleAtoi(sw[0], &t.servers) ||
        !absl::SimpleAtoi(sw[1], &t.workers) || t.servers < 1 ||
        t.workers < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--topologies: expected SxW, got ", p));
    }
    out.push_back(t);
  }
  return out;
}

// `dim` floats of values and 8 key bytes per key.
Row ThroughputRow(const Topology& t, const std::string& kase, bool push,
                  const std::string& size, size_t dim, const Throughput& th) {
  Row r;
  r.topo = t.name();
  r.kase = kase;
  r.op = push ? "push" : "pull";
  r.size = size;
  const double s = std::max(th.seconds, 1e-9);
  const double keys = static_cast<double>(th.keys);
  const double val_bytes = keys * static_cast<double>(dim) * sizeof(float);
  r.req_per_s = static_cast<double>(th.requests) / s;
  r.mkeys_per_s = keys / s / 1e6;
  r.gbit_vals = val_bytes * 8 / s / 1e9;
  r.gbit_total = (val_bytes + keys * sizeof(uint64_t)) * 8 / s / 1e9;
  r.cpu_ns_per_key = th.keys > 0 ? th.cpu_seconds * 1e9 / keys : 0;
  r.cpu_s_per_gb = val_bytes > 0 ? th.cpu_seconds / (val_bytes / 1e9) : 0;
  r.ref = Reference(r.topo, kase, r.op, size);
  return r;
}

// The bulk case's sizes (MiB), checked: the dim must fit the proto's int32
// and a request the transport's message limit.
absl::StatusOr<std::vector<size_t>> BulkSizes() {
  PS_ASSIGN_OR_RETURN(auto sizes,
                      ParseSizes("bulk_mib", absl::GetFlag(FLAGS_bulk_mib)));
  for (size_t mib : sizes) {
    if (mib >= static_cast<size_t>(kDefaultMaxMessageMb)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--bulk_mib: ", mib, " MiB; a request must stay under ",
                       "the ", kDefaultMaxMessageMb, " MiB message limit"));
    }
  }
  return sizes;
}

constexpr size_t kFloatsPerMib = (size_t{1} << 20) / sizeof(float);

// `ops`: true for push, false for pull, in order.
absl::Status RunTopology(const Topology& t,
                         const std::vector<std::string>& cases,
                         const std::vector<bool>& ops, std::vector<Row>* rows) {
  auto has = [&](const char* c) {
    return std::find(cases.begin(), cases.end(), c) != cases.end();
  };
  std::vector<size_t> bulk_mib;
  if (has("bulk")) {
    PS_ASSIGN_OR_RETURN(bulk_mib, BulkSizes());
  }
  std::vector<int> bulk_dims;
  for (size_t mib : bulk_mib)
    bulk_dims.push_back(static_cast<int>(mib * kFloatsPerMib));
  // The latency case's table: the dim-1 one, or one more after the bulk's.
  const size_t latency_floats =
      static_cast<size_t>(std::max(1, absl::GetFlag(FLAGS_latency_kib))) *
      1024 / sizeof(float);
  const size_t latency_keys =
      static_cast<size_t>(std::max(1, absl::GetFlag(FLAGS_latency_keys)));
  if (has("latency") && latency_floats % latency_keys != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--latency_keys ", latency_keys, " does not divide the ",
        latency_floats, " floats of --latency_kib"));
  }
  const size_t latency_dim = latency_floats / latency_keys;
  std::vector<int> extra_dims = bulk_dims;
  int latency_table = kTable;
  if (has("latency") && latency_dim > 1) {
    latency_table = 1 + static_cast<int>(extra_dims.size());
    extra_dims.push_back(static_cast<int>(latency_dim));
  }
  PS_ASSIGN_OR_RETURN(auto cluster, Cluster::Start(t, extra_dims));
  Load dim1;
  dim1.inflight = absl::GetFlag(FLAGS_inflight);
  dim1.chunk_keys = static_cast<size_t>(absl::GetFlag(FLAGS_chunk_kib)) * 1024 /
                    sizeof(float);
  const int nw = t.workers;
  // Shared: zero-copy pushes keep the array alive while they send it.
  auto vals = std::make_shared<const std::vector<float>>();
  auto ensure_vals = [&](size_t n) {
    if (vals->size() < n) {
      vals = std::make_shared<const std::vector<float>>(n, 0.001f);
    }
  };

  if (has("bulk")) {
    // ps-lite's dense benchmark: --bulk_keys keys per server, each worker
    // sends each key as its own request, all in flight.
    const size_t nkeys =
        static_cast<size_t>(std::max(1, absl::GetFlag(FLAGS_bulk_keys))) *
        static_cast<size_t>(t.servers);
    std::vector<std::vector<uint64_t>> one_key_each;
    for (uint64_t k : DenseKeys(nkeys)) one_key_each.push_back({k});
    const std::vector<std::vector<std::vector<uint64_t>>> sets(nw,
                                                               one_key_each);
    for (size_t i = 0; i < bulk_mib.size(); ++i) {
      Load load;
      load.table = kTable + 1 + static_cast<int>(i);
      load.dim = static_cast<size_t>(bulk_dims[i]);
      load.inflight = absl::GetFlag(FLAGS_bulk_inflight) > 0
                          ? absl::GetFlag(FLAGS_bulk_inflight)
                          : static_cast<int>(nkeys);
      ensure_vals(load.dim);
      for (bool push : ops) {
        PS_ASSIGN_OR_RETURN(
            Throughput th,
            MeasureThroughput(cluster.get(), sets, vals, push, load));
        rows->push_back(ThroughputRow(
            t, "bulk", push, absl::StrCat(bulk_mib[i], "MiB"), load.dim, th));
        std::fprintf(
            stderr, "  %s bulk %zu MiB %s: %.3f Gbit/s values, %.3f CPU s/GB\n",
            t.name().c_str(), bulk_mib[i], push ? "push" : "pull",
            rows->back().gbit_vals, rows->back().cpu_s_per_gb);
      }
    }
  }
  if (has("dense")) {
    PS_ASSIGN_OR_RETURN(
        auto sizes, ParseSizes("dense_mib", absl::GetFlag(FLAGS_dense_mib)));
    for (size_t mib : sizes) {
      const size_t n = mib * kFloatsPerMib;
      // Every worker pushes and pulls the same dense block.
      std::vector<std::vector<std::vector<uint64_t>>> sets(nw, {DenseKeys(n)});
      ensure_vals(n);
      for (bool push : ops) {
        PS_ASSIGN_OR_RETURN(
            Throughput th,
            MeasureThroughput(cluster.get(), sets, vals, push, dim1));
        rows->push_back(
            ThroughputRow(t, "dense", push, absl::StrCat(mib, "MiB"), 1, th));
        std::fprintf(stderr, "  %s dense %zu MiB %s: %.3f Gbit/s values\n",
                     t.name().c_str(), mib, push ? "push" : "pull",
                     rows->back().gbit_vals);
      }
    }
  }
  if (has("latency")) {
    const std::vector<uint64_t> keys = DenseKeys(latency_keys);
    ensure_vals(latency_floats);
    const std::vector<float> v(vals->begin(), vals->begin() + latency_floats);
    for (bool push : ops) {
      PS_ASSIGN_OR_RETURN(
          Latency l,
          MeasureLatency(cluster.get(), latency_table, keys, v, push));
      Row r;
      r.topo = t.name();
      r.kase = "latency";
      r.latency = true;
      r.op = push ? "push" : "pull";
      r.size = absl::StrCat(absl::GetFlag(FLAGS_latency_kib), "KiB");
      if (latency_keys > 1) absl::StrAppend(&r.size, "/", latency_keys, "k");
      r.p50_us = l.p50_us;
      r.p99_us = l.p99_us;
      r.req_per_s = l.samples / absl::GetFlag(FLAGS_latency_seconds);
      r.ref = Reference(r.topo, r.kase, r.op, r.size);
      rows->push_back(r);
      std::fprintf(stderr, "  %s latency %s: p50 %.0f us\n", t.name().c_str(),
                   r.op.c_str(), l.p50_us);
    }
  }
  if (has("sparse")) {
    PS_ASSIGN_OR_RETURN(
        auto sizes,
        ParseSizes("sparse_keys", absl::GetFlag(FLAGS_sparse_keys)));
    for (size_t n : sizes) {
      // Two fixed random key sets per worker, alternated: the server's tables
      // stay bounded however long the run.
      const uint64_t dense_ids = absl::GetFlag(FLAGS_sparse_dense_ids);
      if (dense_ids != 0 && n > dense_ids / 2) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--sparse_dense_ids=", dense_ids, " must be at least twice ",
            "--sparse_keys (", n, ")"));
      }
      std::vector<std::vector<std::vector<uint64_t>>> sets(nw);
      for (int w = 0; w < nw; ++w) {
        for (uint64_t s = 0; s < 2; ++s) {
          const uint64_t seed = (static_cast<uint64_t>(w) << 32) ^ (n * 2 + s);
          sets[w].push_back(dense_ids != 0
                                ? RandomFeatureKeys(n, dense_ids, seed)
                                : RandomKeys(n, seed));
        }
      }
      ensure_vals(n);
      for (bool push : ops) {
        PS_ASSIGN_OR_RETURN(
            Throughput th,
            MeasureThroughput(cluster.get(), sets, vals, push, dim1));
        rows->push_back(ThroughputRow(
            t,
            absl::StrCat(dense_ids != 0 ? "sparse_dense_ids" : "sparse",
                         absl::GetFlag(FLAGS_key_caching) ? "_cached" : "",
                         absl::GetFlag(FLAGS_key_sets) ? "_sets" : ""),
            push, KeysLabel(n), 1, th));
        std::fprintf(stderr, "  %s sparse %s %s: %.2f M keys/s\n",
                     t.name().c_str(), KeysLabel(n).c_str(),
                     push ? "push" : "pull", rows->back().mkeys_per_s);
      }
    }
  }
  return absl::OkStatus();
}

int BenchMain() {
  InitLogging("B", absl::GetFlag(FLAGS_log_level));
  signal(SIGPIPE, SIG_IGN);
  const std::vector<std::string> cases =
      absl::StrSplit(absl::GetFlag(FLAGS_cases), ',', absl::SkipEmpty());
  for (const std::string& c : cases) {
    if (c != "bulk" && c != "dense" && c != "latency" && c != "sparse") {
      std::fprintf(stderr, "--cases: unknown case %s\n", c.c_str());
      return 2;
    }
  }
  std::vector<bool> ops;
  for (absl::string_view o :
       absl::StrSplit(absl::GetFlag(FLAGS_ops), ',', absl::SkipEmpty())) {
    if (o != "push" && o != "pull") {
      std::fprintf(stderr, "--ops: unknown op %s\n", std::string(o).c_str());
      return 2;
    }
    ops.push_back(o == "push");
  }
  auto topologies = ParseTopologies(absl::GetFlag(FLAGS_topologies));
  if (!topologies.ok()) {
    std::fprintf(stderr, "%s\n", topologies.status().ToString().c_str());
    return 2;
  }
  const auto t0 = SteadyClock::now();
  double iperf_gbps = 0;
  if (absl::GetFlag(FLAGS_iperf)) {
    auto bps = MeasureIperf(absl::GetFlag(FLAGS_iperf_seconds));
    if (bps.ok()) {
      iperf_gbps = *bps / 8 / 1e9;
      std::fprintf(stderr,
                   "iperf3, one loopback stream: %.3f GB/s (%.2f Gbit/s)\n",
                   iperf_gbps, *bps / 1e9);
    } else {
      std::fprintf(stderr, "iperf3 skipped: %s\n",
                   bps.status().ToString().c_str());
    }
  }
  std::vector<Row> rows;
  for (const Topology& t : *topologies) {
    std::fprintf(stderr,
                 "%s: starting %d server processes, %d worker threads\n",
                 t.name().c_str(), t.servers, t.workers);
    absl::Status s = RunTopology(t, cases, ops, &rows);
    if (!s.ok()) {
      std::fprintf(stderr, "%s failed: %s\n", t.name().c_str(),
                   s.ToString().c_str());
      PrintTable(rows, iperf_gbps);
      return 1;
    }
  }
  std::printf(
      "pushpull_bench: gRPC on loopback, %d request(s) in flight per "
      "worker (bulk: %s), %d channel(s) per server%s%s%s, server: %s\n",
      absl::GetFlag(FLAGS_inflight),
      absl::GetFlag(FLAGS_bulk_inflight) > 0
          ? absl::StrCat(absl::GetFlag(FLAGS_bulk_inflight)).c_str()
          : "one per key",
      absl::GetFlag(FLAGS_channels),
      absl::GetFlag(FLAGS_chunk_kib) > 0
          ? absl::StrCat(", chunks of ", absl::GetFlag(FLAGS_chunk_kib), " KiB")
                .c_str()
          : "",
      absl::GetFlag(FLAGS_client_grpc_args).empty()
          ? ""
          : absl::StrCat(", client args ",
                         absl::GetFlag(FLAGS_client_grpc_args))
                .c_str(),
      absl::GetFlag(FLAGS_server_grpc_args).empty()
          ? ""
          : absl::StrCat(", server args ",
                         absl::GetFlag(FLAGS_server_grpc_args))
                .c_str(),
      absl::GetFlag(FLAGS_noop_server)
          ? "no-op (no table)"
          : absl::StrCat("ServerNode, ", absl::GetFlag(FLAGS_optimizer))
                .c_str());
  std::printf(
      "iperf3 one stream: %s; x iperf below is the rate over that (val: "
      "values only, tot: keys + values); CPU is all processes' over the "
      "measured phase, per 1e9 value bytes\n",
      iperf_gbps > 0 ? absl::StrFormat("%.3f GB/s (%.2f Gbit/s)", iperf_gbps,
                                       iperf_gbps * 8)
                           .c_str()
                     : "not measured");
  PrintTable(rows, iperf_gbps);
  std::printf("total run time %.1f s\n", SecondsSince(t0));
  const std::string csv = absl::GetFlag(FLAGS_csv);
  if (!csv.empty()) {
    absl::Status s = WriteCsv(csv, rows);
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace ps::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  ps::UseReleaseMutexes();  // as ps_server and ps_worker run
  if (absl::GetFlag(FLAGS_serve)) return ps::bench::ServeMain();
  return ps::bench::BenchMain();
}
