// Protocol-buffer wire format by hand, for the few TensorBoard messages this project writes
// (tensorflow.Event and Summary, the hparams plugin's data) without a protobuf schema: a key is
// (field << 3) | wire type; integers are varints, doubles and floats little-endian.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace qlora::tensorboard::wire {

constexpr int kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

inline void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

inline void PutKey(int field, int wire_type, std::string* out) {
  PutVarint(static_cast<uint64_t>(field << 3 | wire_type), out);
}

template <typename T>
void PutLittleEndian(T value, std::string* out) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // x86-64 and aarch64 Linux are little-endian
  out->append(bytes, sizeof(T));
}

// A length-delimited field: a string, bytes or an embedded message's encoding.
inline void PutBytes(int field, const std::string& bytes, std::string* out) {
  PutKey(field, kLengthDelimited, out);
  PutVarint(bytes.size(), out);
  out->append(bytes);
}

inline void PutDouble(int field, double value, std::string* out) {
  PutKey(field, kFixed64, out);
  PutLittleEndian(value, out);
}

inline void PutUint(int field, uint64_t value, std::string* out) {
  PutKey(field, kVarint, out);
  PutVarint(value, out);
}

}  // namespace qlora::tensorboard::wire
