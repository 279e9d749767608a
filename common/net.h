#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace ps {

// Asks the kernel for a free TCP port on `host` (binds port 0, reads it,
// closes). Racy by nature; callers retry on bind failure.
absl::StatusOr<int> PickFreePort(const std::string& host = "127.0.0.1");

// Splits "host:port"; INVALID_ARGUMENT when malformed.
absl::Status SplitHostPort(const std::string& address, std::string* host,
                           int* port);

}  // namespace ps
