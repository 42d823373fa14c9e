// CUDA kernels of rms_norm.h, one block per row, 16-byte accesses:
//
//   ResidualRmsNormForwardKernel  pass 1: h = x + delta (rounded), written, its squares summed
//                                 (no delta: h is x, nothing written); pass 2: n = h * rstd * w
//                                 from the h this thread just wrote (or x), into rows that may be
//                                 wider than dim (spare columns for the next GEMM's extra inputs)
//   RmsNormBackwardKernel         pass 1: sum of w * dn * h; pass 2: dx, with dh added, rounded once
//                                 (dn, dh and dx may be rows of wider buffers: dx with spare
//                                 columns for the next GEMM's extra inputs)
// Products and sums are rounded as the formulas in rms_norm.h round them (__fmul_rn / __fadd_rn
// where ATen stores nothing between them would still round each op: float32 throughout).
#include <algorithm>
#include <cstdint>

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "kernels/rms_norm_backend.h"
#include "kernels/cuda_vectors.cuh"
#include "kernels/dependent_launch.cuh"

namespace qlora::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;

// The sum over the block; every thread gets it.
__device__ float BlockSum(float v) {
  __shared__ float partial[kThreads / kWarp];
  __shared__ float total;
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (threadIdx.x % kWarp == 0) partial[threadIdx.x / kWarp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float t = 0.0f;
    for (int w = 0; w < static_cast<int>(blockDim.x / kWarp); ++w) t += partial[w];
    total = t;
  }
  __syncthreads();
  return total;
}

template <typename T, int V>
__global__ void ResidualRmsNormForwardKernel(const T* __restrict__ x, const T* __restrict__ delta,
                                             const T* __restrict__ weight, int64_t dim, float eps,
                                             T* h, T* __restrict__ n, int64_t n_stride,
                                             float* __restrict__ rstd_out) {
  BeginDependentKernel();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * dim;
  T* const n_row = n + static_cast<int64_t>(blockIdx.x) * n_stride;
  const int64_t vectors = dim / V;
  float sumsq = 0.0f;
  for (int64_t i = threadIdx.x; i < vectors; i += blockDim.x) {
    Vec<T, V> s = Load<T, V>(x + row + i * V);
    if (delta != nullptr) {
      const Vec<T, V> b = Load<T, V>(delta + row + i * V);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        s.v[k] = static_cast<T>(__fadd_rn(static_cast<float>(s.v[k]), static_cast<float>(b.v[k])));
      }
      Store<T, V>(h + row + i * V, s);
    }
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float f = static_cast<float>(s.v[k]);
      sumsq += f * f;
    }
  }
  const float rstd = rsqrtf(BlockSum(sumsq) / static_cast<float>(dim) + eps);
  if (threadIdx.x == 0) rstd_out[blockIdx.x] = rstd;
  const T* normed = delta != nullptr ? h : x;  // h as written above (this thread's own values)
  for (int64_t i = threadIdx.x; i < vectors; i += blockDim.x) {
    const Vec<T, V> s = Load<T, V>(normed + row + i * V), w = Load<T, V>(weight + i * V);
    Vec<T, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      o.v[k] = static_cast<T>(
          __fmul_rn(__fmul_rn(static_cast<float>(s.v[k]), rstd), static_cast<float>(w.v[k])));
    }
    Store<T, V>(n_row + i * V, o);
  }
}

template <typename T, int V>
__global__ void RmsNormBackwardKernel(const T* __restrict__ grad_n, const T* __restrict__ h,
                                      const float* __restrict__ rstd_in,
                                      const T* __restrict__ weight, const T* __restrict__ grad_h,
                                      int64_t dim, int64_t grad_n_stride, int64_t grad_h_stride,
                                      int64_t dx_stride, T* __restrict__ dx) {
  BeginDependentKernel();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * dim;
  const T* const grad_n_row = grad_n + static_cast<int64_t>(blockIdx.x) * grad_n_stride;
  const T* const grad_h_row =
      grad_h != nullptr ? grad_h + static_cast<int64_t>(blockIdx.x) * grad_h_stride : nullptr;
  T* const dx_row = dx + static_cast<int64_t>(blockIdx.x) * dx_stride;
  const int64_t vectors = dim / V;
  const float rstd = rstd_in[blockIdx.x];
  float dot = 0.0f;
  for (int64_t i = threadIdx.x; i < vectors; i += blockDim.x) {
    const Vec<T, V> g = Load<T, V>(grad_n_row + i * V), s = Load<T, V>(h + row + i * V);
    const Vec<T, V> w = Load<T, V>(weight + i * V);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      dot += __fmul_rn(static_cast<float>(g.v[k]), static_cast<float>(w.v[k])) *
             static_cast<float>(s.v[k]);
    }
  }
  const float c = BlockSum(dot) / static_cast<float>(dim) * rstd * rstd * rstd;
  for (int64_t i = threadIdx.x; i < vectors; i += blockDim.x) {
    const Vec<T, V> g = Load<T, V>(grad_n_row + i * V), s = Load<T, V>(h + row + i * V);
    const Vec<T, V> w = Load<T, V>(weight + i * V);
    Vec<T, V> r{};
    if (grad_h_row != nullptr) r = Load<T, V>(grad_h_row + i * V);
    Vec<T, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float wdn = __fmul_rn(static_cast<float>(g.v[k]), static_cast<float>(w.v[k]));
      float d = __fsub_rn(__fmul_rn(rstd, wdn), __fmul_rn(static_cast<float>(s.v[k]), c));
      if (grad_h_row != nullptr) d = __fadd_rn(d, static_cast<float>(r.v[k]));
      o.v[k] = static_cast<T>(d);
    }
    Store<T, V>(dx_row + i * V, o);
  }
}

