#include "transport/data_plane.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <list>
#include <memory>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "google/protobuf/arena.h"
#include "transport/errors.h"
#include "transport/grpc_transport.h"
#include "transport/shared_arena.h"

namespace ps {

using data_plane::Align8;
using data_plane::FrameBytes;
using data_plane::Header;
using data_plane::KeysOffset;
using data_plane::kHeaderBytes;

namespace data_plane {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the data plane's frames are little-endian, as this machine");

namespace {
template <typename T>
void Store(char* p, T v) {
  std::memcpy(p, &v, sizeof(v));
}
template <typename T>
T Load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
}  // namespace

void EncodeHeader(const Header& h, char out[kHeaderBytes]) {
  std::memset(out, 0, kHeaderBytes);
  Store<uint32_t>(out, kMagic);
  out[4] = static_cast<char>(h.type);
  out[5] = static_cast<char>(h.flags);
  Store<uint16_t>(out + 6, h.shared_offset);
  Store<uint32_t>(out + 8, h.meta_len);
  Store<uint32_t>(out + 12, h.shared_page);
  Store<uint64_t>(out + 16, h.id);
  Store<uint64_t>(out + 24, h.keys_len);
  Store<uint64_t>(out + 32, h.vals_len);
  Store<uint64_t>(out + 40, h.timeout_us);
}

absl::Status DecodeHeader(const char in[kHeaderBytes], size_t max_frame_bytes,
                          Header* h) {
  if (Load<uint32_t>(in) != kMagic) {
    return absl::InvalidArgumentError("data plane: not a frame (bad magic)");
  }
  h->type = static_cast<uint8_t>(in[4]);
  h->flags = static_cast<uint8_t>(in[5]);
  h->shared_page = Load<uint32_t>(in + 12);
  h->shared_offset = Load<uint16_t>(in + 6);
  const bool may_share = h->type == kHello || h->type == kPush ||
                         h->type == kPull || h->type == kReply ||
                         h->type == kReplicate;
  // A REPLICATE's "keys" in the arena are its request without its rows'
  // entries (any number of bytes), its values those entries.
  const bool may_share_keys =
      h->type == kPush || h->type == kPull || h->type == kReplicate;
  const bool at = (h->flags & kSharedAt) != 0;
  if ((h->flags & ~(kShared | kSharedKeys | kSharedAt)) != 0 ||
      (h->shared_offset != 0 && !at) || (h->flags != 0 && !may_share) ||
      (h->shared_page != 0 && (h->flags & kShared) == 0) ||
      ((h->flags & kSharedKeys) != 0 &&
       (!may_share_keys || (h->flags & kShared) == 0)) ||
      (at && (h->type != kPush || (h->flags & kShared) == 0 ||
              (h->flags & kSharedKeys) != 0 || h->shared_offset >= kArenaPage ||
              h->shared_offset % 8 != 0))) {
    return absl::InvalidArgumentError("data plane: reserved header bytes set");
  }
  switch (h->type) {
    case kHello:
    case kPush:
    case kPull:
    case kClock:
    case kReplicate:
    case kReply:
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("data plane: unknown frame type ", h->type));
  }
  h->meta_len = Load<uint32_t>(in + 8);
  h->id = Load<uint64_t>(in + 16);
  h->keys_len = Load<uint64_t>(in + 24);
  h->vals_len = Load<uint64_t>(in + 32);
  h->timeout_us = Load<uint64_t>(in + 40);
  // A kShared REPLICATE's vals are its request: any number of bytes; with
  // kSharedKeys, its keys are (and its vals its rows' floats).
  const bool any_vals = h->type == kReplicate && h->flags == kShared;
  const bool any_keys =
      h->type == kReplicate && h->flags == (kShared | kSharedKeys);
  if ((h->keys_len % 8 != 0 && !any_keys) ||
      (h->vals_len % 4 != 0 && !any_vals)) {
    return absl::InvalidArgumentError(
        "data plane: keys not 8-byte or values not 4-byte units");
  }
  // No sum overflows: each part is checked against the limit first.
  if (h->meta_len > max_frame_bytes || h->keys_len > max_frame_bytes ||
      h->vals_len > max_frame_bytes || FrameBytes(*h) > max_frame_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "data plane: frame of ", h->meta_len, " + ", h->keys_len, " + ",
        h->vals_len, " bytes is over the limit of ", max_frame_bytes));
  }
  return absl::OkStatus();
}

ssize_t SendWithDescriptor(int sock, const char* p, size_t n, int pass_fd) {
  iovec v{const_cast<char*>(p), n};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{};
  m.msg_iov = &v;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
  ssize_t r;
  do {
    r = ::sendmsg(sock, &m, MSG_NOSIGNAL);
  } while (r < 0 && errno == EINTR);
  return r;
}

}  // namespace data_plane

