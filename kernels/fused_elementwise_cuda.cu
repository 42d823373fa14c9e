// CUDA kernels of fused_elementwise.h. Every product and sum is rounded as the unfused ATen
// formula rounds it: computed in float32 (__fmul_rn / __fadd_rn: never contracted into an FMA)
// and cast to the tensor dtype (round to nearest even) wherever ATen stores an intermediate.
//
// Kernels:
//   RotaryKernel   one thread per V pairs (i, i + D/2) of one row (b, h, s): 16-byte loads of x,
//                  cos and sin at both halves, 16-byte stores (out may be x); strides from the
//                  tensors; out's heads from up to three tensors, each rotated or copied
//   SwigluForwardKernel / SwigluBackwardKernel   contiguous tensors: one thread per V
//                  elements, 16-byte accesses (backward may write its gradients over any of its
//                  inputs: each thread loads before it stores; and, asked, the forward's output
//                  again)
//   SwigluForwardRowsKernel / SwigluBackwardRowsKernel   the same where some tensor is rows of
//                  a wider buffer (each its own row stride: gate and up side by side in one
//                  packed buffer, outputs with spare columns): blockIdx.y takes kRowsPerBlock
//                  rows, so no thread divides an index by the row length
//   CastScalingKernel / ScaleKernel   one thread per V elements: a 16-bit tensor cast to float32
//                  (a leading block times a column scale), and a tensor times a device scalar in
//                  place (nothing where it is 1)
// Each launches through LaunchDependent (dependent_launch.cuh) and begins with
// BeginDependentKernel.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "kernels/fused_elementwise_backend.h"
#include "kernels/cuda_vectors.cuh"
#include "kernels/dependent_launch.cuh"

namespace qlora::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// A float32 value stored as T: what ATen keeps between two ops.
template <typename T>
__device__ __forceinline__ float Round(float x) {
  return static_cast<float>(static_cast<T>(x));
}

struct Strides4 {
  int64_t b, h, s;
};

// Forward:  o1 = x1 c1 + (-x2) s1,  o2 = x2 c2 + x1 s2.
// Backward: d1 = g1 c1 + g2 s2,      d2 = g2 c2 - g1 s1.
// A thread loads all its values before it stores any, so out may be x (in place). A form walking
// a position's heads, 4 a thread, with the tables loaded once for them, was slower: its registers
// left it a quarter of the warps of this one.
// The grid: blockIdx.z the batch, blockIdx.y the head of out, x over a head's seq * half / V
// threads, so that a thread finds its (b, h, s) with one 32-bit division (the 64-bit divisions of
// a flat index cost ~30 % of the kernel's time). out's heads come from up to kMaxRotarySources
// tensors side by side (q's and k's gradients rotated back and v's copied into packed rows in
// one launch): source i gives heads first_head_i .. first_head_{i+1} - 1, rotated or copied.
constexpr int kMaxRotarySources = 3;

template <typename T>
struct RotarySource {
  const T* x;
  Strides4 xs;
  int first_head;
  bool rotate;
};

template <typename T>
struct RotaryArgs {
  RotarySource<T> sources[kMaxRotarySources];
  int count;
  const T* cos;
  const T* sin;
  T* out;
  int seq, half;
  Strides4 cs, ss, os;
};

