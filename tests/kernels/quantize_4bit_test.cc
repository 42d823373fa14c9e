// Properties of the 4-bit quantizer that hold without bitsandbytes at hand: the packing layout,
// round-trip error bounds, odd sizes and tail blocks, all-zero blocks, double-quantization
// storage and accuracy, and argument checking. Runs on the CPU implementation.
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "kernels/codebooks_4bit.h"
#include "kernels/quantize_4bit.h"

namespace qlora::kernels {
namespace {

Quantize4bitOptions Options(QuantType type, int64_t blocksize, bool double_quant) {
  Quantize4bitOptions o;
  o.type = type;
  o.blocksize = blocksize;
  o.double_quant = double_quant;
  return o;
}

const float* Lut(QuantType type) {
  return type == QuantType::kNF4 ? kNf4Values.v : kFp4Values.v;
}

// Largest gap between neighbouring values of the table: twice the worst rounding error.
float MaxGap(QuantType type) {
  std::vector<float> v(Lut(type), Lut(type) + 16);
  std::sort(v.begin(), v.end());
  float gap = 0;
  for (size_t i = 0; i + 1 < v.size(); ++i) gap = std::max(gap, v[i + 1] - v[i]);
  return gap;
}

TEST(KernelsQuantize4bit, PacksEvenElementInHighNibble) {
  // Block absmax 1, so each value is its own scaled value: codes are exact table entries.
  at::Tensor x = at::tensor({1.0f, -1.0f, 0.0f, 0.07958029955625534f, -0.5250730514526367f},
                            at::kFloat);
  Quantized4bit q = Quantize4bit(x, Options(QuantType::kNF4, 64, false));
  ASSERT_EQ(q.packed.numel(), 3);
  const uint8_t* p = q.packed.data_ptr<uint8_t>();
  EXPECT_EQ(p[0], 0xF0);  // 1.0 -> 15 (high), -1.0 -> 0 (low)
  EXPECT_EQ(p[1], 0x78);  // 0 -> 7, 0.0796 -> 8
  EXPECT_EQ(p[2], 0x27);  // -0.525 -> 2, padding element 0 -> 7
  EXPECT_EQ(q.absmax.item<float>(), 1.0f);
  at::Tensor back = Dequantize4bit(q);
  EXPECT_TRUE(at::equal(back, x));
}

TEST(KernelsQuantize4bit, RoundTripErrorIsBoundedForAllTypesAndSizes) {
  at::manual_seed(7);
  for (QuantType type : {QuantType::kNF4, QuantType::kFP4}) {
    for (int64_t blocksize : {32, 64, 128, 4096}) {
      for (int64_t n : {1, 2, 31, 63, 65, 1000, 4097, 10001}) {
        at::Tensor x = at::randn({n}, at::kFloat);
        Quantized4bit q = Quantize4bit(x, Options(type, blocksize, false));
        ASSERT_EQ(q.packed.numel(), (n + 1) / 2);
        ASSERT_EQ(q.absmax.numel(), (n + blocksize - 1) / blocksize);
        at::Tensor back = Dequantize4bit(q);
        ASSERT_EQ(back.sizes(), x.sizes());
        // |x - deq| <= absmax * maxgap / 2 per block (plus float rounding).
        at::Tensor absmax_per_elem =
            q.absmax.repeat_interleave(blocksize).slice(0, 0, n);
        at::Tensor bound = absmax_per_elem * (MaxGap(type) / 2) * (1 + 1e-5) + 1e-30;
        EXPECT_TRUE(((x - back).abs() <= bound).all().item<bool>())
            << "type " << static_cast<int>(type) << " bs " << blocksize << " n " << n;
        // absmax is the exact max |x| of each block.
        EXPECT_TRUE(at::equal(q.absmax, std::get<0>(at::max(
            at::constant_pad_nd(x.abs(), {0, (blocksize - n % blocksize) % blocksize})
                .view({-1, blocksize}), 1))));
      }
    }
  }
}

TEST(KernelsQuantize4bit, HalfAndBFloat16ShareTheFloatPath) {
  at::manual_seed(3);
  for (at::ScalarType dtype : {at::kHalf, at::kBFloat16}) {
    at::Tensor x = at::randn({37, 29}, at::kFloat).to(dtype);
    Quantized4bit q = Quantize4bit(x, Options(QuantType::kNF4, 64, true));
    Quantized4bit q32 = Quantize4bit(x.to(at::kFloat), Options(QuantType::kNF4, 64, true));
    EXPECT_TRUE(at::equal(q.packed, q32.packed));
    EXPECT_TRUE(at::equal(q.absmax, q32.absmax));
    at::Tensor back = Dequantize4bit(q);
    EXPECT_EQ(back.scalar_type(), dtype);
    EXPECT_EQ(back.sizes(), x.sizes());
    // Dequantizing to another dtype is the float32 result cast once.
    EXPECT_TRUE(at::equal(back, Dequantize4bit(q, at::kFloat).to(dtype)));
  }
}

TEST(KernelsQuantize4bit, AllZeroBlockGivesCodeZeroAndNegativeZero) {
  at::Tensor x = at::randn({3 * 64 + 5}, at::kBFloat16);
  x.slice(0, 64, 128).zero_();
  x.slice(0, 192).zero_();  // the tail block too
  for (QuantType type : {QuantType::kNF4, QuantType::kFP4}) {
    Quantized4bit q = Quantize4bit(x, Options(type, 64, false));
    const float* absmax = q.absmax.data_ptr<float>();
    EXPECT_EQ(absmax[1], 0.0f);
    EXPECT_EQ(absmax[3], 0.0f);
    const uint8_t* p = q.packed.data_ptr<uint8_t>();
    for (int i = 32; i < 64; ++i) ASSERT_EQ(p[i], 0x00) << "0 * inf = NaN -> code 0";
    for (int i = 96; i < 99; ++i) ASSERT_EQ(p[i], 0x00) << "tail byte " << i;
    at::Tensor back = Dequantize4bit(q).view(at::kShort);
    // NF4 code 0 is -1 -> -1 * 0 = -0.0; FP4 code 0 is +0.
    const int16_t zero_bits = type == QuantType::kNF4 ? int16_t(0x8000) : int16_t(0);
    EXPECT_TRUE((back.slice(0, 64, 128) == zero_bits).all().item<bool>());
    EXPECT_TRUE((back.slice(0, 192) == zero_bits).all().item<bool>());
  }
}

TEST(KernelsQuantize4bit, DoubleQuantStorageAndAccuracy) {
  at::manual_seed(11);
  const int64_t n = 4096 * 33;  // 2112 blocks of 64 -> 9 nested blocks, the last partial
  at::Tensor x = at::randn({n}, at::kFloat) * 0.02;
  Quantized4bit plain = Quantize4bit(x, Options(QuantType::kNF4, 64, false));
  Quantized4bit q = Quantize4bit(x, Options(QuantType::kNF4, 64, true));
  ASSERT_TRUE(q.double_quant);
  EXPECT_EQ(q.absmax.scalar_type(), at::kByte);
  EXPECT_EQ(q.absmax.numel(), n / 64);
  EXPECT_EQ(q.nested_absmax.numel(), (n / 64 + 255) / 256);
  EXPECT_EQ(q.nested_code.numel(), 256);
  EXPECT_TRUE(at::equal(q.nested_code, DynamicMap()));
  EXPECT_TRUE(at::equal(q.packed, plain.packed)) << "double quant only changes the absmax";
  EXPECT_EQ(q.nested_offset, at::mean(plain.absmax).item<float>());
  // Storage: 4 bits + 8/64 + 32/(64*256) bits per parameter (0.127 bit of statistics vs 0.5).
  const double stat_bits = 8.0 * (q.absmax.numel() + 4.0 * q.nested_absmax.numel()) / n;
  EXPECT_NEAR(stat_bits, 8.0 / 64 + 32.0 / (64 * 256), 1e-3);
  EXPECT_LT(stat_bits, 0.13);
  // The recovered absmax is within the dynamic map's resolution of the true one.
  at::Tensor recovered = BlockAbsmax(q);
  at::Tensor err = (recovered - plain.absmax).abs().max();
  const float range = (plain.absmax - q.nested_offset).abs().max().item<float>();
  EXPECT_LE(err.item<float>(), range * 0.01f);
  // Dequantize == lut * BlockAbsmax, cast once.
  at::Tensor expected = Dequantize4bit(
      Quantized4bit{q.packed, recovered, {}, {}, 0.0f, false, q.type, 64, 256, q.shape, q.dtype});
  EXPECT_TRUE(at::equal(Dequantize4bit(q), expected));
}

TEST(KernelsQuantize4bit, NestedAbsmaxIsMultiplyThenAdd) {
  at::Tensor codes = at::arange(0, 256, at::kInt).to(at::kByte);
  at::Tensor absmax2 = at::tensor({0.0123f}, at::kFloat);
  const float offset = 0.0377f;
  at::Tensor out = DequantizeBlockwise8bit(codes, absmax2, DynamicMap(), 256, offset);
  for (int i = 0; i < 256; ++i) {
    volatile float product = kDynamicMap.v[i] * 0.0123f;  // rounded on its own
    const float expected = product + offset;
    ASSERT_EQ(out[i].item<float>(), expected) << i;
  }
}

TEST(KernelsQuantize4bit, ShapeAndDtypeAreKept) {
  at::Tensor x = at::randn({3, 5, 7}, at::kBFloat16);
  Quantized4bit q = Quantize4bit(x, Options(QuantType::kFP4, 32, true));
  EXPECT_EQ(q.shape, (std::vector<int64_t>{3, 5, 7}));
  EXPECT_EQ(q.dtype, at::kBFloat16);
  at::Tensor back = Dequantize4bit(q);
  EXPECT_EQ(back.sizes(), x.sizes());
  EXPECT_EQ(back.scalar_type(), at::kBFloat16);
  // Non-contiguous input quantizes its row-major values.
  at::Tensor t = at::randn({64, 96}, at::kFloat).t();
  EXPECT_TRUE(at::equal(Quantize4bit(t, Options(QuantType::kNF4, 64, false)).packed,
                        Quantize4bit(t.contiguous(), Options(QuantType::kNF4, 64, false)).packed));
}

// A weight dequantized into wider rows (the engine's widened LoRA GEMMs): the same values in the
// first columns, the spare columns untouched; on CPU and on the GPU (the strided kernel path:
// rows a multiple of 8 values, and the scalar path: rows of 12), plain and double-quantized.
TEST(KernelsQuantize4bit, DequantizeIntoWiderRowsEqualsTheDenseResult) {
  std::vector<at::Device> devices = {at::kCPU};
  if (HasCudaKernels() && at::hasCUDA()) devices.emplace_back(at::kCUDA, 0);
  for (const at::Device& device : devices) {
    for (const int64_t cols : {int64_t{256}, int64_t{12}}) {
      for (const bool double_quant : {false, true}) {
        SCOPED_TRACE(testing::Message() << device << " cols " << cols << " dq " << double_quant);
        at::manual_seed(11);
        Quantize4bitOptions options;
        options.double_quant = double_quant;
        const Quantized4bit q = Quantize4bit(at::randn({40, cols}).to(device), options);
        const at::Tensor dense = Dequantize4bit(q, at::kBFloat16);
        const at::Tensor wide = at::full({40, cols + 24}, 7.0, dense.options());
        Dequantize4bitInto(q, wide.narrow(1, 0, cols));
        EXPECT_TRUE(at::equal(wide.narrow(1, 0, cols), dense));
        EXPECT_TRUE(at::equal(wide.narrow(1, cols, 24), at::full({40, 24}, 7.0, dense.options())));
      }
    }
  }
  const Quantized4bit q = Quantize4bit(at::randn({8, 64}), Quantize4bitOptions{});
  EXPECT_THROW(Dequantize4bitInto(q, at::empty({8, 32})), c10::Error);       // wrong shape
  EXPECT_THROW(Dequantize4bitInto(q, at::empty({64, 8}).t()), c10::Error);   // column stride
}

// With columns after the rows (the widened weight [W | 0 | scale B | 0] of the LoRA-widened
// GEMMs): the weight as before, then the zeros, scale * values bit for bit as at::mul_out rounds
// them into such a view and the trailing zeros, and nothing past them; in one launch on CUDA.
// Bad columns are named.
TEST(KernelsQuantize4bit, DequantizeIntoWiderRowsWritesTheColumnsAfter) {
  std::vector<at::Device> devices = {at::kCPU};
  if (HasCudaKernels() && at::hasCUDA()) devices.emplace_back(at::kCUDA, 0);
  for (const at::Device& device : devices) {
    for (const auto [zeros, trailing] : {std::pair<int64_t, int64_t>{0, 0}, {16, 0}, {0, 24},
                                         {16, 8}}) {
      for (const at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
        SCOPED_TRACE(testing::Message() << device << " zeros " << zeros << " trailing "
                                        << trailing << " " << dtype);
        at::manual_seed(12);
        Quantize4bitOptions options;
        options.double_quant = true;
        const int64_t rows = 300, cols = 256, r = 8;
        const Quantized4bit q = Quantize4bit(at::randn({rows, cols}).to(device), options);
        // Values spread over many binades (so that rounding matters), some subnormal-adjacent.
        const at::Tensor values = at::randn({rows, r}, at::device(device)) *
                                  at::pow(10.0, at::randint(-6, 3, {rows, r}, at::device(device)));
        const double scale = 1.7;
        const at::Tensor wide = at::full({rows, cols + 64}, 7.0, at::dtype(dtype).device(device));
        const ColumnsAfter after{zeros, values, scale, trailing};
        Dequantize4bitInto(q, wide.narrow(1, 0, cols), &after);
        EXPECT_TRUE(at::equal(wide.narrow(1, 0, cols), Dequantize4bit(q, dtype)));
        EXPECT_TRUE(at::equal(wide.narrow(1, cols, zeros), at::zeros({rows, zeros}, wide.options())));
        at::Tensor expected = at::empty({rows, r}, wide.options());
        at::mul_out(expected, values, at::scalar_tensor(scale, at::kDouble));
        EXPECT_TRUE(at::equal(wide.narrow(1, cols + zeros, r), expected));
        EXPECT_TRUE(at::equal(wide.narrow(1, cols + zeros + r, trailing),
                              at::zeros({rows, trailing}, wide.options())));
        const int64_t rest = 64 - zeros - r - trailing;
        EXPECT_TRUE(at::equal(wide.narrow(1, cols + zeros + r + trailing, rest),
                              at::full({rows, rest}, 7.0, wide.options())));
      }
    }
  }
  const Quantized4bit q = Quantize4bit(at::randn({8, 64}), Quantize4bitOptions{});
  const at::Tensor wide = at::empty({8, 80});
  const ColumnsAfter too_wide{12, at::randn({8, 8}), 1.0};  // 64 + 20 > 80
  EXPECT_THROW(Dequantize4bitInto(q, wide.narrow(1, 0, 64), &too_wide), c10::Error);
  const ColumnsAfter too_wide_trailing{0, at::randn({8, 8}), 1.0, 12};  // 64 + 20 > 80
  EXPECT_THROW(Dequantize4bitInto(q, wide.narrow(1, 0, 64), &too_wide_trailing), c10::Error);
  const ColumnsAfter negative_trailing{0, at::randn({8, 8}), 1.0, -1};
  EXPECT_THROW(Dequantize4bitInto(q, wide.narrow(1, 0, 64), &negative_trailing), c10::Error);
  const ColumnsAfter wrong_rows{0, at::randn({7, 8}), 1.0};
  EXPECT_THROW(Dequantize4bitInto(q, wide.narrow(1, 0, 64), &wrong_rows), c10::Error);
  const ColumnsAfter wrong_dtype{0, at::randn({8, 8}).to(at::kDouble), 1.0};
  EXPECT_THROW(Dequantize4bitInto(q, wide.narrow(1, 0, 64), &wrong_dtype), c10::Error);
}

// WriteColumnsAfter over several weights' rows (a grouped layer's stacked weights held
// dequantized): each target's columns are its zeros, scale * values rounded once and its trailing
// zeros, the weight's own columns and everything past the columns untouched; six targets of
// different row counts, offsets and widths, each its own call; a bad target is named before
// anything is written.
TEST(KernelsQuantize4bit, WriteColumnsAfterWritesEachTargetsColumnsOnly) {
  std::vector<at::Device> devices = {at::kCPU};
  if (HasCudaKernels() && at::hasCUDA()) devices.emplace_back(at::kCUDA, 0);
  for (const at::Device& device : devices) {
    for (const at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
      SCOPED_TRACE(testing::Message() << device << " " << dtype);
      at::manual_seed(5);
      const int64_t cols = 128, stride = 192, r = 16;
      const at::Tensor stacked = at::full({6 * 70, stride}, 7.0, at::dtype(dtype).device(device));
      const at::Tensor before = stacked.clone();
      std::vector<std::pair<at::Tensor, ColumnsAfter>> targets;
      for (int64_t i = 0; i < 6; ++i) {
        const int64_t rows = 40 + 5 * i;  // rows of target i: from i * 70
        const at::Tensor values = at::randn({rows, r}, at::device(device)) *
                                  at::pow(10.0, at::randint(-6, 3, {rows, r}, at::device(device)));
        targets.emplace_back(stacked.narrow(0, i * 70, rows).narrow(1, 0, cols),
                             ColumnsAfter{16 * (i % 3), values, 0.5 + i, 16 * (2 - i % 3)});
      }
      for (const auto& [out, after] : targets) WriteColumnsAfter(out, after);
      at::Tensor expected = before.clone();
      for (int64_t i = 0; i < 6; ++i) {
        const auto& [out, after] = targets[static_cast<size_t>(i)];
        at::Tensor columns = expected.narrow(0, i * 70, out.size(0))
                                 .narrow(1, cols, after.zeros + r + after.trailing_zeros);
        columns.zero_();
        at::Tensor scaled = columns.narrow(1, after.zeros, r);
        at::mul_out(scaled, after.values, at::scalar_tensor(after.scale, at::kDouble));
      }
      EXPECT_TRUE(at::equal(stacked, expected));
    }
  }
  const at::Tensor wide = at::zeros({8, 80});
  EXPECT_THROW(WriteColumnsAfter(wide.narrow(1, 0, 64), ColumnsAfter{12, at::randn({8, 8}), 1.0}),
               c10::Error);  // 64 + 20 > 80
  EXPECT_TRUE(at::equal(wide, at::zeros({8, 80})));  // nothing written
}

TEST(KernelsQuantize4bit, RejectsBadArguments) {
  at::Tensor x = at::randn({128}, at::kFloat);
  EXPECT_THROW(Quantize4bit(x, Options(QuantType::kNF4, 48, false)), c10::Error);
  EXPECT_THROW(Quantize4bit(x, Options(QuantType::kNF4, 16, false)), c10::Error);
  EXPECT_THROW(Quantize4bit(x, Options(QuantType::kNF4, 8192, false)), c10::Error);
  EXPECT_THROW(Quantize4bit(x.to(at::kDouble), Options(QuantType::kNF4, 64, false)), c10::Error);
  EXPECT_THROW(Quantize4bit(at::empty({0}), Options(QuantType::kNF4, 64, false)), c10::Error);
  Quantized4bit q = Quantize4bit(x, Options(QuantType::kNF4, 64, false));
  q.shape = {130};
  EXPECT_THROW(Dequantize4bit(q), c10::Error);
}

}  // namespace
}  // namespace qlora::kernels
