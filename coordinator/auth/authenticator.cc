// Caller authentication and job access (see authenticator.h).
#include "coordinator/auth/authenticator.h"

#include "absl/strings/str_cat.h"
#include "common/posix_files.h"

namespace qlora::coordinator {
namespace {

absl::StatusOr<std::shared_ptr<const UserTable>> ReadTable(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);  // never under mu_
  if (!text.ok()) {
    return absl::Status(text.status().code(), absl::StrCat("--auth-tokens: ", text.status().message()));
  }
  absl::StatusOr<UserTable> table = UserTable::Parse(*text, path);
  if (!table.ok()) return table.status();
  return std::make_shared<const UserTable>(*std::move(table));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(const AuthOptions& options) {
  std::unique_ptr<Authenticator> auth(new Authenticator(options));
  std::shared_ptr<const UserTable> table = std::make_shared<const UserTable>();
  if (!options.tokens_file.empty()) {
    absl::StatusOr<std::shared_ptr<const UserTable>> read = ReadTable(options.tokens_file);
    if (!read.ok()) return read.status();
    table = *std::move(read);
  }
  absl::MutexLock lock(&auth->mu_);
  auth->table_ = std::move(table);
  return auth;
}

absl::Status Authenticator::Reload() {
  if (options_.tokens_file.empty()) return absl::OkStatus();
  absl::StatusOr<std::shared_ptr<const UserTable>> read = ReadTable(options_.tokens_file);
  if (!read.ok()) return read.status();
  absl::MutexLock lock(&mu_);
  table_ = *std::move(read);
  return absl::OkStatus();
}

absl::StatusOr<Caller> Authenticator::Authenticate(const PresentedCredentials& presented) const {
  if (!enabled()) return Caller{kLocalUser, /*admin=*/true};
  std::shared_ptr<const UserTable> table;
  {
    absl::MutexLock lock(&mu_);
    table = table_;
  }
  if (!presented.bearer_token.empty()) {
    if (options_.tokens_file.empty()) {
      return absl::UnauthenticatedError("this coordinator takes no bearer tokens; use a client certificate");
    }
    std::optional<User> user = table->FindByToken(presented.bearer_token);
    if (!user.has_value()) return absl::UnauthenticatedError("the bearer token is not valid");
    return Caller{user->name, user->role == Role::kAdmin};
  }
  if (options_.client_certificates && !presented.certificate_user.empty()) {
    if (!IsValidUserName(presented.certificate_user)) {
      return absl::UnauthenticatedError(
          "the client certificate's common name is not a valid user name (1-64 of A-Z a-z 0-9 . _ @ -)");
    }
    return Caller{presented.certificate_user, table->RoleOf(presented.certificate_user) == Role::kAdmin};
  }
  return absl::UnauthenticatedError(
      options_.client_certificates
          ? "no credentials: present a client certificate or a bearer token (qloractl: $QLORA_TOKEN_FILE)"
          : "no credentials: send a bearer token (qloractl: --token-file or $QLORA_TOKEN_FILE)");
}

absl::Status CheckMayAccess(const Caller& caller, const std::string& owner, const std::string& job_id) {
  if (caller.admin || caller.user == owner) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(job_id, " belongs to another user"));
}

}  // namespace qlora::coordinator
