// One table of safetensors dtypes: name and bits per element.
#include "common/safetensors/dtype.h"

#include <iterator>

#include "absl/strings/str_cat.h"

namespace qlora::safetensors {
namespace {

struct DtypeInfo {
  Dtype dtype;
  absl::string_view name;
  int bits;
};

// Indexed by the enum's value.
constexpr DtypeInfo kDtypes[] = {
    {Dtype::kBool, "BOOL", 8},          {Dtype::kF4, "F4", 4},
    {Dtype::kF6E2M3, "F6_E2M3", 6},     {Dtype::kF6E3M2, "F6_E3M2", 6},
    {Dtype::kU8, "U8", 8},              {Dtype::kI8, "I8", 8},
    {Dtype::kF8E5M2, "F8_E5M2", 8},     {Dtype::kF8E4M3, "F8_E4M3", 8},
    {Dtype::kF8E8M0, "F8_E8M0", 8},     {Dtype::kF8E4M3Fnuz, "F8_E4M3FNUZ", 8},
    {Dtype::kF8E5M2Fnuz, "F8_E5M2FNUZ", 8},
    {Dtype::kI16, "I16", 16},           {Dtype::kU16, "U16", 16},
    {Dtype::kF16, "F16", 16},           {Dtype::kBF16, "BF16", 16},
    {Dtype::kI32, "I32", 32},           {Dtype::kU32, "U32", 32},
    {Dtype::kF32, "F32", 32},           {Dtype::kC64, "C64", 64},
    {Dtype::kF64, "F64", 64},           {Dtype::kI64, "I64", 64},
    {Dtype::kU64, "U64", 64},
};

}  // namespace

absl::StatusOr<Dtype> ParseDtype(absl::string_view name) {
  for (const DtypeInfo& info : kDtypes) {
    if (info.name == name) return info.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown safetensors dtype \"", name, "\""));
}

absl::string_view DtypeName(Dtype dtype) { return kDtypes[static_cast<int>(dtype)].name; }

int DtypeBits(Dtype dtype) { return kDtypes[static_cast<int>(dtype)].bits; }

static_assert(std::size(kDtypes) == static_cast<size_t>(Dtype::kU64) + 1,
              "kDtypes must list every Dtype in enum order");

}  // namespace qlora::safetensors
