// Shared by the kernels' CUDA files: 16-byte vectors of a floating dtype (loads and stores of V
// elements at once) and the dispatch over the floating dtypes those kernels take.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

namespace qlora::kernels::cuda {

template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

template <typename T, int V>
__device__ __forceinline__ Vec<T, V> Load(const T* p) {
  return *reinterpret_cast<const Vec<T, V>*>(p);
}

template <typename T, int V>
__device__ __forceinline__ void Store(T* p, const Vec<T, V>& v) {
  *reinterpret_cast<Vec<T, V>*>(p) = v;
}

inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// f(T{}) for T the C++ type of `type` (float32, float16, bfloat16); false for any other dtype.
template <typename F>
bool DispatchFloating(at::ScalarType type, F&& f) {
  switch (type) {
    case at::kFloat: return f(float{});
    case at::kHalf: return f(c10::Half{});
    case at::kBFloat16: return f(c10::BFloat16{});
    default: return false;
  }
}

}  // namespace qlora::kernels::cuda
