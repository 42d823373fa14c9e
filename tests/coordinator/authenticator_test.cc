// The tokens file (UserTable), caller authentication (Authenticator) and job access: what a
// shared coordinator's users rely on to keep their jobs their own.
#include "coordinator/auth/authenticator.h"

#include "absl/strings/str_cat.h"
#include "common/auth/token_hash.h"
#include "coordinator/auth/user_table.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/test_util.h"

namespace qlora::coordinator {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;
using testing::WriteFile;

std::string Line(const std::string& token, const std::string& user, const std::string& role) {
  return absl::StrCat(TokenHash(token), "  ", user, "\t", role, "\n");
}

TEST(CoordinatorUserTableTest, TokenHashIsSha256Hex) {
  // echo -n abc | sha256sum
  EXPECT_EQ(TokenHash("abc"), "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_TRUE(ConstantTimeEquals("same", "same"));
  EXPECT_FALSE(ConstantTimeEquals("same", "sane"));
  EXPECT_FALSE(ConstantTimeEquals("same", "samey"));
}

TEST(CoordinatorUserTableTest, FindsUsersByTokenAndRolesByName) {
  absl::StatusOr<UserTable> table = UserTable::Parse(
      absl::StrCat("# users\n\n", Line("t-alice", "alice", "user"), Line("t-ops", "ops", "admin"),
                   Line("t-alice-new", "alice", "user")),
      "tokens");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->size(), 3);
  ASSERT_TRUE(table->FindByToken("t-alice").has_value());
  EXPECT_EQ(table->FindByToken("t-alice")->name, "alice");
  EXPECT_EQ(table->FindByToken("t-alice-new")->name, "alice");
  EXPECT_EQ(table->FindByToken("t-ops")->role, Role::kAdmin);
  EXPECT_FALSE(table->FindByToken("t-alic").has_value());
  EXPECT_FALSE(table->FindByToken("").has_value());
  EXPECT_EQ(table->RoleOf("ops"), Role::kAdmin);
  EXPECT_EQ(table->RoleOf("someone"), Role::kUser);
}

TEST(CoordinatorUserTableTest, MalformedLinesAreRefusedNamingTheLine) {
  const std::string good = Line("t", "alice", "user");
  struct Case {
    std::string text;
    std::string why;
  } cases[] = {
      {"t-alice alice user\n", "sha256:"},                                     // a clear token
      {absl::StrCat(TokenHash("t"), " alice\n"), "expected"},                   // missing role
      {absl::StrCat(TokenHash("t"), " alice root\n"), "unknown role 'root'"},
      {absl::StrCat(TokenHash("t"), " al/ice user\n"), "user name"},
      {absl::StrCat(TokenHash("t"), "X alice user\n"), "sha256:"},
      {good + good, "listed twice"},
      {good + Line("u", "alice", "admin"), "two roles"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<UserTable> table = UserTable::Parse(c.text, "tokens.txt");
    ASSERT_FALSE(table.ok()) << c.text;
    EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(table.status().message()), HasSubstr(c.why)) << c.text;
    EXPECT_THAT(std::string(table.status().message()), HasSubstr("tokens.txt:")) << c.text;
  }
}

TEST(CoordinatorAuthenticatorTest, OffMeansEveryCallerIsTheLocalAdmin) {
  absl::StatusOr<std::unique_ptr<Authenticator>> auth = Authenticator::Create({});
  ASSERT_TRUE(auth.ok());
  EXPECT_FALSE((*auth)->enabled());
  absl::StatusOr<Caller> caller = (*auth)->Authenticate({});
  ASSERT_TRUE(caller.ok());
  EXPECT_EQ(caller->user, kLocalUser);
  EXPECT_TRUE(caller->admin);
}

TEST(CoordinatorAuthenticatorTest, TokensAndCertificatesIdentifyCallers) {
  TempDir dir;
  const std::string file = WriteFile(dir.path() + "/tokens", Line("t-alice", "alice", "user") + Line("t-ops", "ops", "admin"));
  absl::StatusOr<std::unique_ptr<Authenticator>> auth =
      Authenticator::Create({.tokens_file = file, .client_certificates = true});
  ASSERT_TRUE(auth.ok()) << auth.status();
  const Authenticator& a = **auth;
  EXPECT_EQ(a.Authenticate({}).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(a.Authenticate({.bearer_token = "nope"}).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(a.Authenticate({.bearer_token = "t-alice"})->user, "alice");
  EXPECT_FALSE(a.Authenticate({.bearer_token = "t-alice"})->admin);
  EXPECT_TRUE(a.Authenticate({.bearer_token = "t-ops"})->admin);
  // A certificate names its user; the role comes from the file.
  EXPECT_EQ(a.Authenticate({.certificate_user = "bob"})->user, "bob");
  EXPECT_TRUE(a.Authenticate({.certificate_user = "ops"})->admin);
  // A wrong token is refused even with a good certificate.
  EXPECT_EQ(a.Authenticate({.bearer_token = "nope", .certificate_user = "bob"}).status().code(),
            absl::StatusCode::kUnauthenticated);
  // A common name that is no user name (spaces, control characters) is refused.
  EXPECT_EQ(a.Authenticate({.certificate_user = "bob\nadmin"}).status().code(), absl::StatusCode::kUnauthenticated);
}

TEST(CoordinatorAuthenticatorTest, CertificatesCountOnlyWhenConfigured) {
  TempDir dir;
  const std::string file = WriteFile(dir.path() + "/tokens", Line("t-alice", "alice", "user"));
  absl::StatusOr<std::unique_ptr<Authenticator>> auth = Authenticator::Create({.tokens_file = file});
  ASSERT_TRUE(auth.ok());
  EXPECT_EQ((*auth)->Authenticate({.certificate_user = "alice"}).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(CoordinatorAuthenticatorTest, ReloadTakesNewUsersAndKeepsTheOldOnesWhenTheFileBreaks) {
  TempDir dir;
  const std::string file = WriteFile(dir.path() + "/tokens", Line("t-alice", "alice", "user"));
  absl::StatusOr<std::unique_ptr<Authenticator>> auth = Authenticator::Create({.tokens_file = file});
  ASSERT_TRUE(auth.ok());
  Authenticator& a = **auth;
  EXPECT_FALSE(a.Authenticate({.bearer_token = "t-bob"}).ok());
  WriteFile(file, Line("t-bob", "bob", "user"));
  ASSERT_TRUE(a.Reload().ok());
  EXPECT_EQ(a.Authenticate({.bearer_token = "t-bob"})->user, "bob");
  EXPECT_FALSE(a.Authenticate({.bearer_token = "t-alice"}).ok()) << "a removed token stops working";
  WriteFile(file, "garbage\n");
  EXPECT_EQ(a.Reload().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.Authenticate({.bearer_token = "t-bob"})->user, "bob");
}

TEST(CoordinatorAuthenticatorTest, MissingOrMalformedTokensFileStopsTheStart) {
  EXPECT_EQ(Authenticator::Create({.tokens_file = "/nonexistent/tokens"}).status().code(),
            absl::StatusCode::kNotFound);
  TempDir dir;
  const std::string file = WriteFile(dir.path() + "/tokens", "secret-token alice user\n");
  EXPECT_EQ(Authenticator::Create({.tokens_file = file}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CoordinatorAuthenticatorTest, UsersMayAccessOnlyTheirOwnJobsAdminsAll) {
  EXPECT_TRUE(CheckMayAccess({"alice", false}, "alice", "job-000001").ok());
  const absl::Status denied = CheckMayAccess({"bob", false}, "alice", "job-000001");
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(denied.message()), HasSubstr("job-000001"));
  EXPECT_TRUE(CheckMayAccess({"ops", true}, "alice", "job-000001").ok());
  // Jobs stored before owners existed belong to no user: only admins.
  EXPECT_FALSE(CheckMayAccess({"alice", false}, "", "job-000001").ok());
}

}  // namespace
}  // namespace qlora::coordinator
