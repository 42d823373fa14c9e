// The worker's Landlock confinement (worker/service/file_confinement.h), in forked children (it
// cannot be undone): reads beneath the read root pass and nothing else of the user's does, a link
// planted in the root that leads out is refused at open, writes go only beneath the output
// folder, and an output folder swapped for a link to elsewhere is refused too; the process's
// threads may name themselves under /proc (the CUDA driver needs it).
#include "worker/service/file_confinement.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>

#include "gtest/gtest.h"
#include "tests/util/files.h"
#include "tests/util/temp_dir.h"

namespace qlora::worker {
namespace {

namespace fs = std::filesystem;

// 0 when open(path, flags) fails with EACCES, 1 when it succeeds, 2 on another error.
int OpenOutcome(const std::string& path, int flags) {
  const int fd = open(path.c_str(), flags | O_CLOEXEC, 0600);
  if (fd >= 0) {
    close(fd);
    return 1;
  }
  return errno == EACCES ? 0 : 2;
}

TEST(WorkerFileConfinement, HoldsAtTheMomentOfUse) {
  testing::TempDir dir;
  const std::string root = dir.path() + "/root", out = dir.path() + "/out",
                    outside = dir.path() + "/outside";
  testing::WriteFile(root + "/data.jsonl", "{}\n");
  testing::WriteFile(outside + "/secret.txt", "secret\n");
  fs::create_directories(out);
  fs::create_symlink(outside + "/secret.txt", root + "/link.jsonl");  // planted after submit
  fs::create_symlink(outside, out + "/checkpoints");                 // a folder swapped for a link

  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    FileConfinement c;
    c.read_beneath = {root};
    c.write_beneath = {out};
    const absl::Status confined = ConfineFiles(c);
    if (absl::IsUnimplemented(confined)) _exit(99);
    if (!confined.ok()) _exit(98);
    // Each check sets one bit when it goes the wrong way.
    int wrong = 0;
    wrong |= (OpenOutcome(root + "/data.jsonl", O_RDONLY) != 1) << 0;
    wrong |= (OpenOutcome(outside + "/secret.txt", O_RDONLY) != 0) << 1;
    wrong |= (OpenOutcome(root + "/link.jsonl", O_RDONLY) != 0) << 2;
    wrong |= (OpenOutcome(out + "/adapter.bin", O_WRONLY | O_CREAT) != 1) << 3;
    wrong |= (OpenOutcome(root + "/written.bin", O_WRONLY | O_CREAT) != 0) << 4;
    wrong |= (OpenOutcome(out + "/checkpoints/step-1.bin", O_WRONLY | O_CREAT) != 0) << 5;
    wrong |= (OpenOutcome("/proc/self/status", O_RDONLY) != 1) << 6;
    wrong |= (OpenOutcome("/dev/null", O_RDWR) != 1) << 7;
    _exit(wrong);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 99) GTEST_SKIP() << "this kernel has no Landlock";
  ASSERT_NE(WEXITSTATUS(status), 98) << "the confinement could not be set up";
  const int wrong = WEXITSTATUS(status);
  EXPECT_FALSE(wrong & 1) << "a file beneath the read root could not be read";
  EXPECT_FALSE(wrong & 2) << "a file outside the roots was read";
  EXPECT_FALSE(wrong & 4) << "a link in the read root led out";
  EXPECT_FALSE(wrong & 8) << "the output folder could not be written";
  EXPECT_FALSE(wrong & 16) << "the read root was written";
  EXPECT_FALSE(wrong & 32) << "an output folder swapped for a link led the write out";
  EXPECT_FALSE(wrong & 64) << "/proc could not be read";
  EXPECT_FALSE(wrong & 128) << "/dev/null could not be opened";
  EXPECT_FALSE(fs::exists(outside + "/step-1.bin"));
}

// Without read roots only writes are confined: a worker may still read anywhere.
TEST(WorkerFileConfinement, WithoutReadRootsOnlyWritesAreConfined) {
  testing::TempDir dir;
  const std::string out = dir.path() + "/out", other = dir.path() + "/other";
  fs::create_directories(out);
  testing::WriteFile(other + "/file.txt", "x\n");
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    FileConfinement c;
    c.write_beneath = {out};
    const absl::Status confined = ConfineFiles(c);
    if (absl::IsUnimplemented(confined)) _exit(99);
    if (!confined.ok()) _exit(98);
    int wrong = 0;
    wrong |= (OpenOutcome(other + "/file.txt", O_RDONLY) != 1) << 0;
    wrong |= (OpenOutcome(other + "/new.txt", O_WRONLY | O_CREAT) != 0) << 1;
    wrong |= (OpenOutcome(out + "/new.txt", O_WRONLY | O_CREAT) != 1) << 2;
    // A thread of this process names itself (the CUDA driver does; cuInit fails with error 304
    // when it cannot), and other /proc files stay read-only.
    wrong |= (OpenOutcome("/proc/thread-self/comm", O_WRONLY | O_TRUNC) != 1) << 3;
    wrong |= (OpenOutcome("/proc/self/oom_score_adj", O_WRONLY) != 0) << 4;
    _exit(wrong);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 99) GTEST_SKIP() << "this kernel has no Landlock";
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace qlora::worker
