// How a client (qloractl, a worker) dials the coordinator: plaintext, TLS (the coordinator's
// certificate checked against a CA), or mutual TLS (a client certificate too). The settings come
// from flags or from the environment (QLORA_TLS, QLORA_TLS_CA, QLORA_TLS_CERT, QLORA_TLS_KEY,
// QLORA_TLS_SERVER_NAME); the coordinator hands its workers the CA and server name this way.
// Bearer tokens are not part of the channel: callers add them per call (BearerMetadata), so a
// token is never sent to a coordinator reached in plaintext unless the caller chose to.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/channel.h>

#include "absl/status/statusor.h"

namespace qlora {

inline constexpr char kTlsVariable[] = "QLORA_TLS";  // "1": TLS with the system roots
inline constexpr char kTlsCaVariable[] = "QLORA_TLS_CA";
inline constexpr char kTlsCertVariable[] = "QLORA_TLS_CERT";
inline constexpr char kTlsKeyVariable[] = "QLORA_TLS_KEY";
inline constexpr char kTlsServerNameVariable[] = "QLORA_TLS_SERVER_NAME";

struct ClientTlsOptions {
  bool enabled = false;     // TLS at all; false = plaintext (loopback only, by the server's rule)
  std::string ca_file;      // PEM roots that signed the coordinator's certificate; "" = system roots
  std::string cert_file;    // mTLS: this client's certificate chain (PEM) ...
  std::string key_file;     // ... and its private key (PEM)
  std::string server_name;  // the name to check the certificate against; "" = the address's host
};

// From the environment: TLS is on when QLORA_TLS is 1 or QLORA_TLS_CA or QLORA_TLS_CERT is set.
ClientTlsOptions ClientTlsFromEnvironment();

// A channel to `address` ("host:port"). INVALID_ARGUMENT naming the file when a PEM file cannot
// be read, or when only one of cert_file and key_file is given.
absl::StatusOr<std::shared_ptr<grpc::Channel>> DialCoordinator(const std::string& address,
                                                               const ClientTlsOptions& tls);

// The metadata pair that carries a bearer token: {"authorization", "Bearer <token>"}.
inline constexpr char kAuthorizationHeader[] = "authorization";
std::string BearerValue(const std::string& token);

}  // namespace qlora
