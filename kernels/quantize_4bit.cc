// Entry points of quantize_4bit.h: argument checks, output allocation, the double-quantization
// pipeline (offset = mean(absmax), then 8-bit blockwise quantization of absmax - offset, as
// bitsandbytes.functional.quantize_4bit does it), and dispatch to the CPU or CUDA backend.
#include "kernels/quantize_4bit.h"

#include <cstring>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mean.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/sub.h>
#include <c10/util/Exception.h>

#include "kernels/block_writes.h"
#include "kernels/codebooks_4bit.h"
#include "kernels/quantize_4bit_backend.h"

namespace qlora::kernels {
namespace {

bool IsPowerOfTwoIn(int64_t v, int64_t lo, int64_t hi) {
  return v >= lo && v <= hi && (v & (v - 1)) == 0;
}

bool IsFloating(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Runs the CPU or CUDA version of a backend function for tensors on `device` (the cuda:: ones
// exist only in CUDA builds).
#ifdef QLORA_HAVE_CUDA
#define CudaOnly(expr) expr
#else
#define CudaOnly(expr) ((void)0)
#endif

#define QLORA_DISPATCH_DEVICE(device, call)                                        \
  do {                                                                             \
    if ((device).is_cpu()) {                                                       \
      cpu::call;                                                                   \
    } else if ((device).is_cuda()) {                                               \
      TORCH_CHECK(HasCudaKernels(), "qlora_kernels was built without CUDA kernels"); \
      CudaOnly(cuda::call);                                                        \
    } else {                                                                       \
      TORCH_CHECK(false, "4-bit kernels run on CPU or CUDA, not ", (device));      \
    }                                                                              \
  } while (0)

at::Tensor TableTensor(const float* values, int64_t size) {
  at::Tensor t = at::empty({size}, at::TensorOptions().dtype(at::kFloat));
  std::memcpy(t.mutable_data_ptr<float>(), values, sizeof(float) * size);
  return t;
}

// q.shape as the [rows, cols] that Dequantize4bitInto writes (rows = shape[0]; a scalar is [1, 1]).
std::vector<int64_t> WeightRows(const Quantized4bit& q) {
  int64_t n = 1;
  for (int64_t d : q.shape) n *= d;
  const int64_t rows = q.shape.empty() ? 1 : q.shape[0];
  return {rows, rows == 0 ? 0 : n / rows};
}

// after's columns right after each row of out [rows, cols], as [rows, zeros + r + trailing]
// within the row stride, once checked.
at::Tensor ColumnsAfterView(const at::Tensor& out, const ColumnsAfter& after) {
  TORCH_CHECK(out.dim() == 2 && out.stride(1) == 1,
              "the columns after a weight's rows need [rows, cols] with unit column stride, got ",
              out.sizes(), " with strides ", out.strides());
  TORCH_CHECK(after.zeros >= 0 && after.trailing_zeros >= 0 && after.values.dim() == 2 &&
                  after.values.size(0) == out.size(0) && after.values.size(1) > 0 &&
                  after.values.stride(1) == 1 && after.values.scalar_type() == at::kFloat &&
                  after.values.device() == out.device(),
              "Dequantize4bitInto: the columns after must be float32 [", out.size(0),
              ", r > 0] with unit column stride on the weight's device, got ",
              after.values.sizes(), " ", after.values.scalar_type());
  const int64_t width = after.zeros + after.values.size(1) + after.trailing_zeros;
  TORCH_CHECK(out.stride(0) >= out.size(1) + width,
              "Dequantize4bitInto: rows of stride ", out.stride(0), " leave no room for ", width,
              " columns after ", out.size(1));
  return out.as_strided({out.size(0), width}, {out.stride(0), 1},
                        out.storage_offset() + out.size(1));
}

// Zeros, then scale * values rounded once, then zeros, into the columns ColumnsAfterView gave.
void FillColumnsAfter(const at::Tensor& columns, const ColumnsAfter& after) {
  const int64_t r = after.values.size(1);
  columns.narrow(1, 0, after.zeros).zero_();
  columns.narrow(1, after.zeros + r, after.trailing_zeros).zero_();
  at::Tensor scaled = columns.narrow(1, after.zeros, r);
  // A CPU 0-dim factor: the product is formed in float32 and rounded once into the output.
  at::mul_out(scaled, after.values, at::scalar_tensor(after.scale, at::kDouble));
}

}  // namespace

void WriteColumnsAfter(const at::Tensor& out, const ColumnsAfter& after) {
  if (!IsFloating(out.scalar_type())) {
    FillColumnsAfter(ColumnsAfterView(out, after), after);
    return;
  }
  WriteBlocks(ColumnsAfterBlocks(out, after));  // one launch on CUDA
}

std::vector<BlockWrite> ColumnsAfterBlocks(const at::Tensor& out, const ColumnsAfter& after) {
  const at::Tensor columns = ColumnsAfterView(out, after);
  const int64_t r = after.values.size(1);
  std::vector<BlockWrite> blocks;
  if (after.zeros > 0) blocks.push_back({columns.narrow(1, 0, after.zeros), at::Tensor(), 1.0});
  blocks.push_back({columns.narrow(1, after.zeros, r), after.values, after.scale});
  if (after.trailing_zeros > 0) {
    blocks.push_back({columns.narrow(1, after.zeros + r, after.trailing_zeros), at::Tensor(), 1.0});
  }
  return blocks;
}

bool HasCudaKernels() {
#ifdef QLORA_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

at::Tensor SerializedQuantMap(QuantType type) {
  at::Tensor t = TableTensor(type == QuantType::kNF4 ? kNf4Values.v : kFp4Values.v, 16);
  if (type == QuantType::kFP4) t.mutable_data_ptr<float>()[8] = 0.0f;  // bnb writes +0 there
  return t;
}

at::Tensor DynamicMap() { return TableTensor(kDynamicMap.v, 256); }

Blockwise8bit QuantizeBlockwise8bit(const at::Tensor& x, int64_t blocksize) {
  TORCH_CHECK(x.scalar_type() == at::kFloat, "QuantizeBlockwise8bit takes float32, not ",
              x.scalar_type());
  TORCH_CHECK(IsPowerOfTwoIn(blocksize, 32, 4096), "blocksize must be a power of two in "
              "[32, 4096], got ", blocksize);
  const at::Tensor flat = x.contiguous().view({-1});
  Blockwise8bit out;
  out.codes = at::empty({flat.numel()}, flat.options().dtype(at::kByte));
  out.absmax = at::empty({CeilDiv(flat.numel(), blocksize)}, flat.options());
  QLORA_DISPATCH_DEVICE(flat.device(),
                        QuantizeBlockwise8bit(flat, blocksize, out.codes, out.absmax));
  return out;
}

at::Tensor DequantizeBlockwise8bit(const at::Tensor& codes, const at::Tensor& absmax,
                                   const at::Tensor& code, int64_t blocksize, float offset) {
  TORCH_CHECK(codes.scalar_type() == at::kByte && absmax.scalar_type() == at::kFloat &&
                  code.scalar_type() == at::kFloat,
              "DequantizeBlockwise8bit takes uint8 codes, float32 absmax and float32 code");
  TORCH_CHECK(code.numel() == 256, "the 8-bit code has 256 entries, got ", code.numel());
  TORCH_CHECK(IsPowerOfTwoIn(blocksize, 32, 4096), "blocksize must be a power of two in "
              "[32, 4096], got ", blocksize);
  TORCH_CHECK(absmax.numel() == CeilDiv(codes.numel(), blocksize), "expected ",
              CeilDiv(codes.numel(), blocksize), " absmax values, got ", absmax.numel());
  TORCH_CHECK(codes.device() == absmax.device() && codes.device() == code.device(),
              "codes, absmax and code must be on one device");
  const at::Tensor q = codes.contiguous().view({-1});
  const at::Tensor a = absmax.contiguous();
  const at::Tensor c = code.contiguous();
  at::Tensor out = at::empty({q.numel()}, a.options());
  QLORA_DISPATCH_DEVICE(q.device(), DequantizeBlockwise8bit(q, a, c, blocksize, offset, out));
  return out;
}

Quantized4bit Quantize4bit(const at::Tensor& input, const Quantize4bitOptions& options) {
  TORCH_CHECK(IsFloating(input.scalar_type()),
              "Quantize4bit takes float32, float16 or bfloat16, not ", input.scalar_type());
  TORCH_CHECK(input.numel() > 0, "Quantize4bit needs a non-empty tensor");
  TORCH_CHECK(IsPowerOfTwoIn(options.blocksize, 32, 4096),
              "blocksize must be a power of two in [32, 4096], got ", options.blocksize);
  TORCH_CHECK(!options.double_quant || IsPowerOfTwoIn(options.nested_blocksize, 32, 4096),
              "nested_blocksize must be a power of two in [32, 4096], got ",
              options.nested_blocksize);

  const at::Tensor x = input.contiguous().view({-1});
  const int64_t n = x.numel();
  Quantized4bit q;
  q.type = options.type;
  q.blocksize = options.blocksize;
  q.shape = input.sizes().vec();
  q.dtype = input.scalar_type();
  q.packed = at::empty({(n + 1) / 2}, x.options().dtype(at::kByte));
  at::Tensor absmax = at::empty({CeilDiv(n, options.blocksize)}, x.options().dtype(at::kFloat));
  QLORA_DISPATCH_DEVICE(x.device(), Quantize4bit(x, options.type, options.blocksize, q.packed,
                                                 absmax));
  if (!options.double_quant) {
    q.absmax = absmax;
    return q;
  }
  // bitsandbytes: offset = absmax.mean(); quantize_blockwise(absmax - offset, blocksize=256).
  const at::Tensor offset = at::mean(absmax);
  Blockwise8bit nested = QuantizeBlockwise8bit(at::sub(absmax, offset), options.nested_blocksize);
  q.double_quant = true;
  q.absmax = nested.codes;
  q.nested_absmax = nested.absmax;
  q.nested_code = DynamicMap().to(x.device());
  q.nested_offset = offset.item<float>();
  q.nested_blocksize = options.nested_blocksize;
  return q;
}

at::Tensor BlockAbsmax(const Quantized4bit& q) {
  if (!q.double_quant) return q.absmax;
  return DequantizeBlockwise8bit(q.absmax, q.nested_absmax, q.nested_code, q.nested_blocksize,
                                 q.nested_offset);
}

at::Tensor Dequantize4bit(const Quantized4bit& q) { return Dequantize4bit(q, q.dtype); }

at::Tensor Dequantize4bit(const Quantized4bit& q, at::ScalarType dtype) {
  at::Tensor out = at::empty(q.shape, q.packed.options().dtype(dtype));
  Dequantize4bitInto(q, out.view(WeightRows(q)));
  return out;
}

void Dequantize4bitInto(const Quantized4bit& q, const at::Tensor& out, const ColumnsAfter* after) {
  TORCH_CHECK(IsFloating(out.scalar_type()),
              "Dequantize4bit produces float32, float16 or bfloat16, not ", out.scalar_type());
  TORCH_CHECK(IsPowerOfTwoIn(q.blocksize, 32, 4096),
              "blocksize must be a power of two in [32, 4096], got ", q.blocksize);
  int64_t n = 1;
  for (int64_t d : q.shape) n *= d;
  TORCH_CHECK(q.packed.scalar_type() == at::kByte && q.packed.numel() == (n + 1) / 2,
              "packed must be uint8 with ", (n + 1) / 2, " bytes for shape ", q.shape, ", got ",
              q.packed.scalar_type(), " with ", q.packed.numel());
  const int64_t blocks = CeilDiv(n, q.blocksize);
  TORCH_CHECK(q.absmax.numel() == blocks, "expected ", blocks, " absmax values, got ",
              q.absmax.numel());
  const at::Device device = q.packed.device();
  TORCH_CHECK(q.absmax.device() == device, "absmax must be on the packed tensor's device");

  const std::vector<int64_t> rows = WeightRows(q);
  TORCH_CHECK(out.sizes() == at::IntArrayRef(rows) && out.stride(1) == 1 &&
                  out.stride(0) >= out.size(1) && out.device() == q.packed.device(),
              "Dequantize4bitInto: out must be ", rows,
              " on the packed tensor's device with unit column stride, got ", out.sizes(),
              " with strides ", out.strides());
  // [rows, zeros + r + trailing] right after each row, checked before anything is written.
  const at::Tensor after_columns = after != nullptr ? ColumnsAfterView(out, *after) : at::Tensor();
  const at::Tensor packed = q.packed.contiguous().view({-1});
  at::Tensor out_flat = out.is_contiguous() ? out.view({-1}) : out;
  const at::Tensor absmax = q.absmax.contiguous();
  AbsmaxSource source;
  at::Tensor absmax2;
  at::Tensor code;
  if (q.double_quant) {
    TORCH_CHECK(q.absmax.scalar_type() == at::kByte, "double-quantized absmax must be uint8");
    TORCH_CHECK(IsPowerOfTwoIn(q.nested_blocksize, 32, 4096), "bad nested_blocksize ",
                q.nested_blocksize);
    TORCH_CHECK(q.nested_absmax.scalar_type() == at::kFloat &&
                    q.nested_absmax.numel() == CeilDiv(blocks, q.nested_blocksize),
                "expected ", CeilDiv(blocks, q.nested_blocksize), " float32 nested_absmax values");
    TORCH_CHECK(q.nested_code.scalar_type() == at::kFloat && q.nested_code.numel() == 256,
                "nested_code must be float32 [256]");
    TORCH_CHECK(q.nested_absmax.device() == device && q.nested_code.device() == device,
                "nested_absmax and nested_code must be on the packed tensor's device");
    absmax2 = q.nested_absmax.contiguous();
    code = q.nested_code.contiguous();
    source.qabsmax = &absmax;
    source.absmax2 = &absmax2;
    source.code = &code;
    source.offset = q.nested_offset;
    source.nested_blocksize = q.nested_blocksize;
  } else {
    TORCH_CHECK(q.absmax.scalar_type() == at::kFloat, "absmax must be float32");
    source.absmax = &absmax;
  }
  if (device.is_cuda() && after != nullptr) {  // one launch for the weight and the columns
    TORCH_CHECK(HasCudaKernels(), "qlora_kernels was built without CUDA kernels");
    CudaOnly(cuda::Dequantize4bit(packed, source, q.type, q.blocksize, out_flat, after));
    return;
  }
  QLORA_DISPATCH_DEVICE(device, Dequantize4bit(packed, source, q.type, q.blocksize, out_flat));
  if (after != nullptr) FillColumnsAfter(after_columns, *after);
}

}  // namespace qlora::kernels
