#include "transport/grpc_transport.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/base/internal/raw_logging.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "grpc/grpc.h"
#include "grpc/grpc_security.h"
#include "grpcpp/alarm.h"
#include "grpcpp/generic/generic_stub.h"
#include "proto/ps.grpc.pb.h"
#include "transport/data_plane.h"
#include "transport/shared_arena.h"

namespace ps {

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()), EncodeReason(s));
}

absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return DecodeReason(absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                                   s.error_message()),
                      s.error_details());
}

absl::Status CheckToken(const grpc::ServerContextBase& ctx,
                        const std::string& expected) {
  if (expected.empty()) return absl::OkStatus();
  const auto& md = ctx.client_metadata();
  auto it = md.find(kTokenHeader);
  if (it == md.end()) {
    return absl::UnauthenticatedError("missing cluster token");
  }
  if (!ConstantTimeEquals(std::string_view(it->second.data(),
                                           it->second.size()),
                          expected)) {
    return absl::UnauthenticatedError("wrong cluster token");
  }
  return absl::OkStatus();
}

bool IsHealthCheckMethod(std::string_view path) {
  return path == "/grpc.health.v1.Health/Check" ||
         path == "/grpc.health.v1.Health/Watch";
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]);
  }
  return diff == 0;
}

namespace {

int MessageLimitBytes(int max_message_mb) {
  if (max_message_mb <= 0) max_message_mb = kDefaultMaxMessageMb;
  // gRPC takes an int: 2047 MiB at most.
  return static_cast<int>(std::min<int64_t>(
      int64_t{max_message_mb} << 20, std::numeric_limits<int>::max()));
}

absl::StatusOr<std::string> ReadPem(const std::string& path,
                                    const char* what) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  if (!in || ss.str().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read ", what, " ", path));
  }
  return ss.str();
}

// The token check, run by gRPC's server auth filter on a call's initial
// metadata before the message is read. `state` is the expected token.
void ProcessToken(void* state, grpc_auth_context*, const grpc_metadata* md,
                  size_t num_md, grpc_process_auth_metadata_done_cb cb,
                  void* user_data) {
  const std::string& expected = *static_cast<const std::string*>(state);
  // gRPC's health-checking service answers without the token: Kubernetes
  // probes (and load balancers) cannot send one, and it tells nothing but
  // SERVING / NOT_SERVING. Only its two methods; every other path,
  // an unknown one included, needs the token.
  for (size_t i = 0; i < num_md; ++i) {
    if (grpc_slice_str_cmp(md[i].key, ":path") != 0) continue;
    if (IsHealthCheckMethod(std::string_view(
            reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(md[i].value)),
            GRPC_SLICE_LENGTH(md[i].value)))) {
      cb(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_OK, nullptr);
      return;
    }
    break;
  }
  const char* error = "missing cluster token";
  for (size_t i = 0; i < num_md; ++i) {
    if (grpc_slice_str_cmp(md[i].key, kTokenHeader) != 0) continue;
    const std::string_view got(
        reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(md[i].value)),
        GRPC_SLICE_LENGTH(md[i].value));
    error = ConstantTimeEquals(got, expected) ? nullptr : "wrong cluster token";
    break;
  }
  // The token stays in the metadata (not consumed): the services check it
  // again, which also covers transports without this filter.
  cb(user_data, nullptr, 0, nullptr, 0,
     error == nullptr ? GRPC_STATUS_OK : GRPC_STATUS_UNAUTHENTICATED, error);
}

void DestroyToken(void* state) { delete static_cast<std::string*>(state); }

// grpc++ 1.51's InsecureServerCredentials() cannot take an auth metadata
// processor, so both plaintext and TLS server credentials are built here
// from the core API, where the processor works for either.
class CoreServerCredentials final : public grpc::ServerCredentials {
 public:
  CoreServerCredentials(GrpcSecurity s, std::string ca, std::string cert,
                        std::string key)
      : s_(std::move(s)),
        ca_(std::move(ca)),
        cert_(std::move(cert)),
        key_(std::move(key)) {}

  void SetAuthMetadataProcessor(
      const std::shared_ptr<grpc::AuthMetadataProcessor>&) override {
    PS_LOG_ERROR("CoreServerCredentials: a C++ auth processor is not "
                 "supported; the token check is built in");
  }

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    grpc_server_credentials* c;
    if (s_.tls.enabled()) {
      grpc_ssl_pem_key_cert_pair pair{key_.c_str(), cert_.c_str()};
      c = grpc_ssl_server_credentials_create_ex(
          ca_.empty() ? nullptr : ca_.c_str(), &pair, 1,
          s_.tls.require_client_cert
              ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
              : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
          nullptr);
    } else {
      c = grpc_insecure_server_credentials_create();
    }
    if (!s_.token.empty()) {
      grpc_auth_metadata_processor p;
      p.process = ProcessToken;
      p.destroy = DestroyToken;
      p.state = new std::string(s_.token);
      grpc_server_credentials_set_auth_metadata_processor(c, p);
    }
    const int port = grpc_server_add_http2_port(server, addr.c_str(), c);
    grpc_server_credentials_release(c);
    return port;
  }

  const GrpcSecurity s_;
  const std::string ca_, cert_, key_;
};

}  // namespace

