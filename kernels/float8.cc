// FP8 rows and the rowwise-scaled GEMM (see float8.h): checks, the CPU implementation, and the
// dispatch to float8_cuda.cu.
#include "kernels/float8.h"

#include <algorithm>
#include <cmath>

#include <ATen/ops/_scaled_mm.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/amax.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/div.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gt.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/where.h>
#include <c10/util/Exception.h>

#include "kernels/codebooks_4bit.h"
#include "kernels/float8_backend.h"

namespace qlora::kernels {
namespace {

const Codebook16& Table(QuantType type) { return type == QuantType::kNF4 ? kNf4Values : kFp4Values; }

float TableMax(const Codebook16& table) {
  float m = 0.0f;
  for (float v : table.v) m = std::max(m, std::fabs(v));
  return m;
}

// scale = amax / 448, 1 where amax is 0; values = e4m3(clamp(x / scale)), all in float32.
Float8Rows FromAmax(const at::Tensor& x, const at::Tensor& amax, const Float8Rows* into) {
  const at::Tensor scales =
      at::where(at::gt(amax, 0), at::div(amax, kFloat8E4m3Max), at::ones_like(amax));
  const at::Tensor values =
      at::clamp(at::div(x, scales), -kFloat8E4m3Max, kFloat8E4m3Max).to(at::kFloat8_e4m3fn);
  if (into == nullptr) return {values, scales};
  into->values.copy_(values);
  into->scales.copy_(scales);
  return *into;
}

void CheckInto(const Float8Rows& into, int64_t rows, int64_t cols, const at::Device& device) {
  TORCH_CHECK(into.values.scalar_type() == at::kFloat8_e4m3fn && into.values.is_contiguous() &&
                  into.values.sizes() == at::IntArrayRef({rows, cols}) &&
                  into.values.device() == device,
              "FP8 rows: values must be contiguous float8_e4m3fn [", rows, ", ", cols, "] on ",
              device);
  TORCH_CHECK(into.scales.scalar_type() == at::kFloat && into.scales.is_contiguous() &&
                  into.scales.sizes() == at::IntArrayRef({rows, 1}) &&
                  into.scales.device() == device,
              "FP8 rows: scales must be contiguous float32 [", rows, ", 1] on ", device);
}

Float8Rows Allocate(int64_t rows, int64_t cols, const at::Device& device) {
  return {at::empty({rows, cols}, at::dtype(at::kFloat8_e4m3fn).device(device)),
          at::empty({rows, 1}, at::dtype(at::kFloat).device(device))};
}

}  // namespace

Float8Rows QuantizeRowsFloat8(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && (x.size(1) <= 1 || x.stride(1) == 1),
              "QuantizeRowsFloat8: x must be [rows, cols] with unit column stride, got ",
              x.sizes(), " strides ", x.strides());
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kHalf ||
                  x.scalar_type() == at::kBFloat16,
              "QuantizeRowsFloat8: x must be float32, float16 or bfloat16");
#ifdef QLORA_HAVE_CUDA
  if (x.is_cuda() && x.size(1) % 8 == 0) {
    Float8Rows out = Allocate(x.size(0), x.size(1), x.device());
    cuda::QuantizeRowsFloat8(x, out.values, out.scales);
    return out;
  }
#endif
  const at::Tensor f = x.to(at::kFloat);
  return FromAmax(f, at::amax(at::abs(f), {1}, /*keepdim=*/true), nullptr);
}

bool Float8WeightTakes(const Quantized4bit& q) {
  return q.shape.size() == 2 && q.blocksize % 8 == 0 && q.shape[1] % q.blocksize == 0;
}

Float8Rows WeightRowsFloat8(const Quantized4bit& q, const Float8Rows* into) {
  TORCH_CHECK(Float8WeightTakes(q), "WeightRowsFloat8: the weight must be 2-D with rows of whole "
                                    "blocks (blocksize ", q.blocksize, ")");
  const int64_t rows = q.shape[0], cols = q.shape[1];
  const at::Device device = q.packed.device();
  if (into != nullptr) CheckInto(*into, rows, cols, device);
  const Codebook16& table = Table(q.type);
  const at::Tensor absmax = BlockAbsmax(q).reshape({rows, cols / q.blocksize});
#ifdef QLORA_HAVE_CUDA
  if (device.is_cuda()) {
    const Float8Rows out = into != nullptr ? *into : Allocate(rows, cols, device);
    cuda::WeightRowsFloat8(q.packed, absmax.contiguous(), table, TableMax(table), q.blocksize,
                           out.values, out.scales);
    return out;
  }
#endif
  const at::Tensor row_max = at::mul(at::amax(absmax, {1}, /*keepdim=*/true), TableMax(table));
  return FromAmax(Dequantize4bit(q, at::kFloat).view({rows, cols}), row_max, into);
}

bool Float8GemmTakes(int64_t in, int64_t out) { return in % 16 == 0 && out % 16 == 0; }

bool Float8GemmRunsOn(const at::Device& device) {
  if (device.is_cpu()) return true;
#ifdef QLORA_HAVE_CUDA
  if (device.is_cuda()) return cuda::DeviceHasFloat8(device.has_index() ? device.index() : -1);
#endif
  return false;
}

at::Tensor Float8Matmul(const Float8Rows& x, const Float8Rows& w, at::ScalarType out_dtype,
                        const at::Tensor& into) {
  TORCH_CHECK(x.values.dim() == 2 && w.values.dim() == 2 && x.values.size(1) == w.values.size(1),
              "Float8Matmul: x [T, in] and w [out, in] must agree on in, got ", x.values.sizes(),
              " and ", w.values.sizes());
  if (into.defined()) {
    TORCH_CHECK(into.scalar_type() == out_dtype && into.dim() == 2 &&
                    into.size(0) == x.values.size(0) && into.size(1) == w.values.size(0) &&
                    into.stride(1) == 1 && into.stride(0) >= into.size(1),
                "Float8Matmul: `into` must be [", x.values.size(0), ", ", w.values.size(0),
                "] of ", out_dtype, " with unit column stride, got ", into.sizes(), " ",
                into.scalar_type(), " strides ", into.strides());
  }
  if (x.values.is_cuda()) {
    TORCH_CHECK(Float8GemmTakes(x.values.size(1), w.values.size(0)),
                "Float8Matmul: in and out must be multiples of 16 on CUDA, got ",
                x.values.size(1), " and ", w.values.size(0));
    // cuBLASLt's FP8 GEMM takes the left operand row-major and the right one column-major: w's
    // rows are that as they lie. Fast accumulation, as FP8 training recipes use it for forward.
    // On sm_90 with cuBLAS 12.9 and newer torch runs the rowwise scales as cuBLASLt's outer-vector
    // scaling, which writes an output of any row stride in place.
    if (into.defined()) {
      at::Tensor out = into;
      at::_scaled_mm_out(out, x.values, w.values.t(), x.scales, w.scales.view({1, -1}),
                         std::nullopt, std::nullopt, out_dtype, /*use_fast_accum=*/true);
      return out;
    }
    return at::_scaled_mm(x.values, w.values.t(), x.scales, w.scales.view({1, -1}), std::nullopt,
                          std::nullopt, out_dtype, /*use_fast_accum=*/true);
  }
  const at::Tensor a = at::mul(x.values.to(at::kFloat), x.scales);
  const at::Tensor b = at::mul(w.values.to(at::kFloat), w.scales);
  const at::Tensor product = at::mm(a, b.t()).to(out_dtype);
  if (!into.defined()) return product;
  into.copy_(product);
  return into;
}

}  // namespace qlora::kernels
