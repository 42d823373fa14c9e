// CUDA kernel of cross_entropy.h.
//
//   CrossEntropyKernel  one block per row: pass 1 keeps each thread's running (max, sum of exp)
//                       over its 16-byte vectors of the row and merges them across the block
//                       into logsumexp; pass 2 reads the row again (from L2: a block's row is a
//                       few tens of KiB) and writes (softmax - onehot) * scale over it.
// Arithmetic in float32 with expf/logf (no fast-math approximations).
#include <cmath>
#include <cstdint>

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/macros/Macros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "kernels/cross_entropy_backend.h"
#include "kernels/cuda_vectors.cuh"
#include "kernels/dependent_launch.cuh"

namespace qlora::kernels::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarp = 32;

// A running maximum and the sum of exp(x - max) over the values seen.
struct MaxSum {
  float max, sum;
};

__device__ __forceinline__ MaxSum Add(MaxSum a, float x) {
  if (x == -INFINITY) return a;  // exp(-inf) adds nothing (and -inf - -inf would be NaN)
  if (x <= a.max) return {a.max, a.sum + expf(x - a.max)};
  return {x, a.sum * expf(a.max - x) + 1.0f};  // exp(-inf) = 0 for the first value
}

__device__ __forceinline__ MaxSum Merge(MaxSum a, MaxSum b) {
  if (a.max == -INFINITY) return b;
  if (b.max == -INFINITY) return a;
  const float m = fmaxf(a.max, b.max);
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

__device__ MaxSum BlockMerge(MaxSum v) {
  __shared__ MaxSum partial[kThreads / kWarp];
  __shared__ MaxSum total;
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, v.max, offset),
                 __shfl_xor_sync(0xffffffffu, v.sum, offset)};
    v = Merge(v, other);
  }
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    MaxSum t = partial[0];
    for (int w = 1; w < static_cast<int>(blockDim.x / kWarp); ++w) t = Merge(t, partial[w]);
    total = t;
  }
  __syncthreads();
  return total;
}

template <typename T, int V>
__global__ void CrossEntropyKernel(T* __restrict__ logits, const int64_t* __restrict__ targets,
                                   int64_t vocab, int64_t ignore_index, bool write_gradient,
                                   float grad_scale, float* __restrict__ losses) {
  BeginDependentKernel();
  T* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  const int64_t target = targets[blockIdx.x];
  const bool valid = target != ignore_index;
  CUDA_KERNEL_ASSERT(!valid || (target >= 0 && target < vocab));
  const int64_t vectors = vocab / V;  // V == 1: every value is its own vector

  MaxSum acc{-INFINITY, 0.0f};
  for (int64_t i = threadIdx.x; i < vectors; i += blockDim.x) {
    const Vec<T, V> x = Load<T, V>(row + i * V);
#pragma unroll
    for (int k = 0; k < V; ++k) acc = Add(acc, static_cast<float>(x.v[k]));
  }
  __shared__ float target_logit;
  if (threadIdx.x == 0) target_logit = valid ? static_cast<float>(row[target]) : 0.0f;
  const MaxSum all = BlockMerge(acc);  // synchronizes: target_logit is read before any write
  const float lse = all.max + logf(all.sum);
  if (threadIdx.x == 0) losses[blockIdx.x] = valid ? lse - target_logit : 0.0f;
  if (!write_gradient) return;

  for (int64_t i = threadIdx.x; i < vectors; i += blockDim.x) {
    Vec<T, V> x = Load<T, V>(row + i * V);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      float g = 0.0f;
      if (valid) {
        g = expf(static_cast<float>(x.v[k]) - lse);
        if (i * V + k == target) g -= 1.0f;
        g *= grad_scale;
      }
      x.v[k] = static_cast<T>(g);
    }
    Store<T, V>(row + i * V, x);
  }
}

}  // namespace

bool CrossEntropyWithGradient(at::Tensor& logits, const at::Tensor& targets, int64_t ignore_index,
                              bool write_gradient, float grad_scale, at::Tensor& losses) {
  if (!logits.is_cuda() || logits.dim() != 2 || !logits.is_contiguous() || !targets.is_cuda() ||
      !targets.is_contiguous() || targets.scalar_type() != at::kLong) {
    return false;
  }
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  if (rows == 0) return true;
  if (vocab == 0 || rows >= (int64_t{1} << 31)) return false;
  return DispatchFloating(logits.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = 16 / sizeof(T);
    const bool vectorized = vocab % kVec == 0 && Aligned16(logits.const_data_ptr());
    const c10::cuda::CUDAGuard guard(logits.device());
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    auto kernel = vectorized ? CrossEntropyKernel<T, kVec> : CrossEntropyKernel<T, 1>;
    LaunchDependent(kernel, static_cast<unsigned>(rows), kThreads, 0, stream,
                    logits.mutable_data_ptr<T>(), targets.const_data_ptr<int64_t>(), vocab,
                    ignore_index, write_gradient, grad_scale, losses.mutable_data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return true;
  });
}

}  // namespace qlora::kernels::cuda
