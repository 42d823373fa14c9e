// StreamLimit: a cap on open streams for everyone and one per user; closed slots free places.
#include "coordinator/rpc/stream_limit.h"

#include <vector>

#include "gtest/gtest.h"

namespace qlora::coordinator {
namespace {

TEST(CoordinatorStreamLimitTest, PerUserCapLeavesRoomForOthersAndTotalCapHolds) {
  StreamLimit limit(/*limit=*/3, /*per_user_limit=*/2);
  StreamLimit::Refusal why;
  std::vector<StreamLimit::Slot> open;
  open.push_back(*limit.TryOpen("alice", &why));
  open.push_back(*limit.TryOpen("alice", &why));
  EXPECT_FALSE(limit.TryOpen("alice", &why).has_value());
  EXPECT_EQ(why, StreamLimit::Refusal::kPerUser);
  open.push_back(*limit.TryOpen("bob", &why));
  EXPECT_FALSE(limit.TryOpen("carol", &why).has_value());
  EXPECT_EQ(why, StreamLimit::Refusal::kTotal);
  open.erase(open.begin());  // one of alice's closes
  EXPECT_TRUE(limit.TryOpen("alice", &why).has_value());
}

TEST(CoordinatorStreamLimitTest, NoPerUserCapByDefault) {
  StreamLimit limit(2);
  StreamLimit::Refusal why;
  auto a = limit.TryOpen("alice", &why);
  auto b = limit.TryOpen("alice", &why);
  EXPECT_TRUE(a.has_value() && b.has_value());
  EXPECT_FALSE(limit.TryOpen("alice", &why).has_value());
}

}  // namespace
}  // namespace qlora::coordinator
