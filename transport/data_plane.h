// The data plane (issue 10): push, pull and clock between a worker and a
// server over one plain TCP connection, beside gRPC, which keeps everything
// else (registration, views, replication, control, and the data calls
// whenever the data plane is not connected).
//
// Why: a gRPC round trip costs three thread wake-ups and HTTP/2 framing in
// 16 KiB frames; on the 2-core machines of docs/benchmarks.md a 4 KiB push
// round trip took 130-150 us where a blocking TCP round trip takes 34 us.
// Here a frame is a fixed header, a small protobuf (the request without its
// keys and values) and the keys and values as they lie: the worker writes
// them from the caller's arrays (one writev), the server reads a whole
// frame into a warm per-connection buffer and applies the values in place
// (8-byte aligned), and answers a pull with the values written straight
// after the reply's header.
//
// Frame (little-endian):
//   0  u32 magic "PSD1"        4  u8 type, u8 flags (0), u16 (0)
//   8  u32 meta_len           12  u32 (0)
//  16  u64 id                 24  u64 keys_len (a multiple of 8)
//  32  u64 vals_len           40  u64 timeout_us (0: none)
//  48  meta (meta_len bytes), zero padding to a multiple of 8,
//      keys (keys_len bytes), vals (vals_len bytes), padding to 8.
// Byte 5 holds flags (kShared, kSharedKeys, kSharedAt). Bytes 6-7: the
// byte offset in its page of a kSharedAt push's values (0 otherwise).
// Bytes 12-15: the arena page of a kShared frame (0 otherwise).
// Types: HELLO (meta: the cluster token; the first frame of a connection,
// answered before anything else is read), PUSH (meta: the PushRequest
// without keys and vals), PULL (the PullRequest without keys; timeout_us:
// how long the server may hold it), CLOCK (the ClockRequest), REPLICATE (a
// primary's ReplicateRequest for its backup, issue 9), REPLY (meta: a
// proto::DataReply; vals: a pull's values).
//
// Same host: a server also listens on an abstract Unix-domain socket under
// a random name (ServerStatus.data_socket), and a client in the same
// network namespace connects there instead of the port
// (cluster.local_socket): the same frames, hello and token, at about half
// the CPU per byte of loopback TCP (no TCP/IP processing or
// acknowledgements; 4 MiB writes moved 2.5x faster on the 2-vCPU machines of
// docs/benchmarks.md). An abstract name has no file and lives in its
// network namespace, so a client on another host or in another container
// is refused at once and takes the port. Anyone in the namespace can
// connect to it, as to the port: the token is what admits a peer.
//
// Shared memory (transport/shared_arena.h): on a same-host socket the
// HELLO may carry a sealed memfd (SCM_RIGHTS) and the flag kShared; the
// server's answer has kShared when it mapped it. On such a connection a
// PUSH with kShared has its vals_len bytes of values at page shared_page of
// the arena instead of in the frame; a PULL with kShared offers the slot at
// shared_page, of vals_len bytes, for its answer, and a REPLY with kShared
// says the values were written there. A kShared frame has no values
// section. A PUSH or PULL with kShared may also have kSharedKeys: its
// keys_len bytes of keys open its slot, the values (or the answer's room)
// follow them at that offset, and the frame has no keys section either;
// the server copies the keys out of the arena, once, before it looks at
// them (a sparse push's keys are twice its values: through the socket they
// were two kernel copies, 10-15 % of its CPU). A kShared frame on a
// connection without an arena, or with a slot outside it, is answered
// INVALID_ARGUMENT and the connection closed. A PUSH with kShared may
// instead have kSharedAt (never with kSharedKeys): its values are the
// caller's own, lent from the arena (SharedArena::Lend) and pushed where
// they lie, at byte shared_offset (a multiple of 8, below kArenaPage) of
// page shared_page; its keys are in the frame. Nothing is copied on either
// side: on the 2-vCPU machines of docs/benchmarks.md the worker's copy of
// a 4 MiB push into a slot was 30 % of its CPU. A REPLICATE with kShared
// (no other flag) has its ReplicateRequest, vals_len bytes (any count),
// at page shared_page instead of in the frame (meta empty): the primary
// serializes it there, and the backup copies it out once before parsing
// it. Through the socket a replicated sparse push's deltas were two
// kernel copies and their system calls. With kSharedKeys as well, the
// slot holds the request without its rows' entries (keys_len bytes, any
// count, copied out and parsed as above), then, at the next 8-byte
// boundary, vals_len bytes of those entries, which the rows name by
// offset (RangeCopy.Rows.vals_offset) and the backup reads in place, once
// each, as a push's values: the primary writes each row once into the
// arena and the backup reads it once from there.
//
// Safety: a connection may send one HELLO of at most 4 KiB within
// `hello_timeout` or it is closed; a wrong token is answered UNAUTHENTICATED
// and closed. A frame over the message limit (cluster.max_message_mb) is
// answered RESOURCE_EXHAUSTED and its connection closed, before its body is
// read; so is one that would take the server's receive buffers past their
// budget (4 such frames). A malformed header closes the connection; a
// malformed request in a well-formed frame is answered INVALID_ARGUMENT. TLS
// has no data plane: a server with TLS does not start one, and its clients
// stay on gRPC.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/ps.pb.h"
#include "transport/transport.h"

