// CUDA kernel of adamw.h: the ATen ops of one AdamW step as one pass over the elements.
//
// Each element goes through the roundings of the ops AdamWStep's CPU path runs on CUDA tensors:
// separate float32 products where ATen runs a separate kernel (__fmul_rn: never fused with what
// follows), ATen's own lerp and addcmul/addcdiv formulas (ATen/native/Lerp.h,
// native/cuda/DeviceAddCmulCdiv.cuh: a fused multiply-add where ATen's kernels have one), and the
// division by sqrt(bias_correction2) as a product with its float32 reciprocal (ATen's CUDA
// division by a scalar).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>

#include <ATen/cuda/CUDAContext.h>
#include <ATen/native/Lerp.h>
#include <ATen/native/cuda/DeviceAddCmulCdiv.cuh>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "kernels/adamw_backend.h"
#include "kernels/cuda_vectors.cuh"

namespace qlora::kernels::cuda {
namespace {

// The step's scalars as ATen hands them to its kernels (float32).
struct Coefficients {
  float decay;             // 1 - lr * weight_decay
  float lerp_weight;       // 1 - beta1
  float beta2;
  float one_minus_beta2;
  float inv_bias_sqrt;     // 1 / float(sqrt(1 - beta2^step))
  float eps;
  float neg_step_size;     // -lr / (1 - beta1^step)
};

// grad's factor: none, float32 or float64 (converted to float32, as ATen's mul loads it).
struct Factor {
  const void* value = nullptr;
  bool is_double = false;
};

__device__ __forceinline__ void Update(float& p, float g, float& m, float& v,
                                       const Coefficients& c, float factor, bool scaled) {
  if (scaled) g = __fmul_rn(g, factor);
  p = __fmul_rn(p, c.decay);
  m = at::native::lerp(m, g, c.lerp_weight);
  v = __fmul_rn(v, c.beta2);
  v = at::native::pointwise_op_impl<float>(v, g, g, c.one_minus_beta2, std::multiplies<float>());
  float d = sqrtf(v);
  d = __fmul_rn(d, c.inv_bias_sqrt);
  d = __fadd_rn(d, c.eps);
  p = at::native::pointwise_op_impl<float>(p, m, d, c.neg_step_size, std::divides<float>());
}

// Four elements a thread at a time where every pointer is 16-byte aligned (vectorized), else one.
template <bool kVectorized>
__global__ void AdamWKernel(float* __restrict__ param, const float* __restrict__ grad,
                            float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq,
                            int64_t n, Coefficients c, Factor factor) {
  const bool scaled = factor.value != nullptr;
  const float f = !scaled ? 1.0f
                  : factor.is_double
                      ? static_cast<float>(*static_cast<const double*>(factor.value))
                      : *static_cast<const float*>(factor.value);
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if constexpr (kVectorized) {
    for (int64_t q = first; q < n / 4; q += stride) {
      float4 p = reinterpret_cast<const float4*>(param)[q];
      const float4 g = reinterpret_cast<const float4*>(grad)[q];
      float4 m = reinterpret_cast<const float4*>(exp_avg)[q];
      float4 v = reinterpret_cast<const float4*>(exp_avg_sq)[q];
      Update(p.x, g.x, m.x, v.x, c, f, scaled);
      Update(p.y, g.y, m.y, v.y, c, f, scaled);
      Update(p.z, g.z, m.z, v.z, c, f, scaled);
      Update(p.w, g.w, m.w, v.w, c, f, scaled);
      reinterpret_cast<float4*>(param)[q] = p;
      reinterpret_cast<float4*>(exp_avg)[q] = m;
      reinterpret_cast<float4*>(exp_avg_sq)[q] = v;
    }
    for (int64_t i = n / 4 * 4 + first; i < n; i += stride) {  // the tail
      Update(param[i], grad[i], exp_avg[i], exp_avg_sq[i], c, f, scaled);
    }
  } else {
    for (int64_t i = first; i < n; i += stride) {
      Update(param[i], grad[i], exp_avg[i], exp_avg_sq[i], c, f, scaled);
    }
  }
}

bool Takes(const at::Tensor& t, const at::Tensor& like) {
  return t.is_cuda() && t.device() == like.device() && t.scalar_type() == at::kFloat &&
         t.is_contiguous() && t.numel() == like.numel();
}

}  // namespace

bool AdamWStep(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
               const at::Tensor& exp_avg_sq, const AdamWStepOptions& o,
               const at::Tensor& grad_factor) {
  for (const at::Tensor* t : {&param, &grad, &exp_avg, &exp_avg_sq}) {
    if (!Takes(*t, param)) return false;
  }
  Factor factor;
  if (grad_factor.defined()) {
    if (!grad_factor.is_cuda() || grad_factor.device() != param.device() ||
        (grad_factor.scalar_type() != at::kFloat && grad_factor.scalar_type() != at::kDouble)) {
      return false;
    }
    factor = {grad_factor.const_data_ptr(), grad_factor.scalar_type() == at::kDouble};
  }
  const int64_t n = param.numel();
  if (n == 0) return true;
  const AdamWBiasCorrections bias = BiasCorrections(o);
  Coefficients c;
  c.decay = static_cast<float>(1.0 - o.lr * o.weight_decay);
  c.lerp_weight = static_cast<float>(1.0 - o.beta1);
  c.beta2 = static_cast<float>(o.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
  c.inv_bias_sqrt = 1.0f / static_cast<float>(std::sqrt(bias.second));
  c.eps = static_cast<float>(o.eps);
  c.neg_step_size = static_cast<float>(-(o.lr / bias.first));
  const c10::cuda::CUDAGuard guard(param.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  constexpr int kThreads = 256;
  const bool vectorized = Aligned16(param.const_data_ptr()) && Aligned16(grad.const_data_ptr()) &&
                          Aligned16(exp_avg.const_data_ptr()) &&
                          Aligned16(exp_avg_sq.const_data_ptr());
  const int64_t work = vectorized ? CeilDiv(n, 4) : n;
  const unsigned blocks =
      static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(CeilDiv(work, kThreads),
                                                                   int64_t{sms} * 8)));
  float* p = param.mutable_data_ptr<float>();
  const float* g = grad.const_data_ptr<float>();
  float* m = exp_avg.mutable_data_ptr<float>();
  float* v = exp_avg_sq.mutable_data_ptr<float>();
  if (vectorized) {
    AdamWKernel<true><<<blocks, kThreads, 0, stream>>>(p, g, m, v, n, c, factor);
  } else {
    AdamWKernel<false><<<blocks, kThreads, 0, stream>>>(p, g, m, v, n, c, factor);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

}  // namespace qlora::kernels::cuda
