// kernels/lora_gradients.h against the float32 formula dh' = scale g B, dB = scale g^T ha: on
// CPU (ATen's GEMMs) and with the one-pass CUDA kernel on the GPU where there is one, for both
// 16-bit dtypes, every rank the kernel takes, the 7B layer's shapes and shapes with partial
// tiles, at every grid and tile shape the options offer; operands and outputs that are rows
// of wider buffers (the engine's grouped layers); the same bits on every run; and which tensors
// the kernel takes, by default and with every rank allowed.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <vector>

#include "kernels/lora_gradients.h"
#include "tests/kernels/test_devices.h"

namespace qlora::kernels {
namespace {

struct Shape {
  int64_t rows, out, r;
};

struct Operands {
  at::Tensor g, b, ha;
};

Operands Make(const Shape& s, at::ScalarType dtype, const at::Device& device, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto make = [&](std::vector<int64_t> shape, double scale) {
    return (at::randn(shape, gen) * scale).to(dtype).to(device);
  };
  return {make({s.rows, s.out}, 1e-3), make({s.out, s.r}, 0.05), make({s.rows, s.r}, 2.0)};
}

// Options that let the kernel take every rank it can, so that the tests below run it where the
// default sends higher ranks to the GEMMs.
LoraGradientPairOptions EveryRank(int blocks_per_sm = 2, int tile_rows = 32) {
  LoraGradientPairOptions options;
  options.blocks_per_sm = blocks_per_sm;
  options.tile_rows = tile_rows;
  options.max_rank = 64;
  return options;
}

// The outputs' distance from the float32 formula, in units of the tolerance (<= 1 passes): a
// couple of the dtype's ulps of each value, plus float32 summation noise of the largest.
double ToleranceUnits(const at::Tensor& got, const at::Tensor& want, at::ScalarType dtype) {
  const double eps = dtype == at::kHalf ? 9.8e-4 : 7.9e-3;
  const at::Tensor w = want.cpu(), diff = (got.to(at::kFloat).cpu() - w).abs();
  const at::Tensor tolerance = w.abs() * (2 * eps) + w.abs().max() * 1e-4;
  return (diff / tolerance).max().item<double>();
}

std::vector<Shape> ShapesFor(const at::Device& device) {
  std::vector<Shape> shapes = {{300, 136, 16}, {64, 128, 32}, {130, 264, 48}, {77, 8, 64}};
  if (device.is_cuda()) {
    // The 7B layer at micro-batch 4 (q/k/v/o/down, gate/up), one of mb 1, and more ranks.
    shapes.insert(shapes.end(),
                  {{8192, 4096, 16}, {8192, 11008, 16}, {2048, 4096, 16}, {1000, 11008, 48},
                   {4096, 4096, 32}, {333, 1360, 64}});
  }
  return shapes;
}

TEST(KernelsLoraGradients, PairEqualsTheFloat32Formula) {
  const double scale = 2.0;
  for (const at::Device& device : KernelTestDevices()) {
    for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
      for (const Shape& s : ShapesFor(device)) {
        SCOPED_TRACE(testing::Message() << device << " " << dtype << " rows " << s.rows << " out "
                                        << s.out << " r " << s.r);
        const Operands x = Make(s, dtype, device, s.rows * 7 + s.out);
        const at::Tensor dha = at::empty({s.rows, s.r}, x.g.options());
        const at::Tensor db = at::empty({s.out, s.r}, x.g.options());
        EXPECT_EQ(LoraGradientPairFused(x.g, x.b, x.ha, dha, db, EveryRank()), device.is_cuda());
        LoraGradientPair(x.g, x.b, x.ha, scale, dha, db, EveryRank());
        const at::Tensor g = x.g.to(at::kFloat);
        EXPECT_LE(ToleranceUnits(dha, at::mm(g, x.b.to(at::kFloat)) * scale, dtype), 1.0);
        EXPECT_LE(ToleranceUnits(db, at::mm(g.t(), x.ha.to(at::kFloat)) * scale, dtype), 1.0);
      }
    }
  }
}

TEST(KernelsLoraGradients, EveryGridAndTileShapeGivesTheFormula) {
  for (const at::Device& device : KernelTestDevices()) {
    for (const Shape& s : {Shape{1000, 11008, 16}, Shape{333, 1360, 64}, Shape{4100, 4096, 32}}) {
      const Operands x = Make(s, at::kBFloat16, device, s.out);
      const at::Tensor g = x.g.to(at::kFloat);
      const at::Tensor want_dha = at::mm(g, x.b.to(at::kFloat)) * 0.5;
      const at::Tensor want_db = at::mm(g.t(), x.ha.to(at::kFloat)) * 0.5;
      for (const LoraGradientPairOptions options :
           {EveryRank(1, 64), EveryRank(2, 32), EveryRank(3, 64), EveryRank(1, 32)}) {
        SCOPED_TRACE(testing::Message() << device << " rows " << s.rows << " out " << s.out
                                        << " r " << s.r << ", " << options.blocks_per_sm
                                        << " blocks an SM, " << options.tile_rows << "-row tiles");
        const at::Tensor dha = at::empty({s.rows, s.r}, x.g.options());
        const at::Tensor db = at::empty({s.out, s.r}, x.g.options());
        LoraGradientPair(x.g, x.b, x.ha, 0.5, dha, db, options);
        EXPECT_LE(ToleranceUnits(dha, want_dha, at::kBFloat16), 1.0);
        EXPECT_LE(ToleranceUnits(db, want_db, at::kBFloat16), 1.0);
      }
    }
  }
}

TEST(KernelsLoraGradients, RowsOfWiderBuffersGiveTheSameBitsAndLeaveTheRestAlone) {
  for (const at::Device& device : KernelTestDevices()) {
    SCOPED_TRACE(testing::Message() << device);
    const Shape s{1000, 4096, 16};
    const Operands x = Make(s, at::kBFloat16, device, 11);
    const at::Tensor dha = at::empty({s.rows, s.r}, x.g.options());
    const at::Tensor db = at::empty({s.out, s.r}, x.g.options());
    LoraGradientPair(x.g, x.b, x.ha, 0.5, dha, db);

    // g in rows of out + 64; ha in the spare columns after a 512-wide input (the widened
    // layers' layout); dh' in the second of three rank slices; dB in a flat buffer's middle.
    const at::Tensor g_rows = at::zeros({s.rows, s.out + 64}, x.g.options());
    g_rows.narrow(1, 0, s.out).copy_(x.g);
    const at::Tensor ha_rows = at::zeros({s.rows, 512 + 64}, x.g.options());
    ha_rows.narrow(1, 512, s.r).copy_(x.ha);
    const at::Tensor dha_rows = at::full({s.rows, 3 * s.r}, 7.0, x.g.options());
    const at::Tensor flat = at::full({(s.out + 2) * s.r}, 7.0, x.g.options());
    const at::Tensor db_view = flat.narrow(0, s.r, s.out * s.r).view({s.out, s.r});
    const at::Tensor g = g_rows.narrow(1, 0, s.out), ha = ha_rows.narrow(1, 512, s.r);
    const at::Tensor dha_view = dha_rows.narrow(1, s.r, s.r);
    EXPECT_EQ(LoraGradientPairFused(g, x.b, ha, dha_view, db_view), device.is_cuda());
    LoraGradientPair(g, x.b, ha, 0.5, dha_view, db_view);
    EXPECT_TRUE(at::equal(dha_view, dha));
    EXPECT_TRUE(at::equal(db_view, db));
    EXPECT_TRUE((dha_rows.narrow(1, 0, s.r) == 7).all().item<bool>());
    EXPECT_TRUE((dha_rows.narrow(1, 2 * s.r, s.r) == 7).all().item<bool>());
    EXPECT_TRUE((flat.narrow(0, 0, s.r) == 7).all().item<bool>());
    EXPECT_TRUE((flat.narrow(0, (s.out + 1) * s.r, s.r) == 7).all().item<bool>());
  }
}

// A grouped layer's adapters (their gradients side by side in one buffer's rows, ha and dh' in
// slices of one [T, sum of r]) in one launch: dh' with the bits of one call each, dB the float32
// formula, both the same bits on a second run; adapters of different ranks go one by one.
TEST(KernelsLoraGradients, GroupedAdaptersInOneLaunch) {
  for (const at::Device& device : KernelTestDevices()) {
    for (const Shape& s : {Shape{1000, 11008, 16}, Shape{4100, 4096, 32}, Shape{300, 136, 16}}) {
      SCOPED_TRACE(testing::Message() << device << " rows " << s.rows << " out " << s.out
                                      << " r " << s.r);
      const int n = 3;
      const Operands x = Make({s.rows, n * s.out, s.r}, at::kBFloat16, device, s.rows + 3);
      const at::Tensor g_rows = at::zeros({s.rows, n * s.out + 64}, x.g.options());
      g_rows.narrow(1, 0, n * s.out).copy_(x.g);
      const Operands h = Make({s.rows, s.out, n * s.r}, at::kBFloat16, device, s.rows + 4);
      auto run = [&] {
        const at::Tensor dha = at::empty({s.rows, n * s.r}, x.g.options());
        std::vector<at::Tensor> db;
        std::vector<LoraGradientPairOperands> pairs;
        for (int i = 0; i < n; ++i) {
          db.push_back(at::empty({s.out, s.r}, x.g.options()));
          pairs.push_back({g_rows.narrow(1, i * s.out, s.out), x.b.narrow(0, i * s.out, s.out),
                           h.ha.narrow(1, i * s.r, s.r), 0.5 + i, dha.narrow(1, i * s.r, s.r),
                           db.back()});
        }
        EXPECT_EQ(LoraGradientPairsFused(pairs, EveryRank()), device.is_cuda());
        LoraGradientPairs(pairs, EveryRank());
        db.push_back(dha);
        return db;
      };
      const std::vector<at::Tensor> first = run(), second = run();
      for (int i = 0; i < n; ++i) {
        SCOPED_TRACE(testing::Message() << "adapter " << i);
        const at::Tensor g = x.g.narrow(1, i * s.out, s.out), b = x.b.narrow(0, i * s.out, s.out);
        const at::Tensor ha = h.ha.narrow(1, i * s.r, s.r).contiguous();
        const at::Tensor dha = first[n].narrow(1, i * s.r, s.r);
        const at::Tensor alone_dha = at::empty({s.rows, s.r}, x.g.options());
        const at::Tensor alone_db = at::empty({s.out, s.r}, x.g.options());
        LoraGradientPair(g.contiguous(), b.contiguous(), ha, 0.5 + i, alone_dha, alone_db,
                         EveryRank());
        EXPECT_TRUE(at::equal(dha, alone_dha));
        const at::Tensor g32 = g.to(at::kFloat);
        EXPECT_LE(ToleranceUnits(first[i], at::mm(g32.t(), ha.to(at::kFloat)) * (0.5 + i),
                                 at::kBFloat16),
                  1.0);
        EXPECT_TRUE(at::equal(first[i], second[i]));
      }
      EXPECT_TRUE(at::equal(first[n], second[n]));
    }
    // Different ranks: one call each, the same results as separate calls.
    const Operands x = Make({256, 256, 16}, at::kBFloat16, device, 9);
    const Operands y = Make({256, 256, 32}, at::kBFloat16, device, 10);
    const at::TensorOptions options = x.g.options();
    const at::Tensor dha_x = at::empty({256, 16}, options), db_x = at::empty({256, 16}, options);
    const at::Tensor dha_y = at::empty({256, 32}, options), db_y = at::empty({256, 32}, options);
    const std::vector<LoraGradientPairOperands> mixed = {{x.g, x.b, x.ha, 1.0, dha_x, db_x},
                                                         {y.g, y.b, y.ha, 1.0, dha_y, db_y}};
    EXPECT_FALSE(LoraGradientPairsFused(mixed));
    LoraGradientPairs(mixed);
    const at::Tensor want_x = at::empty_like(dha_x), want_y = at::empty_like(dha_y);
    const at::Tensor want_db_y = at::empty_like(db_y);
    LoraGradientPair(x.g, x.b, x.ha, 1.0, want_x, at::empty_like(db_x));
    LoraGradientPair(y.g, y.b, y.ha, 1.0, want_y, want_db_y);
    EXPECT_TRUE(at::equal(dha_x, want_x));
    EXPECT_TRUE(at::equal(dha_y, want_y));
    EXPECT_TRUE(at::equal(db_y, want_db_y));
  }
}

// dh' times a row factor written beside dh' (the norm's rstd on a grouped node's dh'): the bits
// of at::mul_out(scaled, dha, row_scale[:, None]) over the dh' the call wrote, for grouped
// adapters in one launch (the kernel's reduction on CUDA) and on the CPU; dh' and dB unchanged.
TEST(KernelsLoraGradients, RowScaledDhEqualsTheProductOfTheRoundedDh) {
  for (const at::Device& device : KernelTestDevices()) {
    SCOPED_TRACE(testing::Message() << device);
    const int n = 2;
    const int64_t rows = 1000, out = 4096, r = 16;
    const Operands x = Make({rows, n * out, r}, at::kBFloat16, device, 21);
    const Operands h = Make({rows, out, n * r}, at::kBFloat16, device, 22);
    const at::Tensor rstd = (at::rand({rows}, at::device(device)) * 3 + 0.1).to(at::kFloat);
    auto run = [&](bool with_scale) {
      std::vector<at::Tensor> results = {at::empty({rows, n * r}, x.g.options()),
                                         at::empty({rows, n * r}, x.g.options())};
      std::vector<LoraGradientPairOperands> pairs;
      for (int i = 0; i < n; ++i) {
        results.push_back(at::empty({out, r}, x.g.options()));
        pairs.push_back({x.g.narrow(1, i * out, out), x.b.narrow(0, i * out, out),
                         h.ha.narrow(1, i * r, r), 0.25 + i, results[0].narrow(1, i * r, r),
                         results.back()});
        if (with_scale) {
          pairs.back().row_scale = rstd;
          pairs.back().dha_scaled = results[1].narrow(1, i * r, r);
        }
      }
      EXPECT_EQ(LoraGradientPairsFused(pairs), device.is_cuda());
      LoraGradientPairs(pairs);
      return results;
    };
    const std::vector<at::Tensor> plain = run(false), scaled = run(true);
    at::Tensor want = at::empty_like(scaled[1]);
    at::mul_out(want, scaled[0], rstd.reshape({-1, 1}));
    EXPECT_TRUE(at::equal(scaled[1], want));
    EXPECT_TRUE(at::equal(scaled[0], plain[0]));
    for (int i = 0; i < n; ++i) EXPECT_TRUE(at::equal(scaled[2 + i], plain[2 + i]));
  }
  // One of the two without the other is refused.
  const Operands x = Make({64, 64, 16}, at::kBFloat16, at::kCPU, 23);
  LoraGradientPairOperands half{x.g, x.b, x.ha, 1.0, at::empty({64, 16}, x.g.options()),
                                at::empty({64, 16}, x.g.options())};
  half.row_scale = at::ones({64});
  EXPECT_THROW(LoraGradientPairs({half}), c10::Error);
}

TEST(KernelsLoraGradients, SameBitsOnEveryRun) {
  for (const at::Device& device : KernelTestDevices()) {
    SCOPED_TRACE(testing::Message() << device);
    const Shape s{4096, 11008, 16};
    const Operands x = Make(s, at::kBFloat16, device, 5);
    std::vector<at::Tensor> runs;
    for (int run = 0; run < 3; ++run) {
      const at::Tensor dha = at::empty({s.rows, s.r}, x.g.options());
      const at::Tensor db = at::empty({s.out, s.r}, x.g.options());
      LoraGradientPair(x.g, x.b, x.ha, 1.0, dha, db);
      runs.push_back(at::cat({dha.flatten(), db.flatten()}));
    }
    EXPECT_TRUE(at::equal(runs[0], runs[1]));
    EXPECT_TRUE(at::equal(runs[0], runs[2]));
  }
}

TEST(KernelsLoraGradients, TheKernelTakesOnlyWhatItCanRead) {
  for (const at::Device& device : KernelTestDevices()) {
    SCOPED_TRACE(testing::Message() << device);
    auto fused = [&](Shape s, at::ScalarType dtype, int64_t g_offset = 0,
                     const LoraGradientPairOptions& kernel_options = {}) {
      const at::TensorOptions options = at::TensorOptions().dtype(dtype).device(device);
      const at::Tensor g = at::zeros({s.rows, s.out + 8}, options).narrow(1, g_offset, s.out);
      return LoraGradientPairFused(g, at::zeros({s.out, s.r}, options),
                                   at::zeros({s.rows, s.r}, options),
                                   at::empty({s.rows, s.r}, options),
                                   at::empty({s.out, s.r}, options), kernel_options);
    };
    const bool cuda = device.is_cuda();
    EXPECT_EQ(fused({256, 4096, 16}, at::kBFloat16), cuda);
    EXPECT_FALSE(fused({256, 4096, 32}, at::kHalf));       // above the default max_rank
    EXPECT_EQ(fused({256, 4096, 64}, at::kHalf, 0, EveryRank()), cuda);
    EXPECT_FALSE(fused({256, 4096, 8}, at::kBFloat16));    // rank not a multiple of 16
    EXPECT_FALSE(fused({256, 4096, 80}, at::kBFloat16, 0, EveryRank()));  // rank above 64
    EXPECT_FALSE(fused({256, 4100, 16}, at::kBFloat16));   // out not a multiple of 8
    EXPECT_FALSE(fused({256, 4096, 16}, at::kFloat));      // float32
    EXPECT_FALSE(fused({256, 4096, 16}, at::kBFloat16, 1));  // rows not 16-byte aligned
  }
}

TEST(KernelsLoraGradients, RejectsMismatchedShapes) {
  const at::Tensor g = at::zeros({8, 16}), b = at::zeros({16, 4}), ha = at::zeros({8, 4});
  EXPECT_THROW(LoraGradientPair(g, at::zeros({12, 4}), ha, 1.0, at::empty({8, 4}),
                                at::empty({16, 4})),
               c10::Error);
  EXPECT_THROW(LoraGradientPair(g, b, ha, 1.0, at::empty({8, 5}), at::empty({16, 4})),
               c10::Error);
}

}  // namespace
}  // namespace qlora::kernels