void ApplyMessageLimit(int max_message_mb, grpc::ChannelArguments* args) {
  const int limit = MessageLimitBytes(max_message_mb);
  args->SetMaxReceiveMessageSize(limit);
  args->SetMaxSendMessageSize(limit);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const GrpcSecurity& s) {
  std::string ca, cert, key;
  if (s.tls.enabled()) {
    if (s.tls.cert_file.empty() || s.tls.key_file.empty()) {
      return absl::InvalidArgumentError(
          "cluster.tls: a server needs cert_file and key_file");
    }
    if (s.tls.require_client_cert && s.tls.ca_file.empty()) {
      return absl::InvalidArgumentError(
          "cluster.tls.require_client_cert needs ca_file");
    }
    auto c = ReadPem(s.tls.cert_file, "cluster.tls.cert_file");
    if (!c.ok()) return c.status();
    auto k = ReadPem(s.tls.key_file, "cluster.tls.key_file");
    if (!k.ok()) return k.status();
    cert = std::move(*c);
    key = std::move(*k);
    if (!s.tls.ca_file.empty()) {
      auto a = ReadPem(s.tls.ca_file, "cluster.tls.ca_file");
      if (!a.ok()) return a.status();
      ca = std::move(*a);
    }
  }
  return std::shared_ptr<grpc::ServerCredentials>(
      std::make_shared<CoreServerCredentials>(s, std::move(ca), std::move(cert),
                                              std::move(key)));
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const GrpcSecurity& s) {
  if (!s.tls.enabled()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions o;
  if (!s.tls.ca_file.empty()) {
    auto a = ReadPem(s.tls.ca_file, "cluster.tls.ca_file");
    if (!a.ok()) return a.status();
    o.pem_root_certs = std::move(*a);
  }
  if (!s.tls.cert_file.empty() && !s.tls.key_file.empty()) {
    auto c = ReadPem(s.tls.cert_file, "cluster.tls.cert_file");
    if (!c.ok()) return c.status();
    auto k = ReadPem(s.tls.key_file, "cluster.tls.key_file");
    if (!k.ok()) return k.status();
    o.pem_cert_chain = std::move(*c);
    o.pem_private_key = std::move(*k);
  }
  return grpc::SslCredentials(o);
}

absl::StatusOr<GrpcSecurity> SecurityFromEnv(GrpcSecurity s) {
  auto get = [](const char* name) -> const char* {
    const char* v = std::getenv(name);
    return v != nullptr && *v != '\0' ? v : nullptr;
  };
  if (const char* v = get("PS_AUTH_TOKEN")) s.token = v;
  if (const char* v = get("PS_MAX_MESSAGE_MB")) {
    if (!absl::SimpleAtoi(v, &s.max_message_mb) || s.max_message_mb < 1 ||
        s.max_message_mb > 2047) {
      return absl::InvalidArgumentError(
          absl::StrCat("PS_MAX_MESSAGE_MB: expected 1..2047, got '", v, "'"));
    }
  }
  if (const char* v = get("PS_TLS_CERT_FILE")) s.tls.cert_file = v;
  if (const char* v = get("PS_TLS_KEY_FILE")) s.tls.key_file = v;
  if (const char* v = get("PS_TLS_CA_FILE")) s.tls.ca_file = v;
  if (const char* v = get("PS_TLS_REQUIRE_CLIENT_CERT")) {
    s.tls.require_client_cert = std::string_view(v) == "1";
  }
  return s;
}

std::vector<std::string> SecurityEnv(const GrpcSecurity& s) {
  std::vector<std::string> env;
  if (!s.token.empty()) env.push_back("PS_AUTH_TOKEN=" + s.token);
  env.push_back(absl::StrCat("PS_MAX_MESSAGE_MB=", s.max_message_mb));
  if (!s.tls.cert_file.empty()) {
    env.push_back("PS_TLS_CERT_FILE=" + s.tls.cert_file);
  }
  if (!s.tls.key_file.empty()) env.push_back("PS_TLS_KEY_FILE=" + s.tls.key_file);
  if (!s.tls.ca_file.empty()) env.push_back("PS_TLS_CA_FILE=" + s.tls.ca_file);
  env.push_back(absl::StrCat("PS_TLS_REQUIRE_CLIENT_CERT=",
                             s.tls.require_client_cert ? 1 : 0));
  return env;
}

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" ||
         host.rfind("127.", 0) == 0;
}

absl::Status CheckBindAllowed(const std::string& host, const GrpcSecurity& s,
                              bool insecure) {
  if (!s.token.empty()) return absl::OkStatus();
  if (!IsLoopbackHost(host) && !insecure) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to listen on ", host,
        " without a cluster token: set PS_AUTH_TOKEN (or cluster.auth_token),"
        " or pass --insecure to accept unauthenticated calls"));
  }
  PS_LOG_WARN("no cluster token (PS_AUTH_TOKEN): calls on {} are not "
              "authenticated",
              host);
  return absl::OkStatus();
}

grpc::ChannelArguments DefaultChannelArgs() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  // Bigger HTTP/2 windows: large pushes would otherwise stall on
  // flow-control round trips.
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 1);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Bug "A ~5 s stall while connecting": gRPC takes the *minimum*
  // reconnect backoff as the minimum connect timeout (doc/connection-
  // backoff.md: MIN_CONNECT_TIMEOUT), so at 100 ms a handshake with a busy
  // peer was cut off ("tcp handshaker shutdown") and the call waited for
  // later attempts. Give a connect 5 s; retries still start after 100 ms
  // (initial backoff) and back off to at most 1 s.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 5000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kMaxReconnectBackoffMs);
  return args;
}

void ConfigureServerBuilder(grpc::ServerBuilder* builder,
                            int max_message_mb) {
  const int limit = MessageLimitBytes(max_message_mb);
  builder->SetMaxReceiveMessageSize(limit);
  builder->SetMaxSendMessageSize(limit);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Calls one connection may have open at once: a worker keeps a few dozen
  // per server; the cap bounds what a client that floods calls and
  // abandons them can make the server hold.
  builder->AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                              kMaxConcurrentCallsPerConnection);
  builder->AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  // What gRPC itself may hold for this server's calls and connections: a
  // client that opens calls and abandons them faster than the server
  // answers them would otherwise queue them without bound (a new stream
  // opens as soon as the client cancels an old one). Room for a few
  // messages of the maximum size; beyond it gRPC refuses new work with
  // RESOURCE_EXHAUSTED instead of allocating.
  grpc::ResourceQuota quota("ps-server");
  quota.Resize(static_cast<size_t>(limit) * 4);
  builder->SetResourceQuota(quota);  // the builder keeps a reference
}

