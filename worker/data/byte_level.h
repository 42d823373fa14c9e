// GPT-2's byte-level alphabet (tokenizers pre_tokenizers/byte_level.rs, bytes_char): each byte
// is spelled as one Unicode character, so byte-level vocabularies are readable text. The
// printable bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand for themselves; the other 68 map
// to U+0100 upward in byte order (a space becomes 'Ġ', U+0120).
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace qlora::data {

// The character that spells `byte`.
char32_t ByteLevelChar(unsigned char byte);

// Raw bytes -> their byte-level spelling (UTF-8).
std::string ByteLevelEncode(absl::string_view raw);

// Byte-level spelling -> raw bytes; false when a character is outside the alphabet.
bool ByteLevelDecode(absl::string_view spelled, std::string* raw);

// Appends the UTF-8 encoding of `cp`.
void AppendUtf8(char32_t cp, std::string* out);

// Decodes the UTF-8 character at text[*pos] and advances *pos; invalid bytes decode as
// U+FFFD and advance by one.
char32_t NextUtf8(absl::string_view text, size_t* pos);

}  // namespace qlora::data
