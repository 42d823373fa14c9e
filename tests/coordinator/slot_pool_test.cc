// Worker slot accounting: GPU ids or CPU slot numbers, busy until released.
#include "coordinator/launch/slot_pool.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace qlora::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(CoordinatorSlotPoolTest, GpuSlotsAreTheConfiguredGpuIds) {
  SlotPool pool({2, 5, 7}, /*cpu_workers=*/4);  // GPUs win over CPU slots
  EXPECT_TRUE(pool.gpu());
  EXPECT_EQ(pool.total(), 3);
  EXPECT_THAT(pool.Free(), ElementsAre(2, 5, 7));
}

TEST(CoordinatorSlotPoolTest, CpuSlotsAreNumberedFromZero) {
  SlotPool pool({}, 3);
  EXPECT_FALSE(pool.gpu());
  EXPECT_EQ(pool.total(), 3);
  EXPECT_THAT(pool.Free(), ElementsAre(0, 1, 2));
}

TEST(CoordinatorSlotPoolTest, TakenSlotsAreBusyUntilReleased) {
  SlotPool pool({2, 5, 7}, 0);
  pool.Take(5);
  pool.Take(2);
  EXPECT_THAT(pool.Free(), ElementsAre(7));
  pool.Release(2);
  EXPECT_THAT(pool.Free(), ElementsAre(2, 7));
  pool.Take(2);
  pool.Take(7);
  EXPECT_THAT(pool.Free(), IsEmpty());
  EXPECT_EQ(pool.total(), 3);
}

TEST(CoordinatorSlotPoolTest, NoSlotsAtAll) {
  SlotPool pool({}, 0);
  EXPECT_EQ(pool.total(), 0);
  EXPECT_THAT(pool.Free(), IsEmpty());
}

}  // namespace
}  // namespace qlora::coordinator
