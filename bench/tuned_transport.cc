#include "bench/tuned_transport.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "transport/grpc_transport.h"

namespace ps::bench {

absl::StatusOr<std::vector<GrpcArg>> ParseGrpcArgs(const std::string& spec) {
  std::vector<GrpcArg> out;
  for (absl::string_view part : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    const size_t eq = part.find('=');
    if (eq == absl::string_view::npos || eq == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("grpc arg \"", part, "\": expected name=value"));
    }
    out.push_back(
        {std::string(part.substr(0, eq)), std::string(part.substr(eq + 1))});
  }
  return out;
}

}  // namespace ps::bench
