// StateDirLock: one holder per state folder; the refusal names the folder and the holder's pid.
#include "coordinator/store/state_lock.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/test_util.h"

namespace qlora::coordinator {
namespace {

using ::testing::HasSubstr;
using testing::ReadFile;
using testing::TempDir;

TEST(CoordinatorStateLockTest, SecondHolderIsRefusedNamingTheFolderAndThePid) {
  TempDir dir;
  absl::StatusOr<StateDirLock> first = StateDirLock::Acquire(dir.path());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(ReadFile(StateDirLock::LockPath(dir.path())), absl::StrCat(getpid(), "\n"));

  // flock is per open file: a second open in this process conflicts like another process.
  absl::StatusOr<StateDirLock> second = StateDirLock::Acquire(dir.path());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr(absl::StrCat("pid ", getpid())));
  EXPECT_THAT(second.status().message(), HasSubstr(dir.path()));

  { StateDirLock released = std::move(*first); }
  EXPECT_TRUE(StateDirLock::Acquire(dir.path()).ok());  // free once the holder lets go
}

TEST(CoordinatorStateLockTest, LockFileThatIsNotARegularFileIsRefusedWithoutBlocking) {
  TempDir dir;
  ASSERT_EQ(mkfifo(StateDirLock::LockPath(dir.path()).c_str(), 0644), 0);
  absl::StatusOr<StateDirLock> lock = StateDirLock::Acquire(dir.path());
  EXPECT_EQ(lock.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(lock.status().message(), HasSubstr("not a regular file"));
}

}  // namespace
}  // namespace qlora::coordinator