void ApplyGrpcArgs(const std::vector<GrpcArg>& args,
                   grpc::ChannelArguments* base) {
  for (const GrpcArg& a : args) {
    int v;
    if (absl::SimpleAtoi(a.value, &v)) {
      base->SetInt(a.name, v);
    } else {
      base->SetString(a.name, a.value);
    }
  }
}

void ApplyGrpcArgs(const std::vector<GrpcArg>& args,
                   grpc::ServerBuilder* builder) {
  for (const GrpcArg& a : args) {
    int v;
    if (absl::SimpleAtoi(a.value, &v)) {
      builder->AddChannelArgument(a.name, v);
    } else {
      builder->AddChannelArgument(a.name, a.value);
    }
  }
}

std::string TokenFromEnv(const std::string& fallback) {
  const char* t = std::getenv("PS_AUTH_TOKEN");
  if (t != nullptr && *t != '\0') return t;
  return fallback;
}

namespace {

// Appends the tag and length of length-delimited field `field` with `len`
// bytes (protobuf wire format).
void AppendLengthDelimited(int field, size_t len, std::string* out) {
  uint64_t v = (static_cast<uint64_t>(field) << 3) | 2;  // wire type LEN
  for (int pass = 0; pass < 2; ++pass) {
    while (v >= 0x80) {
      out->push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    out->push_back(static_cast<char>(v));
    v = len;
  }
}

// A slice of `bytes` (memory that `owner` keeps alive) that holds a
// reference to the owner until gRPC frees the slice.
template <typename T>
grpc::Slice Referencing(absl::Span<const char> bytes,
                        const std::shared_ptr<T>& owner) {
  auto* ref = new std::shared_ptr<T>(owner);
  return grpc::Slice(
      const_cast<char*>(bytes.data()), bytes.size(),
      [](void* p) { delete static_cast<std::shared_ptr<T>*>(p); }, ref);
}

}  // namespace

grpc::ByteBuffer PushWire(std::shared_ptr<const proto::PushRequest> req,
                          const BorrowedValues* borrowed,
                          size_t min_zero_copy_bytes) {
  ABSL_RAW_CHECK(borrowed == nullptr || borrowed->pieces.empty() ||
                     req->vals().empty(),
                 "PushWire: values both in the request and borrowed");
  const absl::Span<const char> borrowed_keys =
      borrowed == nullptr ? absl::Span<const char>() : borrowed->keys;
  ABSL_RAW_CHECK(borrowed_keys.empty() || req->keys().empty(),
                 "PushWire: keys both in the request and borrowed");
  const size_t borrowed_bytes = borrowed == nullptr ? 0 : borrowed->size();
  grpc::ByteBuffer out;
  if (req->keys().size() + borrowed_keys.size() + req->vals().size() +
          borrowed_bytes <
      min_zero_copy_bytes) {
    proto::PushRequest whole;
    const proto::PushRequest* r = req.get();
    if (borrowed_bytes > 0 || !borrowed_keys.empty()) {
      whole = *req;
      if (!borrowed_keys.empty()) {
        whole.set_keys(borrowed_keys.data(), borrowed_keys.size());
      }
      borrowed->AppendTo(whole.mutable_vals());
      r = &whole;
    }
    bool own = false;
    grpc::Status st = grpc::SerializationTraits<proto::PushRequest>::Serialize(
        *r, &out, &own);
    ABSL_RAW_CHECK(st.ok(), "PushRequest serialization failed");
    return out;
  }
  // Every field but keys and vals (PushWireTest checks none is missed).
  const proto::PushRequest head = PushHead(*req);
  std::string prefix = head.SerializeAsString();
  std::vector<grpc::Slice> slices;
  slices.reserve(6 + (borrowed == nullptr ? 0 : borrowed->pieces.size()));
  if (!borrowed_keys.empty()) {
    AppendLengthDelimited(proto::PushRequest::kKeysFieldNumber,
                          borrowed_keys.size(), &prefix);
    slices.emplace_back(prefix);
    slices.push_back(Referencing(borrowed_keys, borrowed->keys_owner));
    prefix.clear();
  }
  // Each non-empty field: its tag and length (copied), then its bytes.
  for (const auto& [field, bytes] :
       {std::pair<int, const std::string*>{proto::PushRequest::kKeysFieldNumber,
                                           &req->keys()},
        {proto::PushRequest::kValsFieldNumber, &req->vals()}}) {
    if (bytes->empty()) continue;
    AppendLengthDelimited(field, bytes->size(), &prefix);
    slices.emplace_back(prefix);
    slices.push_back(Referencing(absl::Span<const char>(*bytes), req));
    prefix.clear();
  }
  if (borrowed_bytes > 0) {
    AppendLengthDelimited(proto::PushRequest::kValsFieldNumber, borrowed_bytes,
                          &prefix);
    slices.emplace_back(prefix);
    for (const absl::Span<const char>& piece : borrowed->pieces) {
      if (!piece.empty()) slices.push_back(Referencing(piece, borrowed->owner));
    }
    prefix.clear();
  }
  if (!prefix.empty()) slices.emplace_back(prefix);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

grpc::ByteBuffer PullReplyWire(const proto::PullResponse& resp,
                               grpc::Slice vals) {
  ABSL_RAW_CHECK(resp.vals().empty(), "PullReplyWire: vals go in the slice");
  std::string head = resp.SerializeAsString();
  if (vals.size() == 0) {
    grpc::Slice only(head);
    return grpc::ByteBuffer(&only, 1);
  }
  AppendLengthDelimited(proto::PullResponse::kValsFieldNumber, vals.size(),
                        &head);
  grpc::Slice slices[2] = {grpc::Slice(head), std::move(vals)};
  return grpc::ByteBuffer(slices, 2);
}

namespace {

std::chrono::system_clock::time_point ToDeadline(absl::Time t) {
  absl::Time cap = absl::Now() + absl::Hours(24);
  if (t > cap) t = cap;
  return absl::ToChronoTime(t);
}

void Prepare(grpc::ClientContext* ctx, absl::Time deadline,
             const std::string& token) {
  ctx->set_deadline(ToDeadline(deadline));
  if (!token.empty()) ctx->AddMetadata(kTokenHeader, token);
}

// Calls of one client still in flight (its destructor waits for them).
struct Inflight {
  absl::Mutex mu;
  int64_t count ABSL_GUARDED_BY(mu) = 0;
  void Add(int64_t d) {
    absl::MutexLock l(&mu);
    count += d;
  }
};

// One ReplicateStream call (issue 9): the batches a primary sends a backup,
// written in order, each answered in order by the backup. A batch not
// answered by its deadline cancels the call; a call that ends (the backup
// died, a deadline, the client going away) fails every batch still
// unanswered, and the next batch opens a new call. The stream owns itself
// until gRPC's OnDone; the client keeps a shared_ptr to send on it.
class ReplicationStream
    : public grpc::ClientBidiReactor<proto::ReplicateRequest,
                                     proto::ReplicateResponse>,
      public std::enable_shared_from_this<ReplicationStream> {
 public:
  using Batch = std::shared_ptr<const proto::ReplicateRequest>;

  static std::shared_ptr<ReplicationStream> Open(
      proto::Server::Stub* stub, const std::string& token,
      std::shared_ptr<Inflight> inflight) {
    std::shared_ptr<ReplicationStream> s(
        new ReplicationStream(std::move(inflight)));
    s->self_ = s;
    if (!token.empty()) s->ctx_.AddMetadata(kTokenHeader, token);
    s->inflight_->Add(1);
    stub->async()->ReplicateStream(&s->ctx_, s.get());
    s->StartRead(&s->resp_);
    s->StartCall();
    return s;
  }

  // Queues `batch`; false when the call has ended (open a new one), with
  // why it ended in *why.
  bool Send(Batch batch, absl::Time deadline,
            ServerClient::Callback<proto::ReplicateResponse> done,
            absl::Status* why) {
    absl::MutexLock l(&mu_);
    if (ended_) {
      *why = end_status_;
      return false;
    }
    pending_.push_back(Pending{std::move(batch), deadline, std::move(done)});
    WriteNextLocked();
    ArmLocked();
    return true;
  }

  // Ends the call: the batches not answered yet fail with CANCELLED.
  void Cancel() { ctx_.TryCancel(); }

  void OnWriteDone(bool ok) override {
    absl::MutexLock l(&mu_);
    writing_.reset();
    if (ok) WriteNextLocked();
    // Otherwise the call is broken: the pending read fails and OnDone
    // fails the batches.
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the call ended; OnDone follows
    Pending p;
    {
      absl::MutexLock l(&mu_);
      if (written_ == 0) {
        // An answer to nothing: not a backup speaking this protocol.
        protocol_error_ = true;
      } else {
        p = std::move(pending_.front());
        pending_.pop_front();
        --written_;
      }
    }
    if (p.done == nullptr) {
      ctx_.TryCancel();
      return;
    }
    // The answer, then the next read: answers reach the caller in order.
    p.done(StatusFromReply(resp_), &resp_);
    resp_.Clear();
    StartRead(&resp_);
  }

  void OnDone(const grpc::Status& status) override {
    std::deque<Pending> failed;
    absl::Status s = FromGrpcStatus(status);
    {
      absl::MutexLock l(&mu_);
      ended_ = true;
      failed.swap(pending_);
      written_ = 0;
      if (timed_out_) {
        s = absl::DeadlineExceededError("replication batch not answered in time");
      } else if (protocol_error_) {
        s = absl::InternalError("replication stream: an answer without a batch");
      } else if (s.ok()) {
        s = absl::UnavailableError("replication stream ended by the backup");
      }
      end_status_ = s;
      alarm_.reset();  // cancels a pending watchdog
    }
    for (Pending& p : failed) {
      proto::ReplicateResponse empty;
      p.done(s, &empty);
    }
    std::shared_ptr<Inflight> inflight = std::move(inflight_);
    std::shared_ptr<ReplicationStream> self = std::move(self_);
    self.reset();  // may delete this
    inflight->Add(-1);
  }

 private:
  struct Pending {
    Batch batch;
    absl::Time deadline;
    ServerClient::Callback<proto::ReplicateResponse> done;
  };

  explicit ReplicationStream(std::shared_ptr<Inflight> inflight)
      : inflight_(std::move(inflight)) {}

  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ != nullptr || written_ >= pending_.size()) return;
    writing_ = pending_[written_++].batch;  // alive until OnWriteDone
    StartWrite(writing_.get());
  }

  // The watchdog: one alarm at a time, at the oldest batch's deadline.
  void ArmLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (armed_ || ended_ || pending_.empty()) return;
    armed_ = true;
    // A new alarm each time (an alarm cannot be set again from its own
    // callback); replacing the old one, even from inside its callback, is
    // safe: gRPC keeps the firing alarm alive until its callback returns.
    alarm_ = std::make_unique<grpc::Alarm>();
    alarm_->Set(ToChrono(pending_.front().deadline),
                [weak = weak_from_this()](bool fired) {
                  if (!fired) return;
                  std::shared_ptr<ReplicationStream> s = weak.lock();
                  if (s != nullptr) s->OnAlarm();
                });
  }

