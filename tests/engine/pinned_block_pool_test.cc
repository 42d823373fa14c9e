// PinnedBlockPool (worker/engine/pinned_block_pool.h) over a counting source of plain host
// memory: blocks within an eighth of the request, reused at the same size class instead of taken
// again, the kept blocks freed when the source runs dry, and blocks that outlive the pool freed
// when they come back. memory::PinnedBlockBytes' rounding is checked beside it. The CUDA source
// itself runs in the activation offloader's GPU tests.
#include "worker/engine/pinned_block_pool.h"

#include <cstdlib>
#include <memory>
#include <map>
#include <string>

#include "gtest/gtest.h"
#include "worker/memory/pinned_block_bytes.h"

namespace qlora::engine {
namespace {

struct CountingSource {
  int64_t allocated = 0, released = 0, live_bytes = 0;
  int64_t limit_bytes = int64_t{1} << 40;  // past this, allocate fails
  std::map<void*, int64_t> live;

  HostBlockSource Source() {
    return {[this](int64_t bytes) -> void* {
              if (live_bytes + bytes > limit_bytes) return nullptr;
              ++allocated;
              live_bytes += bytes;
              void* block = std::malloc(static_cast<size_t>(bytes));
              live[block] = bytes;
              return block;
            },
            [this](void* block) {
              ++released;
              live_bytes -= live.at(block);
              live.erase(block);
              std::free(block);
            }};
  }
};

TEST(PinnedBlockBytes, PagesUpToOneMebibyteThenEighthsOfThePowerOfTwo) {
  using memory::PinnedBlockBytes;
  EXPECT_EQ(PinnedBlockBytes(0), 0);
  EXPECT_EQ(PinnedBlockBytes(1), 4096);
  EXPECT_EQ(PinnedBlockBytes(4097), 8192);
  EXPECT_EQ(PinnedBlockBytes(1 << 20), 1 << 20);
  EXPECT_EQ(PinnedBlockBytes((1 << 20) + 1), (1 << 20) + (1 << 17));
  // A checkpoint input of 300,000 tokens of 4096 bf16 values: 2.29 GiB takes 2.5 GiB (torch's
  // host allocator: 4 GiB).
  const int64_t input = int64_t{300000} * 4096 * 2;
  EXPECT_EQ(PinnedBlockBytes(input), int64_t{5} << 29);
  for (int64_t bytes = 1; bytes < (int64_t{1} << 34); bytes = bytes * 3 + 7) {
    const int64_t block = PinnedBlockBytes(bytes);
    EXPECT_GE(block, bytes);
    EXPECT_EQ(block % 4096, 0) << bytes;
    EXPECT_LE(static_cast<double>(block), memory::kPinnedBlockOverhead * static_cast<double>(bytes) + 4096)
        << bytes;
  }
}

TEST(PinnedBlockPool, ABlockComesBackForTheNextRequestOfItsSize) {
  CountingSource counts;
  PinnedBlockPool pool(counts.Source(), "test blocks");
  const int64_t bytes = (int64_t{3} << 20) + 5;
  const void* first = nullptr;
  {
    const at::Tensor t = pool.Allocate(bytes);
    ASSERT_EQ(t.numel(), bytes);
    EXPECT_EQ(t.scalar_type(), at::kByte);
    EXPECT_TRUE(t.device().is_cpu());
    t.fill_(7);  // the whole block is writable
    first = t.data_ptr();
    EXPECT_EQ(pool.stats().held_bytes, memory::PinnedBlockBytes(bytes));
  }
  EXPECT_EQ(pool.stats().held_bytes, 0);
  EXPECT_EQ(pool.stats().kept_bytes, memory::PinnedBlockBytes(bytes));
  // Another request in the same size class: the same block, none taken from the source.
  const at::Tensor again = pool.Allocate(bytes + 1000);
  EXPECT_EQ(again.data_ptr(), first);
  EXPECT_EQ(counts.allocated, 1);
  EXPECT_EQ(pool.stats().reuses, 1);
  // Two at once: a second block.
  const at::Tensor second = pool.Allocate(bytes);
  EXPECT_NE(second.data_ptr(), again.data_ptr());
  EXPECT_EQ(counts.allocated, 2);
  EXPECT_EQ(counts.released, 0);
}

// A micro-batch is as wide as its longest row: narrower steps take the kept blocks of wider ones
// (up to twice their size); wider ones take new blocks and leave the kept ones for later steps.
TEST(PinnedBlockPool, RowsOfOtherWidthsReuseOrReplaceTheKeptBlocks) {
  CountingSource counts;
  PinnedBlockPool pool(counts.Source(), "test blocks");
  const void* wide = pool.Allocate(int64_t{12} << 20).data_ptr();  // kept
  at::Tensor narrower = pool.Allocate(int64_t{7} << 20);  // 12 MiB serves 7
  EXPECT_EQ(narrower.data_ptr(), wide);
  EXPECT_EQ(pool.stats().held_bytes, int64_t{12} << 20);  // the block's size, not the request's
  EXPECT_EQ(counts.allocated, 1);
  at::Tensor narrow = pool.Allocate(int64_t{5} << 20);  // 12 MiB is over twice 5: a new one
  EXPECT_EQ(counts.allocated, 2);
  narrower.reset();
  narrow.reset();
  EXPECT_EQ(pool.stats().kept_bytes, int64_t{17} << 20);
  // Wider than every kept block: a new one; the kept ones stay (nothing freed mid-step).
  const at::Tensor wider = pool.Allocate(int64_t{20} << 20);
  EXPECT_EQ(counts.released, 0);
  EXPECT_EQ(pool.stats().kept_bytes, int64_t{17} << 20);
  EXPECT_EQ(counts.live_bytes, int64_t{37} << 20);
}

TEST(PinnedBlockPool, WhenTheSourceRunsDryTheKeptBlocksAreFreedFirst) {
  CountingSource counts;
  counts.limit_bytes = int64_t{7} << 20;
  PinnedBlockPool pool(counts.Source(), "test blocks");
  pool.Allocate(int64_t{6} << 20);  // kept once its tensor goes
  EXPECT_EQ(pool.stats().kept_bytes, int64_t{6} << 20);
  // 2 MiB (too small for the kept 6 MiB block) more would pass the limit: the kept block goes,
  // then the request is served.
  const at::Tensor t = pool.Allocate(int64_t{2} << 20);
  EXPECT_EQ(counts.released, 1);
  EXPECT_EQ(pool.stats().kept_bytes, 0);
  // Nothing kept and still too much: an error naming its user and the size.
  try {
    pool.Allocate(int64_t{6} << 20);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "test blocks: no pinned host memory for a block of 6291456 bytes"),
              std::string::npos)
        << e.what();
  }
}

TEST(PinnedBlockPool, BlocksThatOutliveThePoolAreFreedWhenTheyComeBack) {
  CountingSource counts;
  at::Tensor survivor;
  {
    PinnedBlockPool pool(counts.Source(), "test blocks");
    survivor = pool.Allocate(1 << 20);
    pool.Allocate(2 << 20);  // kept, freed with the pool
  }
  EXPECT_EQ(counts.released, 1);
  survivor.fill_(1);  // still valid memory
  survivor.reset();
  EXPECT_EQ(counts.released, 2);
  EXPECT_EQ(counts.allocated, 2);
}

}  // namespace
}  // namespace qlora::engine
