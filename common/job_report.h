// The job report (proto/report.proto) as the JSON text of the report file,
// and back. The text is protobuf's JSON mapping: proto field names, every
// primitive and repeated field printed even when zero or empty (an unset
// `optional` field or google.protobuf.Value is left out), indented one
// space per level, each key followed by ": ".
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "proto/report.pb.h"

namespace ps {

// `report` as JSON text ending in a newline. Never fails for a report the
// scheduler filled (every double finite, every string valid UTF-8); a
// string that is not valid UTF-8 loses its invalid bytes (protobuf logs
// an error).
std::string JobReportJson(const proto::JobReport& report);

// Parses report JSON. Keys this build does not know are ignored (a newer
// scheduler's report). INVALID_ARGUMENT when `json` is not a JSON object or
// a known key holds a value of the wrong type.
absl::StatusOr<proto::JobReport> ParseJobReport(std::string_view json);

// Reads and parses the report file at `path`. NOT_FOUND when it cannot be
// opened; INVALID_ARGUMENT (naming the path) as ParseJobReport, e.g. for a
// file that is still being written.
absl::StatusOr<proto::JobReport> ReadJobReport(const std::string& path);

}  // namespace ps
