// AtomicFileWriter / WriteFileAtomically: a reader sees the old file or the whole new one; a
// failed write (here a full file-size limit, as a full disk would) names the errno, leaves the
// old file as it was and no temporary file behind.
#include "common/atomic_file.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/posix_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/files.h"
#include "tests/util/temp_dir.h"

namespace qlora {
namespace {

TEST(CommonAtomicFileTest, CommitReplacesTheFileWhole) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/f.json";
  ASSERT_TRUE(WriteFileAtomically(path, "old").ok());
  {
    AtomicFileWriter writer(path);
    writer.Append("new ");
    writer.Append("contents");
    EXPECT_EQ(testing::ReadFile(path), "old") << "nothing shows before the commit";
    ASSERT_TRUE(writer.Commit().ok());
  }
  EXPECT_EQ(testing::ReadFile(path), "new contents");
  EXPECT_FALSE(PathExists(path + ".tmp"));
}

TEST(CommonAtomicFileTest, AnAbandonedWriteLeavesTheOldFileAndNoTemporary) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/f.json";
  ASSERT_TRUE(WriteFileAtomically(path, "old").ok());
  {
    AtomicFileWriter writer(path);
    writer.Append("half");
  }  // an early return: never committed
  EXPECT_EQ(testing::ReadFile(path), "old");
  EXPECT_FALSE(PathExists(path + ".tmp"));
}

TEST(CommonAtomicFileTest, MissingFolderIsNamed) {
  const absl::Status s = WriteFileAtomically("/nonexistent-folder/f", "x");
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("ENOENT"));
}

// In a child process (the limit applies to the whole process): files may grow to 1 KiB only,
// and SIGXFSZ is ignored so the write fails with EFBIG, as it would with ENOSPC on a full disk.
TEST(CommonAtomicFileTest, AFailedWriteIsNamedAndLeavesNothingBehind) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/big.bin";
  ASSERT_TRUE(WriteFileAtomically(path, "old").ok());
  const pid_t child = fork();
  if (child == 0) {
    signal(SIGXFSZ, SIG_IGN);
    rlimit limit{1024, 1024};
    setrlimit(RLIMIT_FSIZE, &limit);
    const absl::Status s = WriteFileAtomically(path, std::string(1 << 20, 'x'));
    const bool named = s.code() == absl::StatusCode::kResourceExhausted &&
                       std::string(s.message()).find("EFBIG") != std::string::npos;
    _exit(named ? 0 : 1);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the failure did not name EFBIG as RESOURCE_EXHAUSTED";
  EXPECT_EQ(testing::ReadFile(path), "old");
  EXPECT_FALSE(PathExists(path + ".tmp"));
}

TEST(CommonAtomicFileTest, FileErrorCodes) {
  EXPECT_EQ(FileError("cannot write", "/x", ENOSPC).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(FileError("cannot write", "/x", ENOSPC).message()),
              ::testing::HasSubstr("ENOSPC: No space left on device"));
  EXPECT_EQ(FileError("cannot write", "/x", EROFS).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(FileError("cannot write", "/x", EIO).code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace qlora
