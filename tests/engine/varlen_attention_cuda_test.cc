// Varlen attention on the GPU (skips without one): the flash path against the masked path in
// bfloat16 (output and q/k/v gradients, each compared with the float32 masked result: flash's
// error must stay within a small multiple of the masked bf16 error), with GQA and windows; and
// memory: a packed 16384-token row trains (forward + backward, tiny bf16 model) without any
// seq^2 allocation, while the masked path, forced for contrast, makes one.
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <string>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <gtest/gtest.h>

#ifdef QLORA_HAVE_CUDA_ALLOCATOR_STATS
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "tests/engine/test_util.h"
#include "tests/engine/torch_test_util.h"
#include "tests/engine/varlen_reference.h"
#include "worker/engine/hf_loader.h"
#include "worker/engine/llama_model.h"
#include "worker/engine/tiny_model.h"
#include "worker/engine/varlen_attention.h"

namespace qlora::engine {
namespace {

using ::qlora::testing::AttentionResult;
using ::qlora::testing::MaxAbsDiff;
using ::qlora::testing::PackedCase;

bool HasGpu() { return at::hasCUDA() && at::getNumGPUs() > 0; }

class EngineVarlenCuda : public ::testing::TestWithParam<PackedCase> {
 protected:
  void SetUp() override {
    if (!HasGpu()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(EngineVarlenCuda, FlashMatchesTheMaskedPathInBf16) {
  PackedCase c = GetParam();
  c.head_dim = 64;  // flash needs head_dim % 8 == 0
  const at::Device gpu(at::kCUDA, 0);
  const at::Tensor positions = testing::PositionIds(c);
  const DocumentLayout layout = DocumentLayout::FromPositions(positions, gpu);
  auto flash = [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    EXPECT_TRUE(FlashVarlenApplies(q, k, v));
    return VarlenCausalAttention(q, k, v, layout, c.window);
  };
  auto masked = [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    return MaskedVarlenCausalAttention(q, k, v, layout, c.window);
  };
  const AttentionResult truth = testing::RunAttention(c, masked, at::kFloat, gpu);
  const AttentionResult masked_bf16 = testing::RunAttention(c, masked, at::kBFloat16, gpu);
  const AttentionResult flash_bf16 = testing::RunAttention(c, flash, at::kBFloat16, gpu);
  auto check = [&](const at::Tensor& got, const at::Tensor& reference, const at::Tensor& exact,
                   const char* what) {
    const double scale = std::max(exact.abs().max().item<double>(), 1.0);
    const double flash_error = MaxAbsDiff(got, exact), masked_error = MaxAbsDiff(reference, exact);
    std::cout << c.name << " " << what << ": flash error " << flash_error << ", masked bf16 error "
              << masked_error << " (scale " << scale << ")\n";
    EXPECT_LE(flash_error, 3 * masked_error + 2e-3 * scale) << what;
    EXPECT_LT(MaxAbsDiff(got, reference) / scale, 3e-2) << what;
  };
  check(flash_bf16.out, masked_bf16.out, truth.out, "output");
  check(flash_bf16.grad_q, masked_bf16.grad_q, truth.grad_q, "grad q");
  check(flash_bf16.grad_k, masked_bf16.grad_k, truth.grad_k, "grad k");
  check(flash_bf16.grad_v, masked_bf16.grad_v, truth.grad_v, "grad v");
}

INSTANTIATE_TEST_SUITE_P(Layouts, EngineVarlenCuda, ::testing::ValuesIn(testing::PackedCases()),
                         [](const auto& info) { return info.param.name; });

#ifdef QLORA_HAVE_CUDA_ALLOCATOR_STATS
int64_t PeakAllocatedBytes() {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
      .peak;
}

// Peak allocated bytes above the resident weights for one checkpointed training step of a
// packed row: documents of 1000 tokens and a shorter tail.
int64_t PackedStepPeakBytes(LlamaForCausalLM& model, int64_t seq) {
  std::vector<at::Tensor> docs;
  for (int64_t start = 0; start < seq; start += 1000) {
    docs.push_back(at::arange(std::min<int64_t>(1000, seq - start), at::kLong));
  }
  ForwardOptions packed;
  packed.position_ids = at::cat(docs).unsqueeze(0);
  packed.block_diagonal = true;
  const at::Tensor ids = at::randint(model.config().vocab_size, {1, seq}, at::kLong);
  c10::cuda::CUDACachingAllocator::emptyCache();
  c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  const int64_t before = PeakAllocatedBytes();
  const at::Tensor hidden = model.Forward(ids, packed);
  model.Loss(hidden, ids.to(hidden.device())).loss_sum.backward();
  return PeakAllocatedBytes() - before;
}

TEST(EngineVarlenCudaMemory, PackedRowOf16kTokensAllocatesNoSeqSquaredMask) {
  if (!HasGpu()) GTEST_SKIP() << "no CUDA device";
  testing::TempDir dir;
  TinyModelOptions tiny;  // hidden 64, 4 heads of 16 (2 kv heads), 2 layers, vocab 256
  tiny.init_std = 0.1;
  tiny.dtype = "bfloat16";
  tiny.config.max_position_embeddings = 16384;
  ASSERT_TRUE(MakeTinyModel(dir.path(), tiny).ok());
  LoadOptions load;
  load.device = at::Device(at::kCUDA, 0);
  auto model = LoadLlama(dir.path(), load);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE((*model)->AddLora({.target_modules = {"all-linear"}}).ok());
  (*model)->SetTraining(true);

  constexpr int64_t kSeq = 16384;
  const int64_t seq_squared = kSeq * kSeq;  // one bool mask for the row: 256 MiB
  // A first step makes what lives from then on (cuBLAS workspaces, the GEMM tuner's choices) so
  // that the measured step counts only what a step allocates.
  PackedStepPeakBytes(**model, kSeq);
  const int64_t flash_peak = PackedStepPeakBytes(**model, kSeq);
  std::cout << "packed 16384-token step, flash: peak " << flash_peak / (1 << 20) << " MiB\n";
  EXPECT_LT(flash_peak, seq_squared / 4);

  at::globalContext().setSDPUseFlash(false);  // the masked path, to show the check can fail
  const int64_t masked_peak = PackedStepPeakBytes(**model, kSeq);
  at::globalContext().setSDPUseFlash(true);
  std::cout << "packed 16384-token step, dense mask: peak " << masked_peak / (1 << 20) << " MiB\n";
  EXPECT_GE(masked_peak, seq_squared);
}
#endif  // QLORA_HAVE_CUDA_ALLOCATOR_STATS

}  // namespace
}  // namespace qlora::engine
