// Runs a parameter-server process: serves gRPC on a free port, registers
// with the scheduler, installs the cluster view, heartbeats, and returns
// once the scheduler has had it write its model (or the job ended).
#pragma once

#include <string>

#include "absl/status/status.h"

namespace ps {

struct ServerRunOptions {
  std::string scheduler;  // host:port
  int requested_id = -1;
  std::string bind_host;  // empty: $PS_BIND_HOST, else 127.0.0.1
  int port = 0;  // 0: any free port
  std::string advertise_host;  // empty: bind_host
  int register_timeout_ms = 60000;
  // Listen on a non-loopback address without a token (CheckBindAllowed).
  bool insecure = false;
};

absl::Status RunServer(const ServerRunOptions& options);

}  // namespace ps
