// Stage 3's partitioned base weights and weights streamed from host memory (worker/engine/base_weight_store.h)
// against a model whose weights sit whole in its layers: a layer's 4-bit storage survives the
// trip through one byte buffer bit for bit; a model whose layers come from a store (partitioned
// over 2 or 4 Gloo ranks, or in host memory) computes the same loss and LoRA gradients bit for
// bit, keeps 1/world of the 4-bit bytes, and writes the same merged model. On a GPU the same
// cases run on CUDA (host copies on a side stream).
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include "absl/strings/str_cat.h"

#include "gtest/gtest.h"
#include "tests/engine/torch_test_util.h"
#include "tests/util/temp_dir.h"
#include "tests/zero/gloo_world.h"
#include "worker/engine/base_weight_store.h"
#include "worker/engine/hf_loader.h"
#include "worker/engine/layer_bytes.h"
#include "worker/engine/peft_io.h"
#include "worker/engine/tiny_model.h"
#include "worker/strategy/strategy.h"

namespace qlora {
namespace {

using engine::BaseWeightStore;
using engine::BaseWeightStoreOptions;
using engine::LlamaForCausalLM;

at::Device TestDevice() {
  return torch::cuda::is_available() ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
}

// A tiny model with 4 layers and an odd-sized projection (so shards cut through tensors).
std::string MakeModel(const testing::TempDir& dir) {
  engine::TinyModelOptions tiny;
  tiny.config.num_hidden_layers = 4;
  tiny.config.intermediate_size = 136;
  tiny.seed = 3;
  const std::string path = dir.path() + "/model";
  EXPECT_TRUE(engine::MakeTinyModel(path, tiny).ok());
  return path;
}

engine::LoadOptions Options(bool quantize, std::shared_ptr<BaseWeightStore> store = nullptr) {
  engine::LoadOptions o;
  o.quantize = quantize;
  o.compute_dtype = at::kFloat;
  o.device = TestDevice();
  o.base_weights = std::move(store);
  return o;
}

std::unique_ptr<LlamaForCausalLM> Load(const std::string& path, const engine::LoadOptions& o) {
  auto model = engine::LoadLlama(path, o);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return nullptr;
  engine::LoraOptions lora;
  lora.r = 4;
  lora.alpha = 8;
  lora.target_modules = {"all-linear"};
  lora.seed = 7;
  EXPECT_TRUE((*model)->AddLora(lora).ok());
  (*model)->SetTraining(true);
  // B = 0 at PEFT's init would give A no gradient: make the adapters non-trivial, alike.
  at::NoGradGuard no_grad;
  int k = 0;
  for (auto& [name, t] : (*model)->TrainableParameters()) {
    t.copy_(at::sin(at::arange(t.numel(), t.options()).view(t.sizes()) * 0.37 + (k++)) * 0.05);
  }
  return std::move(*model);
}

struct StepResult {
  at::Tensor loss;
  std::vector<at::Tensor> grads;
};

// Two steps of forward and backward over fixed rows (the second finds the store's cache as the
// first left it), every layer checkpointed but the top one.
StepResult TwoSteps(LlamaForCausalLM& model) {
  const at::Tensor ids = at::remainder(at::arange(2 * 24, at::kLong) * 37 + 5, 256).view({2, 24});
  StepResult result;
  model.SetCheckpointedLayers(3);
  for (int step = 0; step < 2; ++step) {
    for (auto& [name, t] : model.TrainableParameters()) t.mutable_grad() = at::Tensor();
    const at::Tensor hidden = model.Forward(ids);
    engine::CausalLmLoss loss = model.Loss(hidden, ids.to(model.device()));
    loss.loss_sum.backward();
    result.loss = loss.loss_sum.detach().cpu();
  }
  for (auto& [name, t] : model.TrainableParameters()) result.grads.push_back(t.grad().cpu());
  return result;
}

void ExpectSame(const StepResult& a, const StepResult& b, const std::string& what) {
  EXPECT_TRUE(at::equal(a.loss, b.loss)) << what << ": loss " << a.loss.item<float>() << " vs "
                                         << b.loss.item<float>();
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t k = 0; k < a.grads.size(); ++k) {
    EXPECT_TRUE(at::equal(a.grads[k], b.grads[k])) << what << ": gradient " << k;
  }
}

TEST(ZeroBaseWeights, LayerBytesRoundTripBitForBit) {
  testing::TempDir dir;
  const std::string path = MakeModel(dir);
  for (bool quantize : {true, false}) {
    auto model = engine::LoadLlama(path, Options(quantize));
    ASSERT_TRUE(model.ok()) << model.status();
    for (const engine::DecoderLayer& layer : (*model)->layers) {
      const engine::PackedLayer packed = engine::PackLayerWeights(layer, 8 * 3);
      EXPECT_EQ(packed.layout.nbytes % 24, 0);
      engine::DecoderLayer skeleton = layer;
      engine::StripLayerWeights(skeleton);
      const engine::DecoderLayer back =
          engine::UnpackLayerWeights(skeleton, packed.layout, packed.bytes.clone());
      for (const char* name : engine::kLinearModuleNames) {
        const engine::FrozenWeight& a = layer.Linear(name).base;
        const engine::FrozenWeight& b = back.Linear(name).base;
        ASSERT_EQ(a.quantized.has_value(), b.quantized.has_value()) << name;
        if (!a.quantized) {
          EXPECT_TRUE(at::equal(a.dense, b.dense)) << name;
          continue;
        }
        const kernels::Quantized4bit &qa = *a.quantized, &qb = *b.quantized;
        EXPECT_TRUE(at::equal(qa.packed, qb.packed)) << name;
        EXPECT_TRUE(at::equal(qa.absmax, qb.absmax)) << name;
        EXPECT_TRUE(at::equal(qa.nested_absmax, qb.nested_absmax)) << name;
        EXPECT_TRUE(at::equal(qa.nested_code, qb.nested_code)) << name;
        EXPECT_EQ(qa.nested_offset, qb.nested_offset) << name;
        EXPECT_EQ(qa.shape, qb.shape) << name;
        EXPECT_EQ(qa.absmax.scalar_type(), qb.absmax.scalar_type()) << name;
      }
    }
  }
}

TEST(ZeroBaseWeights, StreamedAndWorldOneEqualWholeWeights) {
  testing::TempDir dir;
  const std::string path = MakeModel(dir);
  auto resident = Load(path, Options(true));
  ASSERT_NE(resident, nullptr);
  const StepResult expected = TwoSteps(*resident);
  for (bool on_host : {false, true}) {
    BaseWeightStoreOptions o;
    o.device = TestDevice();
    o.on_host = on_host;
    auto store = std::make_shared<BaseWeightStore>(o);
    auto model = Load(path, Options(true, store));
    ASSERT_NE(model, nullptr);
    EXPECT_EQ(model->base_weight_store(), store.get());
    ExpectSame(expected, TwoSteps(*model), on_host ? "streamed from host memory" : "stage 3 at world 1");
    const engine::BaseWeightStats stats = store->stats();
    EXPECT_GT(stats.fetches, 0);
    if (on_host && TestDevice().is_cuda()) {
      EXPECT_GT(stats.copied_bytes, 0);
      EXPECT_EQ(store->device_bytes(), 0);
      EXPECT_GT(stats.prefetched, 0) << "every layer was fetched when asked for";
    }
  }
}

// Stage 3 over Gloo ranks (CPU): every rank keeps 1/world of the 4-bit bytes and computes what
// the whole model computes; the merged model rank 0 writes while the others join is the same.
TEST(ZeroBaseWeights, PartitionedOverRanksEqualsWhole) {
  testing::TempDir dir;
  const std::string path = MakeModel(dir);
  engine::LoadOptions whole_options = Options(true);
  whole_options.device = at::kCPU;  // Gloo ranks are CPU ranks
  auto whole = Load(path, whole_options);
  ASSERT_NE(whole, nullptr);
  const StepResult expected = TwoSteps(*whole);
  ASSERT_TRUE(engine::SaveMergedModel(*whole, dir.path() + "/merged-whole").ok());

  for (int world : {2, 4}) {
    int64_t share = 0;  // of every layer's bytes, padded for `world` shards
    for (const engine::DecoderLayer& layer : whole->layers) {
      share += engine::PackLayerWeights(layer, 8 * world).layout.nbytes / world;
    }
    std::vector<StepResult> results(world);
    std::vector<int64_t> kept(world);
    const std::string merged = absl::StrCat(dir.path(), "/merged-", world);
    auto statuses = testing::RunGlooWorld(world, [&](int rank, comm::Communicator& c) {
      auto partition = strategy::PlanBaseWeights(3, {}, c);
      if (!partition.ok()) return partition.status();
      EXPECT_TRUE(partition->partitioned);
      BaseWeightStoreOptions o;
      o.rank = partition->rank;
      o.world_size = partition->world_size;
      o.all_gather = partition->all_gather;
      auto store = std::make_shared<BaseWeightStore>(o);
      engine::LoadOptions load = whole_options;
      load.base_weights = store;
      auto model = Load(path, load);
      if (model == nullptr) return absl::InternalError("load failed");
      results[rank] = TwoSteps(*model);
      kept[rank] = store->device_bytes();
      EXPECT_GT(store->stats().gathered_bytes, 0);
      const absl::Status saved = rank == 0 ? engine::SaveMergedModel(*model, merged)
                                           : engine::JoinMergedModelSave(*model);
      if (!saved.ok()) return saved;
      return c.Barrier(absl::Seconds(30));  // no rank leaves while another still talks to it
    });
    for (int rank = 0; rank < world; ++rank) {
      ASSERT_TRUE(statuses[rank].ok()) << "rank " << rank << ": " << statuses[rank];
      ExpectSame(expected, results[rank], absl::StrCat("world ", world, " rank ", rank));
      EXPECT_EQ(kept[rank], share) << "world " << world << " rank " << rank;
    }
    const auto a = testing::LoadTensors(dir.path() + "/merged-whole/model.safetensors");
    const auto b = testing::LoadTensors(merged + "/model.safetensors");
    ASSERT_EQ(a.size(), b.size());
    for (const auto& [name, tensor] : a) {
      ASSERT_TRUE(b.count(name)) << name;
      EXPECT_TRUE(at::equal(tensor, b.at(name))) << "world " << world << ": " << name;
    }
  }
}

// The maker's pre-quantized folders (bitsandbytes' six keys per Linear, random codes), as the
// 70B benchmark makes one: they load without quantizing, their weights are in the documented
// range, and they load partitioned over 2 ranks and compute what they compute whole.
TEST(ZeroBaseWeights, PrequantizedFolderLoadsWholeAndPartitioned) {
  testing::TempDir dir;
  engine::TinyModelOptions tiny;
  tiny.config.num_hidden_layers = 3;
  tiny.config.intermediate_size = 136;
  tiny.dtype = "bfloat16";
  tiny.bnb_nf4 = true;
  const std::string path = dir.path() + "/bnb";
  ASSERT_TRUE(engine::MakeTinyModel(path, tiny).ok());
  engine::LoadOptions o = Options(/*quantize=*/false);
  o.device = at::kCPU;
  auto whole = Load(path, o);
  ASSERT_NE(whole, nullptr);
  ASSERT_TRUE(whole->config().bnb.has_value());
  const engine::FrozenWeight& down = whole->layers[2].down_proj.base;
  ASSERT_TRUE(down.quantized.has_value());
  EXPECT_TRUE(down.quantized->double_quant);
  EXPECT_EQ(down.quantized->shape, (std::vector<int64_t>{64, 136}));
  const at::Tensor w = down.Materialize(at::kFloat);
  EXPECT_LE(w.abs().max().item<float>(), 0.0601f);
  EXPECT_GT(w.abs().max().item<float>(), 0.039f);
  EXPECT_GT(w.std().item<float>(), 0.01f);
  if (TestDevice().is_cuda()) {  // the same folder loaded onto the GPU gives the same weights
    auto on_gpu = Load(path, Options(/*quantize=*/false));
    ASSERT_NE(on_gpu, nullptr);
    EXPECT_TRUE(at::equal(on_gpu->layers[2].down_proj.base.Materialize(at::kFloat).cpu(), w));
  }
  const StepResult expected = TwoSteps(*whole);

  std::vector<StepResult> results(2);
  auto statuses = testing::RunGlooWorld(2, [&](int rank, comm::Communicator& c) {
    auto partition = strategy::PlanBaseWeights(3, {}, c);
    if (!partition.ok()) return partition.status();
    BaseWeightStoreOptions store;
    store.rank = partition->rank;
    store.world_size = partition->world_size;
    store.all_gather = partition->all_gather;
    engine::LoadOptions load = o;
    load.base_weights = std::make_shared<BaseWeightStore>(store);
    auto model = Load(path, load);
    if (model == nullptr) return absl::InternalError("load failed");
    results[rank] = TwoSteps(*model);
    return c.Barrier(absl::Seconds(30));  // no rank leaves while another still talks to it
  });
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(statuses[rank].ok()) << statuses[rank];
    ExpectSame(expected, results[rank], absl::StrCat("pre-quantized, rank ", rank));
  }
}

TEST(ZeroBaseWeights, StagesZeroToTwoKeepWeightsWhole) {
  auto statuses = testing::RunGlooWorld(2, [&](int, comm::Communicator& c) {
    for (int stage : {0, 1, 2}) {
      auto partition = strategy::PlanBaseWeights(stage, {}, c);
      if (!partition.ok()) return partition.status();
      EXPECT_FALSE(partition->partitioned) << stage;
      EXPECT_FALSE(partition->all_gather) << stage;
    }
    auto partition = strategy::PlanBaseWeights(3, {}, c);
    EXPECT_TRUE(partition.ok() && partition->partitioned && partition->world_size == 2);
    EXPECT_EQ(strategy::PlanBaseWeights(4, {}, c).status().code(),
              absl::StatusCode::kInvalidArgument);
    return c.Barrier(absl::Seconds(30));  // no rank leaves while another still connects
  });
  for (const absl::Status& s : statuses) EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace qlora
