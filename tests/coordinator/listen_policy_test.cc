// Which addresses the coordinator may listen on without --insecure.
#include "coordinator/listen_policy.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace qlora::coordinator {
namespace {

TEST(CoordinatorListenPolicyTest, LoopbackIsAllowedAnythingElseNeedsInsecure) {
  for (const char* ok : {"127.0.0.1:50051", "127.0.0.1:0", "127.1.2.3:7", "localhost:50051",
                         "[::1]:50051"}) {
    EXPECT_TRUE(IsLoopbackAddress(ok)) << ok;
    EXPECT_TRUE(CheckListenAddress(ok, false).ok()) << ok;
  }
  for (const char* exposed : {"0.0.0.0:50051", "10.0.0.5:50051", "[::]:50051", ":50051",
                              "example.org:50051", "128.0.0.1:1"}) {
    EXPECT_FALSE(IsLoopbackAddress(exposed)) << exposed;
    const absl::Status refused = CheckListenAddress(exposed, false);
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << exposed;
    EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("--insecure"));
    EXPECT_TRUE(CheckListenAddress(exposed, true).ok()) << exposed;
  }
}

}  // namespace
}  // namespace qlora::coordinator