namespace {

constexpr char kZeros[8] = {};
constexpr size_t kInitialBuffer = 256 * 1024;
// A connection's buffer grown past this goes back to kInitialBuffer once
// empty (frames of up to this size reuse warm memory).
constexpr size_t kKeepBuffer = size_t{17} << 20;
constexpr int kMaxIov = 512;
// A connection's first block for the arenas its requests are parsed into
// (RequestArena).
constexpr size_t kArenaBlockBytes = 64 << 10;
using ArenaBlock = std::unique_ptr<char[]>;

// A 64-byte aligned receive buffer.
struct Buffer {
  char* data = nullptr;
  size_t cap = 0;
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { std::free(data); }
  void Reset() {
    std::free(data);
    data = nullptr;
    cap = 0;
  }
  bool Resize(size_t n, size_t keep) {
    n = (n + 63) & ~size_t{63};
    char* p = static_cast<char*>(std::aligned_alloc(64, n));
    if (p == nullptr) return false;
    if (keep > 0) std::memcpy(p, data, keep);
    std::free(data);
    data = p;
    cap = n;
    return true;
  }
};

// Writes every byte of `iov` (advancing it) under the caller's lock.
// False when the socket failed or timed out (SO_SNDTIMEO).
bool WriteAll(int fd, std::vector<iovec>* iovs) {
  size_t at = 0;
  while (at < iovs->size()) {
    msghdr m{};
    m.msg_iov = iovs->data() + at;
    m.msg_iovlen = std::min<size_t>(iovs->size() - at, kMaxIov);
    ssize_t n = ::sendmsg(fd, &m, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    size_t left = static_cast<size_t>(n);
    while (at < iovs->size() && left >= (*iovs)[at].iov_len) {
      left -= (*iovs)[at].iov_len;
      ++at;
    }
    if (left > 0) {
      (*iovs)[at].iov_base = static_cast<char*>((*iovs)[at].iov_base) + left;
      (*iovs)[at].iov_len -= left;
    }
  }
  return true;
}

void SetTimeout(int fd, int opt, absl::Duration d) {
  timeval tv{};
  if (d != absl::InfiniteDuration() && d > absl::ZeroDuration()) {
    tv = absl::ToTimeval(d);
  }
  ::setsockopt(fd, SOL_SOCKET, opt, &tv, sizeof(tv));
}

void Tune(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
}

// A same-host socket's send buffer: the bytes a writer may have in the
// socket before it blocks (the default, about 208 KiB, makes a 4 MiB frame
// two dozen hand-overs between writer and reader). Capped by
// net.core.wmem_max.
void TuneLocal(int fd) {
  int bytes = 4 << 20;
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
}

// The address of the abstract Unix-domain socket `name` (no file: the
// name lives in the network namespace, and goes with the last descriptor).
socklen_t LocalAddress(const std::string& name, sockaddr_un* a) {
  *a = sockaddr_un{};
  a->sun_family = AF_UNIX;
  const size_t n = std::min(name.size(), sizeof(a->sun_path) - 1);
  std::memcpy(a->sun_path + 1, name.data(), n);  // sun_path[0] == 0: abstract
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

// A frame's first iovecs: header, meta, padding. `hdr` must outlive the
// write.
void FrameHead(const Header& h, absl::string_view meta,
               char hdr[kHeaderBytes], std::vector<iovec>* iov) {
  data_plane::EncodeHeader(h, hdr);
  iov->push_back({hdr, kHeaderBytes});
  if (!meta.empty()) {
    iov->push_back({const_cast<char*>(meta.data()), meta.size()});
  }
  const size_t pad = KeysOffset(h) - kHeaderBytes - meta.size();
  if (pad > 0) iov->push_back({const_cast<char*>(kZeros), pad});
}

void AddBytes(absl::Span<const char> b, std::vector<iovec>* iov) {
  if (!b.empty()) iov->push_back({const_cast<char*>(b.data()), b.size()});
}

void AddValsPad(const Header& h, std::vector<iovec>* iov) {
  const size_t pad = Align8(h.vals_len) - h.vals_len;
  if (pad > 0) iov->push_back({const_cast<char*>(kZeros), pad});
}

// Writes a hello (WriteAll), its first bytes with `arena_fd` beside them
// when it is >= 0.
bool WriteHello(int fd, int arena_fd, std::vector<iovec>* iovs) {
  if (arena_fd < 0) return WriteAll(fd, iovs);
  // The header: the descriptor goes with it.
  const ssize_t n = data_plane::SendWithDescriptor(
      fd, static_cast<const char*>((*iovs)[0].iov_base), (*iovs)[0].iov_len,
      arena_fd);
  if (n <= 0) return false;
  // The rest of the hello (and of the header, should it have gone in part).
  (*iovs)[0].iov_base = static_cast<char*>((*iovs)[0].iov_base) + n;
  (*iovs)[0].iov_len -= static_cast<size_t>(n);
  if ((*iovs)[0].iov_len == 0) iovs->erase(iovs->begin());
  return WriteAll(fd, iovs);
}

// Reads exactly n bytes (blocking, the socket's receive timeout applies).
bool ReadExactly(int fd, char* p, size_t n) {
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

}  // namespace

// ------------------------------------------------------------ server side

class DataConnection {
 public:
  explicit DataConnection(int fd) : fd_(fd) {}
  ~DataConnection() {
    ::close(fd_);
    if (arena_ != nullptr) arena_budget_->fetch_sub(arena_->size());
  }
  int fd() const { return fd_; }

  // The peer's arena, set by the hello before any request is read (and so
  // before any answer can be sent); null when there is none. `budget` is
  // the server's count of mapped bytes, given back when the connection
  // goes.
  void SetArena(std::unique_ptr<SharedMapping> arena,
                std::shared_ptr<std::atomic<int64_t>> budget) {
    arena_ = std::move(arena);
    arena_budget_ = std::move(budget);
  }
  const SharedMapping* arena() const { return arena_.get(); }

  // Writes one frame; on failure the connection is shut down.
  void Write(std::vector<iovec>* iov) {
    absl::MutexLock l(&mu_);
    if (broken_.load()) return;
    if (!WriteAll(fd_, iov)) Shutdown();
  }
  // Not under mu_: a write blocked on a peer that does not read returns
  // (EPIPE) once the socket is shut down.
  void Shutdown() {
    broken_.store(true);
    ::shutdown(fd_, SHUT_RDWR);
  }

 private:
  const int fd_;
  std::unique_ptr<SharedMapping> arena_;
  std::shared_ptr<std::atomic<int64_t>> arena_budget_;
  absl::Mutex mu_;  // one frame at a time
  std::atomic<bool> broken_{false};
};

void DataReplyTo::Send(const absl::Status& s,
                       const google::protobuf::MessageLite* resp,
                       absl::Span<const char> vals) const {
  proto::DataReply r;
  StatusToReply(s, &r);
  if (s.ok() && resp != nullptr) r.set_response(resp->SerializeAsString());
  if (!s.ok()) vals = {};
  const std::string meta = r.SerializeAsString();
  Header h;
  h.type = data_plane::kReply;
  h.meta_len = static_cast<uint32_t>(meta.size());
  h.id = id_;
  h.vals_len = vals.size();
  // Into the slot the request offered, when the values fit it (checked
  // against the arena when the request was read).
  if (!vals.empty()) {
    if (char* at = Slot(vals.size())) {
      if (at != vals.data()) std::memcpy(at, vals.data(), vals.size());
      h.flags = data_plane::kShared;
      h.shared_page = slot_page_;
      vals = {};
    }
  }
  char hdr[kHeaderBytes];
  std::vector<iovec> iov;
  iov.reserve(5);
  FrameHead(h, meta, hdr, &iov);
  AddBytes(vals, &iov);
  if (data_plane::ValsInFrame(h)) AddValsPad(h, &iov);
  conn_->Write(&iov);
}

char* DataReplyTo::Slot(size_t bytes) const {
  if (!slot_ || bytes > slot_bytes_ || conn_->arena() == nullptr) {
    return nullptr;
  }
  char* at = conn_->arena()->At(slot_page_, slot_offset_ + bytes);
  return at == nullptr ? nullptr : at + slot_offset_;
}

struct DataPlaneServer::State {
  DataPlaneServerOptions options;
  DataHandler* handler = nullptr;
  int listen_fd = -1;
  std::thread acceptor;
  // The abstract Unix-domain listener (options.local_socket), -1 if none.
  int local_fd = -1;
  std::thread local_acceptor;
  // Bytes of receive buffers past their initial size, all connections.
  std::atomic<int64_t> grown{0};
  // Connections served, by listener.
  std::atomic<int64_t> served_tcp{0}, served_local{0};
  // Bytes of peers' arenas mapped now, and arenas mapped so far.
  std::shared_ptr<std::atomic<int64_t>> arena_bytes =
      std::make_shared<std::atomic<int64_t>>(0);
  std::atomic<int64_t> arenas{0};

  absl::Mutex mu;
  bool stopped ABSL_GUARDED_BY(mu) = false;
  struct Conn {
    std::shared_ptr<DataConnection> conn;
    std::thread thread;
    std::atomic<bool> done{false};
  };
  std::list<Conn> conns ABSL_GUARDED_BY(mu);

  // Accepts on `fd` until stopped; `tcp`: tune each connection for TCP.
  void Accept(int fd, bool tcp);
  void Serve(const std::shared_ptr<DataConnection>& conn);
  bool Hello(const std::shared_ptr<DataConnection>& conn);
  // False: close the connection. `*worker`: the worker_id of the request,
  // when it has one. `*arena_block`: the connection's block for the
  // requests parsed into an arena (allocated at the first).
  // `keys_buf`: the connection's private copy of what the frame has in its
  // arena that is read more than once (data_plane::PrivateBytes: keys,
  // a replication batch), at least PrivateBytes(h) long.
  bool Dispatch(const std::shared_ptr<DataConnection>& conn, const Header& h,
                const char* frame, int32_t* worker, ArenaBlock* arena_block,
                Buffer* keys_buf);
  void ReapLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (auto it = conns.begin(); it != conns.end();) {
      if (it->done.load()) {
        it->thread.join();
        it = conns.erase(it);
      } else {
        ++it;
      }
    }
  }
};

absl::StatusOr<std::unique_ptr<DataPlaneServer>> DataPlaneServer::Start(
    DataPlaneServerOptions options, DataHandler* handler) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  std::string host = options.host;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo* res = nullptr;
  if (int e = ::getaddrinfo(host.c_str(), "0", &hints, &res); e != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data plane: cannot resolve ", options.host, ": ", gai_strerror(e)));
  }
  int fd = -1;
  std::string why = "no address";
  for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 128) != 0) {
      why = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("data plane: cannot listen on ", options.host, ": ", why));
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = addr.ss_family == AF_INET6
                 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                 : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  // Same-host clients (issue 10): an abstract Unix-domain socket under a
  // random name, announced beside the port (ServerStatus.data_socket). A
  // local stream socket moves a byte at about half the CPU of loopback TCP
  // (no TCP/IP processing, no acknowledgements) and is reachable only from
  // this network namespace, so a client elsewhere falls back to the port.
  // It says the same HELLO with the same token.
  int local_fd = -1;
  std::string local_name;
  if (options.local_socket) {
    absl::BitGen gen;
    char raw[16];
    for (char& c : raw) c = static_cast<char>(absl::Uniform<uint8_t>(gen));
    local_name = absl::StrCat("ps-data-", absl::BytesToHexString(
                                               absl::string_view(raw, 16)));
    sockaddr_un a;
    const socklen_t alen = LocalAddress(local_name, &a);
    local_fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (local_fd < 0 ||
        ::bind(local_fd, reinterpret_cast<sockaddr*>(&a), alen) != 0 ||
        ::listen(local_fd, 128) != 0) {
      PS_LOG_WARN("data plane: no same-host socket, TCP only: {}",
                  std::strerror(errno));
      if (local_fd >= 0) ::close(local_fd);
      local_fd = -1;
      local_name.clear();
    }
  }
  std::unique_ptr<DataPlaneServer> server(new DataPlaneServer());
  server->port_ = port;
  server->local_name_ = local_name;
  server->state_ = std::make_shared<State>();
  State* st = server->state_.get();
  st->options = std::move(options);
  st->handler = handler;
  st->listen_fd = fd;
  st->local_fd = local_fd;
  st->acceptor = std::thread([st] { st->Accept(st->listen_fd, true); });
  if (local_fd >= 0) {
    st->local_acceptor =
        std::thread([st] { st->Accept(st->local_fd, false); });
  }
  return server;
}

DataPlaneServer::~DataPlaneServer() { Stop(); }

