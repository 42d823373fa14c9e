// Which listen addresses need --insecure (see listen_policy.h).
#include "coordinator/listen_policy.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace qlora::coordinator {

bool IsLoopbackAddress(const std::string& address) {
  std::string host = address.substr(0, address.rfind(':'));
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) host = host.substr(1, host.size() - 2);
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

absl::Status CheckListenAddress(const std::string& address, bool insecure) {
  if (insecure || IsLoopbackAddress(address)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "refusing to listen on ", address, ": the API has no TLS and no client authentication yet, "
      "so anyone who reaches this port could submit, read and cancel every job. Listen on "
      "127.0.0.1, or pass --insecure to accept that (e.g. behind a NetworkPolicy)."));
}

}  // namespace qlora::coordinator