template <typename T, int V, bool kBackward>
__global__ void RotaryKernel(RotaryArgs<T> args) {
  BeginDependentKernel();
  const int per_row = args.half / V;
  const int t = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (t >= args.seq * per_row) return;
  RotarySource<T> src = args.sources[0];  // constant indices: no local copy of the arguments
#pragma unroll
  for (int i = 1; i < kMaxRotarySources; ++i) {
    if (i < args.count && static_cast<int>(blockIdx.y) >= args.sources[i].first_head) {
      src = args.sources[i];
    }
  }
  const int half = args.half;
  const int s = t / per_row;
  const int j = (t - s * per_row) * V;
  const int64_t h = blockIdx.y, b = blockIdx.z, xh = h - src.first_head;
  const int64_t xo = b * src.xs.b + xh * src.xs.h + s * src.xs.s + j;
  const int64_t oo = b * args.os.b + h * args.os.h + s * args.os.s + j;
  const Vec<T, V> x1 = Load<T, V>(src.x + xo), x2 = Load<T, V>(src.x + xo + half);
  if (!src.rotate) {
    Store<T, V>(args.out + oo, x1);
    Store<T, V>(args.out + oo + half, x2);
    return;
  }
  const int64_t co = b * args.cs.b + h * args.cs.h + s * args.cs.s + j;
  const int64_t so = b * args.ss.b + h * args.ss.h + s * args.ss.s + j;
  const Vec<T, V> c1 = Load<T, V>(args.cos + co), c2 = Load<T, V>(args.cos + co + half);
  const Vec<T, V> s1 = Load<T, V>(args.sin + so), s2 = Load<T, V>(args.sin + so + half);
  Vec<T, V> o1, o2;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const float a1 = static_cast<float>(x1.v[k]), a2 = static_cast<float>(x2.v[k]);
    const float p1 = Round<T>(__fmul_rn(a1, static_cast<float>(c1.v[k])));
    const float p2 = Round<T>(__fmul_rn(a2, static_cast<float>(c2.v[k])));
    float q1, q2;
    if constexpr (kBackward) {
      q1 = Round<T>(__fmul_rn(a2, static_cast<float>(s2.v[k])));
      q2 = -Round<T>(__fmul_rn(a1, static_cast<float>(s1.v[k])));
    } else {
      q1 = Round<T>(__fmul_rn(-a2, static_cast<float>(s1.v[k])));
      q2 = Round<T>(__fmul_rn(a1, static_cast<float>(s2.v[k])));
    }
    o1.v[k] = static_cast<T>(__fadd_rn(p1, q1));
    o2.v[k] = static_cast<T>(__fadd_rn(p2, q2));
  }
  Store<T, V>(args.out + oo, o1);
  Store<T, V>(args.out + oo + half, o2);
}

// ATen's silu and silu_backward (ActivationSiluKernel.cu), in float32.
__device__ __forceinline__ float Silu(float x) { return x / (1.0f + ::expf(-x)); }
__device__ __forceinline__ float SiluBackward(float dy, float x) {
  const float s = 1.0f / (1.0f + ::expf(-x));
  return dy * s * (1.0f + x * (1.0f - s));
}

template <typename T, int V>
__device__ __forceinline__ Vec<T, V> SwigluVector(const T* gate, const T* up) {
  const Vec<T, V> g = Load<T, V>(gate), u = Load<T, V>(up);
  Vec<T, V> o;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    o.v[k] = static_cast<T>(__fmul_rn(Round<T>(Silu(static_cast<float>(g.v[k]))),
                                      static_cast<float>(u.v[k])));
  }
  return o;
}

template <typename T, int V>
__global__ void SwigluForwardKernel(const T* __restrict__ gate, const T* __restrict__ up,
                                    T* __restrict__ out, int64_t n) {
  BeginDependentKernel();
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (i >= n) return;
  if (i + V <= n) {
    Store<T, V>(out + i, SwigluVector<T, V>(gate + i, up + i));
  } else {
    for (int64_t e = i; e < n; ++e) {
      out[e] = static_cast<T>(__fmul_rn(Round<T>(Silu(static_cast<float>(gate[e]))),
                                        static_cast<float>(up[e])));
    }
  }
}

// Rows a block walks in the row kernels: four rows' loads in flight a thread (one row a block
// made SwiGLU's forward into wider rows slower than the contiguous kernel).
constexpr int kRowsPerBlock = 4;
constexpr int kRowThreads = 128;

// f(row) for each of this block's kRowsPerBlock rows (blockIdx.y) that exist: the row kernels'
// walk (unrolled, so a thread's loads of all its rows can be in flight together). Past 65,535
// row blocks (gridDim.y's limit: rows of 262,140 tokens and longer) each block takes every
// gridDim.y-th group of rows after its own.
template <typename F>
__device__ __forceinline__ void ForBlockRows(int64_t rows, F&& f) {
  for (int64_t first = int64_t{blockIdx.y} * kRowsPerBlock; first < rows;
       first += int64_t{gridDim.y} * kRowsPerBlock) {
#pragma unroll
    for (int k = 0; k < kRowsPerBlock; ++k) {
      if (first + k >= rows) return;
      f(first + k);
    }
  }
}