void DataPlaneServer::Stop() {
  if (state_ == nullptr) return;
  State* st = state_.get();
  std::list<State::Conn> conns;
  {
    absl::MutexLock l(&st->mu);
    if (st->stopped) return;
    st->stopped = true;
    ::shutdown(st->listen_fd, SHUT_RDWR);
    if (st->local_fd >= 0) ::shutdown(st->local_fd, SHUT_RDWR);
  }
  st->acceptor.join();
  ::close(st->listen_fd);
  if (st->local_fd >= 0) {
    st->local_acceptor.join();
    ::close(st->local_fd);
  }
  {
    absl::MutexLock l(&st->mu);
    conns.swap(st->conns);
  }
  for (State::Conn& c : conns) c.conn->Shutdown();
  for (State::Conn& c : conns) c.thread.join();
}

int64_t DataPlaneServer::served(bool local) const {
  return (local ? state_->served_local : state_->served_tcp).load();
}

int64_t DataPlaneServer::arenas() const { return state_->arenas.load(); }

int DataPlaneServer::connections() const {
  absl::MutexLock l(&state_->mu);
  int n = 0;
  for (const State::Conn& c : state_->conns) n += c.done.load() ? 0 : 1;
  return n;
}

void DataPlaneServer::State::Accept(int listener, bool tcp) {
  for (;;) {
    int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    const int err = errno;
    absl::MutexLock l(&mu);
    if (stopped) {
      if (fd >= 0) ::close(fd);
      return;
    }
    if (fd < 0) {
      if (err == EINTR || err == ECONNABORTED) continue;
      if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
        // Out of descriptors or memory for now: try again a little later.
        mu.AwaitWithTimeout(absl::Condition(&stopped), absl::Milliseconds(10));
        continue;
      }
      PS_LOG_WARN("data plane: accept failed: {}", std::strerror(err));
      return;
    }
    ReapLocked();
    if (static_cast<int>(conns.size()) >= options.max_connections) {
      ::close(fd);  // over the cap: the client stays on gRPC
      continue;
    }
    if (tcp) {
      Tune(fd);
    } else {
      TuneLocal(fd);
    }
    SetTimeout(fd, SO_SNDTIMEO, options.send_timeout);
    (tcp ? served_tcp : served_local).fetch_add(1);
    conns.emplace_back();
    Conn& c = conns.back();
    c.conn = std::make_shared<DataConnection>(fd);
    c.thread = std::thread([this, &c] {
      Serve(c.conn);
      c.done.store(true);
    });
  }
}

bool DataPlaneServer::State::Hello(const std::shared_ptr<DataConnection>& conn) {
  SetTimeout(conn->fd(), SO_RCVTIMEO, options.hello_timeout);
  char hdr[kHeaderBytes];
  // The first bytes with any descriptors sent beside them (an arena);
  // descriptors sent with later frames are dropped by the kernel, which
  // closes them, since no later read asks for them.
  int arena_fd = -1;
  size_t got = 0;
  {
    iovec v{hdr, kHeaderBytes};
    alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
    msghdr m{};
    m.msg_iov = &v;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof(control);
    ssize_t n;
    do {
      n = ::recvmsg(conn->fd(), &m, MSG_CMSG_CLOEXEC);
    } while (n < 0 && errno == EINTR);
    if (n <= 0) return false;
    got = static_cast<size_t>(n);
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t fds = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < fds; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (arena_fd < 0) {
          arena_fd = fd;
        } else {
          ::close(fd);
        }
      }
    }
  }
  struct Closer {
    int* fd;
    ~Closer() {
      if (*fd >= 0) ::close(*fd);
    }
  } closer{&arena_fd};
  if (!ReadExactly(conn->fd(), hdr + got, kHeaderBytes - got)) return false;
  Header h;
  absl::Status s =
      data_plane::DecodeHeader(hdr, data_plane::kMaxHelloBytes, &h);
  if (s.ok() && (h.type != data_plane::kHello || h.keys_len != 0 ||
                 h.vals_len != 0)) {
    s = absl::InvalidArgumentError("data plane: the first frame must be HELLO");
  }
  if (!s.ok()) {
    DataReplyTo(conn, h.id).Send(s, nullptr);
    return false;
  }
  std::string rest(FrameBytes(h) - kHeaderBytes, '\0');
  if (!ReadExactly(conn->fd(), rest.data(), rest.size())) return false;
  const std::string_view token(rest.data(), h.meta_len);
  if (!options.token.empty() && !ConstantTimeEquals(token, options.token)) {
    DataReplyTo(conn, h.id)
        .Send(absl::UnauthenticatedError("data plane: wrong cluster token"),
              nullptr);
    return false;
  }
  // The arena, when the peer offered one and it is acceptable.
  bool shared = false;
  if ((h.flags & data_plane::kShared) != 0 && arena_fd >= 0) {
    const int64_t size = [&] {
      struct stat st;
      return ::fstat(arena_fd, &st) == 0 ? static_cast<int64_t>(st.st_size)
                                         : int64_t{-1};
    }();
    const int64_t budget = static_cast<int64_t>(options.arena_budget_bytes);
    if (size > 0 && static_cast<uint64_t>(size) <= options.max_arena_bytes &&
        arena_bytes->fetch_add(size) + size <= budget) {
      const int fd = arena_fd;
      arena_fd = -1;  // Map closes it
      absl::StatusOr<std::unique_ptr<SharedMapping>> m =
          SharedMapping::Map(fd, options.max_arena_bytes);
      if (m.ok()) {
        conn->SetArena(std::move(*m), arena_bytes);
        arenas.fetch_add(1);
        shared = true;
      } else {
        arena_bytes->fetch_sub(size);
        PS_LOG_WARN("data plane: a peer's arena declined: {}",
                    m.status().ToString());
      }
    } else if (size > 0 &&
               static_cast<uint64_t>(size) <= options.max_arena_bytes) {
      arena_bytes->fetch_sub(size);
    }
  }
  {
    // The answer, with kShared when the arena was taken.
    proto::DataReply r;
    StatusToReply(absl::OkStatus(), &r);
    const std::string meta = r.SerializeAsString();
    Header a;
    a.type = data_plane::kReply;
    a.flags = shared ? data_plane::kShared : 0;
    a.meta_len = static_cast<uint32_t>(meta.size());
    a.id = h.id;
    char ahdr[kHeaderBytes];
    std::vector<iovec> iov;
    FrameHead(a, meta, ahdr, &iov);
    conn->Write(&iov);
  }
  SetTimeout(conn->fd(), SO_RCVTIMEO, absl::InfiniteDuration());
  return true;
}

void DataPlaneServer::State::Serve(const std::shared_ptr<DataConnection>& conn) {
  if (!Hello(conn)) {
    conn->Shutdown();
    return;
  }
  Buffer buf;
  if (!buf.Resize(kInitialBuffer, 0)) {
    conn->Shutdown();
    return;
  }
  int64_t grown_here = 0;
  size_t begin = 0, end = 0;
  int32_t worker = -1;  // who the requests came from, once one said
  ArenaBlock arena_block;  // the first block of each request's arena
  // Keys (kSharedKeys) or a replication batch copied out of the arena.
  Buffer keys_buf;
  // Grows `b` to `need` bytes within the receive buffers' budget (`keep`
  // bytes kept), or answers RESOURCE_EXHAUSTED to request `id`, closes the
  // connection and returns false.
  auto grow = [&](Buffer& b, size_t need, size_t keep, uint64_t id) {
    need = (need + 63) & ~size_t{63};  // as Resize rounds
    const int64_t more = static_cast<int64_t>(need - b.cap);
    const int64_t budget = 4 * static_cast<int64_t>(options.max_frame_bytes);
    if (grown.fetch_add(more) + more > budget || !b.Resize(need, keep)) {
      grown.fetch_sub(more);
      DataReplyTo(conn, id).Send(
          absl::ResourceExhaustedError(
              "data plane: the server's receive buffers are full; retry"),
          nullptr);
      conn->Shutdown();
      grown.fetch_sub(grown_here);
      return false;
    }
    grown_here += more;
    return true;
  };
  for (;;) {
    // Every whole frame in [begin, end).
    size_t need = kHeaderBytes;
    while (end - begin >= kHeaderBytes) {
      Header h;
      absl::Status s =
          data_plane::DecodeHeader(buf.data + begin, options.max_frame_bytes, &h);
      if (s.ok() && (h.type == data_plane::kHello || h.type == data_plane::kReply)) {
        s = absl::InvalidArgumentError("data plane: unexpected frame type");
      }
      if (!s.ok()) {
        DataReplyTo(conn, h.id).Send(s, nullptr);
        conn->Shutdown();
        grown.fetch_sub(grown_here);
        return;
      }
      need = FrameBytes(h);
      if (end - begin < need) break;
      if (data_plane::PrivateBytes(h) > keys_buf.cap &&
          !grow(keys_buf, data_plane::PrivateBytes(h), 0, h.id)) {
        return;
      }
      if (!Dispatch(conn, h, buf.data + begin, &worker, &arena_block,
                    &keys_buf)) {
        conn->Shutdown();
        grown.fetch_sub(grown_here);
        return;
      }
      begin += need;
      need = kHeaderBytes;
    }
    if (begin == end) {
      begin = end = 0;
      if (buf.cap > kKeepBuffer && buf.Resize(kInitialBuffer, 0)) {
        grown.fetch_sub(grown_here);
        grown_here = 0;
        keys_buf.Reset();  // its growth was counted in grown_here
      }
      if (keys_buf.cap > kKeepBuffer) {
        grown.fetch_sub(static_cast<int64_t>(keys_buf.cap));
        grown_here -= static_cast<int64_t>(keys_buf.cap);
        keys_buf.Reset();
      }
    }
    // Room for the frame being read, within the budget.
    if (buf.cap - begin < need) {
      if (begin > 0) {
        std::memmove(buf.data, buf.data + begin, end - begin);
        end -= begin;
        begin = 0;
      }
      if (buf.cap < need) {
        Header h;
        (void)data_plane::DecodeHeader(buf.data, options.max_frame_bytes, &h);
        if (!grow(buf, need, end, h.id)) return;
      }
    }
    ssize_t n = ::recv(conn->fd(), buf.data + end, buf.cap - end, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      bool stopping;
      {
        absl::MutexLock l(&mu);
        stopping = stopped;
      }
      // The peer's side closed (its process gone, or done with this
      // server); not this server stopping, which shuts its sockets down.
      if (worker >= 0 && !stopping) {
        handler->PeerClosed(worker);
      }
      conn->Shutdown();
      grown.fetch_sub(grown_here);
      return;
    }
    end += static_cast<size_t>(n);
  }
}

