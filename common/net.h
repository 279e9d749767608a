#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace ps {

// Asks the kernel for a free TCP port on `host` (binds port 0, reads it,
// closes). Racy by nature; callers retry on bind failure.
absl::StatusOr<int> PickFreePort(const std::string& host = "127.0.0.1");

// A port free on `host` now, drawn at random below the kernel's ephemeral
// range (net.ipv4.ip_local_port_range), so that no outgoing connection and
// no bind to port 0 can take it before the process it is meant for binds
// it (a port from PickFreePort can be: CI once saw a worker's metrics port
// taken that way). Falls back to PickFreePort when the range leaves no
// room below it (its low end under 2048) or 64 draws find none free.
absl::StatusOr<int> PickPortBelowEphemeral(const std::string& host = "127.0.0.1");

// A port for a child process to listen on, held by this process until it
// exits: PickPortBelowEphemeral, then bound here with SO_REUSEADDR and not
// listened on. Any bind without SO_REUSEADDR fails on it (so another
// launcher's PickPortBelowEphemeral never returns it: two concurrent
// launchers once handed the same port to two nodes, and the second could
// not listen), while the child it is meant for, which binds with
// SO_REUSEADDR (gRPC and the metrics endpoint do), binds and listens on
// it; a bound socket that does not listen takes no connection. Once the
// child listens, a second listener fails as without the hold. The socket
// is close-on-exec: no child inherits it.
absl::StatusOr<int> ReservePortBelowEphemeral(
    const std::string& host = "127.0.0.1");

// Splits "host:port"; INVALID_ARGUMENT when malformed.
absl::Status SplitHostPort(const std::string& address, std::string* host,
                           int* port);

}  // namespace ps
