// The data plane (transport/data_plane.h) over real loopback sockets: what
// a request carries arrives whole, answers (statuses and reasons included)
// come back to their own call whatever their order, deadlines and broken
// connections fail calls instead of hanging them, and a peer that sends a
// wrong token, garbage, oversized or truncated frames, or nothing at all,
// gets an answer or a closed connection while the server keeps serving.
#include "transport/data_plane.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "transport/errors.h"
#include "transport/shared_arena.h"

namespace ps {
namespace {

using data_plane::Header;
using data_plane::kHeaderBytes;

constexpr size_t kLimit = 1 << 20;

// Records each push and answers it with `push_status`; answers a pull with
// each key's low 32 bits as a float, a clock with `clock_status`; or holds
// push and pull answers while `hold` is set (the test sends them).
class TestHandler : public DataHandler {
 public:
  void Push(const proto::PushRequest& req, absl::Span<const char> keys,
            absl::Span<const char> vals, DataReplyTo reply) override {
    if (on_push) on_push();
    {
      absl::MutexLock l(&mu);
      last_push = req;
      last_keys.assign(keys.data(), keys.size());
      last_vals.assign(vals.data(), vals.size());
      aligned = reinterpret_cast<uintptr_t>(keys.data()) % 8 == 0 &&
                reinterpret_cast<uintptr_t>(vals.data()) % 4 == 0;
      ++pushes;
      if (hold) {
        held.push_back(reply);
        return;
      }
    }
    proto::PushResponse resp;
    reply.Send(push_status, &resp);
  }
  void Pull(const proto::PullRequest& req, absl::Span<const char> keys,
            absl::Duration wait, DataReplyTo reply) override {
    {
      absl::MutexLock l(&mu);
      last_wait = wait;
      if (hold) {
        held.push_back(reply);
        return;
      }
    }
    std::vector<float> vals(keys.size() / 8);
    for (size_t i = 0; i < vals.size(); ++i) {
      uint64_t k;
      std::memcpy(&k, keys.data() + 8 * i, 8);
      vals[i] = static_cast<float>(k & 0xffffffff);
    }
    proto::PullResponse resp;
    resp.set_held_us(req.table() + 1000);
    reply.Send(absl::OkStatus(), &resp,
               absl::Span<const char>(reinterpret_cast<const char*>(vals.data()),
                                      vals.size() * sizeof(float)));
  }
  void Clock(const proto::ClockRequest& req, DataReplyTo reply) override {
    (void)req;
    proto::ClockResponse resp;
    reply.Send(clock_status, &resp);
  }
  // Keeps the request as sent: rows that name their entries in `vals`
  // get them back (out of bounds: left as they came).
  void Replicate(const proto::ReplicateRequest& req,
                 absl::Span<const char> vals, DataReplyTo reply) override {
    absl::Status s;
    {
      absl::MutexLock l(&mu);
      last_replicate = req;
      last_replicate_vals = vals.size();
      for (proto::ReplicaEntry& e : *last_replicate.mutable_entries()) {
        auto* tables = e.has_delta()  ? e.mutable_delta()->mutable_tables()
                       : e.has_copy() ? e.mutable_copy()->mutable_tables()
                                      : nullptr;
        if (tables == nullptr) continue;
        for (proto::RangeCopy::Rows& rows : *tables) {
          if (rows.vals_bytes() == 0 || rows.vals_offset() > vals.size() ||
              rows.vals_bytes() > vals.size() - rows.vals_offset()) {
            continue;
          }
          rows.set_entries(vals.data() + rows.vals_offset(), rows.vals_bytes());
          rows.clear_vals_offset();
          rows.clear_vals_bytes();
        }
      }
      s = replicate_status;
    }
    reply.Send(s, nullptr);
  }

  void PeerClosed(int32_t worker_id) override {
    absl::MutexLock l(&mu);
    closed_by.push_back(worker_id);
  }