namespace ps {

namespace data_plane {

// Values of at least this many bytes go through a connection's arena; the
// kernel's copies of fewer cost less than a slot's bookkeeping.
inline constexpr size_t kArenaMinBytes = 64 << 10;
// A client's arena unless told otherwise (cluster.shared_memory_mb).
inline constexpr size_t kDefaultArenaBytes = size_t{128} << 20;

inline constexpr uint32_t kMagic = 0x31445350;  // "PSD1"
inline constexpr size_t kHeaderBytes = 48;
inline constexpr size_t kMaxHelloBytes = 4096;

enum FrameType : uint8_t {
  kHello = 1,
  kPush = 2,
  kPull = 3,
  kClock = 4,
  kReplicate = 5,
  kReply = 16,
};

// Header flags.
inline constexpr uint8_t kShared = 1;
inline constexpr uint8_t kSharedKeys = 2;  // with kShared
inline constexpr uint8_t kSharedAt = 4;    // with kShared, on a push

struct Header {
  uint8_t type = 0;
  uint8_t flags = 0;
  uint32_t shared_page = 0;  // with kShared
  uint16_t shared_offset = 0;  // with kSharedAt
  uint32_t meta_len = 0;
  uint64_t id = 0;
  uint64_t keys_len = 0;
  uint64_t vals_len = 0;
  uint64_t timeout_us = 0;
};

constexpr size_t Align8(size_t n) { return (n + 7) & ~size_t{7}; }
// Offset of the keys in a frame.
inline size_t KeysOffset(const Header& h) {
  return Align8(kHeaderBytes + h.meta_len);
}
// Whether the frame carries its values (none with kShared).
inline bool ValsInFrame(const Header& h) { return (h.flags & kShared) == 0; }
// Bytes of keys at the start of the frame's arena slot (kSharedKeys), 0
// when its keys are in the frame. (A REPLICATE's "keys" there are its
// request, any number of bytes.)
inline uint64_t SlotKeysBytes(const Header& h) {
  return (h.flags & kSharedKeys) != 0 ? h.keys_len : 0;
}
// Where the values start in a kShared frame's slot: after its keys, at an
// 8-byte boundary (the keys of a push or pull are whole 8-byte keys).
inline uint64_t SlotValsAt(const Header& h) {
  return Align8(SlotKeysBytes(h)) + h.shared_offset;
}
// Bytes the server copies out of the arena, once, into memory the peer
// cannot write before it reads them: the keys of a kSharedKeys frame, or
// a kShared REPLICATE's request.
inline uint64_t PrivateBytes(const Header& h) {
  if (h.type == kReplicate && h.flags == kShared) return h.vals_len;
  return SlotKeysBytes(h);
}
// Bytes of the whole frame, padding included.
inline size_t FrameBytes(const Header& h) {
  return KeysOffset(h) + h.keys_len - SlotKeysBytes(h) +
         (ValsInFrame(h) ? Align8(h.vals_len) : 0);
}

void EncodeHeader(const Header& h, char out[kHeaderBytes]);
// One sendmsg of `n` bytes at `p` on the Unix-domain socket `sock` with the
// descriptor `pass_fd` beside them (SCM_RIGHTS; how a hello hands over an
// arena). Returns what sendmsg returned (retried on EINTR).
ssize_t SendWithDescriptor(int sock, const char* p, size_t n, int pass_fd);
// Reads and checks a header: the magic, a known type, zero reserved bytes
// (kShared only on HELLO, PUSH, PULL and REPLY; a page only with it),
// keys_len a multiple of 8, vals_len of 4, and the whole frame at most
// `max_frame_bytes` (RESOURCE_EXHAUSTED; INVALID_ARGUMENT for the rest).
absl::Status DecodeHeader(const char in[kHeaderBytes], size_t max_frame_bytes,
                          Header* h);

}  // namespace data_plane

class DataConnection;
class SharedArena;

// Where a request's answer goes: its connection and id. Copyable; Send
// may be called from any thread, once per request.
class DataReplyTo {
 public:
  DataReplyTo(std::shared_ptr<DataConnection> conn, uint64_t id)
      : conn_(std::move(conn)), id_(id) {}
  // An answer whose values may go to the `slot_bytes` bytes at
  // `slot_offset` of the arena slot at `slot_page` (checked to lie in the
  // connection's arena; the offset is that of the request's keys there).
  DataReplyTo(std::shared_ptr<DataConnection> conn, uint64_t id,
              uint32_t slot_page, uint64_t slot_offset, uint64_t slot_bytes)
      : conn_(std::move(conn)),
        id_(id),
        slot_page_(slot_page),
        slot_offset_(slot_offset),
        slot_bytes_(slot_bytes),
        slot_(true) {}
  // Writes the answer: `s`, and when it is OK `resp` (may be null) and
  // `vals` (a pull's values, sent as they lie, or written into the
  // request's arena slot when they fit it). Returns once the bytes are in
  // the socket (or the connection is found broken, which closes it).
  void Send(const absl::Status& s, const google::protobuf::MessageLite* resp,
            absl::Span<const char> vals = {}) const;
  // Where a pull's `bytes` of values may be written so that Send passes
  // them on without a copy: the request's arena slot (8-byte aligned), or
  // null when it has none or it is too small. Written there, they are sent
  // by Send(s, resp, {that pointer, bytes}).
  char* Slot(size_t bytes) const;

