// qlora-lora-gradients-bench: the one-pass LoRA gradient kernel (lora_gradients.h) against the two
// GEMMs it replaces (ATen's, as the engine ran them before), at the 7B layer's gradient shapes.
//   lora_gradients_bench [repetitions]   (default 100 per batch, 3 batches, the best batch printed)
// Prints microseconds per call and the rate at which g's bytes go by (the kernel reads g once,
// the GEMMs twice), for the kernel at 1, 2 and 3 blocks an SM and tiles of 64 and 32 rows.
#include <ATen/ATen.h>

#include <cstdio>

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
  for (const Shape& s : {Shape{"7B q/o/down mb4", 8192, 4096, 16},
                         Shape{"7B gate/up mb4", 8192, 11008, 16},
                         Shape{"7B q/o/down mb1", 2048, 4096, 16},
                         Shape{"7B gate/up r64", 8192, 11008, 64}}) {
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
    std::printf("%-18s two GEMMs         %8.1f us %6.0f GB/s\n", s.name, gemms * 1e3,
                2 * g_bytes / gemms / 1e6);
    for (const int tile_rows : {64, 32}) {
      for (const int blocks_per_sm : {1, 2, 3}) {
        const double fused = BestBatchMs(
            [&] {
              qlora::kernels::LoraGradientPair(
                  g, b, ha, 2.0, dha, db,
                  qlora::kernels::LoraGradientPairOptions{blocks_per_sm, tile_rows});
            },
            repetitions);
        std::printf("%-18s one pass, %d/SM, %2d-row tiles %8.1f us %6.0f GB/s  %.2fx\n", s.name,
                    blocks_per_sm, tile_rows, fused * 1e3, g_bytes / fused / 1e6, gemms / fused);
      }
    }
  }
  return 0;
}
