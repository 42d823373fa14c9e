// The host part of a gRPC peer string, for saying where a worker's call came from:
// "ipv4:10.0.0.2:5555" -> "10.0.0.2", "ipv6:[fd00::2]:5555" -> "fd00::2", "unix:/path" -> "local".
// Anything else is returned as is (it is only shown, never trusted).
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace qlora::coordinator {

std::string PeerHost(absl::string_view peer);

}  // namespace qlora::coordinator
