// The GPT-2 byte-level alphabet (see byte_level.h), computed from its definition.
#include "worker/data/byte_level.h"

#include <array>

namespace qlora::data {
namespace {

bool StandsForItself(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct Alphabet {
  std::array<char32_t, 256> to_char{};
  std::array<int16_t, 0x144> to_byte{};  // every character of the alphabet is below U+0144
  Alphabet() {
    to_byte.fill(-1);
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      to_char[b] = StandsForItself(b) ? static_cast<char32_t>(b) : next++;
      to_byte[to_char[b]] = static_cast<int16_t>(b);
    }
  }
};

const Alphabet& GetAlphabet() {
  static const Alphabet* alphabet = new Alphabet();  // immutable after construction
  return *alphabet;
}

}  // namespace

char32_t ByteLevelChar(unsigned char byte) { return GetAlphabet().to_char[byte]; }

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

char32_t NextUtf8(absl::string_view text, size_t* pos) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(*pos);
  int extra;
  char32_t cp;
  if (lead < 0x80) {
    ++*pos;
    return lead;
  } else if ((lead >> 5) == 6) {
    extra = 1, cp = lead & 0x1F;
  } else if ((lead >> 4) == 14) {
    extra = 2, cp = lead & 0x0F;
  } else if ((lead >> 3) == 30) {
    extra = 3, cp = lead & 0x07;
  } else {
    ++*pos;
    return 0xFFFD;
  }
  for (int i = 1; i <= extra; ++i) {
    if (*pos + i >= text.size() || (byte(*pos + i) & 0xC0) != 0x80) {
      ++*pos;
      return 0xFFFD;
    }
    cp = (cp << 6) | (byte(*pos + i) & 0x3F);
  }
  *pos += extra + 1;
  return cp;
}

std::string ByteLevelEncode(absl::string_view raw) {
  std::string out;
  out.reserve(raw.size() * 2);
  for (char c : raw) AppendUtf8(ByteLevelChar(static_cast<unsigned char>(c)), &out);
  return out;
}

bool ByteLevelDecode(absl::string_view spelled, std::string* raw) {
  const Alphabet& alphabet = GetAlphabet();
  size_t pos = 0;
  while (pos < spelled.size()) {
    char32_t cp = NextUtf8(spelled, &pos);
    if (cp >= alphabet.to_byte.size() || alphabet.to_byte[cp] < 0) return false;
    raw->push_back(static_cast<char>(alphabet.to_byte[cp]));
  }
  return true;
}

}  // namespace qlora::data