// Row strides (in elements) of the SwiGLU row kernels' tensors.
struct SwigluStrides {
  int64_t grad = 0, gate = 0, up = 0, grad_gate = 0, grad_up = 0, out = 0;
};

// SwigluForwardKernel's values for [rows, cols] with cols a multiple of V, each tensor with its
// row stride (out: strides.out).
template <typename T, int V>
__global__ void SwigluForwardRowsKernel(const T* __restrict__ gate, const T* __restrict__ up,
                                        T* __restrict__ out, int64_t rows, int64_t cols,
                                        SwigluStrides strides) {
  BeginDependentKernel();
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (c >= cols) return;
  ForBlockRows(rows, [&](int64_t row) {
    Store<T, V>(out + row * strides.out + c,
                SwigluVector<T, V>(gate + row * strides.gate + c, up + row * strides.up + c));
  });
}

// out[i] = float(in[i]), times float(scale[i % cols]) for i < scaled (each product rounded once),
// V values a thread (V divides cols and n where vectorized: then one column row each time).
template <typename T, int V>
__global__ void CastScalingKernel(const T* __restrict__ in, float* __restrict__ out, int64_t n,
                                  int64_t scaled, const T* __restrict__ scale, int64_t cols) {
  BeginDependentKernel();
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (i >= n) return;
  if constexpr (V > 1) {
    const Vec<T, V> x = Load<T, V>(in + i);
    float y[V];
#pragma unroll
    for (int j = 0; j < V; ++j) y[j] = static_cast<float>(x.v[j]);
    if (i < scaled) {
      const Vec<T, V> s = Load<T, V>(scale + i % cols);
#pragma unroll
      for (int j = 0; j < V; ++j) y[j] = __fmul_rn(y[j], static_cast<float>(s.v[j]));
    }
#pragma unroll
    for (int j = 0; j < V; j += 4) {
      *reinterpret_cast<float4*>(out + i + j) = make_float4(y[j], y[j + 1], y[j + 2], y[j + 3]);
    }
  } else {
    float y = static_cast<float>(in[i]);
    if (i < scaled) y = __fmul_rn(y, static_cast<float>(scale[i % cols]));
    out[i] = y;
  }
}

// x[i] = T(float(x[i]) * factor), V values a thread; nothing where the factor is exactly 1.
template <typename T, int V>
__global__ void ScaleKernel(T* __restrict__ x, int64_t n, const float* __restrict__ factor) {
  BeginDependentKernel();
  const float f = *factor;
  if (f == 1.0f) return;
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (i >= n) return;
  if constexpr (V > 1) {
    Vec<T, V> v = Load<T, V>(x + i);
#pragma unroll
    for (int j = 0; j < V; ++j) v.v[j] = static_cast<T>(__fmul_rn(static_cast<float>(v.v[j]), f));
    Store<T, V>(x + i, v);
  } else {
    x[i] = static_cast<T>(__fmul_rn(static_cast<float>(x[i]), f));
  }
}

// dg, du for the output gradient dy; and x = silu(g) * u as SwigluForwardKernel rounds it.
template <typename T>
__device__ __forceinline__ void SwigluBackwardOne(T dy, T g, T u, T& dg, T& du, T& x) {
  const float fdy = static_cast<float>(dy), fg = static_cast<float>(g);
  const float silu = Round<T>(Silu(fg));
  du = static_cast<T>(__fmul_rn(fdy, silu));
  x = static_cast<T>(__fmul_rn(silu, static_cast<float>(u)));
  const float dsilu = Round<T>(__fmul_rn(fdy, static_cast<float>(u)));
  dg = static_cast<T>(SiluBackward(dsilu, fg));
}