 private:
  std::shared_ptr<DataConnection> conn_;
  uint64_t id_;
  uint32_t slot_page_ = 0;
  uint64_t slot_offset_ = 0;
  uint64_t slot_bytes_ = 0;
  bool slot_ = false;
};

// What a server does with the data plane's requests
// (server/server_service.h). Called on the connection's thread, one request
// at a time per connection; the answer may be sent later, from any thread.
class DataHandler {
 public:
  virtual ~DataHandler() = default;
  // `keys` and `vals` are valid only until the call returns (8-byte
  // aligned).
  virtual void Push(const proto::PushRequest& req, absl::Span<const char> keys,
                    absl::Span<const char> vals, DataReplyTo reply) = 0;
  // `keys`: as Push's. `wait`: how long the answer may be held.
  virtual void Pull(const proto::PullRequest& req, absl::Span<const char> keys,
                    absl::Duration wait, DataReplyTo reply) = 0;
  virtual void Clock(const proto::ClockRequest& req, DataReplyTo reply) = 0;
  // A replication batch (ServerNode::Replicate); UNIMPLEMENTED by default.
  // `vals`: the values its rows name by offset (RangeCopy.Rows.vals_offset;
  // empty but over shared memory), in the peer's arena, each byte to be
  // read once; valid only until the call returns (8-byte aligned).
  virtual void Replicate(const proto::ReplicateRequest& req,
                         absl::Span<const char> vals, DataReplyTo reply) {
    (void)req;
    (void)vals;
    reply.Send(absl::UnimplementedError("replicate: not on this data plane"),
               nullptr);
  }
  // The peer closed (or reset) a connection on which it had sent requests
  // as worker `worker_id` (the last push, pull or clock's): not called for
  // connections the server closes itself, nor when it stops.
  virtual void PeerClosed(int32_t worker_id) { (void)worker_id; }
};

struct DataPlaneServerOptions {
  std::string host = "127.0.0.1";  // the address to listen on (port: any)
  std::string token;               // empty: no authentication
  size_t max_frame_bytes = size_t{64} << 20;
  int max_connections = 256;       // more are closed at once
  absl::Duration hello_timeout = absl::Seconds(5);
  // A peer that does not read its answers for this long loses its
  // connection (the answering thread is not held longer).
  absl::Duration send_timeout = absl::Seconds(10);
  // Also listen on an abstract Unix-domain socket under a random name
  // (local_name()), for clients in this network namespace: the same
  // protocol at about half the CPU per byte of loopback TCP.
  bool local_socket = true;
  // The largest arena (transport/shared_arena.h) a same-host peer may hand
  // over, and all connections' arenas together; one over either is
  // declined (the peer then sends its values in the frames). 0: none.
  size_t max_arena_bytes = size_t{512} << 20;
  size_t arena_budget_bytes = size_t{4} << 30;
};

class DataPlaneServer {
 public:
  // Listens on options.host, port chosen by the kernel, and serves each
  // connection on a thread of its own.
  static absl::StatusOr<std::unique_ptr<DataPlaneServer>> Start(
      DataPlaneServerOptions options, DataHandler* handler);
  ~DataPlaneServer();  // Stop()
  int port() const { return port_; }
  // The same-host socket's name (DataPlaneClient::ConnectLocal); empty when
  // there is none.
  const std::string& local_name() const { return local_name_; }
  // Closes the listener and every connection and joins their threads.
  // Answers sent later are dropped. Idempotent.
  void Stop();
  // Connections open now (tests).
  int connections() const;
  // Connections accepted so far over the same-host socket (`local`) or
  // TCP, hello or not.
  int64_t served(bool local) const;
  // Arenas mapped so far (connections that share memory).
  int64_t arenas() const;