namespace {
// Parses a request frame's meta into `req`; a request that does not parse,
// or fails `ok` (sections it must not have), is answered INVALID_ARGUMENT
// and false is returned. The frame itself was whole: the connection stays.
template <typename Req, typename Ok>
bool ParseRequest(const Header& h, const char* meta, const DataReplyTo& reply,
                  Req* req, Ok ok) {
  if (req->ParseFromArray(meta, static_cast<int>(h.meta_len)) && ok(*req)) {
    return true;
  }
  reply.Send(absl::InvalidArgumentError(absl::StrCat(
                 "malformed ", req->GetTypeName(), " (data plane)")),
             nullptr);
  return false;
}

// A push's segments and a replication batch's entries are one message each
// (a9a: ~40 segments per push; a batch of BSP clocks ~10 fields per range):
// parsed into an arena whose first block is the connection's (ArenaBlock),
// they cost no allocation unless the request outgrows it. The handlers use
// the request before they return (DataService copies what it keeps).
//
// The block belongs to the connection's Serve, not to its thread (it was a
// thread_local): freed when Serve returns, it is never alive in a thread
// that has finished its work but not yet run its thread-local destructors,
// which LeakSanitizer took for a leak in the data plane's fuzz target.
class RequestArena {
 public:
  explicit RequestArena(ArenaBlock* block) : arena_(Options(block)) {}
  RequestArena(const RequestArena&) = delete;
  RequestArena& operator=(const RequestArena&) = delete;

  template <typename Req>
  Req* Create() {
    return google::protobuf::Arena::CreateMessage<Req>(&arena_);
  }

 private:
  static google::protobuf::ArenaOptions Options(ArenaBlock* block) {
    if (*block == nullptr) block->reset(new char[kArenaBlockBytes]);
    google::protobuf::ArenaOptions o;
    o.initial_block = block->get();
    o.initial_block_size = kArenaBlockBytes;
    return o;
  }

  google::protobuf::Arena arena_;
};
}  // namespace

bool DataPlaneServer::State::Dispatch(
    const std::shared_ptr<DataConnection>& conn, const Header& h,
    const char* frame, int32_t* worker, ArenaBlock* arena_block,
    Buffer* keys_buf) {
  const char* meta = frame + kHeaderBytes;
  absl::Span<const char> keys(frame + KeysOffset(h), h.keys_len);
  absl::Span<const char> vals(keys.data() + h.keys_len, h.vals_len);
  DataReplyTo reply(conn, h.id);
  const bool sections = h.keys_len == 0 && h.vals_len == 0;
  if (!data_plane::ValsInFrame(h)) {
    // The keys (kSharedKeys), then the values (a push's) or the answer's
    // room (a pull's), in the arena. Each length is at most the frame
    // limit (DecodeHeader): the sum does not overflow.
    // A lent push's values start shared_offset bytes into their page (0
    // for any other frame: DecodeHeader).
    const uint64_t in_slot_keys = data_plane::SlotKeysBytes(h);
    const uint64_t vals_at = data_plane::SlotValsAt(h);
    const char* at =
        conn->arena() == nullptr
            ? nullptr
            : conn->arena()->At(h.shared_page, vals_at + h.vals_len);
    if (at == nullptr) {
      reply.Send(absl::InvalidArgumentError(
                     "data plane: a shared-memory frame outside the "
                     "connection's arena"),
                 nullptr);
      return false;
    }
    if (in_slot_keys > 0) {
      // Copied once into memory the peer cannot write: keys are checked,
      // then read again (split by range, looked up, journaled).
      std::memcpy(keys_buf->data, at, in_slot_keys);
      keys = absl::Span<const char>(keys_buf->data, in_slot_keys);
    }
    if (h.type == data_plane::kPush ||
        (h.type == data_plane::kReplicate &&
         (h.flags & data_plane::kSharedKeys) != 0)) {
      // Read in place, once each (a replication batch's: its rows'
      // entries; its request was copied out as keys).
      vals = absl::Span<const char>(at + vals_at, h.vals_len);
    } else if (h.type == data_plane::kReplicate) {
      // Parsed from a private copy: a parser may read a byte twice.
      if (h.vals_len > 0) std::memcpy(keys_buf->data, at, h.vals_len);
      vals = absl::Span<const char>(keys_buf->data, h.vals_len);
    } else {
      reply = DataReplyTo(conn, h.id, h.shared_page, in_slot_keys, h.vals_len);
      vals = {};
    }
  }
  switch (h.type) {
    case data_plane::kPush: {
      RequestArena arena(arena_block);
      proto::PushRequest* req = arena.Create<proto::PushRequest>();
      if (ParseRequest(h, meta, reply, req, [](const proto::PushRequest& r) {
            return r.keys().empty() && r.vals().empty();
          })) {
        *worker = req->worker_id();
        if (!data_plane::ValsInFrame(h) && req->vals_codec() != 0) {
          // A compressed payload is read by a decompressor that may look
          // at a byte more than once: from private memory, never from the
          // arena the peer can still write (plain values are read once).
          const std::string copy(vals.data(), vals.size());
          handler->Push(*req, keys, copy, std::move(reply));
          return true;
        }
        handler->Push(*req, keys, vals, std::move(reply));
      }
      return true;
    }
    case data_plane::kPull: {
      proto::PullRequest req;
      if (ParseRequest(h, meta, reply, &req, [&](const proto::PullRequest& r) {
            return r.keys().empty() &&
                   (h.vals_len == 0 || !data_plane::ValsInFrame(h));
          })) {
        const absl::Duration wait =
            h.timeout_us == 0
                ? absl::InfiniteDuration()
                : absl::Microseconds(static_cast<int64_t>(
                      std::min<uint64_t>(h.timeout_us, uint64_t{1} << 40)));
        *worker = req.worker_id();
        handler->Pull(req, keys, wait, std::move(reply));
      }
      return true;
    }
    case data_plane::kClock: {
      proto::ClockRequest req;
      if (ParseRequest(h, meta, reply, &req,
                       [&](const proto::ClockRequest&) { return sections; })) {
        *worker = req.worker_id();
        handler->Clock(req, std::move(reply));
      }
      return true;
    }
    case data_plane::kReplicate: {
      RequestArena arena(arena_block);
      proto::ReplicateRequest* req = arena.Create<proto::ReplicateRequest>();
      if (!data_plane::ValsInFrame(h)) {
        // The request in the arena (copied out above), alone, or without
        // its rows' entries (kSharedKeys), which are the values: nothing
        // else. (An empty request parsed from "": never from a null
        // pointer.)
        const bool split = (h.flags & data_plane::kSharedKeys) != 0;
        const absl::Span<const char> head = split ? keys : vals;
        if (h.meta_len == 0 && (split || h.keys_len == 0) &&
            req->ParseFromArray(head.empty() ? "" : head.data(),
                                static_cast<int>(head.size()))) {
          handler->Replicate(*req, split ? vals : absl::Span<const char>(),
                             std::move(reply));
        } else {
          reply.Send(absl::InvalidArgumentError(
                         "malformed ps.proto.ReplicateRequest (data plane)"),
                     nullptr);
        }
        return true;
      }
      if (ParseRequest(h, meta, reply, req,
                       [&](const proto::ReplicateRequest&) { return sections; })) {
        handler->Replicate(*req, {}, std::move(reply));
      }
      return true;
    }
    default:
      return false;
  }
}

// ------------------------------------------------------------ client side

