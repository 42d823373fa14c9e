// Where the coordinator may listen. Without TLS and client authentication anyone who reaches
// the port could submit, read and cancel every job, so a non-loopback address needs both (or
// the operator says --insecure, and then the first log line says so).
#pragma once

#include <string>

#include "absl/status/status.h"

namespace qlora::coordinator {

// True when the host part of "host:port" or "[v6]:port" resolves to loopback addresses only
// (127.0.0.0/8, ::1, ::ffff:127.0.0.0/104); a name is resolved (getaddrinfo), so a name spelled
// like a loopback address but resolving elsewhere is not loopback, nor is one that does not
// resolve, nor an empty host (every interface).
bool IsLoopbackAddress(const std::string& address);

struct ListenSecurity {
  bool tls = false;             // --tls-cert and --tls-key
  bool authentication = false;  // --auth-tokens or --tls-client-ca
  bool insecure = false;        // --insecure
};

// OK for a loopback address, for any address with TLS and authentication, or with --insecure;
// FAILED_PRECONDITION otherwise, saying what is missing and what to do.
absl::Status CheckListenAddress(const std::string& address, const ListenSecurity& security);

// True when `address` is reachable from elsewhere without TLS and authentication (what the
// first log line must warn about).
bool IsExposedInsecurely(const std::string& address, const ListenSecurity& security);

}  // namespace qlora::coordinator
