// Bearer tokens are never stored in clear: the coordinator's tokens file holds their SHA-256
// ("sha256:<64 lowercase hex>"), made by `qloractl hash-token`, and a presented token is hashed
// and compared in constant time. SHA-256 comes from OpenSSL's libcrypto, which gRPC already
// links (a well-kept implementation; hashing by hand would be neither faster nor safer).
#pragma once

#include <string>
#include "absl/strings/string_view.h"

namespace qlora {

// "sha256:" followed by the token's SHA-256 in lowercase hex.
std::string TokenHash(absl::string_view token);

// True when `a` and `b` are equal; the time taken depends only on their lengths.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// A fresh secret for a process the coordinator starts (a worker's or a generation session's
// startup token): 128 bits from std::random_device as 32 hex digits.
std::string RandomToken();

}  // namespace qlora
