// SHA-256 token hashes through OpenSSL, and random tokens (see token_hash.h).
#include "common/auth/token_hash.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <cstdint>
#include <random>

#include "absl/strings/str_format.h"

namespace qlora {

std::string TokenHash(absl::string_view token) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), digest);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "sha256:";
  for (unsigned char byte : digest) {
    out.push_back(kHex[byte >> 4]);
    out.push_back(kHex[byte & 15]);
  }
  return out;
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string RandomToken() {
  std::random_device rd;
  return absl::StrFormat("%016x%016x", (uint64_t{rd()} << 32) | rd(), (uint64_t{rd()} << 32) | rd());
}

}  // namespace qlora
