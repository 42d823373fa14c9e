// Which listen addresses need TLS and authentication, or --insecure (see listen_policy.h).
#include "coordinator/auth/listen_policy.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace qlora::coordinator {
namespace {

bool IsLoopbackSockaddr(const sockaddr* address) {
  if (address->sa_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(address);
    return (ntohl(v4->sin_addr.s_addr) >> 24) == 127;
  }
  if (address->sa_family == AF_INET6) {
    const in6_addr& v6 = reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

}  // namespace

bool IsLoopbackAddress(const std::string& address) {
  std::string host = address.substr(0, address.rfind(':'));
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) host = host.substr(1, host.size() - 2);
  if (host.empty()) return false;  // every interface
  // Decided on what the name resolves to, not on how it is spelled: "127.example.com" may
  // resolve anywhere. Every address it resolves to must be a loopback one; a name that does not
  // resolve is not loopback.
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* resolved = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &resolved) != 0 || resolved == nullptr) return false;
  bool loopback = true;
  for (const addrinfo* a = resolved; a != nullptr; a = a->ai_next) {
    loopback = loopback && IsLoopbackSockaddr(a->ai_addr);
  }
  freeaddrinfo(resolved);
  return loopback;
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
