// AdapterCopies (worker/engine/adapter_copies.h): inside a scope each adapter is cast once and
// the copy handed back afterwards; outside, a fresh cast every time; after the last scope's end
// the next scope casts the adapters' new values again, into the same storage, and a copy that a
// scope did not use is freed at its end. Writes noted in a scope (the held weights' adapter
// blocks) are found there with their signature only, and go with the last scope.
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
  const void* a1_storage = nullptr;
  {
    AdapterCopyScope scope(copies);
    const at::Tensor a1 = copies.Get(a, at::kBFloat16);
    a1_storage = a1.data_ptr();
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
  EXPECT_EQ(copies.cached_bytes(), (32 + 32 + 64) * 2);  // kept for the next scope
  {
    // A new scope casts again, from the parameter's current values, into the same storage.
    AdapterCopyScope scope(copies);
    const at::Tensor again = copies.Get(a, at::kBFloat16);
    EXPECT_TRUE(at::equal(again, a.to(at::kBFloat16)));
    EXPECT_FALSE(at::equal(again, (a / 2).to(at::kBFloat16)));
    EXPECT_EQ(again.data_ptr(), a1_storage);
  }
  // The copies of b and of a in half precision were not used in that scope: freed.
  EXPECT_EQ(copies.cached_bytes(), 32 * 2);
}

TEST(EngineAdapterCopies, ConcatenationsAreCachedByTheirMembers) {
  AdapterCopies copies;
  const at::Tensor q = at::randn({4, 8}), k = at::randn({2, 8}), v = at::randn({4, 8});
  const void* storage = nullptr;
  {
    AdapterCopyScope scope(copies);
    const at::Tensor qkv = copies.Get({q, k, v}, at::kBFloat16);
    storage = qkv.data_ptr();
    EXPECT_TRUE(at::equal(qkv, at::cat({q, k, v}).to(at::kBFloat16)));
    EXPECT_EQ(copies.Get({q, k, v}, at::kBFloat16).data_ptr(), qkv.data_ptr());
    // Other members or another order: another copy.
    EXPECT_NE(copies.Get({q, v, k}, at::kBFloat16).data_ptr(), qkv.data_ptr());
    EXPECT_TRUE(at::equal(copies.Get({q, v}, at::kBFloat16), at::cat({q, v}).to(at::kBFloat16)));
  }
  // The next scope casts the members' new values into the same storage, member by member.
  at::Tensor(k).add_(1);
  AdapterCopyScope scope(copies);
  const at::Tensor again = copies.Get({q, k, v}, at::kBFloat16);
  EXPECT_EQ(again.data_ptr(), storage);
  EXPECT_TRUE(at::equal(again, at::cat({q, k, v}).to(at::kBFloat16)));
}

// Parameters that are views of one buffer (the strategy's flat float32 buffer, as the trainer's
// adapters are): their copies are views of one cast of the whole buffer, made at the first use
// in a scope; a concatenation of some of them is cast from those views.
TEST(EngineAdapterCopies, ViewsOfOneBufferShareOneCast) {
  AdapterCopies copies;
  const at::Tensor flat = at::randn({100});
  const at::Tensor a = flat.narrow(0, 0, 32).view({4, 8}), b = flat.narrow(0, 32, 64).view({16, 4});
  const at::Tensor c = flat.narrow(0, 96, 4).view({1, 4});
  for (int scope_index = 0; scope_index < 2; ++scope_index) {
    SCOPED_TRACE(scope_index);
    AdapterCopyScope scope(copies);
    const at::Tensor a1 = copies.Get(a, at::kBFloat16), b1 = copies.Get(b, at::kBFloat16);
    EXPECT_TRUE(at::equal(a1, a.to(at::kBFloat16)));
    EXPECT_TRUE(at::equal(b1, b.to(at::kBFloat16)));
    EXPECT_EQ(a1.storage().data(), b1.storage().data());  // one cast for both
    EXPECT_EQ(b1.storage_offset(), 32);
    // The buffer's mirror, nothing else (and, from the second scope on, the concatenation
    // below, kept for its storage).
    EXPECT_EQ(copies.cached_bytes(), (100 + (scope_index > 0 ? 5 * 4 : 0)) * 2);
    const at::Tensor ac = copies.Get({a.narrow(1, 0, 4), c}, at::kBFloat16);
    EXPECT_TRUE(at::equal(ac, at::cat({a.narrow(1, 0, 4), c}).to(at::kBFloat16)));
    EXPECT_EQ(copies.cached_bytes(), (100 + 5 * 4) * 2);
    at::Tensor(flat).add_(1);  // the next scope sees the new values
  }
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
  const at::Tensor before = a.to(at::kBFloat16);
  at::Tensor(a).mul_(3);
  // Still the outer scope: the copy is not cast again.
  EXPECT_TRUE(at::equal(copies.Get(a, at::kBFloat16), before));
  outer.reset();
  AdapterCopyScope next(copies);
  EXPECT_TRUE(at::equal(copies.Get(a, at::kBFloat16), a.to(at::kBFloat16)));
}

TEST(EngineAdapterCopies, WritesNotedInAScopeLastUntilItsEnd) {
  AdapterCopies copies;
  int buffer = 0;
  const void* key = &buffer;
  copies.NoteWritten(key, 7);  // outside any scope: not noted
  EXPECT_FALSE(copies.in_scope());
  EXPECT_FALSE(copies.Written(key, 7));
  {
    AdapterCopyScope scope(copies);
    EXPECT_TRUE(copies.in_scope());
    EXPECT_FALSE(copies.Written(key, 7));
    copies.NoteWritten(key, 7);
    EXPECT_TRUE(copies.Written(key, 7));
    EXPECT_FALSE(copies.Written(key, 8));  // another layout or source at the same place
    {
      AdapterCopyScope inner(copies);  // nested: the notes stand
      copies.NoteWritten(key, 8);
    }
    EXPECT_TRUE(copies.Written(key, 8));
    EXPECT_FALSE(copies.Written(key, 7));
    copies.ForgetWrites();
    EXPECT_FALSE(copies.Written(key, 8));
    copies.NoteWritten(key, 9);
  }
  EXPECT_FALSE(copies.Written(key, 9));
  AdapterCopyScope next(copies);  // the adapters may have changed: nothing carries over
  EXPECT_FALSE(copies.Written(key, 9));
}

}  // namespace
}  // namespace qlora::engine
