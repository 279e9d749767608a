// Fuzz target for the config loader (common/config.h). Input: YAML text,
// then optional "\n@section.field=value" overrides. Checks, besides "no
// crash": an error is INVALID_ARGUMENT; ParseJobConfig(ToYaml(c)) == c for
// every accepted config (the header's promise), also after each accepted
// override; a rejected override leaves the config unchanged.
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/strings/str_split.h"
#include "common/config.h"
#include "fuzz/fuzz_util.h"

namespace ps::fuzz {
namespace {

void CheckRoundTrip(const JobConfig& c) {
  const std::string yaml = ToYaml(c);
  auto again = ParseJobConfig(yaml);
  if (!again.ok()) {
    std::fprintf(stderr, "ToYaml output rejected: %s\n%s\n",
                 again.status().ToString().c_str(), yaml.c_str());
  }
  PS_FUZZ_CHECK(again.ok());
  PS_FUZZ_CHECK(*again == c);
}

}  // namespace

int Config(const uint8_t* data, size_t size) {
  absl::string_view in(reinterpret_cast<const char*>(data), size);
  std::vector<absl::string_view> parts =
      absl::StrSplit(in, absl::ByString("\n@"));
  auto parsed = ParseJobConfig(std::string(parts[0]));
  if (!parsed.ok()) {
    PS_FUZZ_CHECK(parsed.status().code() ==
                  absl::StatusCode::kInvalidArgument);
    return 0;
  }
  JobConfig c = *parsed;
  CheckRoundTrip(c);
  (void)Validate(c);
  for (size_t i = 1; i < parts.size(); ++i) {
    const JobConfig before = c;
    absl::Status s = ApplyOverride(&c, std::string(parts[i]));
    if (!s.ok()) {
      PS_FUZZ_CHECK(s.code() == absl::StatusCode::kInvalidArgument);
      PS_FUZZ_CHECK(c == before);
      continue;
    }
    CheckRoundTrip(c);
    (void)Validate(c);
  }
  return 0;
}

}  // namespace ps::fuzz
