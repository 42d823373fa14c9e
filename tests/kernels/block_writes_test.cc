// kernels::WriteBlocks (kernels/block_writes.h) on the CPU and, where there is one, the GPU: each
// block holds zeros, the float32 source times the scale rounded once, or the copied source, and
// nothing outside the blocks moves; the GPU's one launch gives the CPU's bits (vectorized rows and
// element-wise ones: odd widths, unaligned views); ColumnsAfterBlocks through it gives
// WriteColumnsAfter's bits; a malformed block is refused before anything is written.
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "kernels/block_writes.h"
#include "kernels/quantize_4bit.h"
#include "tests/kernels/test_devices.h"

namespace qlora::kernels {
namespace {

constexpr float kSentinel = 7.0f;

struct Case {
  at::Tensor buffer;               // [rows, stride] of the block dtype, the blocks inside
  std::vector<BlockWrite> writes;  // views of buffer
  at::Tensor written;              // where the blocks are (bool, buffer's shape)
};

// Blocks over one [64, 200] buffer of `dtype`: zeros, scaled float32 (aligned, and at an odd
// column with an odd width), copies of the buffer's dtype (aligned and not), on `device`.
Case MakeCase(at::ScalarType dtype, const at::Device& device) {
  at::manual_seed(3);
  Case c;
  c.buffer = at::full({64, 200}, kSentinel, at::dtype(dtype).device(device));
  c.written = at::zeros({64, 200}, at::kBool);
  const auto f32 = at::dtype(at::kFloat).device(device);
  auto add = [&](int64_t row, int64_t rows, int64_t col, int64_t cols, at::Tensor source,
                 double scale) {
    c.writes.push_back({c.buffer.narrow(0, row, rows).narrow(1, col, cols), source, scale});
    c.written.narrow(0, row, rows).narrow(1, col, cols).fill_(true);
  };
  add(0, 64, 0, 16, at::Tensor(), 1.0);                                   // zeros, vectors
  add(0, 64, 16, 32, at::randn({64, 32}, f32), 0.37);                     // scaled, vectors
  add(0, 30, 48, 5, at::randn({30, 5}, f32), -2.5);                       // scaled, odd width
  add(30, 34, 49, 3, at::Tensor(), -1.0);                                 // zeros (never -0)
  add(0, 40, 64, 64, at::randn({40, 64}, f32).to(dtype), 1.0);            // copy, vectors
  add(40, 20, 129, 31, at::randn({20, 31}, f32).to(dtype), 1.0);          // copy, unaligned
  const at::Tensor wide = at::randn({17, 48}, f32);                       // a strided source
  add(5, 17, 160, 24, wide.narrow(1, 8, 24), 0.125);
  return c;
}

// What each block should hold, computed apart from the kernels (float32 product, one rounding).
at::Tensor Expected(const Case& c) {
  at::Tensor expected = c.buffer.cpu().clone();
  for (const BlockWrite& w : c.writes) {
    const int64_t row = (w.out.storage_offset() - c.buffer.storage_offset()) / c.buffer.stride(0);
    const int64_t col = (w.out.storage_offset() - c.buffer.storage_offset()) % c.buffer.stride(0);
    at::Tensor block = expected.narrow(0, row, w.out.size(0)).narrow(1, col, w.out.size(1));
    if (!w.source.defined()) {
      block.zero_();
    } else if (w.source.scalar_type() == at::kFloat) {
      block.copy_((w.source.cpu() * static_cast<float>(w.scale)).to(c.buffer.scalar_type()));
    } else {
      block.copy_(w.source.cpu());
    }
  }
  return expected;
}

TEST(KernelsBlockWrites, BlocksHoldTheirValuesAndNothingElseMoves) {
  for (const at::Device& device : KernelTestDevices()) {
    for (at::ScalarType dtype : {at::kBFloat16, at::kHalf, at::kFloat}) {
      SCOPED_TRACE(device.str() + " " + std::string(c10::toString(dtype)));
      Case c = MakeCase(dtype, device);
      const at::Tensor expected = Expected(c);
      WriteBlocks(c.writes);
      const at::Tensor got = c.buffer.cpu();
      EXPECT_TRUE(at::equal(got, expected)) << (got.to(at::kFloat) - expected.to(at::kFloat)).abs().max();
      // Outside the blocks: the sentinel. Zeros are +0 (a negative scale over zeros is not -0).
      EXPECT_TRUE(at::equal(got.masked_select(c.written.logical_not()).to(at::kFloat),
                            at::full({(~c.written).sum().item<int64_t>()}, kSentinel)));
      EXPECT_FALSE(at::signbit(got.narrow(0, 30, 34).narrow(1, 49, 3).to(at::kFloat)).any().item<bool>());
    }
  }
}

TEST(KernelsBlockWrites, TheGpuWritesTheCpuBits) {
  if (KernelTestDevices().size() < 2) GTEST_SKIP() << "no GPU with this build's kernels";
  for (at::ScalarType dtype : {at::kBFloat16, at::kHalf, at::kFloat}) {
    Case cpu = MakeCase(dtype, at::kCPU);
    Case gpu = MakeCase(dtype, at::Device(at::kCUDA, 0));
    for (size_t i = 0; i < gpu.writes.size(); ++i) {  // the same sources on both
      if (cpu.writes[i].source.defined()) gpu.writes[i].source.copy_(cpu.writes[i].source);
    }
    WriteBlocks(cpu.writes);
    WriteBlocks(gpu.writes);
    EXPECT_TRUE(at::equal(gpu.buffer.cpu(), cpu.buffer)) << c10::toString(dtype);
  }
}

TEST(KernelsBlockWrites, ColumnsAfterBlocksGiveWriteColumnsAftersBits) {
  for (const at::Device& device : KernelTestDevices()) {
    at::manual_seed(5);
    const auto bf16 = at::dtype(at::kBFloat16).device(device);
    const at::Tensor values = at::randn({24, 16}, at::dtype(at::kFloat).device(device));
    const ColumnsAfter after{32, values, 0.3, 16};
    at::Tensor a = at::full({24, 200}, kSentinel, bf16), b = a.clone();
    WriteColumnsAfter(a.narrow(1, 0, 128), after);
    WriteBlocks(ColumnsAfterBlocks(b.narrow(1, 0, 128), after));
    EXPECT_TRUE(at::equal(a, b)) << device;
  }
}

TEST(KernelsBlockWrites, AMalformedBlockIsRefusedBeforeAnythingIsWritten) {
  for (const at::Device& device : KernelTestDevices()) {
    const auto f32 = at::dtype(at::kFloat).device(device);
    at::Tensor buffer = at::full({8, 32}, kSentinel, at::dtype(at::kBFloat16).device(device));
    const BlockWrite good{buffer.narrow(1, 0, 8), at::Tensor(), 1.0};
    const std::vector<std::vector<BlockWrite>> bad = {
        {good, {buffer.narrow(1, 8, 8), at::ones({8, 4}, f32), 1.0}},           // source shape
        {good, {buffer.narrow(1, 8, 8), at::ones({8, 8}, f32).to(at::kBFloat16), 2.0}},  // scaled copy
        {good, {buffer.narrow(1, 8, 8).t(), at::Tensor(), 1.0}},                // column stride
        {good, {at::zeros({8, 8}, f32), at::Tensor(), 1.0}},                    // another dtype
    };
    for (const auto& writes : bad) {
      EXPECT_THROW(WriteBlocks(writes), c10::Error);
      EXPECT_TRUE(at::equal(buffer.cpu().to(at::kFloat), at::full({8, 32}, kSentinel))) << device;
    }
  }
}

}  // namespace
}  // namespace qlora::kernels
