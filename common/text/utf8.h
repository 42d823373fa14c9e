// UTF-8 well-formedness, and making text well-formed where it must be: protobuf's string fields
// (every free-text field of the API: messages, errors, names) refuse to serialize invalid UTF-8,
// so a message quoting a record's bytes would otherwise be lost on the wire.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace qlora {

// The offset of the first byte that does not start a well-formed UTF-8 sequence (Unicode 15,
// table 3-7: no overlong forms, no surrogates, nothing above U+10FFFF), or npos when `text` is
// all well-formed.
size_t FirstInvalidUtf8(std::string_view text);

// `text` with each byte that does not start a well-formed sequence replaced by U+FFFD (the
// replacement character), the rest unchanged.
std::string ValidUtf8(std::string_view text);

// The longest prefix of `text` of at most `max_bytes` that does not cut a multi-byte character.
std::string_view Utf8Prefix(std::string_view text, size_t max_bytes);

}  // namespace qlora
