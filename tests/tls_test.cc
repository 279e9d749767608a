// TLS and mutual TLS with certificates made by `openssl` inside the test (a
// temporary CA, a server certificate for 127.0.0.1, a client certificate):
// the real gRPC service on 127.0.0.1 refuses a client that does not trust
// the CA, and with require_client_cert a client without a certificate; a
// whole a9a job runs over TLS through ps_launch.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/routing.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/ps.grpc.pb.h"
#include "server/server_node.h"
#include "server/server_service.h"
#include "tests/test_views.h"
#include "transport/grpc_transport.h"

namespace ps {
namespace {

namespace fs = std::filesystem;

constexpr char kToken[] = "tls-test-token";

// Runs a shell command; true when it exits 0.
bool Sh(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// Makes ca.pem, server.{pem,key} (for 127.0.0.1 and localhost) and
// client.{pem,key}, all signed by the CA, and other_ca.pem (a CA nobody
// uses), under `dir`.
bool MakeCertificates(const fs::path& dir) {
  const std::string d = dir.string();
  const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
                          "-nodes";
  std::ofstream(dir / "san.ext")
      << "subjectAltName=IP:127.0.0.1,DNS:localhost\n";
  const std::string q = " > /dev/null 2>&1";
  return Sh(absl::StrCat("cd ", d, " && openssl req -x509 ", key,
                         " -keyout ca.key -out ca.pem -days 2 -subj "
                         "/CN=ps-test-ca",
                         q)) &&
         Sh(absl::StrCat("cd ", d, " && openssl req -x509 ", key,
                         " -keyout other_ca.key -out other_ca.pem -days 2 "
                         "-subj /CN=ps-other-ca",
                         q)) &&
         Sh(absl::StrCat("cd ", d, " && openssl req ", key,
                         " -keyout server.key -out server.csr -subj "
                         "/CN=localhost",
                         q)) &&
         Sh(absl::StrCat("cd ", d,
                         " && openssl x509 -req -in server.csr -CA ca.pem "
                         "-CAkey ca.key -CAcreateserial -out server.pem -days 2 "
                         "-extfile san.ext",
                         q)) &&
         Sh(absl::StrCat("cd ", d, " && openssl req ", key,
                         " -keyout client.key -out client.csr -subj "
                         "/CN=ps-worker",
                         q)) &&
         Sh(absl::StrCat("cd ", d,
                         " && openssl x509 -req -in client.csr -CA ca.pem "
                         "-CAkey ca.key -CAcreateserial -out client.pem -days 2",
                         q));
}

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           absl::StrCat("ps_tls_", ::getpid(), "_",
                        ::testing::UnitTest::GetInstance()
                            ->current_test_info()
                            ->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    ASSERT_TRUE(MakeCertificates(dir_))
        << "openssl could not make the test certificates (deploy/install_deps.sh installs it)";
    ASSERT_TRUE(node_.Configure(0, OneServerView()).ok());
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
    if (!HasFailure()) fs::remove_all(dir_);
  }

  std::string F(const char* name) const { return (dir_ / name).string(); }

  // Starts the service with TLS (mutual when `require_client_cert`).
  void StartServer(bool require_client_cert) {
    GrpcSecurity s;
    s.token = kToken;
    s.tls.cert_file = F("server.pem");
    s.tls.key_file = F("server.key");
    s.tls.ca_file = F("ca.pem");
    s.tls.require_client_cert = require_client_cert;
    auto creds = MakeServerCredentials(s);
    ASSERT_TRUE(creds.ok()) << creds.status();
    grpc::ServerBuilder builder;
    ConfigureServerBuilder(&builder);
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", *creds, &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(port, 0);
    address_ = absl::StrCat("127.0.0.1:", port);
  }

  // GetStatus through GrpcClientFactory with `tls` settings.
  absl::Status Call(const TlsFiles& tls) {
    GrpcSecurity s;
    s.token = kToken;
    s.tls = tls;
    GrpcClientFactory f(GrpcClientFactory::Options(s, 1));
    return f.Server(address_)
        ->GetStatus(absl::Now() + absl::Seconds(5))
        .status();
  }

  fs::path dir_;
  ServerNode node_;
  ServerService service_{&node_, kToken, nullptr};
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

TEST_F(TlsTest, ClientTrustingTheCaIsServed) {
  StartServer(/*require_client_cert=*/false);
  TlsFiles tls;
  tls.ca_file = F("ca.pem");
  EXPECT_TRUE(Call(tls).ok());
}

TEST_F(TlsTest, ClientWithoutTheCaIsRefused) {
  StartServer(/*require_client_cert=*/false);
  TlsFiles other;
  other.ca_file = F("other_ca.pem");
  absl::Status s = Call(other);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  // System roots only.
  GrpcSecurity sys;
  sys.token = kToken;
  auto stub = proto::Server::NewStub(grpc::CreateChannel(
      address_, grpc::SslCredentials(grpc::SslCredentialsOptions())));
  grpc::ClientContext ctx;
  ctx.AddMetadata(kTokenHeader, kToken);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  proto::ServerStatus st;
  EXPECT_EQ(stub->GetStatus(&ctx, proto::ServerStatusRequest(), &st)
                .error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TlsTest, PlaintextClientIsRefused) {
  StartServer(/*require_client_cert=*/false);
  absl::Status s = Call(TlsFiles());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

TEST_F(TlsTest, MutualTlsRefusesAClientWithoutACertificate) {
  StartServer(/*require_client_cert=*/true);
  TlsFiles no_cert;
  no_cert.ca_file = F("ca.pem");
  absl::Status s = Call(no_cert);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  // A certificate from another CA is refused too.
  TlsFiles foreign = no_cert;
  foreign.cert_file = F("other_ca.pem");
  foreign.key_file = F("other_ca.key");
  s = Call(foreign);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  TlsFiles with_cert = no_cert;
  with_cert.cert_file = F("client.pem");
  with_cert.key_file = F("client.key");
  EXPECT_TRUE(Call(with_cert).ok());
}

TEST_F(TlsTest, TokenIsStillCheckedOverTls) {
  StartServer(/*require_client_cert=*/false);
  GrpcSecurity s;
  s.token = "wrong";
  s.tls.ca_file = F("ca.pem");
  GrpcClientFactory f(GrpcClientFactory::Options(s, 1));
  EXPECT_EQ(f.Server(address_)
                ->GetStatus(absl::Now() + absl::Seconds(5))
                .status()
                .code(),
            absl::StatusCode::kUnauthenticated);
}

TEST_F(TlsTest, UnreadableCertificateIsInvalidArgument) {
  GrpcSecurity s;
  s.tls.cert_file = F("missing.pem");
  s.tls.key_file = F("server.key");
  EXPECT_EQ(MakeServerCredentials(s).status().code(),
            absl::StatusCode::kInvalidArgument);
  s.tls = TlsFiles();
  s.tls.ca_file = F("missing.pem");
  EXPECT_EQ(MakeChannelCredentials(s).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A whole job over mutual TLS: ps_launch passes the certificate files to
// every process; a9a trains and the report says so.
TEST_F(TlsTest, A9aJobTrainsOverMutualTls) {
  std::string data = PS_SOURCE_DIR "/../shared/data/a9a";
  if (const char* d = std::getenv("PS_SHARED_DATA")) {
    data = absl::StrCat(d, "/a9a");
  }
  if (!fs::exists(data + "/a9a.train")) {
    GTEST_SKIP() << "a9a not found under " << data
                 << " (set PS_SHARED_DATA to the shared data folder)";
  }
  const std::string report = F("report.json");
  const std::string log = F("launch.log");
  std::string cmd = absl::StrCat(
      PS_BIN_DIR "/ps_launch --config " PS_SOURCE_DIR
                 "/deploy/configs/a9a.yaml --run-dir ",
      F("run"), " --report ", report, " --timeout_s 150",
      " --set data.train=", data, "/a9a.train", " --set data.test=", data,
      "/a9a.test", " --set output.model_dir=", F("model"),
      " --set cluster.tls.cert_file=", F("server.pem"),
      " --set cluster.tls.key_file=", F("server.key"),
      " --set cluster.tls.ca_file=", F("ca.pem"),
      " --set cluster.tls.require_client_cert=true", " > ", log, " 2>&1");
  const bool ok = Sh(cmd);
  std::ifstream in(report);
  std::stringstream ss;
  ss << in.rdbuf();
  std::ifstream lin(log);
  std::stringstream ls;
  ls << lin.rdbuf();
  ASSERT_TRUE(ok) << "ps_launch failed:\n" << ls.str().substr(0, 4000);
  EXPECT_TRUE(absl::StrContains(ss.str(), "auc")) << ss.str();
}

// ---- Authentication helpers ----

TEST(AuthTest, NoTokenRefusesANonLoopbackAddressUnlessInsecure) {
  GrpcSecurity none;
  EXPECT_EQ(CheckBindAllowed("0.0.0.0", none, /*insecure=*/false).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CheckBindAllowed("10.1.2.3", none, false).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(CheckBindAllowed("0.0.0.0", none, /*insecure=*/true).ok());
  EXPECT_TRUE(CheckBindAllowed("127.0.0.1", none, false).ok());  // warns
  EXPECT_TRUE(CheckBindAllowed("localhost", none, false).ok());
  EXPECT_TRUE(CheckBindAllowed("::1", none, false).ok());
  GrpcSecurity with_token;
  with_token.token = "t";
  EXPECT_TRUE(CheckBindAllowed("0.0.0.0", with_token, false).ok());
}

TEST(AuthTest, ConstantTimeEquals) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "ab"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

TEST(AuthTest, SecurityEnvRoundTrips) {
  GrpcSecurity s;
  s.token = "tok";
  s.max_message_mb = 12;
  s.tls.cert_file = "/c.pem";
  s.tls.key_file = "/k.pem";
  s.tls.ca_file = "/ca.pem";
  s.tls.require_client_cert = true;
  std::vector<std::string> env = SecurityEnv(s);
  std::vector<std::string> names;
  for (const std::string& e : env) {
    const size_t eq = e.find('=');
    names.push_back(e.substr(0, eq));
    ASSERT_EQ(setenv(names.back().c_str(), e.substr(eq + 1).c_str(), 1), 0);
  }
  auto back = SecurityFromEnv(GrpcSecurity());
  for (const std::string& n : names) unsetenv(n.c_str());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->token, "tok");
  EXPECT_EQ(back->max_message_mb, 12);
  EXPECT_EQ(back->tls.cert_file, "/c.pem");
  EXPECT_EQ(back->tls.key_file, "/k.pem");
  EXPECT_EQ(back->tls.ca_file, "/ca.pem");
  EXPECT_TRUE(back->tls.require_client_cert);
  ASSERT_EQ(setenv("PS_MAX_MESSAGE_MB", "lots", 1), 0);
  EXPECT_EQ(SecurityFromEnv(GrpcSecurity()).status().code(),
            absl::StatusCode::kInvalidArgument);
  unsetenv("PS_MAX_MESSAGE_MB");
}

}  // namespace
}  // namespace ps