 private:
  struct State;
  DataPlaneServer() = default;
  std::shared_ptr<State> state_;
  int port_ = 0;
  std::string local_name_;
};

// One connection to a server's data plane. Thread-safe. Calls write their
// frame on the caller's thread (returning once it is in the socket) and
// are answered on the connection's reader thread; a call's callback runs
// exactly once: with the answer, DEADLINE_EXCEEDED at its deadline, or
// UNAVAILABLE when the connection breaks (the caller retries, as for any
// UNAVAILABLE). A write that makes no progress for 5 s (a server that reads
// nothing: dead, cut off, stuck) breaks the connection; until then it holds
// the calling thread, which gRPC's asynchronous calls do not.
class DataPlaneClient {
 public:
  // Connects to host:port and says hello with `token`. UNAUTHENTICATED when
  // the server refuses the token; UNAVAILABLE when it cannot be reached by
  // `deadline`.
  // `send_stall`: how long a write may make no progress (above).
  static absl::StatusOr<std::shared_ptr<DataPlaneClient>> Connect(
      const std::string& host, int port, const std::string& token,
      size_t max_frame_bytes, absl::Time deadline,
      absl::Duration send_stall = absl::Seconds(5));
  // As Connect, to a server's same-host socket (DataPlaneServer::
  // local_name()). UNAVAILABLE at once when no such socket is in this
  // network namespace (the server is on another host, or in another
  // container): the caller then connects to the port.
  // `arena` (may be null; may be shared by connections to several
  // servers): offered to the server for values of kArenaMinBytes or more,
  // and for values the caller wrote in memory it lent (transport/
  // shared_arena.h); without one, as when the server declines it, every
  // value goes in the frames.
  static absl::StatusOr<std::shared_ptr<DataPlaneClient>> ConnectLocal(
      const std::string& name, const std::string& token, size_t max_frame_bytes,
      absl::Time deadline, absl::Duration send_stall = absl::Seconds(5),
      std::shared_ptr<SharedArena> arena = nullptr);
  // Fails what is in flight (UNAVAILABLE) and joins the reader; dropped by
  // one of its own callbacks (on the reader), it lets the reader end by
  // itself instead (AwaitDetachedReaders).
  ~DataPlaneClient();

