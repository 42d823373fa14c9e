// cuDNN causal attention (worker/engine/cudnn_attention.h). On the CPU: it never applies, and
// the dense dispatch is SDPA's causal attention bit for bit. On a GPU (skips without one): it
// applies to the model's bf16 layout, and its output and q/k/v gradients, plain and with
// grouped-query heads, single rows too, are as close to the float32 result as flash-attention's
// bf16 ones are (within 3x flash's error plus a small floor), with the incoming gradient laid out
// one way, then the other, then the first again in one process (where ATen's own backward for
// the op goes wrong).
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "tests/engine/torch_test_util.h"
#include "tests/engine/varlen_reference.h"
#include "worker/engine/cudnn_attention.h"

namespace qlora::engine {
namespace {

using ::qlora::testing::AttentionResult;
using ::qlora::testing::MaxAbsDiff;
using ::qlora::testing::PackedCase;

at::Tensor SdpaCausal(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return at::scaled_dot_product_attention(q, k, v, {}, 0.0, true, std::nullopt,
                                          k.size(1) != q.size(1));
}

// Unpacked rows: one document per row.
PackedCase Dense(std::string name, int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                 int64_t head_dim) {
  PackedCase c;
  c.name = std::move(name);
  c.rows.assign(batch, {seq});
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.head_dim = head_dim;
  return c;
}

TEST(CudnnAttention, NeverAppliesOnTheCpuWhereTheDispatchIsSdpa) {
  const PackedCase c = Dense("cpu", 2, 24, 4, 2, 16);
  const at::Device cpu(at::kCPU);
  auto dense = [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    EXPECT_FALSE(CudnnAttentionApplies(q, k, v));
    return DenseCausalAttention(q, k, v);
  };
  const AttentionResult got = testing::RunAttention(c, dense, at::kFloat, cpu);
  const AttentionResult want = testing::RunAttention(c, SdpaCausal, at::kFloat, cpu);
  EXPECT_TRUE(at::equal(got.out, want.out));
  EXPECT_TRUE(at::equal(got.grad_q, want.grad_q));
  EXPECT_TRUE(at::equal(got.grad_k, want.grad_k));
  EXPECT_TRUE(at::equal(got.grad_v, want.grad_v));
  EXPECT_THROW(CudnnCausalAttention(at::zeros({1, 2, 8, 16}), at::zeros({1, 2, 8, 16}),
                                    at::zeros({1, 2, 8, 16})),
               c10::Error);
}

class CudnnAttentionCuda : public ::testing::TestWithParam<PackedCase> {
 protected:
  void SetUp() override {
    if (!at::hasCUDA() || at::getNumGPUs() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

// SDPA with its cuDNN backend turned off (flash, on these inputs) while alive: the reference
// must not run cuDNN's backward for the shape itself (see cudnn_attention.h).
class WithoutCudnnSdpa {
 public:
  WithoutCudnnSdpa() : was_(at::globalContext().userEnabledCuDNNSDP()) {
    at::globalContext().setSDPUseCuDNN(false);
  }
  ~WithoutCudnnSdpa() { at::globalContext().setSDPUseCuDNN(was_); }

 private:
  bool was_;
};

TEST_P(CudnnAttentionCuda, MatchesFloat32AsCloselyAsFlashWhateverTheGradientLayout) {
  const PackedCase c = GetParam();
  const at::Device gpu(at::kCUDA, 0);
  auto cudnn = [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    EXPECT_TRUE(CudnnAttentionApplies(q, k, v));
    return CudnnCausalAttention(q, k, v);
  };
  // The model's own dispatch, with its gradient arriving as o_proj's backward lays it out:
  // [batch, seq, heads * head_dim] rows seen as [batch, heads, seq, head_dim].
  auto model_layout = [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    const at::Tensor out = DenseCausalAttention(q, k, v);
    return out.transpose(1, 2).reshape({q.size(0), q.size(2), -1})
        .view({q.size(0), q.size(2), q.size(1), q.size(3)})
        .transpose(1, 2);
  };
  const AttentionResult truth = testing::RunAttention(c, SdpaCausal, at::kFloat, gpu);
  AttentionResult flash;
  {
    WithoutCudnnSdpa guard;
    flash = testing::RunAttention(c, SdpaCausal, at::kBFloat16, gpu);
  }
  // A contiguous gradient, then the model's layout, then contiguous again: ATen's own backward
  // gets the second wrong (bench/reports/kernels_h200_2026-12-01_04.md).
  const AttentionResult runs[3] = {testing::RunAttention(c, cudnn, at::kBFloat16, gpu),
                                   testing::RunAttention(c, model_layout, at::kBFloat16, gpu),
                                   testing::RunAttention(c, cudnn, at::kBFloat16, gpu)};
  const char* names[3] = {"contiguous gradient", "model's gradient layout", "contiguous again"};
  for (int r = 0; r < 3; ++r) {
    auto check = [&](const at::Tensor& got, const at::Tensor& flash_value, const at::Tensor& exact,
                     const char* what) {
      const double scale = std::max(exact.abs().max().item<double>(), 1.0);
      const double error = MaxAbsDiff(got, exact), flash_error = MaxAbsDiff(flash_value, exact);
      std::cout << c.name << ", " << names[r] << ", " << what << ": cuDNN error " << error
                << ", flash bf16 error " << flash_error << " (scale " << scale << ")\n";
      EXPECT_LE(error, 3 * flash_error + 2e-3 * scale) << names[r] << ", " << what;
    };
    check(runs[r].out, flash.out, truth.out, "output");
    check(runs[r].grad_q, flash.grad_q, truth.grad_q, "grad q");
    check(runs[r].grad_k, flash.grad_k, truth.grad_k, "grad k");
    check(runs[r].grad_v, flash.grad_v, truth.grad_v, "grad v");
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudnnAttentionCuda,
    ::testing::Values(Dense("heads8_d64", 2, 256, 8, 8, 64), Dense("heads8_d128", 2, 320, 8, 8, 128),
                      Dense("gqa8to2_d128", 2, 256, 8, 2, 128), Dense("one_row_odd_len", 1, 200, 4, 4, 64),
                      Dense("gqa_one_row", 1, 256, 8, 2, 128)),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace qlora::engine