  void OnAlarm() {
    bool cancel = false;
    {
      absl::MutexLock l(&mu_);
      armed_ = false;
      if (ended_ || pending_.empty()) return;
      if (pending_.front().deadline <= absl::Now()) {
        timed_out_ = true;
        cancel = true;
      } else {
        ArmLocked();
      }
    }
    if (cancel) ctx_.TryCancel();
  }

  static std::chrono::system_clock::time_point ToChrono(absl::Time t) {
    absl::Time cap = absl::Now() + absl::Hours(24);
    return absl::ToChronoTime(t > cap ? cap : t);
  }

  grpc::ClientContext ctx_;
  proto::ReplicateResponse resp_;  // the read in progress
  std::shared_ptr<Inflight> inflight_;
  std::shared_ptr<ReplicationStream> self_;  // until OnDone
  absl::Mutex mu_;
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);  // in order
  size_t written_ ABSL_GUARDED_BY(mu_) = 0;  // pending_[0, written_) sent
  Batch writing_ ABSL_GUARDED_BY(mu_);       // the write in progress
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status end_status_ ABSL_GUARDED_BY(mu_);  // once ended_
  bool armed_ ABSL_GUARDED_BY(mu_) = false;
  bool timed_out_ ABSL_GUARDED_BY(mu_) = false;
  bool protocol_error_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<grpc::Alarm> alarm_ ABSL_GUARDED_BY(mu_);
};

