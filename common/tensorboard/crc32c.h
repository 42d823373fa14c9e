// CRC-32C (Castagnoli), as TFRecord files checksum their records, and TFRecord's masking of it.
#pragma once

#include <cstdint>

#include "absl/strings/string_view.h"

namespace qlora::tensorboard {

uint32_t Crc32c(absl::string_view bytes);
// TFRecord stores ((crc >> 15) | (crc << 17)) + 0xa282ead8 (tensorflow/core/lib/hash/crc32c.h).
uint32_t MaskedCrc32c(absl::string_view bytes);

}  // namespace qlora::tensorboard
