// kernels/rms_norm.h against the unfused formula, h = x + delta then ATen's rms_norm, and what
// autograd computes for it (the gradient reaching x through both the norm and the residual
// stream): on CPU, and the CUDA kernels on the GPU where there is one, for every dtype, rows of
// several sizes (one not vectorizable), and with and without a residual gradient.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <vector>

#include "kernels/rms_norm.h"
#include "tests/kernels/test_devices.h"

namespace qlora::kernels {
namespace {

double MaxDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kFloat).cpu() - b.to(at::kFloat).cpu()).abs().max().item<double>();
}

// Tolerance for a value of magnitude ~`scale` rounded to dtype (a couple of ulps).
double Ulps(at::ScalarType dtype, double scale) {
  const double eps = dtype == at::kFloat ? 1.2e-7 : dtype == at::kHalf ? 9.8e-4 : 7.9e-3;
  return 2 * eps * scale;
}

TEST(KernelsRmsNorm, ForwardAndBackwardEqualTheUnfusedFormulaAndItsAutogradGradient) {
  const double eps = 1e-5;
  for (const at::Device& device : KernelTestDevices()) {
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      for (const int64_t dim : {int64_t{4096}, int64_t{64}, int64_t{12}}) {
        for (const bool residual_grad : {true, false}) {
         for (const bool with_delta : {true, false}) {
          SCOPED_TRACE(testing::Message() << device << " " << dtype << " dim " << dim
                                          << (residual_grad ? " with dh" : " without dh")
                                          << (with_delta ? "" : ", no delta"));
          auto gen = at::make_generator<at::CPUGeneratorImpl>(dim);
          auto make = [&](std::vector<int64_t> shape) {
            return at::randn(shape, gen).to(dtype).to(device);
          };
          const at::Tensor x = make({3, 7, dim});
          const at::Tensor delta = with_delta ? make({3, 7, dim}) : at::Tensor();
          const at::Tensor weight = (at::rand({dim}, gen) + 0.5).to(dtype).to(device);
          const at::Tensor dn = make({3, 7, dim});
          const at::Tensor dh = residual_grad ? make({3, 7, dim}) : at::Tensor();

          const ResidualRmsNormResult r = ResidualRmsNormForward(x, delta, weight, eps);
          const at::Tensor h_ref = with_delta ? x + delta : x;
          EXPECT_TRUE(r.h.equal(h_ref));
          if (!with_delta) EXPECT_TRUE(r.h.is_same(x));  // passed through, not copied
          EXPECT_LT(MaxDiff(r.n, at::rms_norm(h_ref, {dim}, weight, eps)), Ulps(dtype, 4));
          const at::Tensor rstd_ref = at::rsqrt(h_ref.to(at::kFloat).pow(2).mean(-1) + eps);
          EXPECT_LT(MaxDiff(r.rstd, rstd_ref), 1e-5);

          // Autograd of the unfused formula in float32: dn reaches h through the norm, dh along
          // the residual stream; x and delta get the same gradient.
          const at::Tensor leaf = h_ref.to(at::kFloat).detach().requires_grad_();
          const at::Tensor n32 = at::rms_norm(leaf, {dim}, weight.to(at::kFloat), eps);
          at::Tensor objective = (n32 * dn.to(at::kFloat)).sum();
          if (residual_grad) objective = objective + (leaf * dh.to(at::kFloat)).sum();
          const at::Tensor dx_ref = torch::autograd::grad({objective}, {leaf})[0];

          const at::Tensor dx = RmsNormBackward(dn, r.h, r.rstd, weight, dh);
          ASSERT_EQ(dx.scalar_type(), dtype);
          EXPECT_LT(MaxDiff(dx, dx_ref), Ulps(dtype, 8) + 1e-5);
         }
        }
      }
    }
  }
}

// n written into rows with spare columns (for the widened GEMMs that read n) and a gradient
// that arrives as rows of a wider buffer: bit for bit what the contiguous calls give, with the
// spare columns left alone.
TEST(KernelsRmsNorm, SpareColumnsAndRowStridedGradientsGiveTheSameBits) {
  for (const at::Device& device : KernelTestDevices()) {
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      for (const int64_t dim : {int64_t{256}, int64_t{12}}) {
        SCOPED_TRACE(testing::Message() << device << " " << dtype << " dim " << dim);
        auto gen = at::make_generator<at::CPUGeneratorImpl>(dim + 1);
        auto make = [&](std::vector<int64_t> shape) {
          return at::randn(shape, gen).to(dtype).to(device);
        };
        const at::Tensor x = make({2, 5, dim}), delta = make({2, 5, dim});
        const at::Tensor weight = (at::rand({dim}, gen) + 0.5).to(dtype).to(device);
        const ResidualRmsNormResult dense = ResidualRmsNormForward(x, delta, weight, 1e-5);
        const ResidualRmsNormResult spare = ResidualRmsNormForward(x, delta, weight, 1e-5, 40);
        EXPECT_EQ(spare.n.sizes(), x.sizes());
        EXPECT_EQ(spare.n.stride(1), dim + 40);
        EXPECT_TRUE(spare.n.equal(dense.n));
        EXPECT_TRUE(spare.h.equal(dense.h));

        const at::Tensor dn = make({2, 5, dim}), dh = make({2, 5, dim});
        const at::Tensor wide = at::full({10, dim + 16}, 3.0, dn.options());
        wide.narrow(1, 0, dim).copy_(dn.reshape({10, dim}));
        const at::Tensor dn_strided = wide.narrow(1, 0, dim).view({2, 5, dim});
        ASSERT_FALSE(dn_strided.is_contiguous());
        const at::Tensor dx_dense = RmsNormBackward(dn, dense.h, dense.rstd, weight, dh);
        EXPECT_TRUE(RmsNormBackward(dn_strided, dense.h, dense.rstd, weight, dh).equal(dx_dense));
        // The residual gradient as rows of a wider buffer too, and dx into rows with 24 spare
        // columns (for the LoRA input-gradient GEMMs): the same values, in place.
        const at::Tensor dh_wide = at::full({10, dim + 8}, 5.0, dh.options());
        dh_wide.narrow(1, 0, dim).copy_(dh.reshape({10, dim}));
        const at::Tensor dh_strided = dh_wide.narrow(1, 0, dim).view({2, 5, dim});
        const at::Tensor dx_spare =
            RmsNormBackward(dn_strided, dense.h, dense.rstd, weight, dh_strided, 24);
        EXPECT_EQ(dx_spare.sizes(), x.sizes());
        EXPECT_EQ(dx_spare.stride(1), dim + 24);
        EXPECT_TRUE(dx_spare.equal(dx_dense));
      }
    }
  }
}

TEST(KernelsRmsNorm, RejectsMismatchedInputs) {
  const at::Tensor x = at::zeros({2, 8}), w = at::ones({8});
  EXPECT_THROW(ResidualRmsNormForward(x, at::zeros({2, 4}), w, 1e-6), c10::Error);
  EXPECT_THROW(ResidualRmsNormForward(x, x, at::ones({4}), 1e-6), c10::Error);
  EXPECT_THROW(ResidualRmsNormForward(x, x, at::ones({8}, at::kBFloat16), 1e-6), c10::Error);
  EXPECT_THROW(RmsNormBackward(at::zeros({2, 4}), x, at::ones({2}), w, {}), c10::Error);
}

}  // namespace
}  // namespace qlora::kernels
