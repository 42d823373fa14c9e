// CPU implementation of the 4-bit kernels: the reference the CUDA kernels are tested against,
// and bitsandbytes' CUDA semantics reproduced element by element (see quantize_4bit_math.h).
// Multi-threaded over quantization blocks with at::parallel_for. Compiled with
// -ffp-contract=off so that no multiply and add are fused.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include "kernels/codebooks_4bit.h"
#include "kernels/quantize_4bit_backend.h"
#include "kernels/quantize_4bit_math.h"

namespace qlora::kernels::cpu {
namespace {

// About 32K elements per task: small tensors stay on one thread.
int64_t GrainBlocks(int64_t blocksize) { return std::max<int64_t>(1, 32768 / blocksize); }

template <typename F>
void DispatchFloating(at::ScalarType type, F&& f) {
  switch (type) {
    case at::kFloat: return f(float{});
    case at::kHalf: return f(c10::Half{});
    case at::kBFloat16: return f(c10::BFloat16{});
    default: TORCH_CHECK(false, "4-bit kernels support float32, float16 and bfloat16, not ", type);
  }
}

// Max |x| over [begin, end) with subnormals flushed, as fmaxf(fabsf(x)) under -ftz: NaN ignored.
template <typename T>
float BlockMax(const T* x, int64_t begin, int64_t end) {
  float m = 0.0f;
  for (int64_t i = begin; i < end; ++i) {
    m = std::fmax(m, std::fabs(math::FlushSubnormal(static_cast<float>(x[i]))));
  }
  return m;
}

template <typename T>
void Quantize4bitTyped(const T* x, int64_t n, QuantType type, int64_t blocksize, uint8_t* packed,
                       float* absmax) {
  const int64_t blocks = (n + blocksize - 1) / blocksize;
  const Nf4ThresholdTable nf4 = kNf4Thresholds;
  const Fp4Pivots fp4 = kFp4Pivots;
  auto code_of = [&](float scaled) {
    return type == QuantType::kNF4 ? math::Nf4Code(scaled, nf4) : math::Fp4Code(scaled, fp4);
  };
  at::parallel_for(0, blocks, GrainBlocks(blocksize), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t begin = b * blocksize;
      const int64_t end = std::min(n, begin + blocksize);
      const float m = BlockMax(x, begin, end);
      absmax[b] = m;
      const float scale = math::Reciprocal(m);  // inf for an all-zero block: 0 * inf = NaN
      // Elements past n are zero, like the kernel's padded loads (code 7 for NF4, or 0 when NaN).
      for (int64_t i = begin; i < end; i += 2) {
        const float hi = static_cast<float>(x[i]);
        const float lo = i + 1 < n ? static_cast<float>(x[i + 1]) : 0.0f;
        packed[i / 2] = static_cast<uint8_t>(code_of(math::MulFtz(hi, scale)) << 4 |
                                             code_of(math::MulFtz(lo, scale)));
      }
    }
  });
}

template <typename T>
void Dequantize4bitTyped(const uint8_t* packed, const float* absmax, const float* lut, int64_t n,
                         int64_t blocksize, T* out) {
  const int64_t blocks = (n + blocksize - 1) / blocksize;
  at::parallel_for(0, blocks, GrainBlocks(blocksize), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const float a = absmax[b];
      const int64_t begin = b * blocksize;
      const int64_t end = std::min(n, begin + blocksize);
      for (int64_t i = begin; i < end; i += 2) {
        const uint8_t byte = packed[i / 2];
        out[i] = static_cast<T>(math::MulFtz(lut[byte >> 4], a));
        if (i + 1 < end) out[i + 1] = static_cast<T>(math::MulFtz(lut[byte & 0x0F], a));
      }
    }
  });
}

}  // namespace

void Quantize4bit(const at::Tensor& x, QuantType type, int64_t blocksize, at::Tensor& packed,
                  at::Tensor& absmax) {
  DispatchFloating(x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    Quantize4bitTyped(x.const_data_ptr<T>(), x.numel(), type, blocksize,
                      packed.mutable_data_ptr<uint8_t>(), absmax.mutable_data_ptr<float>());
  });
}

void QuantizeBlockwise8bit(const at::Tensor& x, int64_t blocksize, at::Tensor& codes,
                           at::Tensor& absmax) {
  const float* in = x.const_data_ptr<float>();
  uint8_t* q = codes.mutable_data_ptr<uint8_t>();
  float* am = absmax.mutable_data_ptr<float>();
  const int64_t n = x.numel();
  const int64_t blocks = (n + blocksize - 1) / blocksize;
  at::parallel_for(0, blocks, GrainBlocks(blocksize), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t begin = b * blocksize;
      const int64_t end = std::min(n, begin + blocksize);
      const float m = BlockMax(in, begin, end);
      am[b] = m;
      const float scale = math::Reciprocal(m);
      for (int64_t i = begin; i < end; ++i) {
        q[i] = math::DynamicCode(kDynamicMap.v, math::MulFtz(in[i], scale));
      }
    }
  });
}

void DequantizeBlockwise8bit(const at::Tensor& codes, const at::Tensor& absmax,
                             const at::Tensor& code, int64_t blocksize, float offset,
                             at::Tensor& out) {
  const uint8_t* q = codes.const_data_ptr<uint8_t>();
  const float* am = absmax.const_data_ptr<float>();
  const float* table = code.const_data_ptr<float>();
  float* o = out.mutable_data_ptr<float>();
  at::parallel_for(0, codes.numel(), 4096, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      o[i] = math::AddRn(math::MulFtz(table[q[i]], am[i / blocksize]), offset);
    }
  });
}

void Dequantize4bit(const at::Tensor& packed, const AbsmaxSource& source, QuantType type,
                    int64_t blocksize, at::Tensor& out) {
  at::Tensor absmax;
  if (source.absmax != nullptr) {
    absmax = *source.absmax;
  } else {
    absmax = at::empty({source.qabsmax->numel()}, source.qabsmax->options().dtype(at::kFloat));
    DequantizeBlockwise8bit(*source.qabsmax, *source.absmax2, *source.code,
                            source.nested_blocksize, source.offset, absmax);
  }
  const float* lut = type == QuantType::kNF4 ? kNf4Values.v : kFp4Values.v;
  // A row-strided output (a weight written into wider rows) is filled through a contiguous one.
  at::Tensor dense = out.is_contiguous() ? out : at::empty(out.sizes(), out.options());
  DispatchFloating(out.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    Dequantize4bitTyped(packed.const_data_ptr<uint8_t>(), absmax.const_data_ptr<float>(), lut,
                        dense.numel(), blocksize, dense.mutable_data_ptr<T>());
  });
  if (!dense.is_same(out)) out.copy_(dense);
}

}  // namespace qlora::kernels::cpu