// kProduct: also writes the forward's output silu(gate) * up to `product` (its own buffer).
// Contiguous tensors; grad_gate and grad_up may be any of grad, gate and up (written in place).
template <typename T, int V, bool kProduct>
__global__ void SwigluBackwardKernel(const T* grad, const T* gate, const T* up, T* grad_gate,
                                     T* grad_up, T* __restrict__ product, int64_t n) {
  BeginDependentKernel();
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (i >= n) return;
  if (i + V <= n) {
    const Vec<T, V> dy = Load<T, V>(grad + i), g = Load<T, V>(gate + i), u = Load<T, V>(up + i);
    Vec<T, V> dg, du, x;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      SwigluBackwardOne(dy.v[k], g.v[k], u.v[k], dg.v[k], du.v[k], x.v[k]);
    }
    Store<T, V>(grad_gate + i, dg);
    Store<T, V>(grad_up + i, du);
    if (kProduct) Store<T, V>(product + i, x);
  } else {
    for (int64_t e = i; e < n; ++e) {
      T x, dg, du;
      SwigluBackwardOne(grad[e], gate[e], up[e], dg, du, x);
      grad_gate[e] = dg;
      grad_up[e] = du;
      if (kProduct) product[e] = x;
    }
  }
}

// The same over [rows, cols] (cols a multiple of V), each tensor with its row stride (product:
// contiguous, strides.out = cols). A row's vectors are all loaded before any is stored.
template <typename T, int V, bool kProduct>
__global__ void SwigluBackwardRowsKernel(const T* grad, const T* gate, const T* up, T* grad_gate,
                                         T* grad_up, T* __restrict__ product, int64_t rows,
                                         int64_t cols, SwigluStrides strides) {
  BeginDependentKernel();
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (c >= cols) return;
  ForBlockRows(rows, [&](int64_t row) {
    const Vec<T, V> dy = Load<T, V>(grad + row * strides.grad + c);
    const Vec<T, V> g = Load<T, V>(gate + row * strides.gate + c);
    const Vec<T, V> u = Load<T, V>(up + row * strides.up + c);
    Vec<T, V> dg, du, x;
#pragma unroll
    for (int j = 0; j < V; ++j) SwigluBackwardOne(dy.v[j], g.v[j], u.v[j], dg.v[j], du.v[j], x.v[j]);
    Store<T, V>(grad_gate + row * strides.grad_gate + c, dg);
    Store<T, V>(grad_up + row * strides.grad_up + c, du);
    if (kProduct) Store<T, V>(product + row * strides.out + c, x);
  });
}

// The grid of the row kernels over [rows, cols].
dim3 RowGrid(int64_t rows, int64_t cols, int v) {
  const int64_t row_blocks = std::min<int64_t>(CeilDiv(rows, kRowsPerBlock), 65535);
  return dim3(static_cast<unsigned>(CeilDiv(cols / v, kRowThreads)),
              static_cast<unsigned>(std::max<int64_t>(row_blocks, 1)));
}

unsigned Grid(int64_t threads) {
  const int64_t grid = CeilDiv(threads, kThreads);
  TORCH_CHECK(grid < (int64_t{1} << 31), "tensor too large for the fused elementwise kernels");
  return static_cast<unsigned>(grid);
}

Strides4 StridesOf(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

// t's row stride for the SwiGLU row kernels over [rows, cols] = [numel / cols, cols], V values
// a vector: cols where t is contiguous; else t's own where t is [rows, cols] with unit column
// stride and rows that keep vectors whole and aligned; nullopt for any other layout.
template <int V>
std::optional<int64_t> RowStride(const at::Tensor& t, int64_t cols) {
  if (!Aligned16(t.const_data_ptr())) return std::nullopt;
  if (t.is_contiguous()) return cols;
  if (t.dim() != 2 || t.size(1) != cols || t.stride(1) != 1 || cols % V != 0 ||
      t.stride(0) % V != 0) {
    return std::nullopt;
  }
  return t.stride(0);
}

bool Vectorizable(const at::Tensor& t, int v) {
  return t.stride(3) == 1 && Aligned16(t.const_data_ptr()) && t.stride(0) % v == 0 &&
         t.stride(1) % v == 0 && t.stride(2) % v == 0;
}

}  // namespace

