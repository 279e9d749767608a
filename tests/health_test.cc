// gRPC's health-checking service on a node's port (common/health.h), set up
// the way ps_server sets it up: server credentials with the cluster token,
// the Server service, NodeHealth following the life cycle. A probe without
// the token is answered; every other call without it is still refused.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/health.h"
#include "common/logging.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/health.grpc.pb.h"
#include "server/server_node.h"
#include "server/server_service.h"
#include "transport/grpc_transport.h"

namespace ps {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

constexpr char kToken[] = "secret";

class HealthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    InitLogging("T", "warn");
    EnableGrpcHealthService();
    service_ = std::make_unique<ServerService>(&node_, kToken, [] {});
    GrpcSecurity security;
    security.token = kToken;
    auto creds = MakeServerCredentials(security);
    ASSERT_TRUE(creds.ok()) << creds.status();
    grpc::ServerBuilder builder;
    ConfigureServerBuilder(&builder);
    builder.AddListeningPort("127.0.0.1:0", *creds, &port_);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
    ASSERT_NE(server_->GetHealthCheckService(), nullptr);
    health_.Attach(server_->GetHealthCheckService());
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_),
                                   grpc::InsecureChannelCredentials());
  }
  void TearDown() override {
    health_.Detach();
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
    node_.CancelAll(absl::CancelledError("test over"));
  }

  // Check(service) without any metadata, as a Kubernetes probe sends it.
  grpc::Status Check(const std::string& service, HealthCheckResponse* out) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(10));
    HealthCheckRequest req;
    req.set_service(service);
    return Health::NewStub(channel_)->Check(&ctx, req, out);
  }
  HealthCheckResponse::ServingStatus StatusOf(const std::string& service) {
    HealthCheckResponse r;
    grpc::Status s = Check(service, &r);
    EXPECT_TRUE(s.ok()) << "'" << service << "': " << s.error_message();
    return r.status();
  }

  // A unary call of `method` with an empty body and `token` (none when
  // empty), through the generic stub: the status only.
  grpc::StatusCode CallRaw(const std::string& method,
                           const std::string& token) {
    grpc::GenericStub stub(channel_);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(10));
    if (!token.empty()) ctx.AddMetadata(kTokenHeader, token);
    grpc::ByteBuffer req, resp;
    grpc::Slice empty("");
    req = grpc::ByteBuffer(&empty, 1);
    absl::Notification done;
    grpc::Status status;
    stub.UnaryCall(&ctx, method, grpc::StubOptions(), &req, &resp,
                   [&](grpc::Status s) {
                     status = std::move(s);
                     done.Notify();
                   });
    EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(20)));
    return status.error_code();
  }

  ServerNode node_;
  NodeHealth health_{{proto::Server::service_full_name()}};
  std::unique_ptr<ServerService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(HealthTest, CheckWithoutTokenFollowsTheLifeCycle) {
  // Starting: not ready, but alive.
  EXPECT_EQ(StatusOf(""), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(StatusOf("ps.proto.Server"), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(StatusOf(kLivenessService), HealthCheckResponse::SERVING);

  health_.Set(Serving::kServing, "registered");
  EXPECT_EQ(StatusOf(""), HealthCheckResponse::SERVING);
  EXPECT_EQ(StatusOf("ps.proto.Server"), HealthCheckResponse::SERVING);
  EXPECT_EQ(StatusOf(kLivenessService), HealthCheckResponse::SERVING);
  EXPECT_EQ(health_.Describe(), "serving");

  health_.Set(Serving::kStopping, "job over");
  EXPECT_EQ(StatusOf(""), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(StatusOf("ps.proto.Server"), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(StatusOf(kLivenessService), HealthCheckResponse::SERVING);
  EXPECT_EQ(health_.Describe(), "stopping: job over");

  // A name the node does not serve.
  HealthCheckResponse r;
  EXPECT_EQ(Check("ps.proto.Nothing", &r).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST_F(HealthTest, WatchWithoutTokenSeesChanges) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::seconds(20));
  HealthCheckRequest req;
  auto stub = Health::NewStub(channel_);
  auto reader = stub->Watch(&ctx, req);
  HealthCheckResponse r;
  ASSERT_TRUE(reader->Read(&r));
  EXPECT_EQ(r.status(), HealthCheckResponse::NOT_SERVING);
  health_.Set(Serving::kServing, "registered");
  ASSERT_TRUE(reader->Read(&r));
  EXPECT_EQ(r.status(), HealthCheckResponse::SERVING);
  ctx.TryCancel();
}

TEST_F(HealthTest, OtherServicesStillNeedTheToken) {
  health_.Set(Serving::kServing, "registered");
  ASSERT_EQ(StatusOf(""), HealthCheckResponse::SERVING);
  // The Server service without / with a wrong token (an empty GetStatus
  // request is well formed).
  EXPECT_EQ(CallRaw("/ps.proto.Server/GetStatus", ""),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(CallRaw("/ps.proto.Server/GetStatus", "wrong"),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(CallRaw("/ps.proto.Server/GetStatus", kToken),
            grpc::StatusCode::OK);
  // Only Check and Watch are let through: look-alike paths are not.
  for (const char* path :
       {"/grpc.health.v1.Health/Other", "/grpc.health.v1.HealthX/Check",
        "/grpc.health.v1.Health/Check/", "/ps.proto.Server/Push"}) {
    EXPECT_EQ(CallRaw(path, ""), grpc::StatusCode::UNAUTHENTICATED) << path;
  }
  // Through the real client too.
  GrpcClientFactory factory(GrpcTransportOptions{"", 1});
  auto client = factory.Server(absl::StrCat("127.0.0.1:", port_));
  EXPECT_EQ(client->GetStatus(absl::Now() + absl::Seconds(10)).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(HealthCheckMethodTest, OnlyCheckAndWatch) {
  EXPECT_TRUE(IsHealthCheckMethod("/grpc.health.v1.Health/Check"));
  EXPECT_TRUE(IsHealthCheckMethod("/grpc.health.v1.Health/Watch"));
  EXPECT_FALSE(IsHealthCheckMethod("/grpc.health.v1.Health/check"));
  EXPECT_FALSE(IsHealthCheckMethod("/grpc.health.v1.Health/"));
  EXPECT_FALSE(IsHealthCheckMethod(""));
  EXPECT_FALSE(IsHealthCheckMethod("/ps.proto.Server/Push"));
}

}  // namespace
}  // namespace ps
