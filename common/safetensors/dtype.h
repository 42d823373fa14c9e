// The safetensors dtype strings and their bit sizes (huggingface/safetensors `Dtype`).
#pragma once

#include <cstdint>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace qlora::safetensors {

enum class Dtype {
  kBool, kF4, kF6E2M3, kF6E3M2, kU8, kI8, kF8E5M2, kF8E4M3, kF8E8M0, kF8E4M3Fnuz, kF8E5M2Fnuz,
  kI16, kU16, kF16, kBF16, kI32, kU32, kF32, kC64, kF64, kI64, kU64,
};

// "BF16" -> kBF16; InvalidArgument for anything the format does not define.
absl::StatusOr<Dtype> ParseDtype(absl::string_view name);
// kBF16 -> "BF16".
absl::string_view DtypeName(Dtype dtype);
// Bits per element: 4 (F4), 6 (F6_*), otherwise 8 x bytes.
int DtypeBits(Dtype dtype);

}  // namespace qlora::safetensors
