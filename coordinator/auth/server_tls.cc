// The coordinator's TLS credentials (see server_tls.h). OpenSSL checks the files at start;
// gRPC's FileWatcherCertificateProvider re-reads them while serving.
#include "coordinator/auth/server_tls.h"

#include <openssl/pem.h>
#include <openssl/x509.h>

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include "absl/strings/str_cat.h"
#include "common/posix_files.h"

namespace qlora::coordinator {
namespace {

struct BioDeleter { void operator()(BIO* b) const { BIO_free(b); } };
struct X509Deleter { void operator()(X509* x) const { X509_free(x); } };
struct KeyDeleter { void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); } };

absl::StatusOr<std::string> ReadPemFile(const std::string& flag, const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat(flag, ": ", text.status().message()));
  return text;
}

std::unique_ptr<BIO, BioDeleter> MemoryBio(const std::string& text) {
  return std::unique_ptr<BIO, BioDeleter>(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
}

absl::Status CheckIdentity(const ServerTlsOptions& options) {
  absl::StatusOr<std::string> cert_text = ReadPemFile("--tls-cert", options.cert_file);
  if (!cert_text.ok()) return cert_text.status();
  absl::StatusOr<std::string> key_text = ReadPemFile("--tls-key", options.key_file);
  if (!key_text.ok()) return key_text.status();
  std::unique_ptr<X509, X509Deleter> cert(PEM_read_bio_X509(MemoryBio(*cert_text).get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--tls-cert: ", options.cert_file, " holds no PEM certificate"));
  }
  std::unique_ptr<EVP_PKEY, KeyDeleter> key(
      PEM_read_bio_PrivateKey(MemoryBio(*key_text).get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-key: ", options.key_file, " holds no unencrypted PEM private key"));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-key: ", options.key_file, " is not the key of --tls-cert ", options.cert_file));
  }
  if (X509_cmp_current_time(X509_get0_notAfter(cert.get())) <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("--tls-cert: ", options.cert_file, " has expired"));
  }
  if (X509_cmp_current_time(X509_get0_notBefore(cert.get())) >= 0) {
    return absl::InvalidArgumentError(absl::StrCat("--tls-cert: ", options.cert_file, " is not valid yet"));
  }
  return absl::OkStatus();
}

absl::Status CheckClientCa(const std::string& path) {
  absl::StatusOr<std::string> text = ReadPemFile("--tls-client-ca", path);
  if (!text.ok()) return text.status();
  std::unique_ptr<X509, X509Deleter> ca(PEM_read_bio_X509(MemoryBio(*text).get(), nullptr, nullptr, nullptr));
  if (ca == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--tls-client-ca: ", path, " holds no PEM certificate"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const ServerTlsOptions& options) {
  if (options.cert_file.empty() && options.key_file.empty()) {
    if (!options.client_ca_file.empty()) {
      return absl::InvalidArgumentError("--tls-client-ca needs TLS: give --tls-cert and --tls-key too");
    }
    return grpc::InsecureServerCredentials();
  }
  if (options.cert_file.empty() || options.key_file.empty()) {
    return absl::InvalidArgumentError("TLS needs both --tls-cert and --tls-key");
  }
  if (absl::Status ok = CheckIdentity(options); !ok.ok()) return ok;
  if (!options.client_ca_file.empty()) {
    if (absl::Status ok = CheckClientCa(options.client_ca_file); !ok.ok()) return ok;
  }
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      options.key_file, options.cert_file, options.client_ca_file, options.reload_interval_s);
  grpc::experimental::TlsServerCredentialsOptions tls(provider);
  tls.watch_identity_key_cert_pairs();
  if (options.client_ca_file.empty()) {
    tls.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    tls.watch_root_certs();
    tls.set_cert_request_type(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  return grpc::experimental::TlsServerCredentials(tls);
}

}  // namespace qlora::coordinator
