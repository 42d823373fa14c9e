// The CUDA kernels against the CPU oracle on large random inputs: dequantization bit for bit
// (plain, double-quantized, every output dtype, aligned and unaligned packed views), quantization
// with identical absmax and at most rare neighbouring-code differences (CUDA's approximate
// reciprocal vs the CPU's exact one), and the 8-bit double-quantization step. Skips without a GPU.
// (The dequantize kernel's speed: kernels/dequantize_bench.)
#include <cstdint>
#include <cstring>
#include <string>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "kernels/quantize_4bit.h"
#include "tests/kernels/code_boundary.h"

namespace qlora::kernels {
namespace {

class KernelsCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HasCudaKernels()) GTEST_SKIP() << "built without CUDA kernels";
    if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  }
};

Quantized4bit ToDevice(Quantized4bit q, const at::Device& d) {
  q.packed = q.packed.to(d);
  q.absmax = q.absmax.to(d);
  if (q.double_quant) {
    q.nested_absmax = q.nested_absmax.to(d);
    q.nested_code = q.nested_code.to(d);
  }
  return q;
}

bool BitEqual(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.contiguous().cpu();
  const at::Tensor y = b.contiguous().cpu();
  return x.sizes() == y.sizes() && x.scalar_type() == y.scalar_type() &&
         std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

// Number of differing 4-bit codes; fails for any difference that is not a neighbouring code at
// a decision boundary (where CUDA's rcp.approx and the CPU's exact reciprocal may disagree).
int64_t CodeMismatches(const at::Tensor& gpu, const at::Tensor& cpu, const at::Tensor& input,
                       const at::Tensor& absmax, QuantType type, int64_t blocksize) {
  const at::Tensor a = gpu.cpu();
  const at::Tensor b = cpu.cpu();
  const at::Tensor x = input.cpu().to(at::kFloat).contiguous().view({-1});
  const at::Tensor differing = at::nonzero(a != b).view({-1});
  const uint8_t* pa = a.data_ptr<uint8_t>();
  const uint8_t* pb = b.data_ptr<uint8_t>();
  const float* px = x.data_ptr<float>();
  const float* pam = absmax.cpu().contiguous().data_ptr<float>();
  int64_t count = 0;
  for (int64_t k = 0; k < differing.numel(); ++k) {
    const int64_t i = differing[k].item<int64_t>();
    for (int half = 0; half < 2; ++half) {
      const int ca = half == 0 ? pa[i] >> 4 : pa[i] & 15;
      const int cb = half == 0 ? pb[i] >> 4 : pb[i] & 15;
      if (ca == cb) continue;
      ++count;
      const int64_t e = 2 * i + half;
      const float xv = e < x.numel() ? px[e] : 0.0f;
      EXPECT_TRUE(NearBoundary(xv, pam[e / blocksize], BoundaryBetween(type, ca, cb)))
          << "element " << e << " x=" << xv << " cuda " << ca << " cpu " << cb;
    }
  }
  return count;
}

TEST_F(KernelsCuda, MatchesCpuOracleOnLargeRandomInputs) {
  at::manual_seed(2024);
  const int64_t n = (1 << 22) + 4097;  // odd, with a partial tail block
  for (at::ScalarType dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    const at::Tensor x = (at::randn({n}) * at::exp(at::randn({n}))).to(dtype);
    const at::Tensor xg = x.cuda();
    for (QuantType type : {QuantType::kNF4, QuantType::kFP4}) {
      for (int64_t blocksize : {32, 64, 256, 4096}) {
        Quantize4bitOptions o;
        o.type = type;
        o.blocksize = blocksize;
        o.double_quant = false;
        const Quantized4bit cpu = Quantize4bit(x, o);
        const Quantized4bit gpu = Quantize4bit(xg, o);
        const std::string what = std::string(c10::toString(dtype)) + " type " +
                                 std::to_string(static_cast<int>(type)) + " bs " +
                                 std::to_string(blocksize);
        EXPECT_TRUE(BitEqual(gpu.absmax, cpu.absmax)) << what;
        const int64_t mismatches =
            CodeMismatches(gpu.packed, cpu.packed, x, cpu.absmax, type, blocksize);
        // bfloat16 inputs land exactly on FP4 pivots such as 11/128 most often: 6.6e-5 measured.
        EXPECT_LE(mismatches * 10000, n) << what << ": " << mismatches << " codes differ";
        // Dequantization of the same state is exact on both devices, for every output dtype.
        for (at::ScalarType out : {at::kFloat, at::kHalf, at::kBFloat16}) {
          EXPECT_TRUE(BitEqual(Dequantize4bit(gpu, out), Dequantize4bit(ToDevice(gpu, at::kCPU), out)))
              << what << " -> " << out;
        }
      }
    }
  }
}

TEST_F(KernelsCuda, DoubleQuantizationMatchesCpuOracle) {
  at::manual_seed(99);
  const int64_t n = 4096 * 1024 + 333;
  const at::Tensor x = (at::randn({n}) * 0.02).to(at::kBFloat16);
  for (QuantType type : {QuantType::kNF4, QuantType::kFP4}) {
    Quantize4bitOptions o;
    o.type = type;
    const Quantized4bit gpu = Quantize4bit(x.cuda(), o);
    ASSERT_TRUE(gpu.double_quant);
    // The 8-bit step on identical input (the offset itself is each device's at::mean).
    const at::Tensor absmax = Quantize4bit(x, [&] { auto p = o; p.double_quant = false; return p; }())
                                  .absmax;
    const at::Tensor centered = absmax - gpu.nested_offset;
    const Blockwise8bit c = QuantizeBlockwise8bit(centered, 256);
    const Blockwise8bit g = QuantizeBlockwise8bit(centered.cuda(), 256);
    EXPECT_TRUE(BitEqual(g.absmax, c.absmax));
    const int64_t differ = (g.codes.cpu() != c.codes).sum().item<int64_t>();
    EXPECT_LE(differ * 1000, c.codes.numel()) << differ << " absmax codes differ";
    EXPECT_LE((g.codes.cpu().to(at::kInt) - c.codes.to(at::kInt)).abs().max().item<int>(), 1);
    // Fused double dequantization on the GPU == resolve absmax then dequantize on the CPU.
    const Quantized4bit cpu_state = ToDevice(gpu, at::kCPU);
    EXPECT_TRUE(BitEqual(BlockAbsmax(gpu), BlockAbsmax(cpu_state)));
    EXPECT_TRUE(BitEqual(Dequantize4bit(gpu), Dequantize4bit(cpu_state)));
  }
}

TEST_F(KernelsCuda, UnalignedPackedViewTakesTheScalarPath) {
  at::manual_seed(5);
  const int64_t n = 64 * 1000;
  const Quantized4bit q = Quantize4bit(at::randn({n}).cuda(), Quantize4bitOptions{});
  Quantized4bit shifted = q;
  at::Tensor storage = at::empty({q.packed.numel() + 1}, q.packed.options());
  shifted.packed = storage.slice(0, 1);
  shifted.packed.copy_(q.packed);
  EXPECT_TRUE(BitEqual(Dequantize4bit(shifted), Dequantize4bit(q)));
  EXPECT_TRUE(BitEqual(Dequantize4bit(shifted), Dequantize4bit(ToDevice(q, at::kCPU))));
}

}  // namespace
}  // namespace qlora::kernels