namespace {

// The readers of connections dropped by their own callbacks, still running
// (DataPlaneClient::AwaitDetachedReaders). Never destroyed: a reader may
// end while the process's static objects are being destroyed.
struct DetachedCount {
  absl::Mutex mu;
  int running ABSL_GUARDED_BY(mu) = 0;
};
DetachedCount& Detached() {
  static DetachedCount* const d = new DetachedCount;
  return *d;
}

}  // namespace

bool DataPlaneClient::AwaitDetachedReaders(absl::Time deadline) {
  DetachedCount& d = Detached();
  absl::MutexLock l(&d.mu);
  return d.mu.AwaitWithDeadline(
      absl::Condition(
          +[](int* running) { return *running == 0; }, &d.running),
      deadline);
}

int DataPlaneClient::DetachedReaders() {
  DetachedCount& d = Detached();
  absl::MutexLock l(&d.mu);
  return d.running;
}

struct DataPlaneClient::State {
  int fd = -1;
  size_t max_frame_bytes = 0;
  std::thread reader;
  // Set on the reader's own thread when its client was dropped there (the
  // reader then ends detached, counted in Detached()).
  bool detached = false;
  std::atomic<bool> open{true};
  std::atomic<uint64_t> next_id{1};

  absl::Mutex write_mu;  // one frame at a time

  // `keep`: for a call made with keep_values, what keeps `vals` valid
  // after the callback (null otherwise, and when there are none).
  using Done = std::function<void(const absl::Status&, const proto::DataReply*,
                                  absl::Span<const char> vals,
                                  std::shared_ptr<const void> keep)>;
  // A request's slot in the arena (bytes 0: none).
  struct Slot {
    uint32_t page = 0;
    size_t bytes = 0;
    size_t keys = 0;  // bytes of keys at its start; the values follow
    // A lent push's (kSharedAt) values' owner, kept until the server has
    // answered: it reads them until then.
    std::shared_ptr<const void> keep;
  };
  struct Pending {
    absl::Time deadline;
    Done done;
    Slot slot;
    // A pull's table and key count (table -1: not a pull).
    int32_t table = -1;
    uint64_t keys = 0;
    // Hand the answer's values over (Done's `keep`) instead of freeing
    // their slot after the callback.
    bool keep_values = false;
  };
  // The arena the server took (constant once the connection is open; null
  // when there is none). Other connections may share it.
  std::shared_ptr<SharedArena> arena;
  std::atomic<int64_t> shared_calls{0};
  std::atomic<int64_t> lent_calls{0};

  absl::Mutex mu;
  bool closing ABSL_GUARDED_BY(mu) = false;
  absl::flat_hash_map<uint64_t, Pending> pending ABSL_GUARDED_BY(mu);
  // Slots of calls that ended (their deadline) before their answer: the
  // server may still read or write them, so they are freed only when the
  // answer comes. A connection that breaks frees none of its calls' slots
  // (their pages stay taken) and quarantines lent values' owners
  // (SharedArena::Quarantine): a server that stopped, and wakes up, would
  // read and write them still.
  absl::flat_hash_map<uint64_t, Slot> orphans ABSL_GUARDED_BY(mu);
  // The largest answer per key seen for each table's pulls: the size of
  // the slot a pull offers (none before the table's first answer).
  absl::flat_hash_map<int32_t, uint64_t> pull_bytes_per_key ABSL_GUARDED_BY(mu);

  ~State() {
    if (fd >= 0) ::close(fd);
  }

  // Registers `done`, writes the frame; a failed write fails the call.
  // `pull_table` >= 0: a pull of `pull_keys` keys of that table (its answer
  // may come through the arena).
  // `keep_values`: the answer's values are handed over (Pending).
  // `in_slot`: a slot of the arena the caller allocated and wrote the
  // values in (vals empty, no keys): sent as the frame's kShared values,
  // freed once answered.
  void Call(Header h, absl::string_view meta, absl::Span<const char> keys,
            const BorrowedValues* borrowed, absl::Span<const char> vals,
            absl::Time deadline, Done done, int32_t pull_table = -1,
            uint64_t pull_keys = 0, bool keep_values = false,
            const Slot* in_slot = nullptr);
  void Read();
  void FailAll(const absl::Status& s);
  void FreeSlot(const Slot& slot) {
    if (slot.bytes > 0) arena->Free(slot.page, slot.bytes);
  }
};

