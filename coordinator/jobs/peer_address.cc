// gRPC peer strings to host addresses (see peer_address.h).
#include "coordinator/jobs/peer_address.h"

#include "absl/strings/match.h"
#include "absl/strings/strip.h"

namespace qlora::coordinator {

std::string PeerHost(absl::string_view peer) {
  if (absl::StartsWith(peer, "unix:") || absl::StartsWith(peer, "unix-abstract:")) return "local";
  absl::string_view rest = peer;
  if (absl::ConsumePrefix(&rest, "ipv6:")) {
    if (absl::ConsumePrefix(&rest, "[")) {
      const size_t close = rest.find(']');
      if (close != absl::string_view::npos) return std::string(rest.substr(0, close));
    }
    return std::string(rest);
  }
  if (absl::ConsumePrefix(&rest, "ipv4:")) {
    const size_t colon = rest.rfind(':');
    return std::string(colon == absl::string_view::npos ? rest : rest.substr(0, colon));
  }
  return std::string(peer);
}

}  // namespace qlora::coordinator
