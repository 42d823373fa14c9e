// Which addresses the coordinator may listen on: loopback always; elsewhere only with TLS and
// client authentication, or --insecure.
#include "coordinator/auth/listen_policy.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace qlora::coordinator {
namespace {

using ::testing::HasSubstr;

TEST(CoordinatorListenPolicyTest, LoopbackIsAllowedAnythingElseNeedsTlsAndAuthOrInsecure) {
  const ListenSecurity plain;
  for (const char* ok : {"127.0.0.1:50051", "127.0.0.1:0", "127.1.2.3:7", "localhost:50051",
                         "[::1]:50051"}) {
    EXPECT_TRUE(IsLoopbackAddress(ok)) << ok;
    EXPECT_TRUE(CheckListenAddress(ok, plain).ok()) << ok;
  }
  for (const char* exposed : {"0.0.0.0:50051", "10.0.0.5:50051", "[::]:50051", ":50051",
                              "example.org:50051", "128.0.0.1:1"}) {
    EXPECT_FALSE(IsLoopbackAddress(exposed)) << exposed;
    const absl::Status refused = CheckListenAddress(exposed, plain);
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << exposed;
    EXPECT_THAT(std::string(refused.message()), HasSubstr("--insecure"));
    EXPECT_TRUE(CheckListenAddress(exposed, {.insecure = true}).ok()) << exposed;
    EXPECT_TRUE(IsExposedInsecurely(exposed, {.insecure = true}));
    EXPECT_TRUE(CheckListenAddress(exposed, {.tls = true, .authentication = true}).ok()) << exposed;
    EXPECT_FALSE(IsExposedInsecurely(exposed, {.tls = true, .authentication = true}));
  }
}

// The decision is made on the addresses a name resolves to, not on its spelling: a DNS name that
// starts with "127." (here under .invalid, which never resolves, RFC 6761) is not loopback, and
// neither is an IPv4-mapped address outside 127/8; numeric loopback forms are.
TEST(CoordinatorListenPolicyTest, ANameIsJudgedByWhatItResolvesTo) {
  for (const char* spelled_like_loopback :
       {"127.0.0.1.invalid:50051", "127.evil.invalid:50051", "localhost.invalid:1",
        "[::ffff:10.0.0.1]:50051"}) {
    EXPECT_FALSE(IsLoopbackAddress(spelled_like_loopback)) << spelled_like_loopback;
    EXPECT_EQ(CheckListenAddress(spelled_like_loopback, {}).code(),
              absl::StatusCode::kFailedPrecondition)
        << spelled_like_loopback;
  }
  for (const char* loopback : {"[::ffff:127.0.0.1]:50051", "127.1:50051"}) {
    EXPECT_TRUE(IsLoopbackAddress(loopback)) << loopback;
  }
}

TEST(CoordinatorListenPolicyTest, TlsWithoutAuthenticationOrTheReverseIsNotEnough) {
  const absl::Status tls_only = CheckListenAddress("0.0.0.0:1", {.tls = true});
  EXPECT_EQ(tls_only.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(tls_only.message()), HasSubstr("no client authentication"));
  const absl::Status auth_only = CheckListenAddress("0.0.0.0:1", {.authentication = true});
  EXPECT_EQ(auth_only.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(auth_only.message()), HasSubstr("no TLS"));
}

}  // namespace
}  // namespace qlora::coordinator
