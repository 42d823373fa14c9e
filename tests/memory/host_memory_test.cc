// HostAvailableBytes (worker/memory/host_memory.h) on files laid out as the kernel lays them out:
// MemAvailable alone, a cgroup v2 limit with page cache in its usage, a tighter limit on a parent
// cgroup, a v1 memory controller, and nothing readable.
#include "worker/memory/host_memory.h"

#include <string>

#include <gtest/gtest.h>

#include "common/posix_files.h"
#include "tests/util/temp_dir.h"

namespace qlora::worker {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

class HostMemoryTest : public ::testing::Test {
 protected:
  HostMemoryTest() {
    files_.meminfo = dir_.path() + "/meminfo";
    files_.self_cgroup = dir_.path() + "/cgroup";
    files_.cgroup_root = dir_.path() + "/sys";
    Write("meminfo", "MemTotal:       131072000 kB\nMemAvailable:   104857600 kB\n");  // 100 GiB
  }

  // Writes `text` to `relative` under the folder, making its folders.
  void Write(const std::string& relative, const std::string& text) {
    const std::string path = JoinPath(dir_.path(), relative);
    ASSERT_TRUE(MakeDirs(path.substr(0, path.rfind('/'))).ok()) << path;
    ASSERT_TRUE(WriteFileAtomically(path, text).ok()) << path;
  }

  testing::TempDir dir_;
  memory::HostMemoryFiles files_;
};

TEST_F(HostMemoryTest, MemAvailableWithoutAMemoryLimit) {
  Write("cgroup", "0::/\n");
  Write("sys/memory.current", "123\n");  // the root: no memory.max
  EXPECT_EQ(memory::HostAvailableBytes(files_), 100 * kGiB);
}

TEST_F(HostMemoryTest, AV2LimitLessItsUsageNotCountingInactivePageCache) {
  Write("cgroup", "0::/kubepods/pod1\n");
  Write("sys/kubepods/pod1/memory.max", std::to_string(10 * kGiB) + "\n");
  Write("sys/kubepods/pod1/memory.current", std::to_string(6 * kGiB) + "\n");
  Write("sys/kubepods/pod1/memory.stat",
        "anon 1000\nfile 3000\nactive_file 1000\ninactive_file " + std::to_string(2 * kGiB) + "\n");
  Write("sys/kubepods/memory.max", "max\n");
  Write("sys/kubepods/memory.current", std::to_string(50 * kGiB) + "\n");
  EXPECT_EQ(memory::HostAvailableBytes(files_), 6 * kGiB);  // 10 - (6 - 2)
}

TEST_F(HostMemoryTest, ATighterLimitAboveTheProcessesCgroupCounts) {
  Write("cgroup", "0::/job/step\n");
  Write("sys/job/memory.max", std::to_string(8 * kGiB) + "\n");
  Write("sys/job/memory.current", std::to_string(7 * kGiB) + "\n");
  Write("sys/job/step/memory.max", "max\n");
  Write("sys/job/step/memory.current", std::to_string(kGiB) + "\n");
  EXPECT_EQ(memory::HostAvailableBytes(files_), kGiB);
  // Over the limit (usage above it): nothing left, not a negative figure.
  Write("sys/job/memory.current", std::to_string(9 * kGiB) + "\n");
  EXPECT_EQ(memory::HostAvailableBytes(files_), 0);
}

TEST_F(HostMemoryTest, AV1MemoryController) {
  Write("cgroup", "12:pids:/k\n4:cpu,memory:/k\n1:name=systemd:/k\n");
  Write("sys/memory/k/memory.limit_in_bytes", std::to_string(16 * kGiB) + "\n");
  Write("sys/memory/k/memory.usage_in_bytes", std::to_string(4 * kGiB) + "\n");
  Write("sys/memory/k/memory.stat", "cache 5\ntotal_inactive_file " + std::to_string(kGiB) + "\n");
  Write("sys/memory/memory.limit_in_bytes", "9223372036854771712\n");  // v1's "no limit"
  Write("sys/memory/memory.usage_in_bytes", std::to_string(60 * kGiB) + "\n");
  EXPECT_EQ(memory::HostAvailableBytes(files_), 13 * kGiB);  // 16 - (4 - 1)
}

TEST_F(HostMemoryTest, NothingReadableIsZero) {
  memory::HostMemoryFiles nowhere;
  nowhere.meminfo = dir_.path() + "/none";
  nowhere.self_cgroup = dir_.path() + "/none";
  nowhere.cgroup_root = dir_.path() + "/none";
  EXPECT_EQ(memory::HostAvailableBytes(nowhere), 0);
  EXPECT_GT(memory::HostAvailableBytes(), 0);  // this machine's
}

}  // namespace
}  // namespace qlora::worker
