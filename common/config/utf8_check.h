// UTF-8 well-formedness of a job file (internal to qlora_config). YAML streams are Unicode, but
// yaml-cpp passes invalid bytes through, and its emitter then writes U+FFFD in their place: a
// stored resolved copy would differ from the file that was validated. So the parser refuses
// such files up front.
#pragma once

#include <cstddef>
#include <string_view>

namespace qlora::config_internal {

// The offset of the first byte that does not start a well-formed UTF-8 sequence (Unicode 15,
// table 3-7: no overlong forms, no surrogates, nothing above U+10FFFF), or npos when `text` is
// all well-formed.
size_t FirstInvalidUtf8(std::string_view text);

}  // namespace qlora::config_internal
