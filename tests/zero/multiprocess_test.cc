// Two real processes (this binary re-executed as rank 0 and rank 1) train ZeRO stage 2 over Gloo,
// rendezvousing through a store on a temporary directory (test-only: the product's store is the
// coordinator's), and end with the weights one process reaches with the same global batch.
#include <cstring>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/safetensors/reader.h"
#include "common/safetensors/writer.h"
#include "tests/util/rank_processes.h"
#include "tests/util/temp_dir.h"
#include "tests/zero/synthetic_problem.h"
#include "worker/comm/gloo_communicator.h"

namespace qlora {
namespace {

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
  auto communicator = comm::ConnectGloo(options, std::make_shared<testing::DirectoryStore>(dir));
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
  std::vector<safetensors::TensorBytes> named;
  for (const auto& param : (*s)->params()) {
    flat.push_back(param.tensor.detach().reshape({-1}).contiguous());
    named.push_back({{param.name, safetensors::Dtype::kF32, {flat.back().numel()}},
                     flat.back().data_ptr<float>(), flat.back().numel() * sizeof(float)});
  }
  ASSERT_TRUE(safetensors::WriteSafetensors(absl::StrCat(dir, "/result-", rank), named).ok());
}

TEST(ZeroMultiProcess, TwoProcessesTrainLikeOneProcess) {
  testing::TempDir tmp;
  const std::vector<std::string> problems = testing::RunRankProcesses(
      kWorld, "ZeroMultiProcessChild.Rank", "ZERO_CHILD_RANK", {{"ZERO_CHILD_DIR", tmp.path()}},
      absl::Seconds(120));
  EXPECT_TRUE(problems.empty()) << problems.front();
  testing::SyntheticProblem p;
  const std::vector<at::Tensor> reference = testing::ReferenceTrain(p, kSteps);
  auto params = p.MakeParams();
  for (int rank = 0; rank < kWorld; ++rank) {
    auto file = safetensors::SafetensorsFile::Open(absl::StrCat(tmp.path(), "/result-", rank));
    ASSERT_TRUE(file.ok()) << file.status();
    std::vector<at::Tensor> got;
    for (size_t k = 0; k < params.size(); ++k) {
      at::Tensor t = at::empty(params[k].tensor.sizes(), at::kFloat);
      auto view = (*file)->Get(params[k].name);
      ASSERT_TRUE(view.ok()) << view.status();
      ASSERT_EQ(view->nbytes, t.numel() * sizeof(float));
      std::memcpy(t.data_ptr<float>(), view->data, view->nbytes);
      got.push_back(t);
    }
    EXPECT_LE(testing::MaxRelativeError(got, reference), 1e-6) << "rank " << rank;
  }
}

}  // namespace
}  // namespace qlora