bool Aligned16OrUndefined(const at::Tensor& t) {
  return !t.defined() || Aligned16(t.const_data_ptr());
}

// [rows, dim] CUDA tensors of `dtype` whose rows split into 16-byte vectors: contiguous, or (the
// row-strided ones) rows of a wider buffer whose stride keeps every row 16-byte aligned.
bool Takes(std::initializer_list<const at::Tensor*> rows, int64_t dim, at::ScalarType dtype,
           int vec, std::initializer_list<const at::Tensor*> row_strided = {}) {
  if (dim % vec != 0) return false;
  for (const at::Tensor* t : rows) {
    if (!t->defined()) continue;
    const bool strided = std::find(row_strided.begin(), row_strided.end(), t) != row_strided.end();
    const bool layout = strided ? t->dim() == 2 && t->stride(1) == 1 && t->stride(0) >= dim &&
                                      t->stride(0) % vec == 0
                                : t->is_contiguous();
    if (!t->is_cuda() || t->scalar_type() != dtype || !layout || !Aligned16OrUndefined(*t) ||
        t->size(-1) != dim) {
      return false;
    }
  }
  return true;
}

}  // namespace

bool ResidualRmsNormForward(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight,
                            float eps, at::Tensor& h, at::Tensor& n, at::Tensor& rstd) {
  if (x.dim() != 2 || x.size(0) >= (int64_t{1} << 31)) return false;
  const int64_t rows = x.size(0), dim = x.size(1);
  return DispatchFloating(x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);
    if (!Takes({&x, &delta, &weight, &h, &n}, dim, x.scalar_type(), V, {&n})) return false;
    if (rows == 0) return true;
    const c10::cuda::CUDAGuard guard(x.device());
    LaunchDependent(ResidualRmsNormForwardKernel<T, V>, static_cast<unsigned>(rows), kThreads, 0,
                    at::cuda::getCurrentCUDAStream(), x.const_data_ptr<T>(),
                    delta.defined() ? delta.const_data_ptr<T>() : nullptr,
                    weight.const_data_ptr<T>(), dim, eps,
                    delta.defined() ? h.mutable_data_ptr<T>() : nullptr, n.mutable_data_ptr<T>(),
                    n.stride(0), rstd.mutable_data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return true;
  });
}

bool RmsNormBackward(const at::Tensor& grad_n, const at::Tensor& h, const at::Tensor& rstd,
                     const at::Tensor& weight, const at::Tensor& grad_h, at::Tensor& dx) {
  if (h.dim() != 2 || h.size(0) >= (int64_t{1} << 31) || !rstd.is_cuda() ||
      rstd.scalar_type() != at::kFloat || !rstd.is_contiguous()) {
    return false;
  }
  const int64_t rows = h.size(0), dim = h.size(1);
  return DispatchFloating(h.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);
    if (!Takes({&grad_n, &h, &weight, &grad_h, &dx}, dim, h.scalar_type(), V,
               {&grad_n, &grad_h, &dx})) {
      return false;
    }
    if (rows == 0) return true;
    const c10::cuda::CUDAGuard guard(h.device());
    LaunchDependent(RmsNormBackwardKernel<T, V>, static_cast<unsigned>(rows), kThreads, 0,
                    at::cuda::getCurrentCUDAStream(), grad_n.const_data_ptr<T>(),
                    h.const_data_ptr<T>(), rstd.const_data_ptr<float>(), weight.const_data_ptr<T>(),
                    grad_h.defined() ? grad_h.const_data_ptr<T>() : nullptr, dim, grad_n.stride(0),
                    grad_h.defined() ? grad_h.stride(0) : dim, dx.stride(0),
                    dx.mutable_data_ptr<T>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return true;
  });
}

}  // namespace qlora::kernels::cuda
