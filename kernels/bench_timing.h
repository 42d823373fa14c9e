// The kernels' benchmark programs' clock (GPU machine only): a call's time on the current CUDA
// stream, the best of three batches after one warm-up call, and how many calls a batch makes.
#pragma once

#include <ATen/Context.h>
#include <ATen/cuda/CUDAEvent.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>

namespace qlora::kernels {

// Milliseconds per call: the best of 3 batches of `repetitions` calls, timed by CUDA events.
inline double BestBatchMs(const std::function<void()>& call, int repetitions) {
  call();
  double best = 1e30;
  for (int batch = 0; batch < 3; ++batch) {
    at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
    start.record();
    for (int r = 0; r < repetitions; ++r) call();
    stop.record();
    stop.synchronize();
    best = std::min(best, static_cast<double>(start.elapsed_time(stop)) / repetitions);
  }
  return best;
}

// The calls a timed batch makes: argv[1], else 100; 0 (having said so) where there is no GPU.
inline int BenchRepetitions(int argc, char** argv) {
  if (!at::hasCUDA()) {
    std::printf("no GPU: nothing to time\n");
    return 0;
  }
  return argc > 1 ? std::max(1, std::atoi(argv[1])) : 100;
}

}  // namespace qlora::kernels
