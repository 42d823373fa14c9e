// FP8 rows (kernels/float8.h): the rounding and scales the header states, a 4-bit weight's rows
// straight from its codes equal to quantizing its dequantized values, the GEMM against the bf16
// product, and the CUDA kernels against the CPU bit for bit.
#include <cmath>
#include <cstring>

#include <ATen/ATen.h>

#include "gtest/gtest.h"
#include "kernels/float8.h"
#include "kernels/quantize_4bit.h"
#include "tests/kernels/test_devices.h"

namespace qlora::kernels {
namespace {

// Rows of normal draws whose magnitudes span 10^-3..10^2, a row of zeros among them.
at::Tensor SpreadRows(int64_t rows, int64_t cols, at::ScalarType dtype) {
  at::manual_seed(3);
  at::Tensor x = at::randn({rows, cols});
  const at::Tensor magnitude = at::pow(10.0, at::linspace(-3, 2, rows)).unsqueeze(1);
  x = x * magnitude;
  x[rows / 2].zero_();
  return x.to(dtype);
}

at::Tensor Bytes(const at::Tensor& fp8) { return fp8.cpu().view(at::kByte); }

TEST(KernelsFloat8, RowsKeepE4m3PrecisionOfTheirOwnMaximum) {
  const at::Tensor x = SpreadRows(9, 96, at::kBFloat16);
  const Float8Rows q = QuantizeRowsFloat8(x);
  ASSERT_EQ(q.values.scalar_type(), at::kFloat8_e4m3fn);
  ASSERT_EQ(q.scales.sizes(), at::IntArrayRef({9, 1}));
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor back = q.values.to(at::kFloat) * q.scales;
  for (int64_t r = 0; r < 9; ++r) {
    const float amax = xf[r].abs().max().item<float>();
    const float scale = q.scales[r][0].item<float>();
    if (amax == 0) {
      EXPECT_EQ(scale, 1.0f);
      EXPECT_EQ(back[r].abs().max().item<float>(), 0.0f);
      continue;
    }
    EXPECT_EQ(scale, amax / kFloat8E4m3Max) << "row " << r;
    // The row's largest value lands on +-448 exactly; every value within half an e4m3 step
    // (3 mantissa bits: 2^-4 relative), or half the smallest subnormal's step (2^-10) below.
    EXPECT_EQ(q.values[r].to(at::kFloat).abs().max().item<float>(), kFloat8E4m3Max);
    const at::Tensor error = (back[r] - xf[r]).abs();
    const at::Tensor bound = at::clamp_min(xf[r].abs() * std::ldexp(1.0, -4), scale * std::ldexp(1.0, -10));
    EXPECT_TRUE((error <= bound * (1 + 1e-6)).all().item<bool>()) << "row " << r;
  }
}

TEST(KernelsFloat8, RowsOfAWiderBufferAreReadInPlace) {
  const at::Tensor wide = SpreadRows(5, 80, at::kBFloat16);
  const Float8Rows strided = QuantizeRowsFloat8(wide.narrow(1, 0, 64));
  const Float8Rows copied = QuantizeRowsFloat8(wide.narrow(1, 0, 64).contiguous());
  EXPECT_TRUE(at::equal(Bytes(strided.values), Bytes(copied.values)));
  EXPECT_TRUE(at::equal(strided.scales, copied.scales));
}

Quantized4bit RandomWeight(int64_t out, int64_t in, const at::Device& device) {
  at::manual_seed(7);
  const at::Tensor w = (at::randn({out, in}) * 0.02).to(at::kBFloat16).to(device);
  return Quantize4bit(w, Quantize4bitOptions{});
}

TEST(KernelsFloat8, AWeightsRowsFromItsCodesEqualItsDequantizedRowsInFp8) {
  const Quantized4bit q = RandomWeight(48, 192, at::kCPU);
  ASSERT_TRUE(Float8WeightTakes(q));
  const Float8Rows from_codes = WeightRowsFloat8(q);
  // Quantizing puts each block's absmax on a code of magnitude 1: the bound from the scales is
  // the row's maximum, so both ways give the same scales and values.
  const Float8Rows from_values = QuantizeRowsFloat8(Dequantize4bit(q, at::kFloat).view({48, 192}));
  EXPECT_TRUE(at::equal(from_codes.scales, from_values.scales));
  EXPECT_TRUE(at::equal(Bytes(from_codes.values), Bytes(from_values.values)));
  // Into rows of a larger buffer: the same bytes there.
  const Float8Rows buffer{at::zeros({64, 192}, at::kFloat8_e4m3fn), at::zeros({64, 1})};
  const Float8Rows rows{buffer.values.narrow(0, 8, 48), buffer.scales.narrow(0, 8, 48)};
  WeightRowsFloat8(q, &rows);
  EXPECT_TRUE(at::equal(Bytes(buffer.values.narrow(0, 8, 48)), Bytes(from_codes.values)));
  EXPECT_EQ(Bytes(buffer.values.narrow(0, 0, 8)).sum().item<int64_t>(), 0);
}

TEST(KernelsFloat8, WeightsWhoseRowsSplitBlocksAreNotTaken) {
  at::manual_seed(1);
  Quantize4bitOptions options;
  options.blocksize = 128;
  const Quantized4bit q = Quantize4bit(at::randn({4, 192}), options);
  EXPECT_FALSE(Float8WeightTakes(q));
  EXPECT_THROW(WeightRowsFloat8(q), c10::Error);
  EXPECT_TRUE(Float8GemmTakes(4096, 11008));
  EXPECT_FALSE(Float8GemmTakes(4096, 11000 + 4));
}

TEST(KernelsFloat8, TheGemmIsTheBf16ProductWithinFp8Rounding) {
  at::manual_seed(2);
  const at::Tensor x = at::randn({24, 256}).to(at::kBFloat16);
  const Quantized4bit q = RandomWeight(64, 256, at::kCPU);
  const at::Tensor w = Dequantize4bit(q, at::kBFloat16).view({64, 256});
  const at::Tensor y = Float8Matmul(QuantizeRowsFloat8(x), WeightRowsFloat8(q), at::kBFloat16);
  ASSERT_EQ(y.scalar_type(), at::kBFloat16);
  const at::Tensor reference = at::mm(x.to(at::kFloat), w.to(at::kFloat).t());
  // Each product carries two e4m3 roundings (about 2.5 % each, RMS over uniform rounding), which
  // sums of 256 random-signed terms do not grow: the relative error is a few percent.
  const double relative =
      (y.to(at::kFloat) - reference).norm().item<double>() / reference.norm().item<double>();
  EXPECT_LT(relative, 0.05);
  EXPECT_GT(relative, 1e-4);  // FP8, not the bf16 product
}

// Into rows of a wider buffer (the packed gate/up rows with spare columns after them): the same
// product there, the spare columns untouched; on each device.
TEST(KernelsFloat8, TheGemmWritesIntoRowsOfAWiderBuffer) {
  for (const at::Device& device : KernelTestDevices()) {
    if (!Float8GemmRunsOn(device)) continue;
    at::manual_seed(4);
    const Float8Rows x = QuantizeRowsFloat8(at::randn({24, 256}).to(at::kBFloat16).to(device));
    const Float8Rows w = WeightRowsFloat8(RandomWeight(64, 256, device));
    const at::Tensor plain = Float8Matmul(x, w, at::kBFloat16);
    const at::Tensor buffer = at::full({24, 96}, 7.0, at::dtype(at::kBFloat16).device(device));
    const at::Tensor rows = buffer.narrow(1, 0, 64);
    const at::Tensor returned = Float8Matmul(x, w, at::kBFloat16, rows);
    EXPECT_EQ(returned.data_ptr(), rows.data_ptr()) << device;
    if (device.is_cpu()) {
      EXPECT_TRUE(at::equal(rows, plain));
    } else {  // cuBLASLt may pick another kernel for another row stride
      const at::Tensor diff = rows.cpu().to(at::kFloat) - plain.cpu().to(at::kFloat);
      EXPECT_LT(diff.norm().item<double>(), 1e-2 * plain.cpu().to(at::kFloat).norm().item<double>());
    }
    EXPECT_TRUE(at::equal(buffer.narrow(1, 64, 32).cpu(), at::full({24, 32}, 7.0, at::kBFloat16)))
        << device;
    EXPECT_THROW(Float8Matmul(x, w, at::kBFloat16, buffer.narrow(1, 0, 63)), c10::Error);
  }
}

TEST(KernelsFloat8, TheGpuWritesTheCpuBits) {
  if (KernelTestDevices().size() < 2 || !Float8GemmRunsOn(at::Device(at::kCUDA, 0))) {
    GTEST_SKIP() << "no GPU with FP8 tensor cores and this build's kernels";
  }
  const at::Device gpu(at::kCUDA, 0);
  const at::Tensor wide = SpreadRows(33, 4096 + 64, at::kBFloat16);
  for (const at::Tensor& x : {wide.narrow(1, 0, 4096), wide.narrow(1, 0, 4096).contiguous(),
                              wide.narrow(1, 0, 4096).to(at::kFloat)}) {
    const Float8Rows cpu = QuantizeRowsFloat8(x);
    const Float8Rows cuda = QuantizeRowsFloat8(x.to(gpu));
    EXPECT_TRUE(at::equal(Bytes(cpu.values), Bytes(cuda.values)));
    EXPECT_TRUE(at::equal(cpu.scales, cuda.scales.cpu()));
  }
  const Quantized4bit q = RandomWeight(96, 4096, gpu);
  const Float8Rows weight_cuda = WeightRowsFloat8(q);
  Quantized4bit q_cpu = q;
  q_cpu.packed = q.packed.cpu();
  q_cpu.absmax = q.absmax.cpu();
  q_cpu.nested_absmax = q.nested_absmax.cpu();
  q_cpu.nested_code = q.nested_code.cpu();
  const Float8Rows weight_cpu = WeightRowsFloat8(q_cpu);
  EXPECT_TRUE(at::equal(Bytes(weight_cpu.values), Bytes(weight_cuda.values)));
  EXPECT_TRUE(at::equal(weight_cpu.scales, weight_cuda.scales.cpu()));
  // cuBLASLt's FP8 GEMM against the CPU's float32 product of the same rows: summation order and
  // fast accumulation aside, the same.
  const Float8Rows x_cpu = QuantizeRowsFloat8(wide.narrow(1, 0, 4096).contiguous());
  const Float8Rows x_cuda = QuantizeRowsFloat8(wide.narrow(1, 0, 4096).to(gpu));
  const at::Tensor y_cpu = Float8Matmul(x_cpu, weight_cpu, at::kBFloat16).to(at::kFloat);
  const at::Tensor y_cuda = Float8Matmul(x_cuda, weight_cuda, at::kBFloat16).cpu().to(at::kFloat);
  EXPECT_LT((y_cpu - y_cuda).norm().item<double>(), 1e-2 * y_cpu.norm().item<double>());
}

}  // namespace
}  // namespace qlora::kernels