  // Waits until every reader let go that way has ended (its last callback
  // run), or `deadline`; false at the deadline. A process calls it before
  // it returns from main: a reader still running then would run callbacks
  // and log while the static objects they use are destroyed (seen once in
  // 220 launches as "pure virtual method called" at a server's exit).
  static bool AwaitDetachedReaders(absl::Time deadline);
  // How many such readers are running now (tests).
  static int DetachedReaders();

  // Open, as far as this side knows.
  bool ok() const;
  // Whether the server took this connection's arena.
  bool shared() const;
  // Requests sent with an arena slot so far: a push's values, or room
  // offered for a pull's answer (which the server fills when it fits).
  int64_t shared_calls() const;
  // Pushes sent so far whose values the caller wrote in lent memory, sent
  // where they lay (kSharedAt): no copy. Counted in shared_calls() too.
  int64_t lent_calls() const;
  // Whether the calling thread is this connection's reader (a callback):
  // it must not send (a blocking write there could wait for the server,
  // which waits for this reader).
  bool OnReaderThread() const;

  void Push(const proto::PushRequest& req, const BorrowedValues* borrowed,
            absl::Time deadline, ServerClient::Callback<proto::PushResponse> done);
  void Pull(const proto::PullRequest& req, absl::Time deadline,
            ServerClient::Callback<proto::PullResponse> done);
  // As Pull, the values where the connection received them
  // (ServerClient::PullValues).
  void PullValues(const proto::PullRequest& req, absl::Time deadline,
                  ServerClient::ValuesCallback done);
  // As PullValues, the values handed over (ServerClient::PullKept): an
  // answer in its arena slot keeps the slot until `keep` goes; one in the
  // frame is copied out of the reader's buffer.
  void PullKept(const proto::PullRequest& req, absl::Time deadline,
                ServerClient::KeptValuesCallback done);
  void Clock(const proto::ClockRequest& req, absl::Time deadline,
             ServerClient::Callback<proto::ClockResponse> done);
  // The answer's status is the batch's (ReplicateResponse is empty).
  void Replicate(const proto::ReplicateRequest& req, absl::Time deadline,
                 ServerClient::Callback<proto::ReplicateResponse> done);

  struct State;  // shared with the reader thread

 private:
  explicit DataPlaneClient(std::shared_ptr<State> state) : state_(std::move(state)) {}
  // Says hello on the connected socket `fd` (owned from here on) to `peer`
  // (for messages) and starts the reader.
  static absl::StatusOr<std::shared_ptr<DataPlaneClient>> Open(
      int fd, const std::string& peer, const std::string& token,
      size_t max_frame_bytes, absl::Time deadline, absl::Duration send_stall,
      std::shared_ptr<SharedArena> arena = nullptr);
  std::shared_ptr<State> state_;
};

// The request without its keys and vals fields (every other field copied):
// the meta of a data-plane push, and the head of gRPC's PushWire.
proto::PushRequest PushHead(const proto::PushRequest& req);
// The pull request without its keys (every other field copied, the keys
// never): the meta of a data-plane pull.
proto::PullRequest PullHead(const proto::PullRequest& req);
// The replication batch without its rows' entries (every other field
// copied; a delta's or copy's rows name theirs by vals_offset and
// vals_bytes instead): a batch through shared memory, whose values are
// `*entries` in order, each at the next 8-byte boundary.
proto::ReplicateRequest ReplicateHead(const proto::ReplicateRequest& req,
                                      std::vector<absl::string_view>* entries);

}  // namespace ps
