// Which listen addresses need TLS and authentication, or --insecure (see listen_policy.h).
#include "coordinator/listen_policy.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace qlora::coordinator {

bool IsLoopbackAddress(const std::string& address) {
  std::string host = address.substr(0, address.rfind(':'));
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) host = host.substr(1, host.size() - 2);
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

bool IsExposedInsecurely(const std::string& address, const ListenSecurity& security) {
  return !IsLoopbackAddress(address) && !(security.tls && security.authentication);
}

absl::Status CheckListenAddress(const std::string& address, const ListenSecurity& security) {
  if (security.insecure || !IsExposedInsecurely(address, security)) return absl::OkStatus();
  const char* missing = !security.tls && !security.authentication ? "no TLS and no client authentication"
                        : !security.tls                           ? "no TLS (--tls-cert, --tls-key)"
                                                                  : "no client authentication (--auth-tokens or --tls-client-ca)";
  return absl::FailedPreconditionError(absl::StrCat(
      "refusing to listen on ", address, " with ", missing, ": anyone who reaches this port could "
      "submit, read and cancel every job. Configure TLS and authentication, listen on 127.0.0.1, or "
      "pass --insecure to accept the risk."));
}

}  // namespace qlora::coordinator