class GrpcServerClient : public ServerClient {
 public:
  GrpcServerClient(const std::string& address, const GrpcTransportOptions& o,
                   const std::shared_ptr<grpc::ChannelCredentials>& creds,
                   std::shared_ptr<const DataPlaneSwitches> data_plane)
      : token_(o.token),
        address_(address),
        max_frame_bytes_(static_cast<size_t>(MessageLimitBytes(o.max_message_mb))),
        data_plane_(std::move(data_plane)),
        inflight_(std::make_shared<Inflight>()) {
    for (int i = 0; i < std::max(1, o.channels_per_server); ++i) {
      grpc::ChannelArguments args = DefaultChannelArgs();
      // Distinct args and a local subchannel pool give each channel its own
      // TCP connection.
      args.SetInt("ps.channel_index", i);
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      ApplyMessageLimit(o.max_message_mb, &args);
      ApplyGrpcArgs(o.extra_channel_args, &args);
      std::shared_ptr<grpc::Channel> channel =
          grpc::CreateCustomChannel(address, creds, args);
      stubs_.push_back(proto::Server::NewStub(channel));
      generic_.push_back(std::make_unique<grpc::GenericStub>(channel));
    }
  }

  // Values never enter a serialized copy (PushWire): the generic stub sends
  // the request's own buffers, or the borrowed ones.
  // Push, pull, clock and replication batches go over the server's data
  // plane when it is connected (transport/data_plane.h), else over gRPC.
  void Push(std::shared_ptr<const proto::PushRequest> req, absl::Time deadline,
            Callback<proto::PushResponse> done) override {
    if (std::shared_ptr<DataPlaneClient> d = Data()) {
      d->Push(*req, nullptr, deadline, std::move(done));
      return;
    }
    SendPush(PushWire(std::move(req)), deadline, std::move(done));
  }
  void PushBorrowed(std::shared_ptr<const proto::PushRequest> req,
                    BorrowedValues vals, absl::Time deadline,
                    Callback<proto::PushResponse> done) override {
    if (std::shared_ptr<DataPlaneClient> d = Data()) {
      d->Push(*req, &vals, deadline, std::move(done));
      return;
    }
    SendPush(PushWire(std::move(req), &vals), deadline, std::move(done));
  }
  void SendPush(grpc::ByteBuffer wire, absl::Time deadline,
                Callback<proto::PushResponse> done) {
    struct Call {
      grpc::ClientContext ctx;
      grpc::ByteBuffer req;
      grpc::ByteBuffer resp;
      Callback<proto::PushResponse> done;
    };
    auto* call = new Call;
    call->req = std::move(wire);
    call->done = std::move(done);
    Prepare(&call->ctx, deadline, token_);
    {
      absl::MutexLock l(&inflight_->mu);
      ++inflight_->count;
    }
    const size_t i = next_.fetch_add(1, std::memory_order_relaxed);
    generic_[i % generic_.size()]->UnaryCall(
        &call->ctx, "/ps.proto.Server/Push", grpc::StubOptions(), &call->req,
        &call->resp, [call, inflight = inflight_](grpc::Status s) {
          proto::PushResponse resp;
          if (s.ok()) {
            s = grpc::SerializationTraits<proto::PushResponse>::Deserialize(
                &call->resp, &resp);
          }
          call->done(FromGrpcStatus(s), &resp);
          delete call;
          absl::MutexLock l(&inflight->mu);
          --inflight->count;
        });
  }
  void Pull(std::shared_ptr<const proto::PullRequest> req, absl::Time deadline,
            Callback<proto::PullResponse> done) override {
    if (std::shared_ptr<DataPlaneClient> d = Data()) {
      d->Pull(*req, deadline, std::move(done));
      return;
    }
    Start<proto::PullRequest, proto::PullResponse>(
        std::move(req), deadline, std::move(done),
        [](proto::Server::Stub* s, auto* ctx, auto* rq, auto* rs, auto cb) {
          s->async()->Pull(ctx, rq, rs, std::move(cb));
        });
  }
  void PullValues(std::shared_ptr<const proto::PullRequest> req,
                  absl::Time deadline, ValuesCallback done) override {
    if (std::shared_ptr<DataPlaneClient> d = Data()) {
      d->PullValues(*req, deadline, std::move(done));
      return;
    }
    ServerClient::PullValues(std::move(req), deadline, std::move(done));
  }
  void PullKept(std::shared_ptr<const proto::PullRequest> req,
                absl::Time deadline, KeptValuesCallback done) override {
    if (std::shared_ptr<DataPlaneClient> d = Data()) {
      d->PullKept(*req, deadline, std::move(done));
      return;
    }
    ServerClient::PullKept(std::move(req), deadline, std::move(done));
  }
  // On the client's replication stream (opened on first use, and again
  // after it ended).
  void Replicate(std::shared_ptr<const proto::ReplicateRequest> req,
                 absl::Time deadline,
                 Callback<proto::ReplicateResponse> done) override {
    // From a batch's own answer (the next batch) too: one batch is in
    // flight per backup, which reads it whole before it answers, so the
    // write cannot wait for this reader.
    if (std::shared_ptr<DataPlaneClient> d = Data(/*from_reader=*/true)) {
      d->Replicate(*req, deadline, std::move(done));
      return;
    }
    absl::MutexLock l(&stream_mu_);
    absl::Status why;
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (stream_ == nullptr) {
        stream_ = ReplicationStream::Open(NextStub(), token_, inflight_);
      }
      if (stream_->Send(req, deadline, done, &why)) return;
      stream_.reset();  // it ended: a new call
    }
    // A fresh call ended before the batch was on it, twice: the backup
    // refused it (a wrong token: UNAUTHENTICATED) or the channel is going
    // away; the second call's end says which.
    proto::ReplicateResponse empty;
    done(Annotate(why, "replication stream could not be opened"), &empty);
  }
  void Clock(std::shared_ptr<const proto::ClockRequest> req, absl::Time deadline,
             Callback<proto::ClockResponse> done) override {
    if (std::shared_ptr<DataPlaneClient> d = Data()) {
      d->Clock(*req, deadline, std::move(done));
      return;
    }
    Start<proto::ClockRequest, proto::ClockResponse>(
        std::move(req), deadline, std::move(done),
        [](proto::Server::Stub* s, auto* ctx, auto* rq, auto* rs, auto cb) {
          s->async()->Clock(ctx, rq, rs, std::move(cb));
        });
  }
  // Calls still in flight hold the channels: wait for them (bounded), so a
  // channel is never destroyed on gRPC's own callback thread.
  ~GrpcServerClient() override {
    std::thread connector;
    std::shared_ptr<DataPlaneClient> data;
    {
      absl::MutexLock l(&data_mu_);
      closing_ = true;
      connector.swap(connector_);
      data.swap(data_);
    }
    if (connector.joinable()) connector.join();
    data.reset();  // fails its calls in flight
    {
      absl::MutexLock l(&stream_mu_);
      if (stream_ != nullptr) stream_->Cancel();
      stream_.reset();
    }
    absl::MutexLock l(&inflight_->mu);
    auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(inflight_->mu) {
      return inflight_->count == 0;
    };
    inflight_->mu.AwaitWithTimeout(absl::Condition(&idle), absl::Seconds(10));
  }

  absl::Status Finish(const proto::FinishRequest& req,
                      absl::Time deadline) override {
    grpc::ClientContext ctx;
    Prepare(&ctx, deadline, token_);
    proto::FinishResponse resp;
    return FromGrpcStatus(NextStub()->Finish(&ctx, req, &resp));
  }
  absl::StatusOr<proto::ServerControlResponse> Control(
      const proto::ServerControlRequest& req, absl::Time deadline) override {
    grpc::ClientContext ctx;
    Prepare(&ctx, deadline, token_);
    proto::ServerControlResponse resp;
    absl::Status s = FromGrpcStatus(NextStub()->Control(&ctx, req, &resp));
    if (!s.ok()) return s;
    return resp;
  }
  absl::StatusOr<proto::ServerStatus> GetStatus(absl::Time deadline) override {
    grpc::ClientContext ctx;
    Prepare(&ctx, deadline, token_);
    proto::ServerStatusRequest req;
    proto::ServerStatus resp;
    absl::Status s = FromGrpcStatus(NextStub()->GetStatus(&ctx, req, &resp));
    if (!s.ok()) return s;
    return resp;
  }

 private:
  // The data plane's connection when it is up; else null, and a connection
  // is being made (on connector_, at most one try per second after a
  // failure) unless the server has none or the data plane is off.
  // `from_reader`: the caller may be the connection's own reader (a
  // callback), which must not write on it unless the caller knows the
  // write cannot wait for that reader (data_plane.h).
  std::shared_ptr<DataPlaneClient> Data(bool from_reader = false) {
    if (!data_plane_->on.load(std::memory_order_relaxed)) return nullptr;
    std::shared_ptr<DataPlaneClient> broken;  // released after the lock
    absl::MutexLock l(&data_mu_);
    if (data_ != nullptr) {
      if (data_->ok()) {
        return !from_reader && data_->OnReaderThread() ? nullptr : data_;
      }
      broken.swap(data_);
      next_try_ = std::max(next_try_, absl::Now() + absl::Milliseconds(100));
    }
    if (!connecting_ && !closing_ && absl::Now() >= next_try_) {
      connecting_ = true;
      if (connector_.joinable()) connector_.join();  // done: it cleared connecting_
      connector_ = std::thread([this] { ConnectData(); });
    }
    return nullptr;
  }
  // Asks the server for its data port (GetStatus) and connects.
  void ConnectData() {
    const absl::Time deadline = absl::Now() + absl::Seconds(3);
    grpc::ClientContext ctx;
    Prepare(&ctx, deadline, token_);
    proto::ServerStatusRequest req;
    proto::ServerStatus st;
    absl::Status s = FromGrpcStatus(NextStub()->GetStatus(&ctx, req, &st));
    absl::StatusOr<std::shared_ptr<DataPlaneClient>> c;
    // The data port is on the host the gRPC address names.
    const size_t colon = address_.rfind(':');
    const std::string host =
        colon == std::string::npos ? address_ : address_.substr(0, colon);
    if (s.ok() && st.data_port() <= 0) {
      s = absl::NotFoundError("the server has no data plane");
    }
    // A server on this host (in this network namespace) is reached over its
    // same-host socket; one elsewhere refuses that at once, and the port
    // is next.
    bool local = false;
    if (s.ok() && !st.data_socket().empty() &&
        data_plane_->local.load(std::memory_order_relaxed)) {
      c = DataPlaneClient::ConnectLocal(st.data_socket(), token_,
                                        max_frame_bytes_, deadline,
                                        absl::Seconds(5), data_plane_->Arena());
      local = c.ok();
      if (!c.ok()) {
        PS_LOG_DEBUG("data plane to {}: {}; trying its port", address_,
                     c.status().ToString());
      }
    }
    if (s.ok() && !local) {
      c = DataPlaneClient::Connect(host, st.data_port(), token_,
                                   max_frame_bytes_, deadline);
      s = c.status();
    }
    absl::MutexLock l(&data_mu_);
    connecting_ = false;
    if (s.ok() && !closing_) {
      data_ = std::move(*c);
      failures_ = 0;
      if (local) {
        PS_LOG_DEBUG("data plane to {} over its same-host socket", address_);
      } else {
        PS_LOG_DEBUG("data plane to {} on port {}", address_, st.data_port());
      }
      return;
    }
    if (absl::IsNotFound(s)) {
      next_try_ = absl::InfiniteFuture();  // gRPC only, for good
      return;
    }
    if (failures_++ == 0) {
      PS_LOG_WARN("data plane to {}: {}; using gRPC meanwhile", address_,
                  s.ToString());
    }
    next_try_ = absl::Now() + std::min(absl::Seconds(failures_), absl::Seconds(10));
  }

  proto::Server::Stub* NextStub() {
    return stubs_[next_.fetch_add(1, std::memory_order_relaxed) %
                  stubs_.size()]
        .get();
  }

  template <typename Req, typename Resp, typename Fn>
  void Start(std::shared_ptr<const Req> req, absl::Time deadline,
             Callback<Resp> done, Fn fn) {
    struct Call {
      grpc::ClientContext ctx;
      std::shared_ptr<const Req> req;
      Resp resp;
      Callback<Resp> done;
    };
    auto* call = new Call;
    call->req = std::move(req);
    call->done = std::move(done);
    Prepare(&call->ctx, deadline, token_);
    {
      absl::MutexLock l(&inflight_->mu);
      ++inflight_->count;
    }
    fn(NextStub(), &call->ctx, call->req.get(), &call->resp,
       [call, inflight = inflight_](grpc::Status s) {
         call->done(FromGrpcStatus(s), &call->resp);
         delete call;
         absl::MutexLock l(&inflight->mu);
         --inflight->count;
       });
  }

  const std::string token_;
  const std::string address_;
  const size_t max_frame_bytes_;
  const std::shared_ptr<const DataPlaneSwitches> data_plane_;
  absl::Mutex data_mu_;
  std::shared_ptr<DataPlaneClient> data_ ABSL_GUARDED_BY(data_mu_);
  std::thread connector_ ABSL_GUARDED_BY(data_mu_);
  bool connecting_ ABSL_GUARDED_BY(data_mu_) = false;
  bool closing_ ABSL_GUARDED_BY(data_mu_) = false;
  int failures_ ABSL_GUARDED_BY(data_mu_) = 0;
  absl::Time next_try_ ABSL_GUARDED_BY(data_mu_) = absl::InfinitePast();
  std::shared_ptr<Inflight> inflight_;
  absl::Mutex stream_mu_;
  std::shared_ptr<ReplicationStream> stream_ ABSL_GUARDED_BY(stream_mu_);
  std::vector<std::unique_ptr<proto::Server::Stub>> stubs_;
  std::vector<std::unique_ptr<grpc::GenericStub>> generic_;  // same channels
  std::atomic<uint64_t> next_{0};
};

