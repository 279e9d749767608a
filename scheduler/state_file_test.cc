// StateFile: the scheduler's two-slot state file. The newest intact slot
// wins; a torn or damaged newest slot leaves the previous state; a file
// with no intact slot, or of another format, is DATA_LOSS naming it.
#include "scheduler/state_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

class StateFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (std::filesystem::path(::testing::TempDir()) /
             absl::StrCat("state_file_test_", getpid()))
                .string();
    std::filesystem::remove(path_);
  }
  void TearDown() override { std::filesystem::remove(path_); }

  std::string Contents() const {
    std::ifstream in(path_, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  void Overwrite(const std::string& bytes) const {
    std::ofstream(path_, std::ios::binary | std::ios::trunc) << bytes;
  }
  // Flips one byte of slot `slot`'s payload.
  void Damage(int slot) const {
    std::string f = Contents();
    const size_t at = StateFile::kHeaderBytes +
                      slot * StateFile::kMinCapacity +
                      StateFile::kSlotHeaderBytes + 1;
    ASSERT_LT(at, f.size());
    f[at] ^= 0x40;
    Overwrite(f);
  }

  std::string path_;
};

TEST_F(StateFileTest, ReadsTheNewestWrite) {
  EXPECT_EQ(StateFile::Read(path_).status().code(),
            absl::StatusCode::kNotFound);
  StateFile f(path_);
  for (int i = 0; i < 5; ++i) {
    const std::string state = absl::StrCat("state ", i, std::string(i, 'x'));
    ASSERT_TRUE(f.Write(state, /*sync=*/i == 0).ok());
    absl::StatusOr<std::string> got = StateFile::Read(path_);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, state);
  }
  // Shorter states than the slot held before are read at their length.
  ASSERT_TRUE(f.Write("s", false).ok());
  EXPECT_EQ(*StateFile::Read(path_), "s");
}

TEST_F(StateFileTest, ADamagedNewestSlotLeavesThePreviousState) {
  StateFile f(path_);
  ASSERT_TRUE(f.Write("first", false).ok());   // slot 0
  ASSERT_TRUE(f.Write("second", false).ok());  // slot 1
  Damage(1);
  absl::StatusOr<std::string> got = StateFile::Read(path_);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "first");
  Damage(0);
  got = StateFile::Read(path_);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(got.status().message().find(path_), std::string::npos)
      << got.status();
}

TEST_F(StateFileTest, ATruncatedFileKeepsItsIntactSlot) {
  StateFile f(path_);
  ASSERT_TRUE(f.Write("first", false).ok());
  ASSERT_TRUE(f.Write("second", false).ok());
  ASSERT_TRUE(f.Write("third", false).ok());  // slot 0 again
  // Cut inside slot 1's payload: slot 0 ("third") is what is left.
  const std::string whole = Contents();
  Overwrite(whole.substr(0, StateFile::kHeaderBytes + StateFile::kMinCapacity +
                                StateFile::kSlotHeaderBytes + 2));
  EXPECT_EQ(*StateFile::Read(path_), "third");
  Overwrite(whole.substr(0, StateFile::kHeaderBytes + 3));
  EXPECT_EQ(StateFile::Read(path_).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST_F(StateFileTest, AStateThatOutgrowsTheSlotsMakesANewFile) {
  StateFile f(path_);
  ASSERT_TRUE(f.Write("small", false).ok());
  const std::string big(3 * StateFile::kMinCapacity, 'b');
  ASSERT_TRUE(f.Write(big, true).ok());
  EXPECT_EQ(*StateFile::Read(path_), big);
  ASSERT_TRUE(f.Write(big + "c", false).ok());  // in place again
  EXPECT_EQ(*StateFile::Read(path_), big + "c");
  EXPECT_FALSE(std::filesystem::exists(path_ + ".tmp"));
}

// The descriptor the scheduler syncs outside its lock is of the file the
// writes go to: the one at the path, also after the file was made anew.
TEST_F(StateFileTest, DupForSyncIsOfTheFileWrittenTo) {
  StateFile f(path_);
  EXPECT_EQ(f.DupForSync(), -1);  // nothing written yet
  auto same_file = [&](int fd) {
    struct stat a, b;
    const bool same = fd >= 0 && ::fstat(fd, &a) == 0 &&
                      ::stat(path_.c_str(), &b) == 0 && a.st_ino == b.st_ino &&
                      a.st_dev == b.st_dev;
    if (fd >= 0) ::close(fd);
    return same;
  };
  ASSERT_TRUE(f.Write("small", false).ok());
  EXPECT_TRUE(same_file(f.DupForSync()));
  ASSERT_TRUE(f.Write(std::string(3 * StateFile::kMinCapacity, 'b'), false)
                  .ok());  // a new file, renamed over the old one
  const int fd = f.DupForSync();
  EXPECT_EQ(::fdatasync(fd), 0);
  EXPECT_TRUE(same_file(fd));
}

TEST_F(StateFileTest, AnUnreadableFileIsNotTakenForNoState) {
  // A name that cannot be opened though something is there (a symlink to
  // itself: ELOOP; the tests run as root, so modes would not stop a read).
  std::filesystem::create_symlink(path_, path_);
  absl::StatusOr<std::string> got = StateFile::Read(path_);
  std::filesystem::remove(path_);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
  // A folder where the file should be is no state file either.
  std::filesystem::create_directory(path_);
  got = StateFile::Read(path_);
  std::filesystem::remove(path_);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
}

TEST_F(StateFileTest, OtherFilesAreRefused) {
  Overwrite("not a state");
  absl::StatusOr<std::string> got = StateFile::Read(path_);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(got.status().message().find("not a version 2"),
            std::string::npos)
      << got.status();
  // A header whose slot capacity points past the file.
  std::string f(StateFile::kHeaderBytes, '\0');
  f.replace(0, 8, "PSSCHST2");
  f[15] = 0x7f;
  Overwrite(f);
  EXPECT_EQ(StateFile::Read(path_).status().code(),
            absl::StatusCode::kDataLoss);
  // A file written before by someone else is replaced by the first write.
  StateFile w(path_);
  ASSERT_TRUE(w.Write("mine", false).ok());
  EXPECT_EQ(*StateFile::Read(path_), "mine");
}

}  // namespace
}  // namespace ps
