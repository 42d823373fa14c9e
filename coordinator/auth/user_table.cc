// Parsing and lookups of the tokens file (see user_table.h).
#include "coordinator/auth/user_table.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/auth/token_hash.h"

namespace qlora::coordinator {
namespace {

bool IsTokenHash(absl::string_view text) {
  constexpr absl::string_view kPrefix = "sha256:";
  if (text.substr(0, kPrefix.size()) != kPrefix || text.size() != kPrefix.size() + 64) return false;
  for (char c : text.substr(kPrefix.size())) {
    if (!absl::ascii_isdigit(c) && (c < 'a' || c > 'f')) return false;
  }
  return true;
}

}  // namespace

bool IsValidUserName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '_' && c != '@' && c != '-') return false;
  }
  return true;
}

absl::StatusOr<UserTable> UserTable::Parse(absl::string_view text, absl::string_view source) {
  UserTable table;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", line_number, ": ", why));
    };
    std::vector<absl::string_view> fields = absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() != 3) return bad("expected 'sha256:<hex> USER ROLE'");
    if (!IsTokenHash(fields[0])) {
      return bad("the first field must be sha256: and 64 lowercase hex digits (qloractl hash-token)");
    }
    if (!IsValidUserName(fields[1])) return bad("a user name is 1-64 of A-Z a-z 0-9 . _ @ -");
    Role role;
    if (fields[2] == "user") {
      role = Role::kUser;
    } else if (fields[2] == "admin") {
      role = Role::kAdmin;
    } else {
      return bad(absl::StrCat("unknown role '", fields[2], "' (user or admin)"));
    }
    const std::string user(fields[1]);
    for (const TokenEntry& entry : table.tokens_) {
      if (entry.hash == fields[0]) return bad("this token hash is listed twice");
    }
    if (auto it = table.roles_.find(user); it != table.roles_.end() && it->second != role) {
      return bad(absl::StrCat("user ", user, " has two roles"));
    }
    table.roles_[user] = role;
    table.tokens_.push_back({std::string(fields[0]), user});
  }
  return table;
}

std::optional<User> UserTable::FindByToken(absl::string_view token) const {
  const std::string hash = TokenHash(token);
  std::optional<User> found;
  // Every entry is compared, so the time taken does not say which line matched.
  for (const TokenEntry& entry : tokens_) {
    if (ConstantTimeEquals(entry.hash, hash)) found = User{entry.user, roles_.at(entry.user)};
  }
  return found;
}

Role UserTable::RoleOf(const std::string& name) const {
  auto it = roles_.find(name);
  return it == roles_.end() ? Role::kUser : it->second;
}

}  // namespace qlora::coordinator
