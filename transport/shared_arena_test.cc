#include "transport/shared_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(SharedArena, SlotsAreLowestFirstAndFreedRunsMerge) {
  auto a = SharedArena::Create(16 * kArenaPage);
  ASSERT_TRUE(a.ok()) << a.status();
  SharedArena& arena = **a;
  EXPECT_EQ(arena.free_pages(), 16u);
  EXPECT_EQ(arena.Allocate(1), 0u);                  // 1 page
  EXPECT_EQ(arena.Allocate(kArenaPage + 1), 1u);     // 2 pages
  EXPECT_EQ(arena.Allocate(5 * kArenaPage), 3u);     // 5 pages
  EXPECT_EQ(arena.free_pages(), 8u);
  EXPECT_FALSE(arena.Allocate(9 * kArenaPage).has_value());
  EXPECT_FALSE(arena.Allocate(0).has_value());
  EXPECT_FALSE(arena.Allocate(17 * kArenaPage).has_value());
  // Freeing the middle run, then the first: one run of 3 pages at 0.
  arena.Free(1, kArenaPage + 1);
  arena.Free(0, 1);
  EXPECT_EQ(arena.free_pages(), 11u);
  EXPECT_EQ(arena.Allocate(3 * kArenaPage), 0u);
  // The last run and its neighbour merge into the tail: 13 pages from 3.
  arena.Free(3, 5 * kArenaPage);
  EXPECT_EQ(arena.Allocate(13 * kArenaPage), 3u);
  EXPECT_EQ(arena.free_pages(), 0u);
  EXPECT_FALSE(arena.Allocate(1).has_value());
  arena.Free(0, 3 * kArenaPage);
  arena.Free(3, 13 * kArenaPage);
  EXPECT_EQ(arena.free_pages(), 16u);
  EXPECT_EQ(arena.Allocate(16 * kArenaPage), 0u);
}

TEST(SharedArena, BadSizesAreRefused) {
  EXPECT_EQ(SharedArena::Create(0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SharedArena::Create(kArenaPage + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SharedMapping, SeesTheArenasBytesAndChecksBounds) {
  auto a = SharedArena::Create(4 * kArenaPage);
  ASSERT_TRUE(a.ok()) << a.status();
  auto m = SharedMapping::Map(::dup((*a)->fd()), 4 * kArenaPage);
  ASSERT_TRUE(m.ok()) << m.status();
  std::memcpy((*a)->base() + kArenaPage, "hello", 5);
  char* at = (*m)->At(1, 5);
  ASSERT_NE(at, nullptr);
  EXPECT_EQ(std::memcmp(at, "hello", 5), 0);
  std::memcpy(at, "HELLO", 5);  // and the other way
  EXPECT_EQ(std::memcmp((*a)->base() + kArenaPage, "HELLO", 5), 0);
  EXPECT_NE((*m)->At(3, kArenaPage), nullptr);
  EXPECT_EQ((*m)->At(3, kArenaPage + 1), nullptr);
  EXPECT_EQ((*m)->At(4, 0), nullptr);
  EXPECT_EQ((*m)->At(uint64_t{1} << 62, 8), nullptr);
  EXPECT_EQ((*m)->At(0, ~uint64_t{0}), nullptr);
}

TEST(SharedMapping, RefusesWhatCouldShrinkOrIsTooLarge) {
  // Larger than allowed.
  auto a = SharedArena::Create(4 * kArenaPage);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(SharedMapping::Map(::dup((*a)->fd()), 3 * kArenaPage)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // A memfd without seals: its owner could truncate it under the server.
  int fd = ::memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, kArenaPage), 0);
  EXPECT_EQ(SharedMapping::Map(fd, kArenaPage).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Sealed, but of a size that is not whole pages.
  fd = ::memfd_create("odd", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 100), 0);
  ASSERT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  EXPECT_EQ(SharedMapping::Map(fd, kArenaPage).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Sealed against writing: the server could not answer into it.
  fd = ::memfd_create("ro", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, kArenaPage), 0);
  ASSERT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_WRITE), 0);
  EXPECT_EQ(SharedMapping::Map(fd, kArenaPage).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Not a memfd at all.
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  ::close(p[1]);
  EXPECT_EQ(SharedMapping::Map(p[0], kArenaPage).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps
