// Activation checkpointing for LibTorch C++ (which has none): run a block without keeping its
// activations, and recompute it in backward.
//
// Checkpoint(fn, input, params) runs fn(input) under no-grad and records one autograd node
// whose inputs are `input` and `params` (the block's trainable tensors). Its backward restores
// the RNG state that forward saw (so dropout masks repeat), recomputes fn on a detached copy of
// `input` with grad enabled, and returns the gradients for input and params through
// torch::autograd::grad, so both loss.backward() and autograd::grad work. Only `input` and the
// RNG states are kept between forward and backward.
//
// With an offloader (activation_offload.h), `input` waits in host memory between forward and
// backward instead (under `group`, so that a Prefetch of that group brings it back early).
//
// fn gets `recompute`: false in forward, where its output is the block's value; true in
// backward, where only the output's autograd graph is used (its value never is), so fn may skip
// work whose result no backward formula reads and return an output of unspecified value (what
// PyTorch's non-reentrant checkpoint gets by stopping the recomputation early).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "worker/engine/activation_offload.h"

namespace qlora::engine {

struct CheckpointOffload {
  std::shared_ptr<ActivationOffloader> offloader;  // null: the input stays on its device
  int64_t group = -1;
};

using CheckpointedFn = std::function<at::Tensor(const at::Tensor& input, bool recompute)>;

// `fn` must depend on trainable tensors only through `params` (other captured tensors are
// treated as constants) and must stay callable until backward has run.
at::Tensor Checkpoint(CheckpointedFn fn, const at::Tensor& input,
                      const std::vector<at::Tensor>& params, CheckpointOffload offload = {});

}  // namespace qlora::engine