class GrpcSchedulerClient : public SchedulerClient {
 public:
  GrpcSchedulerClient(const std::string& address, const GrpcTransportOptions& o,
                      const std::shared_ptr<grpc::ChannelCredentials>& creds)
      : token_(o.token) {
    grpc::ChannelArguments args = DefaultChannelArgs();
    ApplyMessageLimit(o.max_message_mb, &args);
    stub_ = proto::Scheduler::NewStub(
        grpc::CreateCustomChannel(address, creds, args));
  }

  // Cancels the open session and waits until its reactor is gone: its
  // ClientContext holds a reference to the channel, and the last reference
  // must not drop on gRPC's callback thread (~Channel there releases gRPC's
  // shared callback queue, and when that was its last user, deletes the
  // queue the thread is still polling: a double free at exit).
  // A session whose OnDone has begun is not cancelled: it is being deleted
  // (a TryCancel then raced the delete of its context and failed gRPC's
  // reference-count check, or called a pure virtual method, at 2 of about
  // 350 servers' exits).
  ~GrpcSchedulerClient() override {
    absl::MutexLock l(&session_->mu);
    if (session_->open != nullptr && !session_->ending) {
      session_->open->ctx.TryCancel();
    }
    session_->mu.Await(absl::Condition(
        +[](Session** s) { return *s == nullptr; }, &session_->open));
  }

