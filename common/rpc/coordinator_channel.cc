// Dialing the coordinator in plaintext or (m)TLS (see coordinator_channel.h).
#include "common/rpc/coordinator_channel.h"

#include <cstdlib>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/strings/str_cat.h"
#include "common/posix_files.h"

namespace qlora {
namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("TLS ", what, " ", path, ": ", text.status().message()));
  }
  if (text->find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("TLS ", what, " ", path, " is not a PEM file"));
  }
  return text;
}

}  // namespace

ClientTlsOptions ClientTlsFromEnvironment() {
  ClientTlsOptions tls;
  tls.ca_file = Env(kTlsCaVariable);
  tls.cert_file = Env(kTlsCertVariable);
  tls.key_file = Env(kTlsKeyVariable);
  tls.server_name = Env(kTlsServerNameVariable);
  tls.enabled = Env(kTlsVariable) == "1" || !tls.ca_file.empty() || !tls.cert_file.empty();
  return tls;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> DialCoordinator(const std::string& address,
                                                               const ClientTlsOptions& tls) {
  grpc::ChannelArguments args;
  if (!tls.enabled) return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return absl::InvalidArgumentError("a TLS client certificate needs its key, and a key its certificate");
  }
  grpc::SslCredentialsOptions ssl;
  if (!tls.ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadPem(tls.ca_file, "CA");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *std::move(ca);
  }
  if (!tls.cert_file.empty()) {
    absl::StatusOr<std::string> cert = ReadPem(tls.cert_file, "certificate");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPem(tls.key_file, "key");
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *std::move(cert);
    ssl.pem_private_key = *std::move(key);
  }
  if (!tls.server_name.empty()) args.SetSslTargetNameOverride(tls.server_name);
  return grpc::CreateCustomChannel(address, grpc::SslCredentials(ssl), args);
}

std::string BearerValue(const std::string& token) { return absl::StrCat("Bearer ", token); }

}  // namespace qlora
