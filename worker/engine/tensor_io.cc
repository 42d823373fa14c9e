// safetensors <-> at::Tensor dtype mapping and byte copies.
#include "worker/engine/tensor_io.h"

#include <cstring>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"

namespace qlora::engine {

using safetensors::Dtype;

absl::StatusOr<at::ScalarType> ToScalarType(Dtype dtype) {
  switch (dtype) {
    case Dtype::kBool: return at::kBool;
    case Dtype::kU8: return at::kByte;
    case Dtype::kI8: return at::kChar;
    case Dtype::kI16: return at::kShort;
    case Dtype::kU16: return at::kUInt16;
    case Dtype::kF16: return at::kHalf;
    case Dtype::kBF16: return at::kBFloat16;
    case Dtype::kI32: return at::kInt;
    case Dtype::kU32: return at::kUInt32;
    case Dtype::kF32: return at::kFloat;
    case Dtype::kF64: return at::kDouble;
    case Dtype::kI64: return at::kLong;
    case Dtype::kU64: return at::kUInt64;
    case Dtype::kF8E5M2: return at::kFloat8_e5m2;
    case Dtype::kF8E4M3: return at::kFloat8_e4m3fn;
    default:
      return absl::UnimplementedError(
          absl::StrCat("safetensors dtype ", safetensors::DtypeName(dtype), " has no torch type here"));
  }
}

absl::StatusOr<Dtype> ToSafetensorsDtype(at::ScalarType type) {
  for (Dtype d : {Dtype::kBool, Dtype::kU8, Dtype::kI8, Dtype::kI16, Dtype::kU16, Dtype::kF16,
                  Dtype::kBF16, Dtype::kI32, Dtype::kU32, Dtype::kF32, Dtype::kF64, Dtype::kI64,
                  Dtype::kU64, Dtype::kF8E5M2, Dtype::kF8E4M3}) {
    if (*ToScalarType(d) == type) return d;
  }
  return absl::UnimplementedError(absl::StrCat("torch dtype ", c10::toString(type),
                                               " cannot be written to safetensors"));
}

absl::StatusOr<at::Tensor> CopyToTensor(const safetensors::TensorView& view) {
  auto type = ToScalarType(view.dtype);
  if (!type.ok()) return type.status();
  at::Tensor out = at::empty(view.shape, at::dtype(*type));
  if (view.nbytes) std::memcpy(out.data_ptr(), view.data, view.nbytes);
  return out;
}

absl::StatusOr<at::Tensor> CopyToTensor(const safetensors::TensorView& view, at::ScalarType dtype,
                                        at::Device device) {
  auto type = ToScalarType(view.dtype);
  if (!type.ok()) return type.status();
  // A non-owning view of the mapped bytes; .to(..., copy=true) always makes an owning tensor.
  const at::Tensor mapped = at::from_blob(const_cast<uint8_t*>(view.data), view.shape,
                                          at::dtype(*type));
  return mapped.to(device, dtype, /*non_blocking=*/false, /*copy=*/true);
}

std::string TensorToBytes(const at::Tensor& tensor) {
  const at::Tensor cpu = tensor.detach().to(at::kCPU).contiguous();
  return std::string(static_cast<const char*>(cpu.data_ptr()), cpu.nbytes());
}

}  // namespace qlora::engine
