// qlora-lora-gradients-bench: the one-pass LoRA gradient kernel (lora_gradients.h) against the two
// GEMMs it replaces (ATen's, as the engine ran them before), at the 7B layer's gradient shapes
// and every rank the kernel takes.
//   lora_gradients_bench [repetitions]   (default 100 per batch, 3 batches, the best batch printed)
// Prints microseconds per call and the rate at which g's bytes go by (the kernel reads g once,
// the GEMMs twice), for the kernel at 1, 2 and 3 blocks an SM and tiles of 64 and 32 rows (32:
// ranks 16 and 32 only), and what LoraGradientPair runs by default (LoraGradientPairFused); then
// a grouped layer's adapters (q/k/v, gate/up at r 16) one call each against LoraGradientPairs'
// one launch.
#include <ATen/ATen.h>

#include <cstdio>
#include <vector>

#include "kernels/bench_timing.h"
#include "kernels/lora_gradients.h"

using qlora::kernels::BestBatchMs;

int main(int argc, char** argv) {
  const int repetitions = qlora::kernels::BenchRepetitions(argc, argv);
  if (repetitions == 0) return 0;
  struct Shape {
    const char* name;
    int64_t rows, out, r;
  };
  std::vector<Shape> shapes;
  for (const int64_t r : {16, 32, 48, 64}) {
    shapes.push_back(Shape{"7B q/o/down mb4", 8192, 4096, r});
    shapes.push_back(Shape{"7B gate/up mb4", 8192, 11008, r});
  }
  shapes.push_back(Shape{"7B q/o/down mb1", 2048, 4096, 16});
  for (const Shape& s : shapes) {
    const auto options = at::dtype(at::kBFloat16).device(at::kCUDA);
    const at::Tensor g = at::randn({s.rows, s.out}, options), b = at::randn({s.out, s.r}, options);
    const at::Tensor ha = at::randn({s.rows, s.r}, options);
    at::Tensor dha = at::empty({s.rows, s.r}, options), db = at::empty({s.out, s.r}, options);
    const double g_bytes = 2.0 * s.rows * s.out;
    const double gemms = BestBatchMs(
        [&] {
          at::addmm_out(dha, dha, g, b, 0.0, 2.0);
          at::addmm_out(db, db, g.t(), ha, 0.0, 2.0);
        },
        repetitions);
    std::printf("%-16s r %2lld  two GEMMs                   %8.1f us %6.0f GB/s\n", s.name,
                static_cast<long long>(s.r), gemms * 1e3, 2 * g_bytes / gemms / 1e6);
    const double chosen = BestBatchMs(
        [&] { qlora::kernels::LoraGradientPair(g, b, ha, 2.0, dha, db); }, repetitions);
    const bool fused_by_default = qlora::kernels::LoraGradientPairFused(g, b, ha, dha, db);
    std::printf("%-16s r %2lld  default (%s)  %8.1f us %6.0f GB/s  %.2fx\n", s.name,
                static_cast<long long>(s.r), fused_by_default ? "one pass " : "two GEMMs",
                chosen * 1e3, g_bytes / chosen / 1e6, gemms / chosen);
    for (const int tile_rows : {64, 32}) {
      if (tile_rows == 32 && s.r > 32) continue;  // runs the 64-row tiles
      for (const int blocks_per_sm : {1, 2, 3}) {
        const double fused = BestBatchMs(
            [&] {
              qlora::kernels::LoraGradientPair(
                  g, b, ha, 2.0, dha, db,
                  qlora::kernels::LoraGradientPairOptions{blocks_per_sm, tile_rows, 64});
            },
            repetitions);
        std::printf("%-16s r %2lld  one pass, %d/SM, %2d-row tiles %8.1f us %6.0f GB/s  %.2fx\n",
                    s.name, static_cast<long long>(s.r), blocks_per_sm, tile_rows, fused * 1e3,
                    g_bytes / fused / 1e6, gemms / fused);
      }
    }
  }
  for (const Shape& s : {Shape{"7B q/k/v mb4 x3", 8192, 4096, 16},
                         Shape{"7B gate/up mb4 x2", 8192, 11008, 16}}) {
    const int n = s.out == 4096 ? 3 : 2;
    const auto options = at::dtype(at::kBFloat16).device(at::kCUDA);
    const at::Tensor g = at::randn({s.rows, n * s.out}, options);
    const at::Tensor b = at::randn({n * s.out, s.r}, options);
    const at::Tensor ha = at::randn({s.rows, n * s.r}, options);
    const at::Tensor dha = at::empty({s.rows, n * s.r}, options);
    const at::Tensor db = at::empty({n * s.out, s.r}, options);
    std::vector<qlora::kernels::LoraGradientPairOperands> pairs;
    for (int i = 0; i < n; ++i) {
      pairs.push_back({g.narrow(1, i * s.out, s.out), b.narrow(0, i * s.out, s.out),
                       ha.narrow(1, i * s.r, s.r), 2.0, dha.narrow(1, i * s.r, s.r),
                       db.narrow(0, i * s.out, s.out)});
    }
    const double separate = BestBatchMs(
        [&] {
          for (const auto& p : pairs) {
            qlora::kernels::LoraGradientPair(p.g, p.b, p.ha, p.scale, p.dha, p.db);
          }
        },
        repetitions);
    const double grouped =
        BestBatchMs([&] { qlora::kernels::LoraGradientPairs(pairs); }, repetitions);
    const double g_bytes = 2.0 * s.rows * n * s.out;
    std::printf("%-18s one call each %8.1f us %6.0f GB/s; one launch %8.1f us %6.0f GB/s  %.2fx\n",
                s.name, separate * 1e3, g_bytes / separate / 1e6, grouped * 1e3,
                g_bytes / grouped / 1e6, separate / grouped);
  }
  return 0;
}