bool Rotary(const std::vector<RotaryPart>& parts, const at::Tensor& cos, const at::Tensor& sin,
            bool backward, at::Tensor& out) {
  if (parts.empty() || parts.size() > static_cast<size_t>(kMaxRotarySources) || !out.is_cuda() ||
      out.dim() != 4 || out.numel() == 0) {
    return false;
  }
  return DispatchFloating(out.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);
    const int64_t half = out.size(3) / 2;
    if (half % V != 0 || !Vectorizable(out, V) || !Vectorizable(cos, V) ||
        !Vectorizable(sin, V)) {
      return false;
    }
    RotaryArgs<T> args{};
    int64_t heads = 0;
    for (const RotaryPart& part : parts) {
      const at::Tensor& x = part.x;
      if (!x.is_cuda() || x.dim() != 4 || x.scalar_type() != out.scalar_type() ||
          x.size(0) != out.size(0) || x.size(2) != out.size(2) || x.size(3) != out.size(3) ||
          !Vectorizable(x, V)) {
        return false;
      }
      args.sources[args.count++] = {x.const_data_ptr<T>(), StridesOf(x), static_cast<int>(heads),
                                    part.rotate};
      heads += x.size(1);
    }
    const int64_t batch = out.size(0), seq = out.size(2);
    if (heads != out.size(1) || batch > 65535 || heads > 65535 ||
        seq * (half / V) >= (int64_t{1} << 31)) {
      return false;
    }
    const c10::cuda::CUDAGuard guard(out.device());
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    args.cos = cos.const_data_ptr<T>();
    args.sin = sin.const_data_ptr<T>();
    args.out = out.mutable_data_ptr<T>();
    args.seq = static_cast<int>(seq);
    args.half = static_cast<int>(half);
    args.cs = StridesOf(cos);
    args.ss = StridesOf(sin);
    args.os = StridesOf(out);
    auto kernel = backward ? RotaryKernel<T, V, true> : RotaryKernel<T, V, false>;
    const dim3 grid(static_cast<unsigned>(CeilDiv(seq * (half / V), kThreads)),
                    static_cast<unsigned>(heads), static_cast<unsigned>(batch));
    LaunchDependent(kernel, grid, kThreads, 0, stream, args);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return true;
  });
}

bool SwigluForward(const at::Tensor& gate, const at::Tensor& up, at::Tensor& out) {
  if (!gate.is_cuda() || gate.numel() == 0) return false;
  return DispatchFloating(gate.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);
    const int64_t cols = gate.size(-1), rows = gate.numel() / cols;
    const std::optional<int64_t> g = RowStride<V>(gate, cols), u = RowStride<V>(up, cols),
                                 o = RowStride<V>(out, cols);
    if (!g || !u || !o) return false;
    const c10::cuda::CUDAGuard guard(gate.device());
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    if (gate.is_contiguous() && up.is_contiguous() && out.is_contiguous()) {
      const int64_t n = gate.numel();
      LaunchDependent(SwigluForwardKernel<T, V>, Grid(CeilDiv(n, V)), kThreads, 0, stream,
                      gate.const_data_ptr<T>(), up.const_data_ptr<T>(), out.mutable_data_ptr<T>(),
                      n);
    } else {
      SwigluStrides strides;
      strides.gate = *g, strides.up = *u, strides.out = *o;
      LaunchDependent(SwigluForwardRowsKernel<T, V>, RowGrid(rows, cols, V), kRowThreads, 0, stream,
                      gate.const_data_ptr<T>(), up.const_data_ptr<T>(), out.mutable_data_ptr<T>(),
                      rows, cols, strides);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return true;
  });
}

