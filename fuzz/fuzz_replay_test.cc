// Replays every seed and every saved crash input of the fuzz targets in the
// normal build: fuzz/corpus/<target>/* and fuzz/regressions/<target>/*. A
// crash the fuzzer once found stays a test here (named after the file), so
// CI checks it without clang or libFuzzer.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/config.h"
#include "fuzz/fuzz_util.h"
#include "gtest/gtest.h"

namespace ps::fuzz {
namespace {

namespace fs = std::filesystem;

// The inputs of `target` under fuzz/corpus and fuzz/regressions.
std::vector<fs::path> Inputs(const std::string& target) {
  std::vector<fs::path> out;
  for (const char* kind : {"corpus", "regressions"}) {
    fs::path dir = fs::path(PS_FUZZ_DIR) / kind / target;
    if (!fs::is_directory(dir)) continue;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.is_regular_file()) out.push_back(e.path());
    }
  }
  return out;
}

void Replay(const std::string& target, int (*fn)(const uint8_t*, size_t)) {
  std::vector<fs::path> inputs = Inputs(target);
  ASSERT_FALSE(inputs.empty()) << "no seeds for " << target;
  for (const fs::path& p : inputs) {
    SCOPED_TRACE(p.string());
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string bytes = ss.str();
    EXPECT_EQ(fn(reinterpret_cast<const uint8_t*>(bytes.data()),
                 bytes.size()),
              0);
  }
}

TEST(FuzzReplay, Libsvm) { Replay("libsvm", &Libsvm); }
TEST(FuzzReplay, Criteo) { Replay("criteo", &Criteo); }
TEST(FuzzReplay, Config) { Replay("config", &Config); }
TEST(FuzzReplay, Server) { Replay("server", &Server); }
TEST(FuzzReplay, Scheduler) { Replay("scheduler", &Scheduler); }
TEST(FuzzReplay, Wire) { Replay("wire", &Wire); }
TEST(FuzzReplay, DataPlane) { Replay("dataplane", &DataPlane); }
TEST(FuzzReplay, Files) { Replay("files", &Files); }
TEST(FuzzReplay, Replica) { Replay("replica", &Replica); }

// Found by fuzz_config: a path with a byte that is not UTF-8 was accepted,
// and ToYaml (the config sent to every worker) replaced it with U+FFFD, so
// workers read a different path than the one configured.
TEST(FuzzRegression, ConfigNonUtf8StringRejected) {
  auto c = ParseJobConfig("data:\n  train: ../sha\xf2" "ed/a9a.train\n");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  JobConfig config;
  EXPECT_EQ(ApplyOverride(&config, "data.test=a\xc0\xaf" "b").code(),
            absl::StatusCode::kInvalidArgument);  // overlong '/'
  EXPECT_EQ(ApplyOverride(&config, "data.test=\xed\xa0\x80").code(),
            absl::StatusCode::kInvalidArgument);  // a surrogate
  EXPECT_TRUE(ApplyOverride(&config, "data.test=caf\xc3\xa9/\xf0\x9f\x98\x80")
                  .ok());
  EXPECT_EQ(config.data.test, "caf\xc3\xa9/\xf0\x9f\x98\x80");
}

}  // namespace
}  // namespace ps::fuzz
