// kernels/adamw.h against the unfused ATen ops of torch's single-tensor AdamW (the formula its
// CPU path runs, and the one tests/zero/optim_test.cc holds against torch itself): on the CPU,
// and the CUDA kernel on the GPU where there is one, over a length with a tail (not a multiple of
// 4), a misaligned slice (the kernel's scalar path), several steps (bias correction), with and
// without a clipping factor, beta1 below and above 0.5 (lerp's two formulas).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "kernels/adamw.h"
#include "tests/kernels/test_devices.h"

namespace qlora::kernels {
namespace {

// The ATen ops, one by one (torch/optim/adam.py `_single_tensor_adam`, decoupled decay).
void UnfusedStep(at::Tensor p, at::Tensor g, at::Tensor m, at::Tensor v,
                 const AdamWStepOptions& o, const at::Tensor& factor) {
  if (factor.defined()) g = g * factor.reshape({});
  p.mul_(1.0 - o.lr * o.weight_decay);
  m.lerp_(g, 1.0 - o.beta1);
  v.mul_(o.beta2).addcmul_(g, g, 1.0 - o.beta2);
  const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(o.step));
  const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(o.step));
  at::Tensor denom = v.sqrt();
  denom.div_(std::sqrt(bc2)).add_(o.eps);
  p.addcdiv_(m, denom, -(o.lr / bc1));
}

// Largest |a - b| / (|b| + floor): the difference in units of the values' magnitude, where a
// value near zero counts at `floor` (a parameter that an update nearly cancelled keeps the
// update's rounding error, which is relative to the update, not to what is left).
double MaxRelative(const at::Tensor& a, const at::Tensor& b, double floor = 0.0) {
  const at::Tensor x = a.cpu().to(at::kDouble), y = b.cpu().to(at::kDouble);
  return ((x - y).abs() / (y.abs() + floor).clamp_min(1e-30)).max().item<double>();
}

TEST(KernelsAdamW, StepsEqualTheUnfusedOps) {
  for (const at::Device& device : KernelTestDevices()) {
    for (const double beta1 : {0.9, 0.3}) {
      for (const bool with_factor : {false, true}) {
        for (const bool misaligned : {false, true}) {
          SCOPED_TRACE(testing::Message() << device << " beta1 " << beta1
                                          << (with_factor ? " with factor" : "")
                                          << (misaligned ? " misaligned" : ""));
          const int64_t n = 100003;  // not a multiple of 4
          auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
          auto make = [&](double scale) {
            // One element more: the misaligned case takes the slice from element 1.
            const at::Tensor whole = (at::randn({n + 1}, gen) * scale).to(device);
            return misaligned ? whole.narrow(0, 1, n) : whole.narrow(0, 0, n);
          };
          at::Tensor p = make(0.5), m = make(0.01), v = make(0.001).abs();
          at::Tensor p_ref = p.clone(), m_ref = m.clone(), v_ref = v.clone();
          const at::Tensor factor =
              with_factor ? at::full({}, 0.37, at::dtype(at::kDouble).device(device))
                          : at::Tensor();
          AdamWStepOptions o;
          o.beta1 = beta1;
          o.beta2 = 0.99;
          o.eps = 1e-6;
          o.weight_decay = 0.05;
          for (int64_t step = 1; step <= 4; ++step) {
            o.step = step;
            o.lr = 1e-3 * static_cast<double>(step);
            const at::Tensor g = make(0.2 * static_cast<double>(step));
            const at::Tensor g_before = g.clone();
            AdamWStep(p, g, m, v, o, factor);
            UnfusedStep(p_ref, g, m_ref, v_ref, o, factor);
            EXPECT_TRUE(at::equal(g, g_before)) << "grad was written";
          }
          // The same roundings, op for op: equal but where a rounding differs by an ulp (the
          // compiler's multiply-adds, the scalar divisor's reciprocal): a float32 ulp or two of
          // the value, or of the last update (~lr) where the parameter is near zero (on an H200
          // 99 % of the parameters are bitwise equal; a wrong formula is off by far more).
          EXPECT_LE(MaxRelative(p, p_ref, /*floor=*/4 * o.lr), 5e-7);
          EXPECT_LE(MaxRelative(m, m_ref), 3e-7);
          EXPECT_LE(MaxRelative(v, v_ref), 3e-7);
          if (device.is_cpu()) {  // the CPU path is the ops themselves
            EXPECT_TRUE(at::equal(p, p_ref) && at::equal(m, m_ref) && at::equal(v, v_ref));
          } else {
            const double equal = p.eq(p_ref).to(at::kDouble).mean().item<double>();
            RecordProperty("bitwise_equal_fraction", std::to_string(equal));
            std::printf("[ adamw ] %s: %.6f of the parameters bitwise equal to the ops'\n",
                        misaligned ? "scalar path" : "vector path", equal);
          }
        }
      }
    }
  }
}

TEST(KernelsAdamW, RejectsMismatchedTensors) {
  const at::Tensor p = at::zeros({8}), g = at::zeros({8}), m = at::zeros({8}), v = at::zeros({8});
  AdamWStepOptions o;
  EXPECT_THROW(AdamWStep(p, at::zeros({7}), m, v, o), c10::Error);
  EXPECT_THROW(AdamWStep(p, g.to(at::kDouble), m, v, o), c10::Error);
  o.step = 0;
  EXPECT_THROW(AdamWStep(p, g, m, v, o), c10::Error);
  o.step = 1;
  EXPECT_THROW(AdamWStep(p, g, m, v, o, at::ones({2})), c10::Error);
  AdamWStep(p, g, m, v, o, at::ones({1}));  // one element, any shape
}

}  // namespace
}  // namespace qlora::kernels
