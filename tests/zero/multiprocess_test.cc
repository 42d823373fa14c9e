// Two real processes (this binary re-executed as rank 0 and rank 1) train ZeRO stage 2 over Gloo,
// rendezvousing through a store on a temporary directory (test-only: the product's store is the
// coordinator's), and end with the weights one process reaches with the same global batch.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "tests/zero/synthetic_problem.h"
#include "tests/zero/temp_dir.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/strategy/partition_file.h"

extern char** environ;

namespace qlora {
namespace {

// Values are files named after the key; Get polls for the file (fine for a test, never for the
// product).
class DirectoryStore final : public comm::RendezvousStore {
 public:
  explicit DirectoryStore(std::string dir) : dir_(std::move(dir)) {}
  absl::Status Set(const std::string& key, const std::string& bytes) override {
    const std::string path = Path(key);
    std::ofstream(path + ".tmp", std::ios::binary) << bytes;
    if (std::rename((path + ".tmp").c_str(), path.c_str()) != 0) {
      return absl::InternalError("rename failed");
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      std::ifstream in(Path(key), std::ios::binary);
      if (in) {
        std::stringstream ss;
        ss << in.rdbuf();
        return ss.str();
      }
      if (absl::Now() >= deadline) return absl::DeadlineExceededError(key);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

 private:
  std::string Path(const std::string& key) const {
    return dir_ + "/" + absl::StrReplaceAll(key, {{"/", "%"}});
  }
  std::string dir_;
};

constexpr int kWorld = 2;
constexpr int kSteps = 5;

// The child: runs only when the parent test sets ZERO_CHILD_RANK.
TEST(ZeroMultiProcessChild, Rank) {
  const char* rank_env = std::getenv("ZERO_CHILD_RANK");
  const char* dir_env = std::getenv("ZERO_CHILD_DIR");
  if (rank_env == nullptr || dir_env == nullptr) GTEST_SKIP() << "run by ZeroMultiProcess only";
  const int rank = std::atoi(rank_env);
  const std::string dir = dir_env;
  comm::GlooOptions options;
  options.rank = rank;
  options.world_size = kWorld;
  options.prefix = "job/gen-0";
  options.connect_timeout = absl::Seconds(30);
  auto communicator = comm::ConnectGloo(options, std::make_shared<DirectoryStore>(dir));
  ASSERT_TRUE(communicator.ok()) << communicator.status();
  testing::SyntheticProblem p;
  strategy::StrategyOptions so;
  so.adamw = p.adamw;
  so.max_grad_norm = p.max_grad_norm;
  so.bucket_elements = 40;
  auto s = strategy::MakeStrategy(2, so, **communicator, p.MakeParams(rank));
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(testing::TrainSteps(p, **s, kWorld, rank, 0, kSteps).ok());
  std::vector<at::Tensor> flat;
  std::vector<strategy::NamedFloats> named;
  for (const auto& param : (*s)->params()) {
    flat.push_back(param.tensor.detach().reshape({-1}).contiguous());
    named.push_back({param.name, flat.back().data_ptr<float>(), flat.back().numel()});
  }
  ASSERT_TRUE(strategy::WritePartitionFile(absl::StrCat(dir, "/result-", rank), {}, named).ok());
}

TEST(ZeroMultiProcess, TwoProcessesTrainLikeOneProcess) {
  testing::TempDir tmp;
  std::vector<pid_t> children;
  for (int rank = 0; rank < kWorld; ++rank) {
    std::vector<std::string> env_strings = {absl::StrCat("ZERO_CHILD_RANK=", rank),
                                            "ZERO_CHILD_DIR=" + tmp.path()};
    std::vector<char*> envp;
    for (std::string& e : env_strings) envp.push_back(e.data());
    for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
    envp.push_back(nullptr);
    std::string exe = "/proc/self/exe", filter = "--gtest_filter=ZeroMultiProcessChild.Rank";
    char* argv[] = {exe.data(), filter.data(), nullptr};
    pid_t pid;
    ASSERT_EQ(::posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv, envp.data()), 0);
    children.push_back(pid);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  for (pid_t pid : children) {
    int status = 0;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (absl::Now() > deadline) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        ADD_FAILURE() << "child " << pid << " did not finish";
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child " << pid;
  }
  testing::SyntheticProblem p;
  const std::vector<at::Tensor> reference = testing::ReferenceTrain(p, kSteps);
  auto params = p.MakeParams();
  for (int rank = 0; rank < kWorld; ++rank) {
    auto file = strategy::PartitionFileReader::Open(absl::StrCat(tmp.path(), "/result-", rank));
    ASSERT_TRUE(file.ok()) << file.status();
    std::vector<at::Tensor> got;
    for (size_t k = 0; k < params.size(); ++k) {
      at::Tensor t = at::empty(params[k].tensor.sizes(), at::kFloat);
      ASSERT_TRUE(file->Read(params[k].name, 0, t.numel(), t.data_ptr<float>()).ok());
      got.push_back(t);
    }
    EXPECT_LE(testing::MaxRelativeError(got, reference), 1e-6) << "rank " << rank;
  }
}

}  // namespace
}  // namespace qlora
