// Loading streams: quantizing a checkpoint on load keeps the process's peak resident memory far
// below the checkpoint's size (one tensor in flight, file pages released after use).
// Each test runs in its own process under ctest, so ru_maxrss measures this load alone.
#include <sys/resource.h>

#include <iostream>

#include "gtest/gtest.h"
#include "tests/engine/test_util.h"
#include "worker/engine/hf_loader.h"
#include "worker/engine/tiny_model.h"

namespace qlora::engine {
namespace {

int64_t PeakRssBytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

TEST(EngineStreaming, QuantizeOnLoadKeepsPeakMemoryNearOneTensor) {
  UseMmapForLargeHostAllocations();  // as the worker's main() does
  ::qlora::testing::TempDir dir;
  TinyModelOptions tiny;
  LlamaConfig& c = tiny.config;
  c.hidden_size = 512;
  c.intermediate_size = 2048;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 8;
  c.head_dim = 64;
  c.num_hidden_layers = 16;
  c.vocab_size = 512;
  tiny.max_shard_bytes = 64 << 20;
  ASSERT_TRUE(MakeTinyModel(dir.path(), tiny).ok());
  int64_t checkpoint_bytes = 0;
  for (const std::string& name : ::qlora::testing::ListDir(dir.path())) {
    checkpoint_bytes += ::qlora::testing::FileSize(dir / name);
  }
  ASSERT_GT(checkpoint_bytes, 250 << 20);

  LoadOptions options;
  options.compute_dtype = at::kFloat;  // the largest per-tensor copies
  const int64_t before = PeakRssBytes();
  auto model = LoadLlama(dir.path(), options);
  ASSERT_TRUE(model.ok()) << model.status();
  const int64_t growth = PeakRssBytes() - before;
  // Budget: the 4-bit model (~1/7 of fp32), the dense embeddings/lm_head, one fp32 linear
  // weight in flight and allocator slack. Loading everything at once would need the full size.
  const int64_t budget = checkpoint_bytes / 4;
  std::cout << "checkpoint " << (checkpoint_bytes >> 20) << " MiB, peak RSS growth "
            << (growth >> 20) << " MiB, budget " << (budget >> 20) << " MiB\n";
  EXPECT_LT(growth, budget);
}

}  // namespace
}  // namespace qlora::engine