  void KeepSession(proto::Role role, int id) override {
    Session* s = nullptr;
    {
      absl::MutexLock l(&session_->mu);
      if (session_->open != nullptr) return;
      s = session_->open = new Session(session_);
      session_->ending = false;
    }
    // Started without the lock, which its OnDone takes. Nothing can end it
    // before StartCall, and the destructor cannot run meanwhile (the
    // caller holds the client).
    s->req.set_role(role);
    s->req.set_id(id);
    if (!token_.empty()) s->ctx.AddMetadata(kTokenHeader, token_);
    stub_->async()->Session(&s->ctx, &s->req, s);
    s->StartRead(&s->event);
    s->StartCall();
  }

#define PS_SYNC_CALL(Method, Req, Resp)                                   \
  absl::StatusOr<Resp> Method(const Req& req, absl::Time deadline)        \
      override {                                                          \
    grpc::ClientContext ctx;                                              \
    Prepare(&ctx, deadline, token_);                                      \
    Resp resp;                                                            \
    absl::Status s = FromGrpcStatus(stub_->Method(&ctx, req, &resp));     \
    if (!s.ok()) return s;                                                \
    return resp;                                                          \
  }
  PS_SYNC_CALL(Register, proto::RegisterRequest, proto::RegisterResponse)
  PS_SYNC_CALL(GetView, proto::GetViewRequest, proto::GetViewResponse)
  PS_SYNC_CALL(Heartbeat, proto::HeartbeatRequest, proto::HeartbeatResponse)
  PS_SYNC_CALL(GetWork, proto::GetWorkRequest, proto::GetWorkResponse)
  PS_SYNC_CALL(SetConsistency, proto::SetConsistencyRequest,
               proto::SetConsistencyResponse)
  PS_SYNC_CALL(Status, proto::StatusRequest, proto::StatusResponse)
  PS_SYNC_CALL(Checkpoint, proto::CheckpointRequest,  // issue 9
               proto::CheckpointResponse)
  PS_SYNC_CALL(Drain, proto::DrainRequest, proto::DrainResponse)  // issue 9
#undef PS_SYNC_CALL

#define PS_SYNC_VOID_CALL(Method, Req, Resp)                              \
  absl::Status Method(const Req& req, absl::Time deadline) override {     \
    grpc::ClientContext ctx;                                              \
    Prepare(&ctx, deadline, token_);                                      \
    Resp resp;                                                            \
    return FromGrpcStatus(stub_->Method(&ctx, req, &resp));               \
  }
  PS_SYNC_VOID_CALL(Barrier, proto::BarrierRequest, proto::BarrierResponse)
  PS_SYNC_VOID_CALL(WorkerDone, proto::WorkerDoneRequest,
                    proto::WorkerDoneResponse)
  PS_SYNC_VOID_CALL(ServerDone, proto::ServerDoneRequest,
                    proto::ServerDoneResponse)
#undef PS_SYNC_VOID_CALL

