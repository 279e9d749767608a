#include "common/job_report.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"

namespace ps {

std::string JobReportJson(const proto::JobReport& report) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  options.add_whitespace = true;
  std::string json;
  // Printing fails only for a message that does not match its descriptor;
  // JobReport is compiled in, so the status carries nothing to act on.
  (void)google::protobuf::util::MessageToJsonString(report, &json, options);
  return json;  // add_whitespace ends the text with a newline
}

absl::StatusOr<proto::JobReport> ParseJobReport(std::string_view json) {
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  proto::JobReport report;
  const auto status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &report,
      options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a job report: ", status.message().as_string()));
  }
  return report;
}

absl::StatusOr<proto::JobReport> ReadJobReport(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<proto::JobReport> report = ParseJobReport(text.str());
  if (!report.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", report.status().message()));
  }
  return report;
}

}  // namespace ps