void DataPlaneClient::State::Call(Header h, absl::string_view meta,
                                  absl::Span<const char> keys,
                                  const BorrowedValues* borrowed,
                                  absl::Span<const char> vals,
                                  absl::Time deadline, Done done,
                                  int32_t pull_table, uint64_t pull_keys,
                                  bool keep_values, const Slot* in_slot) {
  h.id = next_id.fetch_add(1, std::memory_order_relaxed);
  h.meta_len = static_cast<uint32_t>(meta.size());
  if (borrowed != nullptr && borrowed->pieces.empty()) {
    borrowed = nullptr;  // the values are in `vals`
  }
  // A slot filled by the caller (a replication batch) may start with a
  // request ("keys") before its values.
  h.keys_len = in_slot != nullptr ? in_slot->keys : keys.size();
  h.vals_len = in_slot != nullptr    ? in_slot->bytes - Align8(in_slot->keys)
               : borrowed != nullptr ? borrowed->size()
                                     : vals.size();
  if (FrameBytes(h) > max_frame_bytes || meta.size() > max_frame_bytes) {
    if (in_slot != nullptr) FreeSlot(*in_slot);
    done(absl::ResourceExhaustedError(absl::StrCat(
             "data plane: request of ", FrameBytes(h),
             " bytes is over the message limit of ", max_frame_bytes)),
         nullptr, {}, nullptr);
    return;
  }
  // Values the caller wrote in memory lent from the arena, in one run at
  // an 8-byte boundary, go where they lie (kSharedAt), the keys in the
  // frame.
  Slot slot;
  bool lent = false;
  if (in_slot != nullptr) {
    slot = *in_slot;
    h.flags = data_plane::kShared |
              (slot.keys > 0 ? data_plane::kSharedKeys : uint8_t{0});
    h.shared_page = slot.page;
    shared_calls.fetch_add(1, std::memory_order_relaxed);
  } else if (arena != nullptr && borrowed != nullptr && pull_table < 0) {
    const char* first = nullptr;
    const char* next = nullptr;
    bool one_run = true;
    for (const absl::Span<const char>& p : borrowed->pieces) {
      if (p.empty()) continue;
      if (first == nullptr) {
        first = next = p.data();
      } else if (p.data() != next) {
        one_run = false;
        break;
      }
      next += p.size();
    }
    if (one_run && first != nullptr && arena->Holds(first, h.vals_len)) {
      const size_t at = static_cast<size_t>(first - arena->base());
      if (at % 8 == 0) {
        lent = true;
        h.flags = data_plane::kShared | data_plane::kSharedAt;
        h.shared_page = static_cast<uint32_t>(at / kArenaPage);
        h.shared_offset = static_cast<uint16_t>(at % kArenaPage);
        slot.keep = borrowed->owner;
        shared_calls.fetch_add(1, std::memory_order_relaxed);
        lent_calls.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
  // A slot for the keys and large values (a push's), or the keys and room
  // for a pull's answer of the size its table's last answers had; none when
  // the arena is full.
  if (arena != nullptr && !lent && in_slot == nullptr) {
    size_t want = h.vals_len;
    if (pull_table >= 0) {
      absl::MutexLock l(&mu);
      auto it = pull_bytes_per_key.find(pull_table);
      want = it == pull_bytes_per_key.end() ||
                     pull_keys > max_frame_bytes / it->second
                 ? 0
                 : static_cast<size_t>(pull_keys * it->second);
      want = std::min(want, max_frame_bytes);
    }
    // Both at most max_frame_bytes (checked above): no overflow.
    const size_t with_keys = keys.size() + want;
    if (with_keys >= data_plane::kArenaMinBytes) {
      if (std::optional<uint32_t> page = arena->Allocate(with_keys)) {
        slot = Slot{*page, with_keys, keys.size()};
      }
    }
  }
  if (slot.bytes > 0 && in_slot == nullptr) {
    char* at = arena->base() + size_t{slot.page} * kArenaPage;
    if (!keys.empty()) {
      std::memcpy(at, keys.data(), keys.size());
      at += keys.size();
      keys = {};  // not in the frame
    }
    if (pull_table < 0) {
      if (borrowed != nullptr) {
        for (const absl::Span<const char>& p : borrowed->pieces) {
          std::memcpy(at, p.data(), p.size());
          at += p.size();
        }
      } else {
        std::memcpy(at, vals.data(), vals.size());
      }
    } else {
      h.vals_len = slot.bytes - slot.keys;  // the answer's room
    }
    h.flags = data_plane::kShared |
              (slot.keys > 0 ? data_plane::kSharedKeys : uint8_t{0});
    h.shared_page = slot.page;
    shared_calls.fetch_add(1, std::memory_order_relaxed);
  }
  bool refused = false;
  {
    absl::MutexLock l(&mu);
    if (closing || !open.load()) {
      refused = true;
    } else {
      pending.emplace(h.id, Pending{deadline, std::move(done), slot, pull_table,
                                    pull_keys, keep_values});
    }
  }
  if (refused) {
    FreeSlot(slot);
    done(absl::UnavailableError("data plane: connection closed"), nullptr, {},
         nullptr);
    return;
  }
  char hdr[kHeaderBytes];
  std::vector<iovec> iov;
  iov.reserve(6 + (borrowed != nullptr ? borrowed->pieces.size() : 0));
  FrameHead(h, meta, hdr, &iov);
  AddBytes(keys, &iov);
  if (slot.bytes == 0 && !lent) {
    if (borrowed != nullptr) {
      for (const absl::Span<const char>& p : borrowed->pieces) AddBytes(p, &iov);
    } else {
      AddBytes(vals, &iov);
    }
    AddValsPad(h, &iov);
  }
  bool written;
  {
    absl::MutexLock l(&write_mu);
    written = open.load() && WriteAll(fd, &iov);
  }
  if (!written) {
    open.store(false);
    ::shutdown(fd, SHUT_RDWR);  // the reader fails every call, this one too
  }
}

void DataPlaneClient::State::FailAll(const absl::Status& s) {
  absl::flat_hash_map<uint64_t, Pending> failed;
  // Lent values the server may still read: never released (orphans'
  // included).
  std::vector<std::shared_ptr<const void>> kept;
  {
    absl::MutexLock l(&mu);
    failed.swap(pending);
    for (auto& [id, o] : orphans) {
      if (o.keep != nullptr) kept.push_back(std::move(o.keep));
    }
    orphans.clear();
  }
  for (auto& [id, p] : failed) {
    if (p.slot.keep != nullptr) kept.push_back(std::move(p.slot.keep));
    p.done(s, nullptr, {}, nullptr);
  }
  for (std::shared_ptr<const void>& k : kept) {
    SharedArena::Quarantine(std::move(k));
  }
}

void DataPlaneClient::State::Read() {
  Buffer buf;
  size_t begin = 0, end = 0;
  absl::Status why = absl::UnavailableError("data plane: connection lost");
  if (!buf.Resize(kInitialBuffer, 0)) {
    why = absl::ResourceExhaustedError("data plane: no memory for a buffer");
  }
  while (buf.data != nullptr) {
    // Answers complete in [begin, end).
    size_t need = kHeaderBytes;
    bool bad = false;
    while (end - begin >= kHeaderBytes) {
      Header h;
      absl::Status s =
          data_plane::DecodeHeader(buf.data + begin, max_frame_bytes, &h);
      if (s.ok() && (h.type != data_plane::kReply || h.keys_len != 0)) {
        s = absl::InternalError("data plane: unexpected frame from the server");
      }
      if (!s.ok()) {
        why = absl::UnavailableError(s.message());
        bad = true;
        break;
      }
      need = FrameBytes(h);
      if (end - begin < need) break;
      Pending p;
      bool found = false;
      {
        absl::MutexLock l(&mu);
        auto it = pending.find(h.id);
        if (it != pending.end()) {
          p = std::move(it->second);
          pending.erase(it);
          found = true;
        } else if (auto o = orphans.find(h.id); o != orphans.end()) {
          FreeSlot(o->second);  // answered after its deadline
          orphans.erase(o);
        }
      }
      if (found) {  // else: answered after its deadline
        const char* frame = buf.data + begin;
        proto::DataReply reply;
        // The values: in the frame, or in the slot this call offered.
        const char* vals = frame + KeysOffset(h);
        const bool in_slot = !data_plane::ValsInFrame(h);
        const bool slot_ok =
            !in_slot || (p.slot.bytes > 0 && p.table >= 0 &&
                         h.shared_page == p.slot.page &&
                         h.vals_len <= p.slot.bytes - p.slot.keys);
        if (in_slot && slot_ok) {
          vals = arena->base() + size_t{p.slot.page} * kArenaPage +
                 p.slot.keys;
        }
        if (!slot_ok || !reply.ParseFromArray(frame + kHeaderBytes,
                                               static_cast<int>(h.meta_len))) {
          p.done(absl::InternalError("data plane: malformed answer"), nullptr,
                 {}, nullptr);
        } else {
          if (p.table >= 0 && p.keys > 0 && h.vals_len > 0 &&
              h.vals_len % p.keys == 0) {
            absl::MutexLock l(&mu);
            uint64_t& per_key = pull_bytes_per_key[p.table];
            per_key = std::max<uint64_t>(per_key, h.vals_len / p.keys);
          }
          absl::Span<const char> got(vals, h.vals_len);
          std::shared_ptr<const void> keep;
          if (p.keep_values && !got.empty()) {
            if (in_slot) {
              // The slot is the caller's now (the server answered: it
              // writes no more), freed when `keep` goes.
              keep = SharedArena::Own(arena, p.slot.page, p.slot.bytes);
              p.slot.bytes = 0;
            } else {
              // In the reader's buffer, which the next answer reuses.
              auto copy = std::make_shared<std::vector<float>>(got.size() / 4);
              std::memcpy(copy->data(), got.data(), got.size());
              got = absl::Span<const char>(
                  reinterpret_cast<const char*>(copy->data()), got.size());
              keep = std::move(copy);
            }
          }
          p.done(StatusFromReply(reply), &reply, got, std::move(keep));
        }
        FreeSlot(p.slot);
      }
      begin += need;
      need = kHeaderBytes;
    }
    if (bad) break;
    if (begin == end) {
      begin = end = 0;
      if (buf.cap > kKeepBuffer) (void)buf.Resize(kInitialBuffer, 0);
    }
    if (buf.cap - begin < need) {
      if (begin > 0) {
        std::memmove(buf.data, buf.data + begin, end - begin);
        end -= begin;
        begin = 0;
      }
      if (buf.cap < need && !buf.Resize(need, end)) {
        why = absl::ResourceExhaustedError("data plane: no memory for an answer");
        break;
      }
    }
    // Wait for bytes, at most until the earliest deadline.
    absl::Time first = absl::InfiniteFuture();
    {
      absl::MutexLock l(&mu);
      if (closing) break;
      for (const auto& [id, p] : pending) first = std::min(first, p.deadline);
    }
    int wait_ms = 1000;
    const absl::Time now = absl::Now();
    if (first != absl::InfiniteFuture()) {
      wait_ms = static_cast<int>(std::clamp<int64_t>(
          absl::ToInt64Milliseconds(absl::Ceil(first - now, absl::Milliseconds(1))),
          0, 1000));
    }
    pollfd pfd{fd, POLLIN, 0};
    int r = ::poll(&pfd, 1, wait_ms);
    if (r < 0 && errno != EINTR) break;
    if (r <= 0) {
      // Calls past their deadline.
      std::vector<Done> expired;
      {
        absl::MutexLock l(&mu);
        if (closing) break;
        const absl::Time t = absl::Now();
        for (auto it = pending.begin(); it != pending.end();) {
          if (it->second.deadline <= t) {
            if (it->second.slot.bytes > 0 || it->second.slot.keep != nullptr) {
              orphans.emplace(it->first, std::move(it->second.slot));
            }
            expired.push_back(std::move(it->second.done));
            pending.erase(it++);
          } else {
            ++it;
          }
        }
      }
      for (Done& d : expired) {
        d(absl::DeadlineExceededError("data plane: no answer by the deadline"),
          nullptr, {}, nullptr);
      }
      continue;
    }
    ssize_t n = ::recv(fd, buf.data + end, buf.cap - end, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    end += static_cast<size_t>(n);
  }
  open.store(false);
  ::shutdown(fd, SHUT_RDWR);
  FailAll(why);
}

absl::StatusOr<std::shared_ptr<DataPlaneClient>> DataPlaneClient::Connect(
    const std::string& host_in, int port, const std::string& token,
    size_t max_frame_bytes, absl::Time deadline, absl::Duration send_stall) {
  std::string host = host_in;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port_str = absl::StrCat(port);
  if (int e = ::getaddrinfo(host.c_str(), port_str.c_str(), &hints, &res);
      e != 0) {
    return absl::UnavailableError(absl::StrCat(
        "data plane: cannot resolve ", host_in, ": ", gai_strerror(e)));
  }
  int fd = -1;
  std::string why = "no address";
  for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                  a->ai_protocol);
    if (fd < 0) continue;
    int r = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (r != 0 && errno == EINPROGRESS) {
      pollfd pfd{fd, POLLOUT, 0};
      do {
        const int64_t ms = std::max<int64_t>(
            0, absl::ToInt64Milliseconds(deadline - absl::Now()));
        r = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(ms, 60000)));
      } while (r < 0 && errno == EINTR);
      int err = 0;
      socklen_t len = sizeof(err);
      if (r == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 &&
          err == 0) {
        r = 0;
      } else {
        why = r == 0 ? "timed out" : std::strerror(err != 0 ? err : errno);
        r = -1;
      }
    } else if (r != 0) {
      why = std::strerror(errno);
    }
    if (r != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("data plane: cannot connect to ",
                                               host_in, ":", port, ": ", why));
  }
  Tune(fd);
  return Open(fd, absl::StrCat(host_in, ":", port), token, max_frame_bytes,
              deadline, send_stall);
}