  // Runs first in each Push (a test's hook; set before any push).
  std::function<void()> on_push;
  absl::Mutex mu;
  bool hold = false;
  std::vector<DataReplyTo> held;
  std::vector<int32_t> closed_by;  // PeerClosed's workers
  int pushes = 0;
  proto::PushRequest last_push;
  std::string last_keys, last_vals;
  bool aligned = false;
  absl::Duration last_wait;
  absl::Status push_status;
  absl::Status clock_status;
  proto::ReplicateRequest last_replicate;
  size_t last_replicate_vals = 0;  // bytes of values it came with
  absl::Status replicate_status;
};

class DataPlaneTest : public ::testing::Test {
 protected:
  void Serve(const std::string& token = "", int max_connections = 256,
             absl::Duration hello_timeout = absl::Seconds(5)) {
    DataPlaneServerOptions o;
    o.token = token;
    o.max_frame_bytes = kLimit;
    o.max_connections = max_connections;
    o.hello_timeout = hello_timeout;
    auto s = DataPlaneServer::Start(o, &handler_);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
  }
  std::shared_ptr<DataPlaneClient> Connect(const std::string& token = "") {
    auto c = DataPlaneClient::Connect("127.0.0.1", server_->port(), token,
                                      kLimit, absl::Now() + absl::Seconds(5));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : nullptr;
  }
  // A raw socket to the server.
  int RawSocket() {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(server_->port()));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    timeval tv{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
  }
  static std::string Frame(uint8_t type, const std::string& meta,
                           const std::string& keys = "",
                           const std::string& vals = "", uint64_t id = 7) {
    Header h;
    h.type = type;
    h.meta_len = static_cast<uint32_t>(meta.size());
    h.id = id;
    h.keys_len = keys.size();
    h.vals_len = vals.size();
    std::string f(data_plane::FrameBytes(h), '\0');
    data_plane::EncodeHeader(h, f.data());
    std::memcpy(f.data() + kHeaderBytes, meta.data(), meta.size());
    std::memcpy(f.data() + data_plane::KeysOffset(h), keys.data(), keys.size());
    std::memcpy(f.data() + data_plane::KeysOffset(h) + keys.size(), vals.data(),
                vals.size());
    return f;
  }
  static void SendAll(int fd, const std::string& b) {
    ASSERT_EQ(send(fd, b.data(), b.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(b.size()));
  }
  // The status of the next answer on `fd`; UNAVAILABLE when it closes
  // first (an answer followed by the close is read as that answer).
  static absl::Status ReadAnswer(int fd) {
    char hdr[kHeaderBytes];
    size_t got = 0;
    while (got < kHeaderBytes) {
      ssize_t n = recv(fd, hdr + got, kHeaderBytes - got, 0);
      if (n <= 0) return absl::UnavailableError("closed");
      got += n;
    }
    Header h;
    absl::Status s = data_plane::DecodeHeader(hdr, kLimit, &h);
    if (!s.ok()) return absl::InternalError("bad answer header");
    std::string rest(data_plane::FrameBytes(h) - kHeaderBytes, '\0');
    got = 0;
    while (got < rest.size()) {
      ssize_t n = recv(fd, rest.data() + got, rest.size() - got, 0);
      if (n <= 0) return absl::UnavailableError("closed mid-answer");
      got += n;
    }
    proto::DataReply r;
    if (!r.ParseFromArray(rest.data(), h.meta_len)) {
      return absl::InternalError("bad answer");
    }
    return absl::Status(static_cast<absl::StatusCode>(r.code()), r.message());
  }
  // True when the server closes `fd` (reads EOF) within 5 s.
  static bool Closed(int fd) {
    char b[256];
    for (;;) {
      ssize_t n = recv(fd, b, sizeof(b), 0);
      if (n == 0) return true;
      if (n < 0) return errno == ECONNRESET;
    }
  }
  std::string Hello(const std::string& token = "") {
    return Frame(data_plane::kHello, token, "", "", 1);
  }
  // A push of keys 1..n with values 0.5 * key, through the client.
  absl::Status PushOnce(DataPlaneClient* c, int n,
                        absl::Time deadline = absl::Now() + absl::Seconds(5)) {
    proto::PushRequest req;
    req.set_worker_id(3);
    req.set_seq(42);
    req.set_table(1);
    std::vector<uint64_t> keys(n);
    std::vector<float> vals(n);
    for (int i = 0; i < n; ++i) {
      keys[i] = i + 1;
      vals[i] = 0.5f * (i + 1);
    }
    req.set_keys(reinterpret_cast<const char*>(keys.data()), n * 8);
    req.set_vals(reinterpret_cast<const char*>(vals.data()), n * 4);
    absl::Notification done;
    absl::Status out;
    c->Push(req, nullptr, deadline,
            [&](const absl::Status& s, proto::PushResponse*) {
              out = s;
              done.Notify();
            });
    done.WaitForNotification();
    return out;
  }

  TestHandler handler_;
  std::unique_ptr<DataPlaneServer> server_;
};

TEST_F(DataPlaneTest, PushArrivesWholeAlignedWithEveryOtherField) {
  Serve();
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(PushOnce(c.get(), 1000).ok());
  absl::MutexLock l(&handler_.mu);
  EXPECT_EQ(handler_.last_push.worker_id(), 3);
  EXPECT_EQ(handler_.last_push.seq(), 42u);
  EXPECT_EQ(handler_.last_push.table(), 1);
  EXPECT_TRUE(handler_.last_push.keys().empty());
  ASSERT_EQ(handler_.last_keys.size(), 8000u);
  ASSERT_EQ(handler_.last_vals.size(), 4000u);
  uint64_t k;
  float v;
  std::memcpy(&k, handler_.last_keys.data() + 8 * 999, 8);
  std::memcpy(&v, handler_.last_vals.data() + 4 * 999, 4);
  EXPECT_EQ(k, 1000u);
  EXPECT_EQ(v, 500.0f);
  EXPECT_TRUE(handler_.aligned);
}

// Worker failure (issue 9): a peer that closes a connection it pushed on
// (its process gone) is reported with the push's worker_id; one that never
// sent a request is not, nor are the connections the server closes when it
// stops.
TEST_F(DataPlaneTest, PeerThatClosesIsReportedByItsWorkerId) {
  Serve();
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(PushOnce(c.get(), 10).ok());  // as worker 3
  auto idle = Connect();
  ASSERT_NE(idle, nullptr);
  c.reset();
  idle.reset();
  const absl::Time until = absl::Now() + absl::Seconds(10);
  for (;;) {
    {
      absl::MutexLock l(&handler_.mu);
      if (!handler_.closed_by.empty()) break;
    }
    ASSERT_LT(absl::Now(), until) << "the close was not reported";
    absl::SleepFor(absl::Milliseconds(2));
  }
  while (server_->connections() > 0 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  {
    absl::MutexLock l(&handler_.mu);
    EXPECT_EQ(handler_.closed_by, std::vector<int32_t>{3});
    handler_.closed_by.clear();
  }
  auto open = Connect();
  ASSERT_NE(open, nullptr);
  ASSERT_TRUE(PushOnce(open.get(), 10).ok());
  server_->Stop();
  absl::MutexLock l(&handler_.mu);
  EXPECT_TRUE(handler_.closed_by.empty());
}

TEST_F(DataPlaneTest, BorrowedPiecesArriveAsOneValsField) {
  Serve();
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  auto owner = std::make_shared<std::vector<float>>(1001);
  for (size_t i = 0; i < owner->size(); ++i) (*owner)[i] = static_cast<float>(i);
  BorrowedValues b;
  b.owner = owner;
  const char* base = reinterpret_cast<const char*>(owner->data());
  b.pieces = {{base, 400}, {base + 400, 0}, {base + 400, 3604}};  // 1001 floats
  proto::PushRequest req;
  std::vector<uint64_t> keys(1001, 5);
  req.set_keys(reinterpret_cast<const char*>(keys.data()), keys.size() * 8);
  absl::Notification done;
  c->Push(req, &b, absl::Now() + absl::Seconds(5),
          [&](const absl::Status& s, proto::PushResponse*) {
            EXPECT_TRUE(s.ok()) << s;
            done.Notify();
          });
  done.WaitForNotification();
  absl::MutexLock l(&handler_.mu);
  ASSERT_EQ(handler_.last_vals.size(), 1001u * 4);
  EXPECT_EQ(std::memcmp(handler_.last_vals.data(), base, 1001 * 4), 0);
}

// The same-host socket (issue 10): an abstract Unix-domain socket under a
// random name beside the port, with the same frames, the same hello and
// the same token.
TEST_F(DataPlaneTest, SameHostSocketCarriesTheSameCalls) {
  Serve();
  const std::string name = server_->local_name();
  ASSERT_EQ(name.rfind("ps-data-", 0), 0u) << name;
  EXPECT_EQ(name.size(), 8u + 32u);  // 16 random bytes in hex
  auto c = DataPlaneClient::ConnectLocal(name, "", kLimit,
                                         absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(PushOnce(c->get(), 1000).ok());
  {
    absl::MutexLock l(&handler_.mu);
    EXPECT_EQ(handler_.last_push.seq(), 42u);
    ASSERT_EQ(handler_.last_keys.size(), 8000u);
    ASSERT_EQ(handler_.last_vals.size(), 4000u);
    float v;
    std::memcpy(&v, handler_.last_vals.data() + 4 * 999, 4);
    EXPECT_EQ(v, 500.0f);
    EXPECT_TRUE(handler_.aligned);
  }
  // Frames several times the socket's default buffer (208 KiB) arrive
  // whole, back to back: 80k keys, 960 KB each.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(PushOnce(c->get(), 80000).ok());
  {
    absl::MutexLock l(&handler_.mu);
    ASSERT_EQ(handler_.last_vals.size(), 320000u);
    float v;
    std::memcpy(&v, handler_.last_vals.data() + handler_.last_vals.size() - 4,
                4);
    EXPECT_EQ(v, 40000.0f);
    EXPECT_EQ(handler_.pushes, 4);
  }
  // A pull's values come back over it too.
  proto::PullRequest req;
  std::vector<uint64_t> keys = {3, 9};
  req.set_keys(reinterpret_cast<const char*>(keys.data()), keys.size() * 8);
  absl::Notification done;
  (*c)->Pull(req, absl::Now() + absl::Seconds(30),
             [&](const absl::Status& s, proto::PullResponse* resp) {
               EXPECT_TRUE(s.ok()) << s;
               if (s.ok()) {
                 float v[2];
                 EXPECT_EQ(resp->vals().size(), 8u);
                 std::memcpy(v, resp->vals().data(), 8);
                 EXPECT_EQ(v[0], 3.0f);
                 EXPECT_EQ(v[1], 9.0f);
               }
               done.Notify();
             });
  done.WaitForNotification();
  EXPECT_EQ(server_->connections(), 1);
  EXPECT_EQ(server_->served(/*local=*/true), 1);
  EXPECT_EQ(server_->served(/*local=*/false), 0);
  // Two servers on one host never share a name.
  DataPlaneServerOptions o;
  auto other = DataPlaneServer::Start(o, &handler_);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE((*other)->local_name(), name);
  EXPECT_FALSE((*other)->local_name().empty());
}

TEST_F(DataPlaneTest, SameHostSocketChecksTheToken) {
  Serve("s3cret");
  auto bad = DataPlaneClient::ConnectLocal(server_->local_name(), "nope",
                                           kLimit,
                                           absl::Now() + absl::Seconds(5));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kUnauthenticated);
  auto good = DataPlaneClient::ConnectLocal(server_->local_name(), "s3cret",
                                            kLimit,
                                            absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_TRUE(PushOnce(good->get(), 3).ok());
  absl::MutexLock l(&handler_.mu);
  EXPECT_EQ(handler_.pushes, 1);
}

// A server on another host (or in another network namespace) has no socket
// by that name here: the client hears so at once and takes the port.
TEST_F(DataPlaneTest, SameHostSocketThatIsNotHereIsUnavailableAtOnce) {
  const absl::Time t0 = absl::Now();
  auto c = DataPlaneClient::ConnectLocal(
      "ps-data-00000000000000000000000000000000", "", kLimit,
      absl::Now() + absl::Seconds(5));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(1));
  EXPECT_EQ(DataPlaneClient::ConnectLocal("", "", kLimit,
                                          absl::Now() + absl::Seconds(5))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DataPlaneClient::ConnectLocal(std::string(200, 'x'), "", kLimit,
                                          absl::Now() + absl::Seconds(5))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // A server told not to have one announces none.
  DataPlaneServerOptions o;
  o.local_socket = false;
  auto s = DataPlaneServer::Start(o, &handler_);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE((*s)->local_name().empty());
}

// Stopping the server closes its same-host connections as it does TCP
// ones: a call in flight fails UNAVAILABLE, and the name is gone.
TEST_F(DataPlaneTest, StoppedServerClosesItsSameHostConnections) {
  Serve();
  handler_.hold = true;
  const std::string name = server_->local_name();
  auto c = DataPlaneClient::ConnectLocal(name, "", kLimit,
                                         absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(c.ok()) << c.status();
  absl::Notification done;
  absl::Status out;
  proto::PullRequest req;
  (*c)->Pull(req, absl::Now() + absl::Seconds(30),
             [&](const absl::Status& s, proto::PullResponse*) {
               out = s;
               done.Notify();
             });
  {
    absl::MutexLock l(&handler_.mu);
    handler_.mu.AwaitWithTimeout(
        absl::Condition(+[](TestHandler* h) { return !h->held.empty(); },
                        &handler_),
        absl::Seconds(5));
    ASSERT_FALSE(handler_.held.empty());
  }
  server_->Stop();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(out.code(), absl::StatusCode::kUnavailable) << out;
  EXPECT_FALSE((*c)->ok());
  EXPECT_EQ(DataPlaneClient::ConnectLocal(name, "", kLimit,
                                          absl::Now() + absl::Seconds(5))
                .status()
                .code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(DataPlaneTest, PullAnswersWithValuesAndTheCallersTimeLeft) {
  Serve();
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  proto::PullRequest req;
  req.set_table(7);
  std::vector<uint64_t> keys = {3, 9, (uint64_t{1} << 40) + 11};
  req.set_keys(reinterpret_cast<const char*>(keys.data()), keys.size() * 8);
  absl::Notification done;
  c->Pull(req, absl::Now() + absl::Seconds(30),
          [&](const absl::Status& s, proto::PullResponse* resp) {
            ASSERT_TRUE(s.ok()) << s;
            EXPECT_EQ(resp->held_us(), 1007);
            ASSERT_EQ(resp->vals().size(), 12u);
            float v[3];
            std::memcpy(v, resp->vals().data(), 12);
            EXPECT_EQ(v[0], 3.0f);
            EXPECT_EQ(v[1], 9.0f);
            EXPECT_EQ(v[2], 11.0f);
            done.Notify();
          });
  done.WaitForNotification();
  absl::MutexLock l(&handler_.mu);
  EXPECT_GT(handler_.last_wait, absl::Seconds(25));
  EXPECT_LE(handler_.last_wait, absl::Seconds(30));
}

// PullValues: the same answer, its values handed over where the connection
// received them, not copied into the response.
TEST_F(DataPlaneTest, PullValuesHandsOverTheValuesAsReceived) {
  Serve();
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  proto::PullRequest req;
  req.set_table(7);
  std::vector<uint64_t> keys = {4, 5, 6, 7};
  req.set_keys(reinterpret_cast<const char*>(keys.data()), keys.size() * 8);
  absl::Notification done;
  c->PullValues(req, absl::Now() + absl::Seconds(30),
                [&](const absl::Status& s, proto::PullResponse* resp,
                    absl::Span<const char> vals) {
                  ASSERT_TRUE(s.ok()) << s;
                  EXPECT_EQ(resp->held_us(), 1007);
                  EXPECT_TRUE(resp->vals().empty());
                  ASSERT_EQ(vals.size(), 16u);
                  float v[4];
                  std::memcpy(v, vals.data(), 16);
                  EXPECT_EQ(v[0], 4.0f);
                  EXPECT_EQ(v[3], 7.0f);
                  done.Notify();
                });
  done.WaitForNotification();
  // A failed call has no values.
  server_->Stop();
  absl::Notification failed;
  c->PullValues(req, absl::Now() + absl::Seconds(5),
                [&](const absl::Status& s, proto::PullResponse*,
                    absl::Span<const char> vals) {
                  EXPECT_FALSE(s.ok());
                  EXPECT_TRUE(vals.empty());
                  failed.Notify();
                });
  ASSERT_TRUE(failed.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

TEST_F(DataPlaneTest, ErrorsKeepTheirCodeAndReason) {
  Serve();
  handler_.clock_status = ErrorWithReason(absl::StatusCode::kFailedPrecondition,
                                          proto::REASON_STALE_EPOCH, "old view");
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  absl::Notification done;
  c->Clock(proto::ClockRequest(), absl::Now() + absl::Seconds(5),
           [&](const absl::Status& s, proto::ClockResponse*) {
             EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
             EXPECT_TRUE(IsStaleEpoch(s)) << s;
             EXPECT_EQ(s.message(), "old view");
             done.Notify();
           });
  done.WaitForNotification();
}

TEST_F(DataPlaneTest, ReplicationBatchArrivesWholeAndItsStatusComesBack) {
  Serve();
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  proto::ReplicateRequest req;
  req.set_from_server(2);
  req.set_epoch(5);
  proto::ReplicaPush* p = req.add_entries()->mutable_push();
  p->set_worker(1);
  p->set_vals(std::string(100000, 'v'));
  for (absl::Status want :
       {absl::OkStatus(),
        ErrorWithReason(absl::StatusCode::kUnavailable,
                        proto::REASON_VIEW_BEHIND, "view behind")}) {
    {
      absl::MutexLock l(&handler_.mu);
      handler_.replicate_status = want;
    }
    absl::Notification done;
    c->Replicate(req, absl::Now() + absl::Seconds(5),
                 [&](const absl::Status& s, proto::ReplicateResponse*) {
                   EXPECT_EQ(s.code(), want.code());
                   EXPECT_EQ(ReasonOf(s), ReasonOf(want));
                   done.Notify();
                 });
    done.WaitForNotification();
    absl::MutexLock l(&handler_.mu);
    EXPECT_EQ(handler_.last_replicate.SerializeAsString(),
              req.SerializeAsString());
  }
}

// A batch of many deltas' rows (bytes fields of every size, around 2 KiB
// and far above, empty ones) arrives byte for byte.
// A replication batch of `n` entries whose rows are of every size (0.6 MB
// in all).
proto::ReplicateRequest RowsOfEverySize(int* count) {
  proto::ReplicateRequest req;
  req.set_from_server(1);
  req.set_epoch(3);
  const size_t sizes[] = {0,    1,    7,    2000, 2030,  2047,
                          2048, 2049, 2100, 4096, 65536, 100001};
  int n = 0;
  for (size_t a : sizes) {
    for (size_t b : {size_t{0}, size_t{8}, size_t{4104}}) {
      proto::ReplicaEntry* e = req.add_entries();
      e->set_range(n % 7);
      e->set_index(++n);
      proto::RangeCopy::Rows* rows = e->mutable_delta()->add_tables();
      rows->set_table(n % 3);
      rows->set_by_slot(true);
      std::string slots(b, '\0');
      for (size_t i = 0; i < b; ++i) slots[i] = static_cast<char>(i * 7 + n);
      rows->set_slots(slots);
      std::string entries(a, '\0');
      for (size_t i = 0; i < a; ++i) entries[i] = static_cast<char>(i * 13 + n);
      rows->set_entries(entries);
      rows->set_base_slots(static_cast<uint32_t>(a));
      rows->set_base_digest(uint64_t{0x0123456789abcdef} * n);
    }
  }
  *count = n;
  return req;
}

TEST_F(DataPlaneTest, ReplicationBatchOfRowsOfEverySizeArrivesByteForByte) {
  Serve();
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  int n = 0;
  const proto::ReplicateRequest req = RowsOfEverySize(&n);
  absl::Notification done;
  c->Replicate(req, absl::Now() + absl::Seconds(5),
               [&](const absl::Status& s, proto::ReplicateResponse*) {
                 EXPECT_TRUE(s.ok()) << s;
                 done.Notify();
               });
  done.WaitForNotification();
  absl::MutexLock l(&handler_.mu);
  // (EXPECT_TRUE: a failure would print the whole 0.6 MB twice.)
  EXPECT_TRUE(handler_.last_replicate.SerializeAsString() ==
              req.SerializeAsString());
  EXPECT_EQ(handler_.last_replicate.entries_size(), n);
}

TEST_F(DataPlaneTest, AnswersOutOfOrderReachTheirOwnCalls) {
  Serve();
  handler_.hold = true;
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  constexpr int kCalls = 20;
  absl::Mutex mu;
  std::vector<int> got(kCalls, -1);
  int answered = 0;
  for (int i = 0; i < kCalls; ++i) {
    proto::PullRequest req;
    const uint64_t key = 100 + i;
    req.set_keys(reinterpret_cast<const char*>(&key), 8);
    c->Pull(req, absl::Now() + absl::Seconds(10),
            [&, i](const absl::Status& s, proto::PullResponse* resp) {
              absl::MutexLock l(&mu);
              float v = -1;
              if (s.ok() && resp->vals().size() == 4) {
                std::memcpy(&v, resp->vals().data(), 4);
              }
              got[i] = static_cast<int>(v);
              ++answered;
            });
  }
  std::vector<DataReplyTo> held;
  for (;;) {
    absl::MutexLock l(&handler_.mu);
    if (handler_.held.size() == kCalls) {
      held = handler_.held;
      break;
    }
    handler_.mu.AwaitWithTimeout(absl::Condition(+[](TestHandler* h) {
                                   return h->held.size() == kCalls;
                                 }, &handler_),
                                 absl::Seconds(5));
  }
  // Answer in reverse order, each with its own request's value.
  for (int i = kCalls - 1; i >= 0; --i) {
    const float v = static_cast<float>(100 + i);
    proto::PullResponse resp;
    held[i].Send(absl::OkStatus(), &resp,
                 absl::Span<const char>(reinterpret_cast<const char*>(&v), 4));
  }
  absl::MutexLock l(&mu);
  mu.AwaitWithTimeout(absl::Condition(
                          +[](int* n) { return *n == kCalls; }, &answered),
                      absl::Seconds(10));
  for (int i = 0; i < kCalls; ++i) EXPECT_EQ(got[i], 100 + i) << i;
}

// A client dropped by one of its own callbacks (a connection found broken
// and replaced from its answer) leaves its reader to end by itself: counted
// until it has ended, so that a process waits for it before it exits
// instead of running its callbacks while the static objects go.
TEST_F(DataPlaneTest, ReaderOfAClientDroppedByItsOwnCallbackIsAwaited) {
  Serve();
  std::shared_ptr<DataPlaneClient> c = Connect();
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(DataPlaneClient::DetachedReaders(), 0);
  absl::Notification dropped, release;
  int counted = -1;
  proto::PushRequest req;
  req.set_worker_id(3);
  c->Push(req, nullptr, absl::Now() + absl::Seconds(5),
          [&](const absl::Status&, proto::PushResponse*) {
            c.reset();  // the last reference, on the reader's thread
            counted = DataPlaneClient::DetachedReaders();
            dropped.Notify();
            release.WaitForNotification();  // the reader still runs
          });
  ASSERT_TRUE(dropped.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(counted, 1);
  EXPECT_FALSE(DataPlaneClient::AwaitDetachedReaders(absl::Now() +
                                                     absl::Milliseconds(100)))
      << "the reader is still in its callback";
  release.Notify();
  EXPECT_TRUE(
      DataPlaneClient::AwaitDetachedReaders(absl::Now() + absl::Seconds(5)));
  EXPECT_EQ(DataPlaneClient::DetachedReaders(), 0);
}

TEST_F(DataPlaneTest, UnansweredCallFailsAtItsDeadline) {
  Serve();
  handler_.hold = true;
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  const absl::Time t0 = absl::Now();
  absl::Status s = PushOnce(c.get(), 4, t0 + absl::Milliseconds(200));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(190));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(3));
  // A late answer for the expired call is dropped; the connection works.
  {
    absl::MutexLock l(&handler_.mu);
    handler_.hold = false;
    proto::PushResponse resp;
    handler_.held.at(0).Send(absl::OkStatus(), &resp);
  }
  EXPECT_TRUE(PushOnce(c.get(), 4).ok());
}

TEST_F(DataPlaneTest, StoppedServerFailsCallsInFlightAndTheClientSaysSo) {
  Serve();
  handler_.hold = true;
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  absl::Notification done;
  absl::Status out;
  proto::PullRequest req;
  c->Pull(req, absl::Now() + absl::Seconds(30),
          [&](const absl::Status& s, proto::PullResponse*) {
            out = s;
            done.Notify();
          });
  for (;;) {
    absl::MutexLock l(&handler_.mu);
    if (!handler_.held.empty()) break;
    handler_.mu.AwaitWithTimeout(
        absl::Condition(+[](TestHandler* h) { return !h->held.empty(); },
                        &handler_),
        absl::Seconds(5));
  }
  server_->Stop();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(out.code(), absl::StatusCode::kUnavailable) << out;
  EXPECT_FALSE(c->ok());
  // Later calls fail at once, and an answer sent after the stop is dropped.
  EXPECT_EQ(PushOnce(c.get(), 1).code(), absl::StatusCode::kUnavailable);
  absl::MutexLock l(&handler_.mu);
  proto::PullResponse resp;
  handler_.held[0].Send(absl::OkStatus(), &resp);
}

// A server that answers the hello and then reads nothing (stuck, or cut
// off with its socket full): the client's write gives up after the stall
// time instead of holding the caller's thread, and the call fails
// UNAVAILABLE (the caller retries over gRPC).
TEST_F(DataPlaneTest, ServerThatReadsNothingBreaksTheConnection) {
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(ls, 1), 0);
  socklen_t len = sizeof(a);
  getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len);
  int peer = -1;
  std::thread acceptor([&] {
    peer = accept(ls, nullptr, nullptr);
    char hello[kHeaderBytes];
    recv(peer, hello, sizeof(hello), MSG_WAITALL);  // a hello, no token
    proto::DataReply ok;
    const std::string meta = ok.SerializeAsString();
    SendAll(peer, Frame(data_plane::kReply, meta, "", "", 1));
  });
  auto c = DataPlaneClient::Connect("127.0.0.1", ntohs(a.sin_port), "", 64 << 20,
                                    absl::Now() + absl::Seconds(5),
                                    /*send_stall=*/absl::Milliseconds(300));
  acceptor.join();
  ASSERT_TRUE(c.ok()) << c.status();
  const absl::Time t0 = absl::Now();
  // 32 MiB: more than both sockets' buffers hold.
  absl::Status s = PushOnce(c->get(), 4 << 20);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_LT(absl::Now() - t0, absl::Seconds(10));
  EXPECT_FALSE((*c)->ok());
  close(peer);
  close(ls);
}

TEST_F(DataPlaneTest, TokenIsChecked) {
  Serve("s3cret");
  auto bad = DataPlaneClient::Connect("127.0.0.1", server_->port(), "nope",
                                      kLimit, absl::Now() + absl::Seconds(5));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kUnauthenticated);
  auto none = DataPlaneClient::Connect("127.0.0.1", server_->port(), "", kLimit,
                                       absl::Now() + absl::Seconds(5));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnauthenticated);
  auto good = Connect("s3cret");
  ASSERT_NE(good, nullptr);
  EXPECT_TRUE(PushOnce(good.get(), 3).ok());
  // Without a hello, a push is refused and the connection closed, unapplied.
  int fd = RawSocket();
  SendAll(fd, Frame(data_plane::kPush, "", std::string(8, '\1'),
                    std::string(4, '\0')));
  EXPECT_EQ(ReadAnswer(fd).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Closed(fd));
  close(fd);
  absl::MutexLock l(&handler_.mu);
  EXPECT_EQ(handler_.pushes, 1);
}

TEST_F(DataPlaneTest, SilentPeerIsClosedAfterTheHelloTimeout) {
  Serve("", 256, absl::Milliseconds(200));
  int fd = RawSocket();
  const absl::Time t0 = absl::Now();
  EXPECT_TRUE(Closed(fd));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(4));
  close(fd);
}

TEST_F(DataPlaneTest, OversizedFramesAreRefusedBeforeTheirBody) {
  Serve();
  // The client refuses to send one.
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(PushOnce(c.get(), kLimit / 8).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(PushOnce(c.get(), 10).ok());
  // A raw peer announcing 1 TB gets RESOURCE_EXHAUSTED and a close.
  int fd = RawSocket();
  SendAll(fd, Hello());
  EXPECT_TRUE(ReadAnswer(fd).ok());
  Header h;
  h.type = data_plane::kPush;
  h.id = 9;
  h.vals_len = uint64_t{1} << 40;
  std::string hdr(kHeaderBytes, '\0');
  data_plane::EncodeHeader(h, hdr.data());
  SendAll(fd, hdr);
  EXPECT_EQ(ReadAnswer(fd).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(Closed(fd));
  close(fd);
  EXPECT_TRUE(PushOnce(c.get(), 10).ok());
}

TEST_F(DataPlaneTest, MalformedRequestInAWholeFrameIsAnsweredAndTheConnectionKept) {
  Serve();
  int fd = RawSocket();
  SendAll(fd, Hello());
  ASSERT_TRUE(ReadAnswer(fd).ok());
  SendAll(fd, Frame(data_plane::kPush, std::string("\xff\xff\xff", 3)));
  EXPECT_EQ(ReadAnswer(fd).code(), absl::StatusCode::kInvalidArgument);
  SendAll(fd, Frame(data_plane::kClock, ""));
  EXPECT_TRUE(ReadAnswer(fd).ok());
  close(fd);
}

TEST_F(DataPlaneTest, GarbageAndTruncatedFramesNeverStopTheServer) {
  Serve();
  std::mt19937 rng(12345);
  const std::string valid = Frame(data_plane::kPush, "", std::string(16, '\2'),
                                  std::string(8, '\3'));
  for (int round = 0; round < 100; ++round) {
    int fd = RawSocket();
    std::string bytes;
    if (round % 3 != 0) bytes = Hello();
    std::string f = valid;
    switch (round % 4) {
      case 0:  // random bytes
        f.assign(1 + rng() % 200, '\0');
        for (char& ch : f) ch = static_cast<char>(rng());
        break;
      case 1:  // a few flipped bytes anywhere
        for (int k = 0; k < 3; ++k) f[rng() % f.size()] ^= 1 + rng() % 255;
        break;
      case 2:  // truncated, then the peer leaves
        f.resize(rng() % f.size());
        break;
      default:  // header flips only
        f[rng() % kHeaderBytes] ^= 1 + rng() % 255;
        break;
    }
    bytes += f;
    send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    shutdown(fd, SHUT_WR);
    Closed(fd);  // whatever was answered, the server ends it
    close(fd);
  }
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(PushOnce(c.get(), 10).ok());
}

TEST_F(DataPlaneTest, ConnectionsOverTheCapAreClosed) {
  Serve("", 2);
  auto a = Connect();
  auto b = Connect();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto third = DataPlaneClient::Connect("127.0.0.1", server_->port(), "",
                                        kLimit, absl::Now() + absl::Seconds(5));
  EXPECT_EQ(third.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(server_->connections(), 2);
  a.reset();  // its slot is free again once the server sees it close
  absl::Time until = absl::Now() + absl::Seconds(5);
  while (server_->connections() > 1 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_NE(Connect(), nullptr);
}

// Shared memory (issue 10, transport/shared_arena.h): over the same-host
// socket a client that offers an arena sends a request's keys and values
// through it when together they are 64 KiB or more, and a pull's answer
// comes back through it (after its keys) once the client knows the table's
// answer size.
class SharedMemoryTest : public DataPlaneTest {
 protected:
  // A connection that offers a new arena of `arena_bytes` (0: none; the
  // last one made is arena_), or `arena` when given.
  std::shared_ptr<DataPlaneClient> ConnectShared(
      size_t arena_bytes, std::shared_ptr<SharedArena> arena = nullptr) {
    if (arena == nullptr && arena_bytes > 0) {
      auto a = SharedArena::Create(arena_bytes);
      EXPECT_TRUE(a.ok()) << a.status();
      if (a.ok()) arena_ = arena = std::move(*a);
    }
    auto c = DataPlaneClient::ConnectLocal(server_->local_name(), "", kLimit,
                                           absl::Now() + absl::Seconds(5),
                                           absl::Seconds(5), std::move(arena));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : nullptr;
  }
  std::shared_ptr<SharedArena> arena_;
  // Pushes `n` values 0.5 * (i + 1) without waiting; `*out` gets the status.
  void PushAsync(DataPlaneClient* c, int n, absl::Time deadline,
                 absl::Notification* done, absl::Status* out) {
    proto::PushRequest req;
    req.set_worker_id(3);
    std::vector<uint64_t> keys(n);
    std::vector<float> vals(n);
    for (int i = 0; i < n; ++i) {
      keys[i] = i + 1;
      vals[i] = 0.5f * (i + 1);
    }
    req.set_keys(reinterpret_cast<const char*>(keys.data()), n * 8);
    req.set_vals(reinterpret_cast<const char*>(vals.data()), n * 4);
    c->Push(req, nullptr, deadline,
            [done, out](const absl::Status& s, proto::PushResponse*) {
              *out = s;
              done->Notify();
            });
  }
  // Pulls keys 1..n of table 2 and checks the values (TestHandler: each
  // key's value is the key).
  void PullAndCheck(DataPlaneClient* c, int n) {
    proto::PullRequest req;
    req.set_table(2);
    std::vector<uint64_t> keys(n);
    for (int i = 0; i < n; ++i) keys[i] = i + 1;
    req.set_keys(reinterpret_cast<const char*>(keys.data()), n * 8);
    absl::Notification done;
    c->PullValues(req, absl::Now() + absl::Seconds(30),
                  [&](const absl::Status& s, proto::PullResponse*,
                      absl::Span<const char> vals) {
                    EXPECT_TRUE(s.ok()) << s;
                    EXPECT_EQ(vals.size(), size_t(n) * 4);
                    for (int i = 0; s.ok() && i < n; ++i) {
                      float v;
                      std::memcpy(&v, vals.data() + 4 * i, 4);
                      if (v != static_cast<float>(i + 1)) {
                        ADD_FAILURE() << "value " << i << ": " << v;
                        break;
                      }
                    }
                    done.Notify();
                  });
    done.WaitForNotification();
  }
  void ExpectLastKeys(int n) {
    absl::MutexLock l(&handler_.mu);
    ASSERT_EQ(handler_.last_keys.size(), size_t(n) * 8);
    for (int i = 0; i < n; ++i) {
      uint64_t k;
      std::memcpy(&k, handler_.last_keys.data() + 8 * i, 8);
      ASSERT_EQ(k, uint64_t(i + 1)) << i;
    }
  }
  void ExpectLastVals(int n) {
    absl::MutexLock l(&handler_.mu);
    ASSERT_EQ(handler_.last_vals.size(), size_t(n) * 4);
    for (int i = 0; i < n; ++i) {
      float v;
      std::memcpy(&v, handler_.last_vals.data() + 4 * i, 4);
      ASSERT_EQ(v, 0.5f * (i + 1)) << i;
    }
    EXPECT_TRUE(handler_.aligned);
  }
  // Waits (at most 5 s) until the handler holds `n` answers.
  void WaitHeld(size_t n) {
    struct Want {
      TestHandler* h;
      size_t n;
    } want{&handler_, n};
    absl::MutexLock l(&handler_.mu);
    handler_.mu.AwaitWithTimeout(
        absl::Condition(+[](Want* w) { return w->h->held.size() == w->n; },
                        &want),
        absl::Seconds(5));
    ASSERT_EQ(handler_.held.size(), n);
  }
  // Answers every held push OK and holds no more.
  void AnswerHeld() {
    absl::MutexLock l(&handler_.mu);
    handler_.hold = false;
    proto::PushResponse resp;
    for (const DataReplyTo& r : handler_.held) r.Send(absl::OkStatus(), &resp);
    handler_.held.clear();
  }
  // A raw same-host connection.
  int RawLocal() {
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    const std::string& name = server_->local_name();
    std::memcpy(a.sun_path + 1, name.data(), name.size());
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a),
                      offsetof(sockaddr_un, sun_path) + 1 + name.size()),
              0);
    timeval tv{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
  }
  // Sends a hello with kShared and `arena_fd` beside it; returns whether
  // the answer took the arena (false also when the answer is not OK).
  static bool SharedHello(int fd, int arena_fd) {
    Header h;
    h.type = data_plane::kHello;
    h.flags = data_plane::kShared;
    h.id = 1;
    char hdr[kHeaderBytes];
    data_plane::EncodeHeader(h, hdr);
    EXPECT_EQ(arena_fd >= 0
                  ? data_plane::SendWithDescriptor(fd, hdr, kHeaderBytes,
                                                   arena_fd)
                  : send(fd, hdr, kHeaderBytes, MSG_NOSIGNAL),
              ssize_t(kHeaderBytes));
    char a[kHeaderBytes];
    size_t got = 0;
    while (got < kHeaderBytes) {
      ssize_t n = recv(fd, a + got, kHeaderBytes - got, 0);
      if (n <= 0) return false;
      got += n;
    }
    Header ah;
    if (!data_plane::DecodeHeader(a, kLimit, &ah).ok()) return false;
    std::string rest(data_plane::FrameBytes(ah) - kHeaderBytes, '\0');
    if (!rest.empty() && recv(fd, rest.data(), rest.size(), MSG_WAITALL) !=
                             ssize_t(rest.size())) {
      return false;
    }
    proto::DataReply r;
    return r.ParseFromArray(rest.data(), ah.meta_len) && r.code() == 0 &&
           (ah.flags & data_plane::kShared) != 0;
  }
  // A PUSH frame whose vals_len values are at arena page `page`, after
  // its `keys_len` bytes of keys there when `shared_keys` (else one key,
  // 0, in the frame).
  static std::string SharedPush(uint32_t page, uint64_t vals_len,
                                bool compressed = false,
                                bool shared_keys = false,
                                uint64_t keys_len = 8) {
    proto::PushRequest req;
    req.set_worker_id(1);
    if (compressed) req.set_vals_codec(proto::CODEC_ZSTD);
    Header h;
    h.type = data_plane::kPush;
    h.flags = data_plane::kShared |
              (shared_keys ? data_plane::kSharedKeys : uint8_t{0});
    h.keys_len = shared_keys ? keys_len : 8;
    h.vals_len = vals_len;
    return SharedFrame(h, page, req.SerializeAsString());
  }
  // The frame of `h` (id 9) with its arena page and `meta`; whatever else
  // the frame holds (keys in it) is zero.
  static std::string SharedFrame(Header h, uint32_t page,
                                 const std::string& meta) {
    h.shared_page = page;
    h.meta_len = static_cast<uint32_t>(meta.size());
    h.id = 9;
    std::string f(data_plane::FrameBytes(h), '\0');
    data_plane::EncodeHeader(h, f.data());
    std::memcpy(f.data() + kHeaderBytes, meta.data(), meta.size());
    return f;
  }
  // A REPLICATE frame whose request of `len` bytes is at arena page `page`
  // (kShared), with `meta` in the frame as well (which it must not have).
  static std::string SharedReplicate(uint32_t page, uint64_t len,
                                     const std::string& meta = "") {
    Header h;
    h.type = data_plane::kReplicate;
    h.flags = data_plane::kShared;
    h.vals_len = len;
    return SharedFrame(h, page, meta);
  }
  // A REPLICATE frame whose request without its rows' entries (`head_len`
  // bytes) is at arena page `page`, followed at the next 8-byte boundary by
  // `vals_len` bytes of entries (kShared | kSharedKeys).
  static std::string SharedSplitReplicate(uint32_t page, uint64_t head_len,
                                          uint64_t vals_len,
                                          const std::string& meta = "") {
    Header h;
    h.type = data_plane::kReplicate;
    h.flags = data_plane::kShared | data_plane::kSharedKeys;
    h.keys_len = head_len;
    h.vals_len = vals_len;
    return SharedFrame(h, page, meta);
  }
  // Sends `frame` on a same-host connection that offered a good arena of 16
  // pages: it must be answered INVALID_ARGUMENT and the connection closed.
  // `what` names the case in a failure.
  void ExpectRefusedAndClosed(const std::string& frame,
                              const std::string& what) {
    auto a = SharedArena::Create(16 * kArenaPage);
    ASSERT_TRUE(a.ok());
    int fd = RawLocal();
    ASSERT_TRUE(SharedHello(fd, (*a)->fd()));
    SendAll(fd, frame);
    EXPECT_EQ(ReadAnswer(fd).code(), absl::StatusCode::kInvalidArgument)
        << what;
    EXPECT_TRUE(Closed(fd)) << what;
    close(fd);
  }
};

// Values the caller wrote in memory lent from the arena (SharedArena::
// Lend) are pushed where they lie: the frame says where (kSharedAt), and
// neither side copies them.
class LentMemoryTest : public SharedMemoryTest {
 protected:
  // Pushes `n` floats (keys 1..n in the frame), borrowed with `owner`:
  // those at `at`, or, with `split` > 0, `split` of them at `at` and the
  // rest at `rest`.
  void PushLent(DataPlaneClient* c, const char* at, int n,
                std::shared_ptr<const void> owner, absl::Notification* done,
                absl::Status* out, int split = 0, const char* rest = nullptr) {
    proto::PushRequest req;
    req.set_worker_id(3);
    std::vector<uint64_t> keys(n);
    for (int i = 0; i < n; ++i) keys[i] = i + 1;
    req.set_keys(reinterpret_cast<const char*>(keys.data()), n * 8);
    BorrowedValues b;
    b.owner = std::move(owner);
    if (split == 0) {
      b.pieces.emplace_back(at, size_t(n) * 4);
    } else {
      b.pieces.emplace_back(at, size_t(split) * 4);
      b.pieces.emplace_back(rest, size_t(n - split) * 4);
    }
    c->Push(req, &b, absl::Now() + absl::Seconds(30),
            [done, out](const absl::Status& s, proto::PushResponse*) {
              *out = s;
              done->Notify();
            });
  }
  absl::Status PushLentOnce(DataPlaneClient* c, const char* at, int n,
                            std::shared_ptr<const void> owner) {
    absl::Notification done;
    absl::Status out;
    PushLent(c, at, n, std::move(owner), &done, &out);
    done.WaitForNotification();
    return out;
  }
  // Writes 0.5 * (first + i + 1) for i < n at `at`.
  static void Fill(char* at, int n, int first = 0) {
    for (int i = 0; i < n; ++i) {
      const float v = 0.5f * (first + i + 1);
      std::memcpy(at + 4 * i, &v, 4);
    }
  }
  // The first value the handler got.
  float FirstVal() {
    absl::MutexLock l(&handler_.mu);
    float v = 0;
    if (handler_.last_vals.size() >= 4) {
      std::memcpy(&v, handler_.last_vals.data(), 4);
    }
    return v;
  }
  // A PUSH frame of one key (0, in the frame) whose vals_len values are at
  // byte `offset` of arena page `page` (kSharedAt).
  static std::string LentPushFrame(uint32_t page, uint16_t offset,
                                   uint64_t vals_len) {
    proto::PushRequest req;
    req.set_worker_id(1);
    const std::string meta = req.SerializeAsString();
    Header h;
    h.type = data_plane::kPush;
    h.flags = data_plane::kShared | data_plane::kSharedAt;
    h.shared_page = page;
    h.shared_offset = offset;
    h.meta_len = static_cast<uint32_t>(meta.size());
    h.id = 9;
    h.keys_len = 8;
    h.vals_len = vals_len;
    std::string f(data_plane::FrameBytes(h), '\0');
    data_plane::EncodeHeader(h, f.data());
    std::memcpy(f.data() + kHeaderBytes, meta.data(), meta.size());
    return f;
  }
};

TEST_F(LentMemoryTest, LentValuesArePushedWhereTheyLie) {
  Serve();
  auto c = ConnectShared(size_t{1} << 20);
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->shared());
  constexpr int kN = 20000;
  std::shared_ptr<char> lent = SharedArena::Lend(arena_, 3 * kN * 4);
  ASSERT_NE(lent, nullptr);
  int64_t lent_calls = 0;
  for (size_t offset :
       {size_t{0}, size_t{8}, kArenaPage + 16, size_t{kN} * 4}) {
    char* at = lent.get() + offset;
    Fill(at, kN);
    // The server reads the caller's memory, not a copy: what the caller
    // writes there before the server reads it is what the server gets.
    handler_.on_push = [at] {
      const float v = 42.0f;
      std::memcpy(at, &v, 4);
    };
    ASSERT_TRUE(PushLentOnce(c.get(), at, kN, lent).ok()) << offset;
    handler_.on_push = nullptr;
    EXPECT_EQ(c->lent_calls(), ++lent_calls) << offset;
    EXPECT_EQ(FirstVal(), 42.0f) << offset;
    {
      // The rest as the caller wrote it.
      absl::MutexLock l(&handler_.mu);
      const float v = 0.5f;
      std::memcpy(handler_.last_vals.data(), &v, 4);
    }
    ExpectLastKeys(kN);
    ExpectLastVals(kN);
  }
  // Nothing of the arena was taken for them: a slot of 3/4 of it is free.
  EXPECT_TRUE(arena_->Allocate(size_t{768} << 10).has_value());
}

// Lent values that are not one run at an 8-byte boundary of the offered
// arena are copied into a slot (or the frame), as any other values.
TEST_F(LentMemoryTest, OtherValuesAreCopied) {
  Serve();
  auto c = ConnectShared(size_t{1} << 20);
  ASSERT_NE(c, nullptr);
  constexpr int kN = 20000;
  std::shared_ptr<char> lent = SharedArena::Lend(arena_, 3 * kN * 4);
  ASSERT_NE(lent, nullptr);
  auto other = SharedArena::Create(size_t{1} << 20);  // not offered
  ASSERT_TRUE(other.ok());
  std::shared_ptr<SharedArena> other_arena = std::move(*other);
  std::shared_ptr<char> elsewhere = SharedArena::Lend(other_arena, kN * 4);
  ASSERT_NE(elsewhere, nullptr);
  struct Case {
    char* at;
    int split;  // 0: one piece; else [0, split) and, a page later, the rest
    const char* what;
  };
  for (const Case& k : {Case{lent.get() + 4, 0, "4-byte boundary"},
                        Case{lent.get(), 100, "two pieces"},
                        Case{elsewhere.get(), 0, "another arena"}}) {
    char* const at = k.at;
    char* const rest = k.at + 4 * k.split + kArenaPage;
    Fill(at, k.split == 0 ? kN : k.split);
    if (k.split != 0) Fill(rest, kN - k.split, k.split);
    handler_.on_push = [at] {
      const float v = 42.0f;
      std::memcpy(at, &v, 4);
    };
    absl::Notification done;
    absl::Status s;
    PushLent(c.get(), at, kN, lent, &done, &s, k.split, rest);
    done.WaitForNotification();
    handler_.on_push = nullptr;
    ASSERT_TRUE(s.ok()) << k.what << ": " << s;
    EXPECT_EQ(c->lent_calls(), 0) << k.what;
    EXPECT_EQ(FirstVal(), 0.5f) << k.what;  // a copy, taken before
    ExpectLastVals(kN);
  }
  EXPECT_EQ(c->shared_calls(), 3);  // each copied into a slot
}

// The connection keeps lent values' owner until the server has answered,
// and forever once the connection breaks with the push unanswered: a
// stopped server that wakes up would read them still.
TEST_F(LentMemoryTest, OwnerKeptUntilAnsweredAndQuarantinedOnABreak) {
  Serve();
  auto c = ConnectShared(size_t{1} << 20);
  ASSERT_NE(c, nullptr);
  constexpr int kN = 20000;
  auto poll_until = [](auto done) {
    const absl::Time until = absl::Now() + absl::Seconds(5);
    while (!done() && absl::Now() < until)
      absl::SleepFor(absl::Milliseconds(1));
    return done();
  };
  {
    std::shared_ptr<char> lent = SharedArena::Lend(arena_, kN * 4);
    ASSERT_NE(lent, nullptr);
    Fill(lent.get(), kN);
    std::weak_ptr<char> watch = lent;
    handler_.hold = true;
    absl::Notification done;
    absl::Status out;
    PushLent(c.get(), lent.get(), kN, lent, &done, &out);
    lent.reset();
    ASSERT_NO_FATAL_FAILURE(WaitHeld(1));
    EXPECT_FALSE(watch.expired());
    AnswerHeld();
    done.WaitForNotification();
    EXPECT_TRUE(out.ok()) << out;
    EXPECT_TRUE(poll_until([&] { return watch.expired(); }));
  }
  std::shared_ptr<char> lent = SharedArena::Lend(arena_, kN * 4);
  ASSERT_NE(lent, nullptr);
  Fill(lent.get(), kN);
  std::weak_ptr<char> watch = lent;
  const size_t quarantined = SharedArena::quarantined();
  handler_.hold = true;
  absl::Notification done;
  absl::Status out;
  PushLent(c.get(), lent.get(), kN, lent, &done, &out);
  lent.reset();
  ASSERT_NO_FATAL_FAILURE(WaitHeld(1));
  server_->Stop();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(out.code(), absl::StatusCode::kUnavailable) << out;
  EXPECT_TRUE(poll_until(
      [&] { return SharedArena::quarantined() == quarantined + 1; }));
  c.reset();
  EXPECT_FALSE(watch.expired());
  absl::MutexLock l(&handler_.mu);
  handler_.held.clear();
  handler_.hold = false;
}

// PullKept: an answer the server wrote into the pull's arena slot stays
// there, the slot the caller's until it lets go of `keep`; an answer in
// the frame (before the table's answer size is known) is copied out.
TEST_F(SharedMemoryTest, KeptPullAnswerKeepsItsSlot) {
  Serve();
  auto c = ConnectShared(size_t{1} << 20);
  ASSERT_NE(c, nullptr);
  constexpr int kN = 20000;
  auto pull_kept = [&](std::shared_ptr<const void>* keep) {
    proto::PullRequest req;
    req.set_table(2);
    std::vector<uint64_t> keys(kN);
    for (int i = 0; i < kN; ++i) keys[i] = i + 1;
    req.set_keys(reinterpret_cast<const char*>(keys.data()), kN * 8);
    absl::Notification done;
    absl::Span<const char> got;
    c->PullKept(
        req, absl::Now() + absl::Seconds(30),
        [&](const absl::Status& s, proto::PullResponse*,
            absl::Span<const char> vals, std::shared_ptr<const void> k) {
          EXPECT_TRUE(s.ok()) << s;
          got = vals;
          *keep = std::move(k);
          done.Notify();
        });
    done.WaitForNotification();
    return got;
  };
  const size_t all_free = arena_->free_pages();
  for (int round = 0; round < 2; ++round) {  // in the frame, then the slot
    std::shared_ptr<const void> keep;
    const absl::Span<const char> got = pull_kept(&keep);
    ASSERT_NE(keep, nullptr) << round;
    ASSERT_EQ(got.size(), size_t(kN) * 4);
    // Read after the callback, and after another call on the connection.
    PullAndCheck(c.get(), 100);
    for (int i = 0; i < kN; ++i) {
      float v;
      std::memcpy(&v, got.data() + 4 * i, 4);
      ASSERT_EQ(v, static_cast<float>(i + 1)) << round << " " << i;
    }
    const bool in_arena = arena_->Holds(got.data(), got.size());
    EXPECT_EQ(in_arena, round == 1);
    EXPECT_EQ(arena_->free_pages() < all_free, in_arena);
    keep.reset();
    EXPECT_EQ(arena_->free_pages(), all_free) << round;
  }
}

TEST_F(LentMemoryTest, LentFramesOutsideTheArenaCloseTheirConnection) {
  Serve();
  // Past its end (16 pages): refused, the connection closed.
  for (auto [page, offset, len] :
       {std::tuple<uint32_t, uint16_t, uint64_t>{15, 8, kArenaPage},
        {16, 0, 4},
        {0, 8, 16 * kArenaPage}}) {
    ExpectRefusedAndClosed(LentPushFrame(page, offset, len),
                           absl::StrCat(page, " ", offset, " ", len));
  }
  // Up to its last byte: read from there.
  auto a = SharedArena::Create(16 * kArenaPage);
  ASSERT_TRUE(a.ok());
  const float v = 2.5f;
  std::memcpy((*a)->base() + 15 * kArenaPage + 8, &v, 4);
  int fd = RawLocal();
  ASSERT_TRUE(SharedHello(fd, (*a)->fd()));
  SendAll(fd, LentPushFrame(15, 8, kArenaPage - 8));
  EXPECT_TRUE(ReadAnswer(fd).ok());
  close(fd);
  EXPECT_EQ(FirstVal(), 2.5f);
}

TEST_F(SharedMemoryTest, LargeValuesGoThroughTheArenaBothWays) {
  Serve();
  auto c = ConnectShared(size_t{4} << 20);
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(c->shared());
  EXPECT_EQ(server_->arenas(), 1);
  // 80k keys and values (640 + 320 KB): through the arena, whole and
  // aligned.
  ASSERT_TRUE(PushOnce(c.get(), 80000).ok());
  EXPECT_EQ(c->shared_calls(), 1);
  ExpectLastVals(80000);
  ExpectLastKeys(80000);
  // 1000 (8 + 4 KB): in the frame.
  ASSERT_TRUE(PushOnce(c.get(), 1000).ok());
  EXPECT_EQ(c->shared_calls(), 1);
  ExpectLastVals(1000);
  ExpectLastKeys(1000);
  // A pull of a table not yet answered sends its keys (160 KB) through the
  // arena and has its answer in the frame; the next one, sized by it, has
  // its answer through the arena too, after its keys (the server writes
  // it there, not over them); one too small for a slot all in the frame.
  PullAndCheck(c.get(), 20000);
  EXPECT_EQ(c->shared_calls(), 2);
  PullAndCheck(c.get(), 20000);
  EXPECT_EQ(c->shared_calls(), 3);
  PullAndCheck(c.get(), 30000);
  EXPECT_EQ(c->shared_calls(), 4);
  PullAndCheck(c.get(), 100);
  EXPECT_EQ(c->shared_calls(), 4);
  // Many in turn reuse the same slots.
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(PushOnce(c.get(), 80000).ok());
  EXPECT_EQ(c->shared_calls(), 54);
  ExpectLastVals(80000);
  ExpectLastKeys(80000);
}

// A large replication batch (a primary's deltas for a backup on this host)
// is serialized into a slot of the arena instead of the socket, arrives
// byte for byte, and frees its slot once answered; a small one goes in its
// frame.
TEST_F(SharedMemoryTest, LargeReplicationBatchGoesThroughTheArena) {
  Serve();
  auto c = ConnectShared(size_t{4} << 20);  // room for 6 such batches
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->shared());
  int n = 0;
  const proto::ReplicateRequest big = RowsOfEverySize(&n);
  proto::ReplicateRequest small;
  small.set_from_server(2);
  small.add_entries()->set_index(5);
  auto replicate = [&](const proto::ReplicateRequest& req) {
    absl::Notification done;
    absl::Status got;
    c->Replicate(req, absl::Now() + absl::Seconds(10),
                 [&](const absl::Status& s, proto::ReplicateResponse*) {
                   got = s;
                   done.Notify();
                 });
    done.WaitForNotification();
    absl::MutexLock l(&handler_.mu);
    // (EXPECT_TRUE: a failure would print the whole 0.6 MB twice.)
    EXPECT_TRUE(handler_.last_replicate.SerializeAsString() ==
                req.SerializeAsString());
    return got;
  };
  auto vals_bytes = [&] {
    absl::MutexLock l(&handler_.mu);
    return handler_.last_replicate_vals;
  };
  ASSERT_TRUE(replicate(big).ok());
  EXPECT_EQ(c->shared_calls(), 1);
  // Its rows' entries came as values, each at an 8-byte boundary.
  size_t entries = 0;
  for (const proto::ReplicaEntry& e : big.entries()) {
    for (const auto& rows : e.delta().tables()) {
      entries += (rows.entries().size() + 7) & ~size_t{7};
    }
  }
  EXPECT_EQ(vals_bytes(), entries);
  ASSERT_TRUE(replicate(small).ok());
  EXPECT_EQ(c->shared_calls(), 1);
  EXPECT_EQ(vals_bytes(), 0u);
  // A large batch without rows goes through the arena whole.
  proto::ReplicateRequest no_rows;
  no_rows.set_from_server(2);
  for (int i = 0; i < 20000; ++i) {
    proto::ReplicaEntry* e = no_rows.add_entries();
    e->set_range(i % 5);
    e->set_index(i + 1000);
    e->set_dead_worker(i % 3);
  }
  ASSERT_GE(no_rows.ByteSizeLong(), data_plane::kArenaMinBytes);
  ASSERT_TRUE(replicate(no_rows).ok());
  EXPECT_EQ(c->shared_calls(), 2);
  EXPECT_EQ(vals_bytes(), 0u);
  // So does one whose rows' entries are not most of it (the rest would be
  // copied into a head for them).
  proto::ReplicaEntry* few = no_rows.add_entries();
  few->set_index(1);
  few->mutable_delta()->add_tables()->set_entries(std::string(4000, 'e'));
  ASSERT_TRUE(replicate(no_rows).ok());
  EXPECT_EQ(c->shared_calls(), 3);
  EXPECT_EQ(vals_bytes(), 0u);
  // More than the arena holds at once, in turn: the slots are reused.
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(replicate(big).ok());
  EXPECT_EQ(c->shared_calls(), 23);
}

// A REPLICATE whose request without its rows' entries and those entries
// lie in the arena (kSharedKeys): either part outside the arena closes the
// connection; a head that is no request, or a frame with a meta section
// too, is answered INVALID_ARGUMENT and the connection kept; a good one
// reaches the handler with its values in place.
TEST_F(SharedMemoryTest, HostileSplitReplicationBatches) {
  Serve();
  for (auto [page, head, vals] :
       {std::tuple<uint32_t, uint64_t, uint64_t>{16, 5, 0},
        {15, kArenaPage + 1, 0},
        {15, 5, kArenaPage},
        {14, 3, 2 * kArenaPage - 4},
        {0xffffffffu, 0, 4}}) {
    ExpectRefusedAndClosed(SharedSplitReplicate(page, head, vals),
                           absl::StrCat(page, " ", head, " ", vals));
  }
  auto a = SharedArena::Create(16 * kArenaPage);
  ASSERT_TRUE(a.ok());
  int fd = RawLocal();
  ASSERT_TRUE(SharedHello(fd, (*a)->fd()));
  char* page3 = (*a)->base() + 3 * kArenaPage;
  std::memset(page3, 0xff, 401);
  SendAll(fd, SharedSplitReplicate(3, 401, 8));
  EXPECT_EQ(ReadAnswer(fd).code(), absl::StatusCode::kInvalidArgument);
  proto::ReplicateRequest req;
  req.set_from_server(4);
  req.set_epoch(7);
  req.add_entries()->set_index(11);
  proto::RangeCopy::Rows* rows =
      req.add_entries()->mutable_delta()->add_tables();
  rows->set_vals_offset(8);
  rows->set_vals_bytes(12);
  const std::string head = req.SerializeAsString();
  ASSERT_NE(head.size() % 8, 0u);  // the values at the next boundary
  std::memcpy(page3, head.data(), head.size());
  const std::string floats = "abcdefghijklmnopqrst";  // 20 bytes
  std::memcpy(page3 + data_plane::Align8(head.size()), floats.data(),
              floats.size());
  SendAll(fd, SharedSplitReplicate(3, head.size(), 20, head));  // a meta too
  EXPECT_EQ(ReadAnswer(fd).code(), absl::StatusCode::kInvalidArgument);
  SendAll(fd, SharedSplitReplicate(3, 0, 0));  // empty: an empty request
  EXPECT_TRUE(ReadAnswer(fd).ok());
  SendAll(fd, SharedSplitReplicate(3, head.size(), 20));
  EXPECT_TRUE(ReadAnswer(fd).ok());
  close(fd);
  absl::MutexLock l(&handler_.mu);
  EXPECT_EQ(handler_.last_replicate_vals, 20u);
  ASSERT_EQ(handler_.last_replicate.entries_size(), 2);
  EXPECT_EQ(handler_.last_replicate.entries(1).delta().tables(0).entries(),
            "ijklmnopqrst");
}

// A batch through shared memory carries every field of its entries but
// the rows' entries, which it names by offset: ReplicateHead misses no
// field (one added to these messages must be copied there: this test then
// fails until it is).
TEST(ReplicateHeadTest, CopiesEveryFieldButTheRowsEntries) {
  EXPECT_EQ(proto::RangeCopy::Rows::descriptor()->field_count(), 10);
  EXPECT_EQ(proto::RangeDelta::descriptor()->field_count(), 3);
  EXPECT_EQ(proto::RangeCopy::descriptor()->field_count(), 2);
  EXPECT_EQ(proto::ReplicaEntry::descriptor()->field_count(), 11);
  EXPECT_EQ(proto::ReplicateRequest::descriptor()->field_count(), 3);
  proto::ReplicateRequest req;
  req.set_from_server(3);
  req.set_epoch(9);
  auto fill = [](proto::RangeCopy::Rows* rows, int n) {
    rows->set_table(n);
    rows->set_keys(std::string(8 * n, 'k'));
    rows->set_entries(std::string(4 * n + 1, static_cast<char>('a' + n)));
    rows->set_by_slot(n % 2 == 1);
    rows->set_slots(std::string(4 * n, 's'));
    rows->set_base_slots(n + 10);
    rows->set_base_digest(0xabcdef00u + n);
    rows->set_slot_bits(std::string(8, static_cast<char>(n)));
  };
  proto::ReplicaEntry* d = req.add_entries();
  d->set_range(1);
  d->set_index(20);
  d->mutable_delta()->set_base(17);
  d->mutable_delta()->mutable_state()->set_bsp_applied(3);
  fill(d->mutable_delta()->add_tables(), 1);
  fill(d->mutable_delta()->add_tables(), 2);
  proto::ReplicaEntry* c = req.add_entries();
  c->set_range(2);
  c->set_index(5);
  c->mutable_copy()->mutable_state()->set_bsp_applied(2);
  fill(c->mutable_copy()->add_tables(), 3);
  proto::ReplicaEntry* other = req.add_entries();
  other->set_range(4);
  other->set_index(6);
  other->set_dead_worker(1);
  std::vector<absl::string_view> entries;
  const proto::ReplicateRequest head = ReplicateHead(req, &entries);
  ASSERT_EQ(entries.size(), 3u);
  // Put back: the request as it was.
  proto::ReplicateRequest back = head;
  uint64_t at = 0;
  int i = 0;
  for (proto::ReplicaEntry& e : *back.mutable_entries()) {
    auto* tables = e.has_delta()  ? e.mutable_delta()->mutable_tables()
                   : e.has_copy() ? e.mutable_copy()->mutable_tables()
                                  : nullptr;
    if (tables == nullptr) continue;
    for (proto::RangeCopy::Rows& rows : *tables) {
      EXPECT_TRUE(rows.entries().empty());
      EXPECT_EQ(rows.vals_offset(), at);
      EXPECT_EQ(rows.vals_bytes(), entries[i].size());
      rows.set_entries(std::string(entries[i]));
      rows.clear_vals_offset();
      rows.clear_vals_bytes();
      at += data_plane::Align8(entries[i].size());
      ++i;
    }
  }
  EXPECT_EQ(back.SerializeAsString(), req.SerializeAsString());
}

// A REPLICATE frame whose request lies in the arena: one outside it closes
// the connection; bytes there that are no request, or a frame that also
// has a meta section, are answered INVALID_ARGUMENT and the connection
// kept; a request there is read whole, from a copy the peer cannot change.
TEST_F(SharedMemoryTest, HostileSharedReplicationBatches) {
  Serve();
  for (auto [page, len] : {std::pair<uint32_t, uint64_t>{16, 5},
                           {15, kArenaPage + 1},
                           {0xffffffffu, 4}}) {
    ExpectRefusedAndClosed(SharedReplicate(page, len),
                           absl::StrCat(page, " ", len));
  }
  auto a = SharedArena::Create(16 * kArenaPage);
  ASSERT_TRUE(a.ok());
  int fd = RawLocal();
  ASSERT_TRUE(SharedHello(fd, (*a)->fd()));
  char* page3 = (*a)->base() + 3 * kArenaPage;
  std::memset(page3, 0xff, 401);
  SendAll(fd, SharedReplicate(3, 401));
  EXPECT_EQ(ReadAnswer(fd).code(), absl::StatusCode::kInvalidArgument);
  proto::ReplicateRequest req;
  req.set_from_server(4);
  req.set_epoch(7);
  req.add_entries()->set_index(11);
  const std::string bytes = req.SerializeAsString();
  std::memcpy(page3, bytes.data(), bytes.size());
  SendAll(fd, SharedReplicate(3, bytes.size(), bytes));  // a meta too
  EXPECT_EQ(ReadAnswer(fd).code(), absl::StatusCode::kInvalidArgument);
  SendAll(fd, SharedReplicate(3, 0));  // empty (fuzz_dataplane's find)
  EXPECT_TRUE(ReadAnswer(fd).ok());
  SendAll(fd, SharedReplicate(3, bytes.size()));
  EXPECT_TRUE(ReadAnswer(fd).ok());
  close(fd);
  absl::MutexLock l(&handler_.mu);
  EXPECT_EQ(handler_.last_replicate.SerializeAsString(), bytes);
}

TEST_F(SharedMemoryTest, FullArenaSendsInTheFrame) {
  Serve();
  auto c = ConnectShared(96 * kArenaPage);  // two slots of 192 KiB
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->shared());
  handler_.hold = true;
  constexpr int kN = 16384;  // 128 KiB of keys, 64 KiB of values
  absl::Notification done[3];
  absl::Status out[3];
  for (int i = 0; i < 3; ++i) {
    PushAsync(c.get(), kN, absl::Now() + absl::Seconds(30), &done[i], &out[i]);
  }
  EXPECT_EQ(c->shared_calls(), 2);  // the third went in its frame
  ASSERT_NO_FATAL_FAILURE(WaitHeld(3));
  AnswerHeld();
  for (int i = 0; i < 3; ++i) {
    done[i].WaitForNotification();
    EXPECT_TRUE(out[i].ok()) << out[i];
  }
  ExpectLastVals(kN);
  // Answered, the slots are free again.
  ASSERT_TRUE(PushOnce(c.get(), kN).ok());
  EXPECT_EQ(c->shared_calls(), 3);
}

// A call whose deadline passes keeps its slot until its answer comes: the
// server may still be reading it.
TEST_F(SharedMemoryTest, ExpiredCallKeepsItsSlotUntilAnswered) {
  Serve();
  auto c = ConnectShared(48 * kArenaPage);  // one slot of 192 KiB
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->shared());
  constexpr int kN = 16384;
  handler_.hold = true;
  EXPECT_EQ(PushOnce(c.get(), kN, absl::Now() + absl::Milliseconds(100)).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(c->shared_calls(), 1);
  // The slot is still lent: the next push goes in its frame.
  absl::Notification done;
  absl::Status out;
  PushAsync(c.get(), kN, absl::Now() + absl::Seconds(30), &done, &out);
  EXPECT_EQ(c->shared_calls(), 1);
  ASSERT_NO_FATAL_FAILURE(WaitHeld(2));
  AnswerHeld();
  done.WaitForNotification();
  EXPECT_TRUE(out.ok()) << out;
  // The late answer gave the slot back.
  ASSERT_TRUE(PushOnce(c.get(), kN).ok());
  EXPECT_EQ(c->shared_calls(), 2);
  ExpectLastVals(kN);
}

TEST_F(SharedMemoryTest, ArenaOverTheServersLimitIsDeclined) {
  DataPlaneServerOptions o;
  o.max_frame_bytes = kLimit;
  o.max_arena_bytes = size_t{1} << 20;
  auto s = DataPlaneServer::Start(o, &handler_);
  ASSERT_TRUE(s.ok()) << s.status();
  server_ = std::move(*s);
  auto c = ConnectShared(size_t{2} << 20);
  ASSERT_NE(c, nullptr);
  EXPECT_FALSE(c->shared());
  EXPECT_EQ(server_->arenas(), 0);
  ASSERT_TRUE(PushOnce(c.get(), 80000).ok());
  EXPECT_EQ(c->shared_calls(), 0);
  ExpectLastVals(80000);
  PullAndCheck(c.get(), 20000);
  PullAndCheck(c.get(), 20000);
  EXPECT_EQ(c->shared_calls(), 0);
  // Within the limit: taken.
  auto d = ConnectShared(size_t{1} << 20);
  ASSERT_NE(d, nullptr);
  EXPECT_TRUE(d->shared());
}

TEST_F(SharedMemoryTest, HostileSharedFramesCloseOnlyTheirConnection) {
  Serve();
  // No arena offered: a shared frame is refused and the connection closed.
  {
    int fd = RawLocal();
    SendAll(fd, Hello());
    ASSERT_TRUE(ReadAnswer(fd).ok());
    SendAll(fd, SharedPush(0, 64));
    EXPECT_EQ(ReadAnswer(fd).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(Closed(fd));
    close(fd);
  }
  // An arena that could shrink is declined; shared frames then refused.
  {
    int mfd = memfd_create("unsealed", MFD_CLOEXEC);
    ASSERT_GE(mfd, 0);
    ASSERT_EQ(ftruncate(mfd, 16 * kArenaPage), 0);
    int fd = RawLocal();
    EXPECT_FALSE(SharedHello(fd, mfd));
    close(mfd);
    SendAll(fd, SharedPush(0, 64));
    EXPECT_EQ(ReadAnswer(fd).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(Closed(fd));
    close(fd);
  }
  // A kShared hello without a descriptor: no arena.
  {
    int fd = RawLocal();
    EXPECT_FALSE(SharedHello(fd, -1));
    close(fd);
  }
  // A good arena, then slots outside it: refused, connection closed.
  for (auto [page, len] : {std::pair<uint32_t, uint64_t>{16, 4},
                           {15, kArenaPage + 4},
                           {0xffffffffu, 4}}) {
    ExpectRefusedAndClosed(SharedPush(page, len), absl::StrCat(page, " ", len));
  }
  // Keys in the slot (kSharedKeys) that, with the values after them, end
  // past the arena: refused, connection closed.
  for (auto [page, keys_len] : {std::pair<uint32_t, uint64_t>{15, 4096},
                                {16, 8},
                                {0, 16 * kArenaPage}}) {
    ExpectRefusedAndClosed(SharedPush(page, 4, false, true, keys_len),
                           absl::StrCat(page, " ", keys_len));
  }
  // kSharedKeys without kShared, or on a frame other than a push or pull:
  // a malformed header, the connection closed.
  for (auto [type, flags] :
       {std::pair<uint8_t, uint8_t>{data_plane::kPush, data_plane::kSharedKeys},
        {data_plane::kClock, data_plane::kShared | data_plane::kSharedKeys}}) {
    Header h;
    h.type = type;
    h.flags = flags;
    h.id = 5;
    h.keys_len = 8;
    char hdr[kHeaderBytes];
    data_plane::EncodeHeader(h, hdr);
    ExpectRefusedAndClosed(std::string(hdr, kHeaderBytes),
                           absl::StrCat(int(type)));
  }
  // Keys and values inside it: both read from there.
  {
    auto a = SharedArena::Create(16 * kArenaPage);
    ASSERT_TRUE(a.ok());
    const uint64_t k = 77;
    const float v = 2.5f;
    std::memcpy((*a)->base() + 14 * kArenaPage, &k, 8);
    std::memcpy((*a)->base() + 14 * kArenaPage + 8, &v, 4);
    int fd = RawLocal();
    ASSERT_TRUE(SharedHello(fd, (*a)->fd()));
    SendAll(fd, SharedPush(14, 4, false, true, 8));
    EXPECT_TRUE(ReadAnswer(fd).ok());
    close(fd);
    absl::MutexLock l(&handler_.mu);
    ASSERT_EQ(handler_.last_keys.size(), 8u);
    ASSERT_EQ(handler_.last_vals.size(), 4u);
    uint64_t got_k;
    float got_v;
    std::memcpy(&got_k, handler_.last_keys.data(), 8);
    std::memcpy(&got_v, handler_.last_vals.data(), 4);
    EXPECT_EQ(got_k, 77u);
    EXPECT_EQ(got_v, 2.5f);
    EXPECT_TRUE(handler_.aligned);
  }
  // Inside it: the push is read from there.
  {
    auto a = SharedArena::Create(16 * kArenaPage);
    ASSERT_TRUE(a.ok());
    const float v = 2.5f;
    std::memcpy((*a)->base() + 15 * kArenaPage, &v, 4);
    int fd = RawLocal();
    ASSERT_TRUE(SharedHello(fd, (*a)->fd()));
    SendAll(fd, SharedPush(15, 4));
    EXPECT_TRUE(ReadAnswer(fd).ok());
    close(fd);
    absl::MutexLock l(&handler_.mu);
    ASSERT_EQ(handler_.last_vals.size(), 4u);
    float got;
    std::memcpy(&got, handler_.last_vals.data(), 4);
    EXPECT_EQ(got, 2.5f);
  }
  // Over TCP a kShared hello carries nothing, and the server still serves.
  {
    int fd = RawSocket();
    EXPECT_FALSE(SharedHello(fd, -1));
    close(fd);
  }
  auto c = ConnectShared(size_t{1} << 20);
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(c->shared());
  ASSERT_TRUE(PushOnce(c.get(), 80000).ok());
  ExpectLastVals(80000);
}

// Plain values are read where they lie; compressed ones are copied out
// first, so a peer writing the slot while the server decompresses it
// cannot change what the decompressor already checked.
TEST_F(SharedMemoryTest, CompressedValuesAreCopiedOutOfTheArenaFirst) {
  Serve();
  auto a = SharedArena::Create(16 * kArenaPage);
  ASSERT_TRUE(a.ok());
  char* slot = (*a)->base() + 2 * kArenaPage;
  handler_.on_push = [slot] { std::memset(slot, 'x', 8); };
  for (bool compressed : {false, true}) {
    std::memcpy(slot, "abcdefgh", 8);
    int fd = RawLocal();
    ASSERT_TRUE(SharedHello(fd, (*a)->fd()));
    SendAll(fd, SharedPush(2, 8, compressed));
    EXPECT_TRUE(ReadAnswer(fd).ok());
    close(fd);
    absl::MutexLock l(&handler_.mu);
    EXPECT_EQ(handler_.last_vals, compressed ? "abcdefgh" : "xxxxxxxx");
  }
}

// Keys sent in the arena are copied out before the handler sees them (it
// checks them, then reads them again): a peer writing the slot meanwhile
// changes the values read in place, never the keys.
TEST_F(SharedMemoryTest, SharedKeysAreCopiedOutOfTheArenaFirst) {
  Serve();
  auto a = SharedArena::Create(16 * kArenaPage);
  ASSERT_TRUE(a.ok());
  char* slot = (*a)->base() + 3 * kArenaPage;
  handler_.on_push = [slot] { std::memset(slot, 'x', 16); };
  std::memcpy(slot, "abcdefghijklmnop", 16);
  int fd = RawLocal();
  ASSERT_TRUE(SharedHello(fd, (*a)->fd()));
  SendAll(fd, SharedPush(3, 8, false, true, 8));
  EXPECT_TRUE(ReadAnswer(fd).ok());
  close(fd);
  absl::MutexLock l(&handler_.mu);
  EXPECT_EQ(handler_.last_keys, "abcdefgh");
  EXPECT_EQ(handler_.last_vals, "xxxxxxxx");
}

// A server that goes away with shared calls in flight fails them
// (UNAVAILABLE) like any other, and an answer it sends afterwards into a
// slot reaches no one; a new connection gets a new arena.
TEST_F(SharedMemoryTest, StoppedServerFailsSharedCallsInFlight) {
  Serve();
  auto c = ConnectShared(size_t{1} << 20);
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->shared());
  PullAndCheck(c.get(), 20000);  // the table's answer size, learnt
  handler_.hold = true;
  absl::Notification pushed, pulled;
  absl::Status push_out, pull_out;
  PushAsync(c.get(), 20000, absl::Now() + absl::Seconds(30), &pushed,
            &push_out);
  proto::PullRequest req;
  req.set_table(2);
  std::vector<uint64_t> keys(20000, 7);
  req.set_keys(reinterpret_cast<const char*>(keys.data()), keys.size() * 8);
  c->PullValues(req, absl::Now() + absl::Seconds(30),
                [&](const absl::Status& s, proto::PullResponse*,
                    absl::Span<const char> vals) {
                  pull_out = s;
                  EXPECT_TRUE(vals.empty());
                  pulled.Notify();
                });
  EXPECT_EQ(c->shared_calls(), 3);  // the pulls and the push
  ASSERT_NO_FATAL_FAILURE(WaitHeld(2));
  server_->Stop();
  ASSERT_TRUE(pushed.WaitForNotificationWithTimeout(absl::Seconds(5)));
  ASSERT_TRUE(pulled.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(push_out.code(), absl::StatusCode::kUnavailable) << push_out;
  EXPECT_EQ(pull_out.code(), absl::StatusCode::kUnavailable) << pull_out;
  EXPECT_FALSE(c->ok());
  {
    // Answers after the stop, one into the pull's slot: dropped.
    absl::MutexLock l(&handler_.mu);
    std::vector<float> vals(20000, 1.0f);
    proto::PullResponse resp;
    handler_.held[1].Send(
        absl::OkStatus(), &resp,
        absl::Span<const char>(reinterpret_cast<const char*>(vals.data()),
                               vals.size() * 4));
    handler_.held[0].Send(absl::OkStatus(), &resp);
    handler_.held.clear();
    handler_.hold = false;
  }
  c.reset();  // its calls' slots stay taken in arena_, never reused
  Serve();
  auto d = ConnectShared(size_t{1} << 20);
  ASSERT_NE(d, nullptr);
  EXPECT_TRUE(d->shared());
  ASSERT_TRUE(PushOnce(d.get(), 80000).ok());
  ExpectLastVals(80000);
}

// Flags the protocol does not define, or on frames that cannot share, are
// malformed headers.
TEST(DataPlaneHeader, SharedFlagOnlyWhereDefined) {
  char b[kHeaderBytes];
  Header h;
  Header out;
  h.type = data_plane::kClock;
  h.flags = data_plane::kShared;
  data_plane::EncodeHeader(h, b);
  EXPECT_EQ(data_plane::DecodeHeader(b, kLimit, &out).code(),
            absl::StatusCode::kInvalidArgument);
  h.type = data_plane::kPush;
  h.flags = 2;
  data_plane::EncodeHeader(h, b);
  EXPECT_EQ(data_plane::DecodeHeader(b, kLimit, &out).code(),
            absl::StatusCode::kInvalidArgument);
  h.flags = 0;
  h.shared_page = 3;  // a page without the flag
  data_plane::EncodeHeader(h, b);
  EXPECT_EQ(data_plane::DecodeHeader(b, kLimit, &out).code(),
            absl::StatusCode::kInvalidArgument);
  h.flags = data_plane::kShared;
  h.vals_len = 400;
  data_plane::EncodeHeader(h, b);
  ASSERT_TRUE(data_plane::DecodeHeader(b, kLimit, &out).ok());
  EXPECT_EQ(out.shared_page, 3u);
  EXPECT_EQ(data_plane::FrameBytes(out), kHeaderBytes);  // no values section
  h.vals_len = kLimit + 4;  // the message limit still holds
  data_plane::EncodeHeader(h, b);
  EXPECT_EQ(data_plane::DecodeHeader(b, kLimit, &out).code(),
            absl::StatusCode::kResourceExhausted);
}

// A REPLICATE may have kShared (its request in the arena: any number of
// bytes, read into private memory first), with kSharedKeys (its request
// without its rows' entries, any number of bytes, then those entries,
// whole floats, at the next 8-byte boundary), never kSharedAt; any other
// frame's values are still whole floats.
TEST(DataPlaneHeader, SharedReplicationBatchIsAnyNumberOfBytes) {
  char b[kHeaderBytes];
  Header out;
  Header h;
  h.type = data_plane::kReplicate;
  h.flags = data_plane::kShared;
  h.shared_page = 2;
  h.vals_len = 401;
  data_plane::EncodeHeader(h, b);
  ASSERT_TRUE(data_plane::DecodeHeader(b, kLimit, &out).ok());
  EXPECT_EQ(data_plane::PrivateBytes(out), 401u);
  EXPECT_EQ(data_plane::FrameBytes(out), kHeaderBytes);
  h.flags = data_plane::kShared | data_plane::kSharedKeys;
  h.keys_len = 401;
  h.vals_len = 12;
  data_plane::EncodeHeader(h, b);
  ASSERT_TRUE(data_plane::DecodeHeader(b, kLimit, &out).ok());
  EXPECT_EQ(data_plane::PrivateBytes(out), 401u);
  EXPECT_EQ(data_plane::SlotValsAt(out), 408u);
  EXPECT_EQ(data_plane::FrameBytes(out), kHeaderBytes);
  h.vals_len = 13;  // its entries are floats
  data_plane::EncodeHeader(h, b);
  EXPECT_EQ(data_plane::DecodeHeader(b, kLimit, &out).code(),
            absl::StatusCode::kInvalidArgument);
  h.keys_len = 0;
  h.vals_len = 401;
  for (uint8_t flags : {uint8_t{data_plane::kShared | data_plane::kSharedAt},
                        uint8_t{data_plane::kShared | data_plane::kSharedKeys |
                                data_plane::kSharedAt}}) {
    h.flags = flags;
    data_plane::EncodeHeader(h, b);
    EXPECT_EQ(data_plane::DecodeHeader(b, kLimit, &out).code(),
              absl::StatusCode::kInvalidArgument)
        << int(flags);
  }
  h.flags = 0;  // in the frame: its values (none) whole floats still
  h.shared_page = 0;
  data_plane::EncodeHeader(h, b);
  EXPECT_EQ(data_plane::DecodeHeader(b, kLimit, &out).code(),
            absl::StatusCode::kInvalidArgument);
  h.type = data_plane::kPush;
  h.flags = data_plane::kShared;
  h.shared_page = 2;
  data_plane::EncodeHeader(h, b);
  EXPECT_EQ(data_plane::DecodeHeader(b, kLimit, &out).code(),
            absl::StatusCode::kInvalidArgument);
  h.vals_len = kLimit + 1;  // the message limit still holds
  h.type = data_plane::kReplicate;
  data_plane::EncodeHeader(h, b);
  EXPECT_EQ(data_plane::DecodeHeader(b, kLimit, &out).code(),
            absl::StatusCode::kResourceExhausted);
}

// kSharedAt: only on a push with kShared and without kSharedKeys, at an
// offset below a page and a multiple of 8; an offset only with it.
TEST(DataPlaneHeader, LentValuesOnlyOnAPush) {
  char b[kHeaderBytes];
  Header out;
  Header h;
  h.type = data_plane::kPush;
  h.flags = data_plane::kShared | data_plane::kSharedAt;
  h.shared_page = 3;
  h.shared_offset = 8;
  h.keys_len = 16;
  h.vals_len = 400;
  data_plane::EncodeHeader(h, b);
  ASSERT_TRUE(data_plane::DecodeHeader(b, kLimit, &out).ok());
  EXPECT_EQ(out.shared_page, 3u);
  EXPECT_EQ(out.shared_offset, 8u);
  EXPECT_EQ(data_plane::SlotKeysBytes(out), 0u);
  EXPECT_EQ(data_plane::FrameBytes(out), kHeaderBytes + 16);  // the keys
  for (auto [type, flags, offset] :
       {std::tuple<uint8_t, uint8_t, uint16_t>{data_plane::kPush,
                                               data_plane::kSharedAt, 8},
        {data_plane::kPull, data_plane::kShared | data_plane::kSharedAt, 8},
        {data_plane::kReply, data_plane::kShared | data_plane::kSharedAt, 0},
        {data_plane::kPush,
         data_plane::kShared | data_plane::kSharedAt | data_plane::kSharedKeys,
         8},
        {data_plane::kPush, data_plane::kShared | data_plane::kSharedAt, 4},
        {data_plane::kPush, data_plane::kShared | data_plane::kSharedAt,
         kArenaPage},
        {data_plane::kPush, data_plane::kShared, 8},
        {data_plane::kPush, 8, 0}}) {
    h.type = type;
    h.flags = flags;
    h.shared_offset = offset;
    data_plane::EncodeHeader(h, b);
    EXPECT_EQ(data_plane::DecodeHeader(b, kLimit, &out).code(),
              absl::StatusCode::kInvalidArgument)
        << int(type) << " " << int(flags) << " " << offset;
  }
}

}  // namespace
}  // namespace ps
