// The coordinator's listening credentials: plaintext, or TLS with its certificate and key
// (re-read when the files change, so a renewed certificate needs no restart), optionally asking
// clients for certificates signed by a client CA (mTLS). Clients without a certificate are still
// admitted to the TLS session (workers have none; users may use a bearer token instead), and
// authentication decides what they may do (authenticator.h).
#pragma once

#include <memory>
#include <string>

#include <grpcpp/security/server_credentials.h>

#include "absl/status/statusor.h"

namespace qlora::coordinator {

struct ServerTlsOptions {
  std::string cert_file;       // PEM certificate chain; "" = plaintext
  std::string key_file;        // PEM private key
  std::string client_ca_file;  // PEM CA bundle for client certificates; "" = no mTLS
  int reload_interval_s = 10;  // how often the files are checked for changes
};

// Checks the files now (readable PEM, the key matches the certificate, the certificate is in
// its validity period) so that a mistake stops the start with a message naming the file, then
// makes the credentials.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const ServerTlsOptions& options);

}  // namespace qlora::coordinator
