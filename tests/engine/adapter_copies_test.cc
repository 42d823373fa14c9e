// AdapterCopies (worker/engine/adapter_copies.h): inside a scope each adapter is cast once and
// the copy handed back afterwards; outside, a fresh cast every time; the last scope's end drops
// every copy, so the next scope sees the adapters' new values.
#include <ATen/ATen.h>

#include "gtest/gtest.h"
#include "worker/engine/adapter_copies.h"

namespace qlora::engine {
namespace {

TEST(EngineAdapterCopies, OutsideAScopeEveryCallCasts) {
  AdapterCopies copies;
  const at::Tensor a = at::randn({4, 8});
  const at::Tensor first = copies.Get(a, at::kBFloat16), second = copies.Get(a, at::kBFloat16);
  EXPECT_TRUE(at::equal(first, a.to(at::kBFloat16)));
  EXPECT_NE(first.data_ptr(), second.data_ptr());
  EXPECT_EQ(copies.cached_bytes(), 0);
}

TEST(EngineAdapterCopies, InsideAScopeTheFirstCastIsHandedBack) {
  AdapterCopies copies;
  const at::Tensor a = at::randn({4, 8}), b = at::randn({16, 4});
  {
    AdapterCopyScope scope(copies);
    const at::Tensor a1 = copies.Get(a, at::kBFloat16);
    EXPECT_TRUE(at::equal(a1, a.to(at::kBFloat16)));
    EXPECT_EQ(copies.Get(a, at::kBFloat16).data_ptr(), a1.data_ptr());
    // Another dtype or another tensor is another copy.
    EXPECT_EQ(copies.Get(a, at::kHalf).scalar_type(), at::kHalf);
    EXPECT_NE(copies.Get(b, at::kBFloat16).data_ptr(), a1.data_ptr());
    EXPECT_EQ(copies.cached_bytes(), (32 + 32 + 64) * 2);
    // The copy is not a view of the parameter: writing the parameter leaves it as it was.
    at::Tensor(a).mul_(2);
    EXPECT_TRUE(at::equal(copies.Get(a, at::kBFloat16), a1));
  }
  EXPECT_EQ(copies.cached_bytes(), 0);
  // A new scope casts again, from the parameter's current values.
  AdapterCopyScope scope(copies);
  EXPECT_TRUE(at::equal(copies.Get(a, at::kBFloat16), a.to(at::kBFloat16)));
}

TEST(EngineAdapterCopies, ConcatenationsAreCachedByTheirMembers) {
  AdapterCopies copies;
  const at::Tensor q = at::randn({4, 8}), k = at::randn({2, 8}), v = at::randn({4, 8});
  AdapterCopyScope scope(copies);
  const at::Tensor qkv = copies.Get({q, k, v}, at::kBFloat16);
  EXPECT_TRUE(at::equal(qkv, at::cat({q, k, v}).to(at::kBFloat16)));
  EXPECT_EQ(copies.Get({q, k, v}, at::kBFloat16).data_ptr(), qkv.data_ptr());
  // Other members or another order: another copy.
  EXPECT_NE(copies.Get({q, v, k}, at::kBFloat16).data_ptr(), qkv.data_ptr());
  EXPECT_TRUE(at::equal(copies.Get({q, v}, at::kBFloat16), at::cat({q, v}).to(at::kBFloat16)));
}

TEST(EngineAdapterCopies, NestedScopesKeepTheCopiesUntilTheLastEnds) {
  AdapterCopies copies;
  const at::Tensor a = at::randn({4, 8});
  auto outer = std::make_unique<AdapterCopyScope>(copies);
  at::Tensor first;
  {
    AdapterCopyScope inner(copies);
    first = copies.Get(a, at::kBFloat16);
  }
  EXPECT_EQ(copies.Get(a, at::kBFloat16).data_ptr(), first.data_ptr());
  outer.reset();
  EXPECT_EQ(copies.cached_bytes(), 0);
}

}  // namespace
}  // namespace qlora::engine