absl::StatusOr<std::shared_ptr<DataPlaneClient>> DataPlaneClient::ConnectLocal(
    const std::string& name, const std::string& token, size_t max_frame_bytes,
    absl::Time deadline, absl::Duration send_stall,
    std::shared_ptr<SharedArena> arena) {
  if (name.empty() || name.size() > sizeof(sockaddr_un::sun_path) - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("data plane: bad same-host socket name '", name, "'"));
  }
  sockaddr_un a;
  const socklen_t alen = LocalAddress(name, &a);
  // Non-blocking: a listener whose backlog is full answers EAGAIN instead
  // of holding the caller, which then takes the port.
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&a), alen) != 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return absl::UnavailableError(absl::StrCat(
        "data plane: no same-host socket ", name, ": ", why));
  }
  TuneLocal(fd);
  return Open(fd, name, token, max_frame_bytes, deadline, send_stall,
              std::move(arena));
}

absl::StatusOr<std::shared_ptr<DataPlaneClient>> DataPlaneClient::Open(
    int fd, const std::string& peer, const std::string& token,
    size_t max_frame_bytes, absl::Time deadline, absl::Duration send_stall,
    std::shared_ptr<SharedArena> arena) {
  // Blocking from here on; the hello is bounded by the deadline.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  const absl::Duration left =
      std::max(deadline - absl::Now(), absl::Milliseconds(1));
  SetTimeout(fd, SO_SNDTIMEO, left);
  SetTimeout(fd, SO_RCVTIMEO, left);
  // The arena (a same-host socket only) is offered with the hello.
  Header h;
  h.type = data_plane::kHello;
  h.flags = arena != nullptr ? data_plane::kShared : 0;
  h.meta_len = static_cast<uint32_t>(token.size());
  char hdr[kHeaderBytes];
  std::vector<iovec> iov;
  FrameHead(h, token, hdr, &iov);
  char answer[kHeaderBytes];
  Header ah;
  proto::DataReply reply;
  std::string meta;
  absl::Status s;
  if (token.size() > data_plane::kMaxHelloBytes - kHeaderBytes - 8) {
    s = absl::InvalidArgumentError("data plane: cluster token too long");
  } else if (!WriteHello(fd, arena != nullptr ? arena->fd() : -1, &iov) ||
             !ReadExactly(fd, answer, kHeaderBytes)) {
    s = absl::UnavailableError(
        absl::StrCat("data plane: no answer to the hello from ", peer));
  } else if (s = data_plane::DecodeHeader(answer, data_plane::kMaxHelloBytes, &ah);
             !s.ok() || ah.type != data_plane::kReply) {
    s = absl::UnavailableError("data plane: the peer is not a data plane");
  } else {
    meta.resize(FrameBytes(ah) - kHeaderBytes);
    if (!ReadExactly(fd, meta.data(), meta.size()) ||
        !reply.ParseFromArray(meta.data(), static_cast<int>(ah.meta_len))) {
      s = absl::UnavailableError("data plane: malformed hello answer");
    } else {
      s = StatusFromReply(reply);
    }
  }
  if (!s.ok()) {
    ::close(fd);
    return s;
  }
  // The reader waits in poll. A write blocks while the socket is full: a
  // server that takes nothing for send_stall (dead, cut off, or stuck) loses
  // the connection, so the caller's thread is freed and the calls go over
  // gRPC (a failed call names the server to the scheduler, which probes
  // it). SO_SNDTIMEO counts time without progress, not a frame's whole
  // time: a slow link that keeps moving never trips it.
  SetTimeout(fd, SO_RCVTIMEO, absl::InfiniteDuration());
  SetTimeout(fd, SO_SNDTIMEO, send_stall);
  auto st = std::make_shared<State>();
  st->fd = fd;
  // The server took the arena (kShared in its answer), or it goes.
  if (arena != nullptr && (ah.flags & data_plane::kShared) != 0) {
    st->arena = std::move(arena);
  }
  st->max_frame_bytes = max_frame_bytes;
  st->reader = std::thread([st]() mutable {
    st->Read();
    // Counted off last, once the state (and what its callbacks held) is
    // gone.
    const bool detached = st->detached;
    st.reset();
    if (detached) {
      DetachedCount& d = Detached();
      absl::MutexLock l(&d.mu);
      --d.running;
    }
  });
  return std::shared_ptr<DataPlaneClient>(new DataPlaneClient(std::move(st)));
}

DataPlaneClient::~DataPlaneClient() {
  {
    absl::MutexLock l(&state_->mu);
    state_->closing = true;
  }
  state_->open.store(false);
  ::shutdown(state_->fd, SHUT_RDWR);
  if (std::this_thread::get_id() == state_->reader.get_id()) {
    // Dropped by one of its own callbacks: the reader ends by itself (it
    // keeps the state alive), counted until it has.
    state_->detached = true;
    {
      DetachedCount& d = Detached();
      absl::MutexLock l(&d.mu);
      ++d.running;
    }
    state_->reader.detach();
  } else {
    state_->reader.join();
  }
}

bool DataPlaneClient::ok() const { return state_->open.load(); }

bool DataPlaneClient::shared() const { return state_->arena != nullptr; }

int64_t DataPlaneClient::shared_calls() const {
  return state_->shared_calls.load();
}

int64_t DataPlaneClient::lent_calls() const {
  return state_->lent_calls.load();
}

bool DataPlaneClient::OnReaderThread() const {
  return std::this_thread::get_id() == state_->reader.get_id();
}

namespace {
// A call's callback as the reader gives it: the response parsed, and the
// frame's values (a pull's) passed on where the reader received them
// (empty when the call failed), with what keeps them valid after it (a
// call made with keep_values; null otherwise and when it failed).
template <typename Resp, typename F>
DataPlaneClient::State::Done ParsedKept(F done) {
  return [done = std::move(done)](const absl::Status& s,
                                  const proto::DataReply* reply,
                                  absl::Span<const char> vals,
                                  std::shared_ptr<const void> keep) mutable {
    Resp resp;
    absl::Status st = s;
    if (st.ok() && reply != nullptr &&
        !resp.ParseFromString(reply->response())) {
      st = absl::InternalError("data plane: malformed response");
    }
    if (!st.ok()) {
      vals = {};
      keep = nullptr;
    }
    done(st, &resp, vals, std::move(keep));
  };
}
// ParsedKept for a call whose values need not outlive its callback.
template <typename Resp, typename F>
DataPlaneClient::State::Done Parsed(F done) {
  return ParsedKept<Resp>(
      [done = std::move(done)](
          const absl::Status& s, Resp* resp, absl::Span<const char> vals,
          std::shared_ptr<const void>) mutable { done(s, resp, vals); });
}
// The same, for an answer without values.
template <typename Resp>
DataPlaneClient::State::Done Typed(ServerClient::Callback<Resp> done) {
  return Parsed<Resp>([done = std::move(done)](const absl::Status& s,
                                               Resp* resp,
                                               absl::Span<const char>) {
    done(s, resp);
  });
}
// A request's message serialized into a buffer kept by the calling thread,
// valid until the thread's next call (State::Call writes the frame before
// it returns). A replication batch is up to 8 MiB: serialized into a new
// string each time, its zero-fill and first-touch page faults cost a
// replicating server 10 % of its CPU (perf, 2026-11-28); here the bytes are
// written once, into memory the thread already has.
absl::string_view SerializeHead(const google::protobuf::MessageLite& m) {
  struct Kept {
    std::unique_ptr<char[]> data;
    size_t cap = 0;
  };
  thread_local Kept kept;
  const size_t n = m.ByteSizeLong();
  // Protobuf serializes nothing of 2 GiB or more: an empty head, which the
  // server answers INVALID_ARGUMENT (no batch comes near: at most 8 MiB).
  if (n > static_cast<size_t>(std::numeric_limits<int>::max())) return {};
  // A buffer grown past this for one large request is not kept.
  constexpr size_t kKeepBytes = size_t{32} << 20;
  if (n > kept.cap || (kept.cap > kKeepBytes && n <= kKeepBytes)) {
    kept.cap = std::max<size_t>(n, 4096);
    kept.data.reset(new char[kept.cap]);
  }
  m.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(kept.data.get()));
  return absl::string_view(kept.data.get(), n);
}
}  // namespace

