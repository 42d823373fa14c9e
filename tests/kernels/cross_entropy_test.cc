// kernels/cross_entropy.h against the float32 formula (ATen's cross_entropy on the logits taken
// to float32, and its autograd gradient): on CPU, and on CUDA where there is a GPU, for every
// dtype, vectorizable and odd vocabularies, ignored rows, a grad scale, and rows holding -inf.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <vector>

#include "kernels/cross_entropy.h"
#include "tests/kernels/test_devices.h"

namespace qlora::kernels {
namespace {

struct Reference {
  at::Tensor losses, grad;  // float32
};

Reference Formula(const at::Tensor& logits, const at::Tensor& targets, double scale) {
  const at::Tensor z = logits.to(at::kFloat).detach().requires_grad_();
  const at::Tensor losses =
      at::cross_entropy_loss(z, targets, {}, at::Reduction::None, /*ignore_index=*/-100);
  const at::Tensor grad = torch::autograd::grad({losses.sum() * scale}, {z})[0];
  return {losses.detach(), grad};
}

double MaxDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kFloat).cpu() - b.to(at::kFloat).cpu()).abs().max().item<double>();
}

TEST(KernelsCrossEntropy, LossesAndGradientEqualTheFloat32Formula) {
  for (const at::Device& device : KernelTestDevices()) {
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      for (const int64_t vocab : {int64_t{4000}, int64_t{997}, int64_t{8}}) {
        SCOPED_TRACE(testing::Message() << device << " " << dtype << " vocab " << vocab);
        auto gen = at::make_generator<at::CPUGeneratorImpl>(vocab);
        const int64_t rows = 37;
        const at::Tensor logits = (at::randn({rows, vocab}, gen) * 4).to(dtype).to(device);
        at::Tensor targets = at::randint(vocab, {rows}, gen, at::kLong);
        targets.index_put_({at::indexing::Slice(3, 9)}, -100);
        targets = targets.to(device);
        const double scale = 1.0 / 3000;
        const Reference ref = Formula(logits, targets, scale);

        at::Tensor work = logits.clone();
        CrossEntropyOptions options;
        options.grad_scale = scale;
        const at::Tensor losses = CrossEntropyWithGradient(work, targets, options);
        ASSERT_EQ(losses.scalar_type(), at::kFloat);
        EXPECT_LT(MaxDiff(losses, ref.losses), 2e-5);
        // The gradient, rounded once to the logits' dtype.
        EXPECT_LT(MaxDiff(work, ref.grad.to(dtype)),
                  dtype == at::kFloat ? 1e-9 : 2 * scale / 256);
        EXPECT_EQ(work.index({at::indexing::Slice(3, 9)}).abs().sum().item<double>(), 0.0);

        at::Tensor untouched = logits.clone();
        options.write_gradient = false;
        EXPECT_LT(MaxDiff(CrossEntropyWithGradient(untouched, targets, options), ref.losses), 2e-5);
        EXPECT_TRUE(untouched.equal(logits));
      }
    }
  }
}

TEST(KernelsCrossEntropy, MinusInfinityLogitsAddNothing) {
  for (const at::Device& device : KernelTestDevices()) {
    at::Tensor logits = at::zeros({2, 16}, at::kFloat);
    logits.index_put_({at::indexing::Slice(), at::indexing::Slice(8, 16)}, -INFINITY);
    logits = logits.to(device);
    const at::Tensor targets = at::tensor({int64_t{1}, int64_t{7}}).to(device);
    const at::Tensor losses = CrossEntropyWithGradient(logits, targets);
    EXPECT_NEAR(losses[0].item<double>(), std::log(8.0), 1e-6) << device;
    EXPECT_FALSE(logits.isnan().any().item<bool>()) << device;
    EXPECT_NEAR(logits[0][0].item<double>(), 1.0 / 8, 1e-7) << device;
    EXPECT_NEAR(logits[0][1].item<double>(), 1.0 / 8 - 1, 1e-7) << device;
    EXPECT_EQ(logits[0][9].item<double>(), 0.0) << device;
  }
}

TEST(KernelsCrossEntropy, RejectsWhatItCannotTake) {
  at::Tensor logits = at::zeros({4, 6});
  EXPECT_THROW(CrossEntropyWithGradient(logits, at::zeros({3}, at::kLong)), c10::Error);
  EXPECT_THROW(CrossEntropyWithGradient(logits, at::zeros({4}, at::kInt)), c10::Error);
  at::Tensor strided = at::zeros({6, 4}).t();
  EXPECT_THROW(CrossEntropyWithGradient(strided, at::zeros({4}, at::kLong)), c10::Error);
}

}  // namespace
}  // namespace qlora::kernels
