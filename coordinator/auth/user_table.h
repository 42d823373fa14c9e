// The coordinator's users: who a bearer token or a client certificate is, and what they may do.
// Read from the tokens file (--auth-tokens), one user per line:
//
//   # comment
//   sha256:<64 hex digits>  alice  user
//   sha256:<64 hex digits>  ops    admin
//
// The hash is of the token (`qloractl hash-token` prints such a line), so the file holds no
// secret. A user may have several lines (several tokens, e.g. during a rotation), all with one
// role. A client certificate (mTLS) names its user by its subject's common name; that user's
// role is the one in this file, `user` when the name is not in it.
#pragma once

#include <map>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"

namespace qlora::coordinator {

enum class Role { kUser, kAdmin };

struct User {
  std::string name;
  Role role = Role::kUser;
};

class UserTable {
 public:
  // INVALID_ARGUMENT naming `source` and the line for a malformed line, an unknown role, a
  // token hash given twice, or one user with two roles.
  static absl::StatusOr<UserTable> Parse(absl::string_view text, absl::string_view source);

  // The user holding `token`, or nullopt. Compares hashes in constant time.
  std::optional<User> FindByToken(absl::string_view token) const;
  // The role of the user called `name` (kUser when the file does not name them).
  Role RoleOf(const std::string& name) const;
  int size() const { return static_cast<int>(tokens_.size()); }

 private:
  struct TokenEntry {
    std::string hash;  // "sha256:<hex>"
    std::string user;
  };
  std::vector<TokenEntry> tokens_;
  std::map<std::string, Role> roles_;
};

// Names of users (from the tokens file or a certificate): 1-64 of [A-Za-z0-9._@-].
bool IsValidUserName(absl::string_view name);

}  // namespace qlora::coordinator
