// qlora-dequantize-bench: the NF4 (double-quantized) -> bf16 dequantize kernel's time and memory
// throughput at the base projections' weight shapes, next to two bounds on the same output: a
// bf16 fill (writes only: the dequantize writes 4 bytes for each one it reads) and a bf16 copy.
//   dequantize_bench [repetitions]   (default 100 per batch, 3 batches, the best batch printed)
// Bytes counted per weight: the packed codes (0.5 a value), the bf16 output (2 a value) and the
// per-block absmax codes. Prints microseconds and GB/s per weight shape.
#include <ATen/ATen.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "kernels/bench_timing.h"
#include "kernels/quantize_4bit.h"

using qlora::kernels::BestBatchMs;

int main(int argc, char** argv) {
  const int repetitions = qlora::kernels::BenchRepetitions(argc, argv);
  if (repetitions == 0) return 0;
  const std::vector<std::pair<const char*, std::pair<int64_t, int64_t>>> weights = {
      {"7B q/o 4096x4096", {4096, 4096}},
      {"7B gate 11008x4096", {11008, 4096}},
      {"70B q/o 8192x8192", {8192, 8192}},
      {"70B gate 28672x8192", {28672, 8192}}};
  for (const auto& [name, dims] : weights) {
    const auto [rows, cols] = dims;
    const qlora::kernels::Quantized4bit q = qlora::kernels::Quantize4bit(
        at::randn({rows, cols}, at::dtype(at::kBFloat16).device(at::kCUDA)) * 0.02,
        qlora::kernels::Quantize4bitOptions{});
    const double values = static_cast<double>(rows) * static_cast<double>(cols);
    const double bytes = values * 2.5 + static_cast<double>(q.absmax.numel());
    const double ms =
        BestBatchMs([&] { (void)qlora::kernels::Dequantize4bit(q, at::kBFloat16); }, repetitions);
    std::printf("%-20s dequantize nf4-dq    %8.1f us %7.0f GB/s\n", name, ms * 1e3,
                bytes / ms / 1e6);
    at::Tensor out = at::empty({rows, cols}, at::dtype(at::kBFloat16).device(at::kCUDA));
    const at::Tensor source = at::randn_like(out);
    const double fill = BestBatchMs([&] { out.fill_(1.0); }, repetitions);
    const double copy = BestBatchMs([&] { out.copy_(source); }, repetitions);
    std::printf("%-20s bf16 fill           %8.1f us %7.0f GB/s (writes only)\n", name, fill * 1e3,
                values * 2 / fill / 1e6);
    std::printf("%-20s bf16 copy           %8.1f us %7.0f GB/s (reads + writes)\n", name,
                copy * 1e3, values * 4 / copy / 1e6);
  }
  return 0;
}
