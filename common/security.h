// The transport security settings of a job config (cluster.auth_token,
// cluster.max_message_mb, cluster.tls). Processes that get no config before
// they connect (servers, workers) read the same settings from the
// environment the launcher sets (SecurityFromEnv, transport/grpc_transport.h).
#pragma once

#include "common/config.h"
#include "transport/grpc_transport.h"

namespace ps {

inline GrpcSecurity SecurityFromConfig(const JobConfig& c) {
  GrpcSecurity s;
  s.token = c.cluster.auth_token;
  s.max_message_mb = c.cluster.max_message_mb;
  s.tls.cert_file = c.cluster.tls.cert_file;
  s.tls.key_file = c.cluster.tls.key_file;
  s.tls.ca_file = c.cluster.tls.ca_file;
  s.tls.require_client_cert = c.cluster.tls.require_client_cert;
  return s;
}

}  // namespace ps