void DataPlaneClient::Push(const proto::PushRequest& req,
                           const BorrowedValues* borrowed, absl::Time deadline,
                           ServerClient::Callback<proto::PushResponse> done) {
  const absl::string_view meta = SerializeHead(PushHead(req));
  Header h;
  h.type = data_plane::kPush;
  const absl::Span<const char> keys =
      borrowed != nullptr && !borrowed->keys.empty()
          ? borrowed->keys
          : absl::Span<const char>(req.keys());
  state_->Call(h, meta, keys, borrowed, req.vals(), deadline,
               Typed<proto::PushResponse>(std::move(done)));
}

void DataPlaneClient::Pull(const proto::PullRequest& req, absl::Time deadline,
                           ServerClient::Callback<proto::PullResponse> done) {
  PullValues(req, deadline,
             [done = std::move(done)](const absl::Status& s,
                                      proto::PullResponse* resp,
                                      absl::Span<const char> vals) {
               if (!vals.empty()) {
                 resp->mutable_vals()->assign(vals.data(), vals.size());
               }
               done(s, resp);
             });
}

namespace {
// A pull's header: it may be held until `deadline`.
Header PullHeader(absl::Time deadline) {
  Header h;
  h.type = data_plane::kPull;
  const absl::Duration left = deadline - absl::Now();
  h.timeout_us = left == absl::InfiniteDuration()
                     ? 0
                     : static_cast<uint64_t>(std::max<int64_t>(
                           1, absl::ToInt64Microseconds(left)));
  return h;
}
uint64_t PullKeyCount(const proto::PullRequest& req) {
  return req.keys().empty() ? req.num_keys() : req.keys().size() / 8;
}
}  // namespace

void DataPlaneClient::PullValues(const proto::PullRequest& req,
                                 absl::Time deadline,
                                 ServerClient::ValuesCallback done) {
  state_->Call(PullHeader(deadline), SerializeHead(PullHead(req)), req.keys(),
               nullptr, {}, deadline,
               Parsed<proto::PullResponse>(std::move(done)), req.table(),
               PullKeyCount(req));
}

void DataPlaneClient::PullKept(const proto::PullRequest& req,
                               absl::Time deadline,
                               ServerClient::KeptValuesCallback done) {
  state_->Call(PullHeader(deadline), SerializeHead(PullHead(req)), req.keys(),
               nullptr, {}, deadline,
               ParsedKept<proto::PullResponse>(std::move(done)), req.table(),
               PullKeyCount(req), /*keep_values=*/true);
}

void DataPlaneClient::Clock(const proto::ClockRequest& req, absl::Time deadline,
                            ServerClient::Callback<proto::ClockResponse> done) {
  Header h;
  h.type = data_plane::kClock;
  state_->Call(h, SerializeHead(req), {}, nullptr, {}, deadline,
               Typed<proto::ClockResponse>(std::move(done)));
}

void DataPlaneClient::Replicate(
    const proto::ReplicateRequest& req, absl::Time deadline,
    ServerClient::Callback<proto::ReplicateResponse> done) {
  Header h;
  h.type = data_plane::kReplicate;
  // Serialized whole, not written from the request's own strings
  // (protobuf's aliasing into the writev was tried, 2026-11-29): the
  // backup's answer can arrive, and the primary recycle the batch's
  // entries on this connection's reader thread, before the writing call
  // has returned, and ASan, which checks a sendmsg's buffers after the
  // call, saw them freed.
  // A large batch goes through a slot of the arena (a backup on this
  // host): no copy through the socket. Its rows' entries are written once
  // into the slot, after the request without them (ReplicateHead), where
  // the backup reads them in place; a batch without rows is serialized
  // there whole.
  const size_t bytes = req.ByteSizeLong();
  if (state_->arena != nullptr && bytes >= data_plane::kArenaMinBytes &&
      bytes <= state_->max_frame_bytes) {
    // The head is a copy of the rest of the batch: made only when the rows'
    // entries are most of it (not for a BSP clock's sums, say).
    size_t entries_bytes = 0;
    for (const proto::ReplicaEntry& e : req.entries()) {
      const auto& tables =
          e.has_delta() ? e.delta().tables() : e.copy().tables();
      for (const proto::RangeCopy::Rows& rows : tables) {
        entries_bytes += rows.entries().size();
      }
    }
    std::vector<absl::string_view> entries;
    proto::ReplicateRequest head;
    if (entries_bytes >= bytes / 2) head = ReplicateHead(req, &entries);
    const size_t head_bytes = entries.empty() ? 0 : head.ByteSizeLong();
    size_t total = entries.empty() ? bytes : Align8(head_bytes);
    for (absl::string_view e : entries) total += Align8(e.size());
    if (total <= state_->max_frame_bytes) {
      if (std::optional<uint32_t> page = state_->arena->Allocate(total)) {
        State::Slot slot{*page, total, head_bytes, nullptr};
        uint8_t* at = reinterpret_cast<uint8_t*>(
            state_->arena->base() + size_t{slot.page} * kArenaPage);
        if (entries.empty()) {
          req.SerializeWithCachedSizesToArray(at);
        } else {
          head.SerializeWithCachedSizesToArray(at);
          at += Align8(head_bytes);
          for (absl::string_view e : entries) {
            std::memcpy(at, e.data(), e.size());
            at += Align8(e.size());
          }
        }
        state_->Call(h, {}, {}, nullptr, {}, deadline,
                     Typed<proto::ReplicateResponse>(std::move(done)), -1, 0,
                     false, &slot);
        return;
      }
    }
  }
  state_->Call(h, SerializeHead(req), {}, nullptr, {}, deadline,
               Typed<proto::ReplicateResponse>(std::move(done)));
}

namespace {

// `from` without its entries, which go at `*offset` of the values (at an
// 8-byte boundary) and are listed in `entries`.
void RowsHead(const proto::RangeCopy::Rows& from, proto::RangeCopy::Rows* to,
              uint64_t* offset, std::vector<absl::string_view>* entries) {
  to->set_table(from.table());
  to->set_keys(from.keys());
  to->set_by_slot(from.by_slot());
  to->set_slots(from.slots());
  to->set_base_slots(from.base_slots());
  to->set_base_digest(from.base_digest());
  to->set_slot_bits(from.slot_bits());
  if (!from.entries().empty()) {
    to->set_vals_offset(*offset);
    to->set_vals_bytes(from.entries().size());
    entries->push_back(from.entries());
    *offset += Align8(from.entries().size());
  }
}

}  // namespace

proto::ReplicateRequest ReplicateHead(const proto::ReplicateRequest& req,
                                      std::vector<absl::string_view>* entries) {
  proto::ReplicateRequest head;
  head.set_from_server(req.from_server());
  head.set_epoch(req.epoch());
  uint64_t offset = 0;
  for (const proto::ReplicaEntry& e : req.entries()) {
    proto::ReplicaEntry* to = head.add_entries();
    if (!e.has_delta() && !e.has_copy()) {
      *to = e;
      continue;
    }
    to->set_range(e.range());
    to->set_index(e.index());
    if (e.has_delta()) {
      proto::RangeDelta* d = to->mutable_delta();
      d->set_base(e.delta().base());
      if (e.delta().has_state()) *d->mutable_state() = e.delta().state();
      for (const proto::RangeCopy::Rows& rows : e.delta().tables()) {
        RowsHead(rows, d->add_tables(), &offset, entries);
      }
    } else {
      proto::RangeCopy* c = to->mutable_copy();
      if (e.copy().has_state()) *c->mutable_state() = e.copy().state();
      for (const proto::RangeCopy::Rows& rows : e.copy().tables()) {
        RowsHead(rows, c->add_tables(), &offset, entries);
      }
    }
  }
  return head;
}

proto::PullRequest PullHead(const proto::PullRequest& req) {
  proto::PullRequest head;
  head.set_worker_id(req.worker_id());
  head.set_clock(req.clock());
  head.set_epoch(req.epoch());
  head.set_table(req.table());
  head.set_wait_ms(req.wait_ms());
  head.set_key_list(req.key_list());
  head.set_num_keys(req.num_keys());
  head.set_key_lists(req.key_lists());
  head.set_others_at(req.others_at());
  return head;
}

proto::PushRequest PushHead(const proto::PushRequest& req) {
  proto::PushRequest head;
  head.set_worker_id(req.worker_id());
  head.set_seq(req.seq());
  head.set_clock(req.clock());
  head.set_epoch(req.epoch());
  head.set_table(req.table());
  head.set_num_examples(req.num_examples());
  *head.mutable_segments() = req.segments();
  if (req.has_end_clock()) *head.mutable_end_clock() = req.end_clock();
  head.set_key_list(req.key_list());
  head.set_num_keys(req.num_keys());
  head.set_key_lists(req.key_lists());
  head.set_value_encoding(req.value_encoding());
  head.set_vals_codec(req.vals_codec());
  head.set_vals_raw_bytes(req.vals_raw_bytes());
  return head;
}

}  // namespace ps
