// Activation offloading (worker/engine/activation_offload.h): saved tensors come back with the
// same bytes, a storage saved twice travels once, parameters and small tensors stay, a ticket is
// restored once; and a model whose layers offload computes bit for bit the loss and gradients of
// one that does not, checkpointed or not, with two micro-batches, leaving no host memory held
// after backward, nor after a graph dropped without one.
// On the CPU, and on a GPU when there is one (pinned memory, side streams, prefetch).
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include "gtest/gtest.h"
#include "tests/engine/lora_test_util.h"
#include "tests/engine/test_util.h"
#include "tests/engine/torch_test_util.h"
#include "worker/engine/activation_offload.h"
#include "worker/engine/hf_loader.h"
#include "worker/engine/llama_model.h"
#include "worker/engine/tiny_model.h"
#include "worker/memory/activation_offload_plan.h"

namespace qlora::engine {
namespace {

using ::qlora::testing::MaxAbsDiff;
using ::qlora::testing::TempDir;

TEST(EngineActivationOffload, TensorsComeBackBitForBitAndSharedStoragesTravelOnce) {
  for (const at::Device& device : TestDevices()) {
    SCOPED_TRACE(device.str());
    ActivationOffloadOptions options;
    options.min_bytes = 64;
    ActivationOffloader offloader(device, options);
    const at::Tensor a = at::randn({64, 32}, at::dtype(at::kBFloat16).device(device));
    const at::Tensor a_t = a.t();        // a view of a's storage
    const at::Tensor b = at::randn({1000}, at::dtype(at::kFloat).device(device));
    const at::Tensor small = at::randn({4}, at::dtype(at::kFloat).device(device));
    const at::Tensor param = at::randn({64, 64}, at::device(device)).requires_grad_(true);
    EXPECT_TRUE(offloader.Offloadable(a));
    EXPECT_FALSE(offloader.Offloadable(small));
    EXPECT_FALSE(offloader.Offloadable(param));
    EXPECT_FALSE(offloader.Offloadable(at::Tensor()));
    // A narrow view of a much larger buffer stays on the device (it would move the whole buffer);
    // a third of one goes (the packed q/k/v rows' column blocks: the buffer travels once).
    EXPECT_FALSE(offloader.Offloadable(b.narrow(0, 0, 100)));
    EXPECT_TRUE(offloader.Offloadable(a.narrow(1, 0, 32 / 3 + 1)));

    const int64_t ta = offloader.Offload(a, 0), ta_t = offloader.Offload(a_t, 0);
    const int64_t tb = offloader.Offload(b, 1);
    EXPECT_EQ(offloader.offloaded_bytes(), a.nbytes() + b.nbytes());  // a's storage once
    offloader.Prefetch(1);
    offloader.Prefetch(7);  // no such group: nothing
    const at::Tensor rb = offloader.Restore(tb), ra_t = offloader.Restore(ta_t);
    const at::Tensor ra = offloader.Restore(ta);
    EXPECT_TRUE(at::equal(ra, a));
    EXPECT_TRUE(at::equal(ra_t, a_t));
    EXPECT_EQ(ra_t.strides(), a_t.strides());
    EXPECT_TRUE(at::equal(rb, b));
    EXPECT_EQ(ra.device(), device);
    EXPECT_EQ(offloader.host_bytes(), 0);  // every ticket restored: nothing held
    EXPECT_THROW(offloader.Restore(ta), c10::Error);
    // Clear forgets what was not restored.
    const int64_t again = offloader.Offload(b, 2);
    offloader.Clear();
    EXPECT_EQ(offloader.host_bytes(), 0);
    EXPECT_THROW(offloader.Restore(again), c10::Error);
  }
}

// The values saved are those at Offload, with the work queued before it done, even when the
// owner lets the tensor go at once and its memory is asked for again (the offloader holds the
// device copy until its transfer is done).
TEST(EngineActivationOffload, ATensorFreedAfterOffloadStillArrivesIntact) {
  for (const at::Device& device : TestDevices()) {
    SCOPED_TRACE(device.str());
    ActivationOffloadOptions options;
    options.min_bytes = 0;
    ActivationOffloader offloader(device, options);
    at::Tensor x = at::zeros({1 << 22}, at::device(device));
    x.add_(1);  // queued before Offload
    const int64_t ticket = offloader.Offload(x, 0);
    x = at::Tensor();
    const at::Tensor reuse = at::full({1 << 22}, 7.0, at::device(device));  // the freed size again
    EXPECT_TRUE(at::equal(offloader.Restore(ticket).cpu(), at::ones({1 << 22})));
    EXPECT_TRUE(at::equal(reuse.cpu(), at::full({1 << 22}, 7.0)));
  }
}

// The host runs layers ahead of the GPU: a layer's device copies go once the layer two above it
// saves (max_layers_pending 2), not when the host happens to see their transfer done, and the
// memory they free can be taken by the next layer's tensors at once without spoiling a copy still
// queued (the compute stream waits for it). Ten "layers" of 64 MiB each, their copies queued behind one
// another on the copy stream while the compute stream fills freed memory with other values.
TEST(EngineActivationOffload, ALayersDeviceCopiesGoTwoLayersLaterAndTheirMemoryIsReusedSafely) {
  for (const at::Device& device : TestDevices()) {
    SCOPED_TRACE(device.str());
    ActivationOffloadOptions options;
    options.min_bytes = 0;
    options.max_layers_pending = 2;
    ActivationOffloader offloader(device, options);
    constexpr int64_t kLayers = 10, kValues = int64_t{16} << 20;  // 64 MiB of float32
    constexpr int64_t kBytes = kValues * 4;
    if (device.is_cuda()) {
      // The host must run ahead of the GPU here, as it does in training: pinned blocks cached
      // (no cudaHostAlloc in the loop), device blocks cached, and ~0.2 s of GEMMs queued first,
      // so every copy below is still waiting while the host refills the memory it frees.
      std::vector<at::Tensor> warm;
      for (int64_t i = 0; i < kLayers; ++i) {
        warm.push_back(at::empty({kBytes}, at::dtype(at::kByte).pinned_memory(true)));
      }
      for (int64_t i = 0; i < 2 * kLayers; ++i) {
        warm.push_back(at::empty({kBytes}, at::dtype(at::kByte).device(device)));
      }
      warm.clear();
      const at::Tensor m = at::randn({8192, 8192}, at::device(device));
      for (int i = 0; i < 10; ++i) (void)at::mm(m, m);
    }
    std::vector<int64_t> tickets;
    std::vector<at::Tensor> reused;
    for (int64_t layer = 0; layer < kLayers; ++layer) {
      at::Tensor x = at::full({kValues}, static_cast<double>(layer), at::device(device));
      tickets.push_back(offloader.Offload(x, layer));
      x = at::Tensor();
      // At most this layer's and the one below's copies still hold device memory; on the GPU,
      // queued behind the GEMMs, exactly those.
      EXPECT_LE(offloader.pending_bytes(), 2 * kBytes) << "layer " << layer;
      if (device.is_cuda()) {
        EXPECT_EQ(offloader.pending_bytes(), std::min<int64_t>(layer + 1, 2) * kBytes)
            << "layer " << layer << ": the copies did not wait behind the GEMMs";
      }
      reused.push_back(at::full({kValues}, -1.0, at::device(device)));
    }
    for (int64_t layer = 0; layer < kLayers; ++layer) {
      const at::Tensor back = offloader.Restore(tickets[static_cast<size_t>(layer)]).cpu();
      EXPECT_TRUE(at::equal(back, at::full({kValues}, static_cast<double>(layer))))
          << "layer " << layer << " came back with other values";
    }
    for (const at::Tensor& r : reused) EXPECT_TRUE(at::equal(r.cpu(), at::full({kValues}, -1.0)));
    EXPECT_EQ(offloader.pending_bytes(), 0);
  }
}

// A tiny bf16 model of five decoder layers in `dir`.
bool MakeFiveLayers(const TempDir& dir) {
  TinyModelOptions tiny;
  tiny.init_std = 0.1;
  tiny.dtype = "bfloat16";
  tiny.config.num_hidden_layers = 5;
  return MakeTinyModel(dir.path(), tiny).ok();
}

// The five-layer model of `dir` on `device` (adapters with LoRA dropout `dropout`), a batch, its
// labels, and the loss and gradients of two micro-batches of it from seed 7 with every layer
// checkpointed and nothing offloaded.
struct WithReference {
  std::unique_ptr<LlamaForCausalLM> model;
  at::Tensor ids, labels;
  std::map<std::string, at::Tensor> gradients;
};
WithReference LoadWithReference(const TempDir& dir, const at::Device& device, double dropout) {
  WithReference w;
  w.model = LoadBf16WithAdapters(dir.path(), device, dropout);
  if (w.model == nullptr) return w;
  w.ids = RandomIds(w.model->config(), 2, 16).to(device);
  w.labels = LabelsFor(w.ids.cpu()).to(device);
  at::manual_seed(7);
  w.gradients = TwoMicroBatchGradients(*w.model, w.ids, w.labels);
  return w;
}

// The same two micro-batches from the same seed, under the model's split now: bit for bit the
// reference's loss and gradients.
void ExpectReferenceGradients(const WithReference& w) {
  at::manual_seed(7);
  const auto split = TwoMicroBatchGradients(*w.model, w.ids, w.labels);
  ASSERT_EQ(split.size(), w.gradients.size());
  for (const auto& [name, g] : w.gradients) {
    EXPECT_TRUE(at::equal(g, split.at(name))) << name << ": " << MaxAbsDiff(g, split.at(name));
  }
}

TEST(EngineActivationOffload, OffloadedLayersGiveBitwiseTheSameLossAndGradients) {
  TempDir dir;
  ASSERT_TRUE(MakeFiveLayers(dir));
  for (const at::Device& device : TestDevices()) {
    for (double dropout : {0.0, 0.2}) {
      SCOPED_TRACE(device.str() + " dropout " + std::to_string(dropout));
      const WithReference w = LoadWithReference(dir, device, dropout);
      ASSERT_NE(w.model, nullptr);
      LlamaForCausalLM& model = *w.model;
      ActivationOffloadOptions offload;
      offload.min_bytes = 0;  // the tiny model's tensors are small
      // {checkpointed layers, offloaded layers}: offloading among checkpointed layers, among
      // plain ones, and more than there are (the top layer is never offloaded).
      for (auto [checkpointed, offloaded] :
           std::vector<std::pair<int64_t, int64_t>>{{5, 1}, {5, 2}, {4, 4}, {0, 2}, {2, 9}}) {
        SCOPED_TRACE(std::to_string(checkpointed) + " checkpointed, " +
                     std::to_string(offloaded) + " offloaded");
        model.SetCheckpointedLayers(checkpointed);
        model.SetOffloadedLayers(offloaded, offload);
        EXPECT_EQ(model.offloaded_layers(), std::min<int64_t>(offloaded, 4));
        ExpectReferenceGradients(w);
        const ActivationOffloader* offloader = model.activation_offloader();
        ASSERT_NE(offloader, nullptr);
        EXPECT_GT(offloader->offloaded_bytes(), 0);
        EXPECT_EQ(offloader->host_bytes(), 0);  // backward restored every tensor
        // A graph dropped without backward lets go of what it offloaded.
        {
          const at::Tensor hidden = model.Forward(w.ids);
          EXPECT_GT(offloader->host_bytes(), 0);
        }
        EXPECT_EQ(offloader->host_bytes(), 0);
      }
      model.SetOffloadedLayers(0);
      model.SetCheckpointedLayers(5);
      EXPECT_EQ(model.offloaded_layers(), 0);
      EXPECT_EQ(model.activation_offloader(), nullptr);
    }
  }
}

// The inputs alone (the longest rows): the highest checkpointed layers' inputs but the top one's
// wait in host memory, no layer's saves do, and the loss and gradients are bit for bit those of
// no offloading.
TEST(EngineActivationOffload, InputsAloneTravelAndGiveBitwiseTheSameGradients) {
  TempDir dir;
  ASSERT_TRUE(MakeFiveLayers(dir));
  for (const at::Device& device : TestDevices()) {
    SCOPED_TRACE(device.str());
    const WithReference w = LoadWithReference(dir, device, 0.0);
    ASSERT_NE(w.model, nullptr);
    LlamaForCausalLM& model = *w.model;
    ActivationOffloadOptions offload;
    offload.min_bytes = 0;
    model.SetOffloadedLayers(0, offload, 2);
    EXPECT_EQ(model.offloaded_layers(), 0);
    EXPECT_EQ(model.offloaded_inputs(), 2);
    const ActivationOffloader* offloader = model.activation_offloader();
    ASSERT_NE(offloader, nullptr);
    {
      const at::Tensor hidden = model.Forward(w.ids);
      for (int64_t i = 0; i < 5; ++i) {
        SCOPED_TRACE("layer " + std::to_string(i));
        EXPECT_EQ(offloader->host_bytes_of(LlamaForCausalLM::OffloadLateGroup(i)), 0);
        EXPECT_EQ(offloader->host_bytes_of(LlamaForCausalLM::OffloadEarlyGroup(i)) > 0,
                  i == 2 || i == 3);
      }
    }
    ExpectReferenceGradients(w);
    EXPECT_EQ(offloader->host_bytes(), 0);  // backward restored every input
    // The split changing keeps the request: all five checkpointed less one, still two inputs.
    model.SetCheckpointedLayers(3);
    EXPECT_EQ(model.offloaded_inputs(), 2);
    model.SetOffloadedLayers(0);
    EXPECT_EQ(model.offloaded_inputs(), 0);
    EXPECT_EQ(model.activation_offloader(), nullptr);
  }
}

// An offloaded layer's saves go to two groups: its attention's to the late one (fetched once the
// layer above has done its MLP backward), its MLP's to the early one, with the checkpointed
// layers' inputs (fetched a layer or two ahead). Backward's prefetches bring every one back
// before it is restored (none fetched on demand), under a checkpointed layer and a plain one.
TEST(EngineActivationOffload, AnOffloadedLayersAttentionAndMlpSavesGoToTwoGroups) {
  TempDir dir;
  ASSERT_TRUE(MakeFiveLayers(dir));
  for (const at::Device& device : TestDevices()) {
    for (int64_t checkpointed : {5, 0}) {
      SCOPED_TRACE(device.str() + ", " + std::to_string(checkpointed) + " checkpointed");
      const std::unique_ptr<LlamaForCausalLM> loaded =
          LoadBf16WithAdapters(dir.path(), device, 0.0);
      ASSERT_NE(loaded, nullptr);
      LlamaForCausalLM& model = *loaded;
      ActivationOffloadOptions offload;
      offload.min_bytes = 0;
      model.SetCheckpointedLayers(checkpointed);
      model.SetOffloadedLayers(2, offload);
      const std::vector<bool> offloaded = memory::PlaceOffloads(5, checkpointed, 2).offloaded;
      const at::Tensor ids = RandomIds(model.config(), 2, 16).to(device);
      const ActivationOffloader& offloader = *model.activation_offloader();
      const CausalLmLoss loss = model.Loss(model.Forward(ids), LabelsFor(ids.cpu()).to(device));
      int64_t groups = 0;
      for (int64_t i = 0; i < 5; ++i) {
        SCOPED_TRACE("layer " + std::to_string(i));
        const int64_t late = offloader.host_bytes_of(LlamaForCausalLM::OffloadLateGroup(i));
        const int64_t early = offloader.host_bytes_of(LlamaForCausalLM::OffloadEarlyGroup(i));
        groups += late + early;
        if (offloaded[i]) {
          EXPECT_GT(late, 0);
          EXPECT_GT(early, 0);
        } else {
          EXPECT_EQ(late, 0);
          // A checkpointed layer's input (not the top layer's, which is never offloaded).
          EXPECT_EQ(early > 0, i < std::min<int64_t>(checkpointed, 4));
        }
      }
      EXPECT_EQ(groups, offloader.host_bytes());
      loss.loss_sum.backward();
      EXPECT_EQ(offloader.host_bytes(), 0);
      EXPECT_EQ(offloader.demand_fetches(), 0);
    }
  }
}

}  // namespace
}  // namespace qlora::engine