 private:
  struct Session;
  // Shared by the client and its open session's reactor, so that the
  // reactor can say it is gone after the client stopped waiting for it.
  struct SessionSlot {
    absl::Mutex mu;
    Session* open ABSL_GUARDED_BY(mu) = nullptr;
    // Set by `open`'s OnDone before it deletes it: from then on nobody
    // touches it.
    bool ending ABSL_GUARDED_BY(mu) = false;
  };

  // The open session's call; deletes itself when done.
  struct Session final : grpc::ClientReadReactor<proto::SessionEvent> {
    explicit Session(std::shared_ptr<SessionSlot> slot)
        : slot(std::move(slot)) {}
    void OnReadDone(bool ok) override {
      if (ok) StartRead(&event);  // nothing is sent today
    }
    void OnDone(const grpc::Status& s) override {
      PS_LOG_DEBUG("session with the scheduler ended: {}",
                   FromGrpcStatus(s).ToString());
      // Deleted first, then the slot cleared: the client (and its channel)
      // outlives the context. Marked first, under the lock, so that the
      // client's destructor does not cancel it while it is deleted.
      std::shared_ptr<SessionSlot> keep = std::move(slot);
      {
        absl::MutexLock l(&keep->mu);
        keep->ending = true;
      }
      delete this;
      absl::MutexLock l(&keep->mu);
      keep->open = nullptr;
    }
    std::shared_ptr<SessionSlot> slot;
    grpc::ClientContext ctx;
    proto::SessionRequest req;
    proto::SessionEvent event;
  };

  const std::string token_;
  std::unique_ptr<proto::Scheduler::Stub> stub_;
  const std::shared_ptr<SessionSlot> session_ =
      std::make_shared<SessionSlot>();
};

}  // namespace

GrpcClientFactory::GrpcClientFactory(GrpcTransportOptions options)
    : options_(std::move(options)),
      data_plane_(std::make_shared<DataPlaneSwitches>()) {
  data_plane_->on.store(options_.data_plane && !options_.tls.enabled());
  data_plane_->local.store(options_.local_socket);
  GrpcSecurity s;
  s.tls = options_.tls;
  auto creds = MakeChannelCredentials(s);
  if (creds.ok()) {
    creds_ = std::move(*creds);
  } else {
    PS_LOG_ERROR("{}; calls will fail", creds.status().ToString());
    creds_ = grpc::SslCredentials(grpc::SslCredentialsOptions());
  }
}

GrpcTransportOptions GrpcClientFactory::Options(const GrpcSecurity& s,
                                                int channels_per_server) {
  GrpcTransportOptions o;
  o.token = s.token;
  o.channels_per_server = channels_per_server;
  o.max_message_mb = s.max_message_mb;
  o.tls = s.tls;
  return o;
}

std::shared_ptr<ServerClient> GrpcClientFactory::Server(
    const std::string& address) {
  absl::MutexLock l(&mu_);
  auto& c = servers_[address];
  if (!c) {
    c = std::make_shared<GrpcServerClient>(address, options_, creds_,
                                           data_plane_);
  }
  return c;
}

void GrpcClientFactory::SetDataPlane(bool on) {
  data_plane_->on.store(on && !options_.tls.enabled());
}

void GrpcClientFactory::SetLocalSocket(bool on) {
  data_plane_->local.store(on);
}

void GrpcClientFactory::SetSharedMemory(size_t bytes) {
  data_plane_->SetArenaBytes(bytes);
}

std::shared_ptr<char> GrpcClientFactory::SharedMemory(size_t bytes) {
  if (!data_plane_->on.load() || !data_plane_->local.load()) return nullptr;
  return SharedArena::Lend(data_plane_->Arena(), bytes);
}

std::shared_ptr<SharedArena> DataPlaneSwitches::Arena() const {
  absl::MutexLock l(&mu_);
  if (arena_ == nullptr && arena_bytes_ > 0 && !arena_failed_) {
    absl::StatusOr<std::unique_ptr<SharedArena>> a =
        SharedArena::Create(arena_bytes_);
    if (a.ok()) {
      arena_ = std::move(*a);
    } else {
      arena_failed_ = true;
      PS_LOG_WARN("data plane: no shared memory: {}", a.status().ToString());
    }
  }
  return arena_;
}

void DataPlaneSwitches::SetArenaBytes(size_t bytes) {
  absl::MutexLock l(&mu_);
  if (bytes == arena_bytes_) return;
  arena_bytes_ = bytes;
  arena_ = nullptr;
  arena_failed_ = false;
}

std::shared_ptr<SchedulerClient> GrpcClientFactory::Scheduler(
    const std::string& address) {
  absl::MutexLock l(&mu_);
  auto& c = schedulers_[address];
  if (!c) {
    c = std::make_shared<GrpcSchedulerClient>(address, options_, creds_);
  }
  return c;
}

}  // namespace ps
