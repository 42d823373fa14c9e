// Who is calling the client API (JobService), and whether they may touch a job.
//
// With neither a tokens file nor client certificates configured, authentication is off: every
// caller is the admin "local" (the embedded default, which listens on loopback only; see
// listen_policy.h). Otherwise a call must carry a bearer token listed in the tokens file
// (user_table.h) or a client certificate verified by the TLS layer, else UNAUTHENTICATED. Users
// see and act on their own jobs only (PERMISSION_DENIED otherwise); admins on every job.
//
// Thread-safe. Reload() re-reads the tokens file (on SIGHUP) without holding the lock while it
// reads; a file that no longer parses leaves the previous table in force.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/auth/user_table.h"

namespace qlora::coordinator {

struct AuthOptions {
  std::string tokens_file;           // "" = no bearer tokens
  bool client_certificates = false;  // a verified client certificate names its user (mTLS)
};

// What a call presented; empty fields were not presented.
struct PresentedCredentials {
  std::string bearer_token;
  std::string certificate_user;      // the verified certificate's subject common name
};

struct Caller {
  std::string user;
  bool admin = false;
};

inline constexpr char kLocalUser[] = "local";

class Authenticator {
 public:
  // Reads the tokens file, if any: INVALID_ARGUMENT / NOT_FOUND naming it when it is malformed
  // or missing.
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(const AuthOptions& options);

  bool enabled() const { return !options_.tokens_file.empty() || options_.client_certificates; }
  // The caller, or UNAUTHENTICATED saying what was missing or wrong. A bearer token, when
  // presented, wins over the certificate (a wrong token is refused even with a certificate).
  absl::StatusOr<Caller> Authenticate(const PresentedCredentials& presented) const;
  // Re-reads the tokens file; on error keeps the current table and returns why.
  absl::Status Reload();

 private:
  explicit Authenticator(AuthOptions options) : options_(std::move(options)) {}

  const AuthOptions options_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const UserTable> table_ ABSL_GUARDED_BY(mu_);
};

// OK when `caller` may see and act on a job owned by `owner`; PERMISSION_DENIED naming the job
// otherwise.
absl::Status CheckMayAccess(const Caller& caller, const std::string& owner, const std::string& job_id);

}  // namespace qlora::coordinator