bool SwigluBackward(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up,
                    at::Tensor& grad_gate, at::Tensor& grad_up, at::Tensor* product) {
  if (!gate.is_cuda() || gate.numel() == 0) return false;
  return DispatchFloating(gate.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);
    const int64_t cols = gate.size(-1), rows = gate.numel() / cols;
    const at::Tensor* tensors[] = {&grad, &gate, &up, &grad_gate, &grad_up};
    std::optional<int64_t> strides[5];
    bool contiguous = product == nullptr || product->is_contiguous();
    for (int i = 0; i < 5; ++i) {
      strides[i] = RowStride<V>(*tensors[i], cols);
      if (!strides[i]) return false;
      contiguous = contiguous && tensors[i]->is_contiguous();
    }
    if (product != nullptr && (!product->is_contiguous() || !Aligned16(product->const_data_ptr()))) {
      return false;
    }
    const c10::cuda::CUDAGuard guard(gate.device());
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    T* product_out = product != nullptr ? product->mutable_data_ptr<T>() : nullptr;
    if (contiguous) {
      const int64_t n = gate.numel();
      auto kernel = product != nullptr ? SwigluBackwardKernel<T, V, true>
                                       : SwigluBackwardKernel<T, V, false>;
      LaunchDependent(kernel, Grid(CeilDiv(n, V)), kThreads, 0, stream, grad.const_data_ptr<T>(),
                      gate.const_data_ptr<T>(), up.const_data_ptr<T>(),
                      grad_gate.mutable_data_ptr<T>(), grad_up.mutable_data_ptr<T>(), product_out,
                      n);
    } else {
      const SwigluStrides s{*strides[0], *strides[1], *strides[2], *strides[3], *strides[4], cols};
      auto kernel = product != nullptr ? SwigluBackwardRowsKernel<T, V, true>
                                       : SwigluBackwardRowsKernel<T, V, false>;
      LaunchDependent(kernel, RowGrid(rows, cols, V), kRowThreads, 0, stream,
                      grad.const_data_ptr<T>(), gate.const_data_ptr<T>(), up.const_data_ptr<T>(),
                      grad_gate.mutable_data_ptr<T>(), grad_up.mutable_data_ptr<T>(), product_out,
                      rows, cols, s);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return true;
  });
}

bool ScaleInPlace(const at::Tensor& x, const at::Tensor& factor) {
  if (!x.is_cuda() || !x.is_contiguous() || factor.device() != x.device() ||
      factor.scalar_type() != at::kFloat || x.numel() == 0) {
    return false;
  }
  return DispatchFloating(x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);
    const int64_t n = x.numel();
    const c10::cuda::CUDAGuard guard(x.device());
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const bool vectorized = n % V == 0 && Aligned16(x.const_data_ptr());
    const unsigned blocks = Grid(CeilDiv(n, vectorized ? V : 1));
    if (vectorized) {
      LaunchDependent(ScaleKernel<T, V>, blocks, kThreads, 0, stream, x.mutable_data_ptr<T>(), n,
                      factor.const_data_ptr<float>());
    } else {
      LaunchDependent(ScaleKernel<T, 1>, blocks, kThreads, 0, stream, x.mutable_data_ptr<T>(), n,
                      factor.const_data_ptr<float>());
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return true;
  });
}

bool CastScalingLeadingRows(const at::Tensor& in, const at::Tensor& out, int64_t scaled,
                            const at::Tensor& scale) {
  if (!in.is_cuda() || (in.scalar_type() != at::kBFloat16 && in.scalar_type() != at::kHalf) ||
      !in.is_contiguous() || !out.is_contiguous() || !scale.is_contiguous() ||
      out.device() != in.device() || scale.device() != in.device() || in.numel() == 0) {
    return false;
  }
  return DispatchFloating(in.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 8;  // 16 bytes of T in, 32 of float32 out
    const int64_t n = in.numel(), cols = scale.numel();
    const c10::cuda::CUDAGuard guard(in.device());
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const bool vectorized = n % V == 0 && (cols == 0 || cols % V == 0) && scaled % V == 0 &&
                            Aligned16(in.const_data_ptr()) && Aligned16(out.const_data_ptr()) &&
                            Aligned16(scale.const_data_ptr());
    const int per_thread = vectorized ? V : 1;
    const unsigned blocks = static_cast<unsigned>(CeilDiv(CeilDiv(n, per_thread), kThreads));
    const T* s = scale.const_data_ptr<T>();
    const int64_t c = std::max<int64_t>(cols, 1);
    if (vectorized) {
      LaunchDependent(CastScalingKernel<T, V>, blocks, kThreads, 0, stream, in.const_data_ptr<T>(),
                      out.mutable_data_ptr<float>(), n, scaled, s, c);
    } else {
      LaunchDependent(CastScalingKernel<T, 1>, blocks, kThreads, 0, stream, in.const_data_ptr<T>(),
                      out.mutable_data_ptr<float>(), n, scaled, s, c);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return true;
  });
}

}  // namespace qlora::kernels::cuda
