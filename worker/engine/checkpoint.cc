// The checkpoint autograd node: forward without a graph, recompute-and-differentiate in backward.
#include "worker/engine/checkpoint.h"

#include <mutex>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/core/Generator.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace qlora::engine {
namespace {

using torch::autograd::variable_list;

// The default generators' states of the CPU and of the input's accelerator.
class RngState {
 public:
  static RngState Capture(const at::Device& device) {
    RngState s;
    s.devices_.push_back(at::Device(at::kCPU));
    if (!device.is_cpu()) s.devices_.push_back(device);
    for (const at::Device& d : s.devices_) {
      at::Generator gen = at::globalContext().defaultGenerator(d);
      std::lock_guard<std::mutex> lock(gen.mutex());
      s.states_.push_back(gen.get_state());
    }
    return s;
  }
  void Restore() const {
    for (size_t i = 0; i < devices_.size(); ++i) {
      at::Generator gen = at::globalContext().defaultGenerator(devices_[i]);
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(states_[i]);
    }
  }

 private:
  std::vector<at::Device> devices_;
  std::vector<at::Tensor> states_;
};

class CheckpointBackward : public torch::autograd::Node {
 public:
  // `input` (detached) is kept, or, with an offloader, handed to it: then only its ticket is.
  CheckpointBackward(CheckpointedFn fn, const at::Tensor& input, std::vector<at::Tensor> params,
                     RngState rng, CheckpointOffload offload)
      : fn_(std::move(fn)), params_(std::move(params)), rng_(std::move(rng)),
        offloader_(std::move(offload.offloader)), input_requires_grad_(input.requires_grad()),
        device_(input.device()) {
    at::Tensor detached = input.detach();
    if (offloader_ != nullptr && offloader_->Offloadable(detached)) {
      ticket_ = offloader_->Offload(detached, offload.group);
    } else {
      input_ = std::move(detached);
    }
  }

  ~CheckpointBackward() override {
    if (ticket_ >= 0) offloader_->Forget({ticket_});  // never backpropagated
  }

  std::string name() const override { return "qlora::engine::CheckpointBackward"; }

  variable_list apply(variable_list&& grads) override {
    TORCH_CHECK(fn_, "checkpointed block was already backpropagated (retain_graph is unsupported)");
    at::Tensor output;
    at::Tensor input = ticket_ >= 0 ? offloader_->Restore(std::exchange(ticket_, -1)) : input_;
    input = input.detach().requires_grad_(input_requires_grad_);
    {
      // Recompute with the forward's RNG stream, then give the caller's stream back.
      const RngState now = RngState::Capture(device_);
      rng_.Restore();
      at::AutoGradMode enable(true);
      output = fn_(input, /*recompute=*/true);
      now.Restore();
    }
    variable_list inputs;
    std::vector<size_t> slots;  // position in the result for each differentiated input
    if (input.requires_grad()) {
      inputs.push_back(input);
      slots.push_back(0);
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      if (params_[i].requires_grad()) {
        inputs.push_back(params_[i]);
        slots.push_back(i + 1);
      }
    }
    variable_list result(1 + params_.size());
    if (!inputs.empty() && output.requires_grad() && grads[0].defined()) {
      at::AutoGradMode enable(true);
      variable_list computed = torch::autograd::grad({output}, inputs, {grads[0]},
                                                     /*retain_graph=*/false,
                                                     /*create_graph=*/false,
                                                     /*allow_unused=*/true);
      for (size_t i = 0; i < slots.size(); ++i) result[slots[i]] = computed[i];
    }
    release_variables();
    return result;
  }

  void release_variables() override {
    fn_ = nullptr;
    input_.reset();
  }

 private:
  CheckpointedFn fn_;
  std::vector<at::Tensor> params_;
  RngState rng_;
  std::shared_ptr<ActivationOffloader> offloader_;
  bool input_requires_grad_;
  at::Device device_;
  at::Tensor input_;      // when not offloaded
  int64_t ticket_ = -1;   // when offloaded
};

}  // namespace

at::Tensor Checkpoint(CheckpointedFn fn, const at::Tensor& input,
                      const std::vector<at::Tensor>& params, CheckpointOffload offload) {
  bool needs_grad = input.requires_grad();
  for (const at::Tensor& p : params) needs_grad = needs_grad || p.requires_grad();
  if (!at::GradMode::is_enabled() || !needs_grad) return fn(input, /*recompute=*/false);

  RngState rng = RngState::Capture(input.device());
  at::Tensor output;
  {
    at::NoGradGuard no_grad;
    output = fn(input, /*recompute=*/false);
  }
  auto node = std::shared_ptr<CheckpointBackward>(
      new CheckpointBackward(std::move(fn), input, params, std::move(rng), offload),
      torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(input, params));
  torch::autograd::create_gradient_edge(output, node);
  return output;
}

}  // namespace qlora::engine
