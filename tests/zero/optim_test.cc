// AdamW against torch.optim.AdamW and the LR schedules against transformers'
// get_*_schedule_with_warmup, both run by the reference Python ($QLORA_PYTHON); clipping against
// torch's closed form.
#include <stdio.h>
#include <stdlib.h>

#include <array>
#include <cmath>
#include <string>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/util/files.h"
#include "tests/util/temp_dir.h"
#include "worker/optim/adamw.h"
#include "worker/optim/clip.h"
#include "worker/optim/lr_schedule.h"

namespace qlora {
namespace {

// $QLORA_PYTHON, else the configured one (qlora_add_gtest's ENVIRONMENT list loses all but its
// first entry, so the variable does not reach tests run by ctest).
std::string ReferencePython() {
  const char* python = std::getenv("QLORA_PYTHON");
  if (python != nullptr && *python != '\0') return python;
  return QLORA_CONFIGURED_PYTHON;
}

// Runs `script` with the reference Python and parses its stdout as JSON; null when unavailable.
nlohmann::json RunPython(const std::string& script) {
  const std::string python = ReferencePython();
  if (python.empty() || !testing::FileExists(python)) return nullptr;
  testing::TempDir tmp;
  const std::string path = tmp.Sub("script.py");
  testing::WriteFile(path, script);
  FILE* pipe = ::popen((python + " " + path + " 2>/dev/null").c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), pipe)) out.append(buf.data(), n);
  const int rc = ::pclose(pipe);
  EXPECT_EQ(rc, 0) << out;
  return nlohmann::json::parse(out, nullptr, false);
}

constexpr int kN = 37;
constexpr int kSteps = 12;

// The same tensors in both languages, built from torch ops on float32.
at::Tensor InitialParam() { return at::sin(at::arange(kN, at::kFloat) * 0.37).mul(0.5); }
at::Tensor Grad(int k) {
  return at::cos(at::arange(kN, at::kFloat) * (0.1 + 0.01 * k)).mul(0.3 * (k + 1));
}
double Lr(int k) { return 1e-2 * (1.0 + 0.1 * k); }

TEST(ZeroOptim, AdamWMatchesTorch) {
  const nlohmann::json expected = RunPython(R"(
import json, torch
p = (torch.sin(torch.arange(37, dtype=torch.float32) * 0.37) * 0.5).requires_grad_()
opt = torch.optim.AdamW([p], lr=1e-2, betas=(0.85, 0.99), eps=1e-6, weight_decay=0.05, foreach=False)
for k in range(12):
    p.grad = torch.cos(torch.arange(37, dtype=torch.float32) * (0.1 + 0.01 * k)) * (0.3 * (k + 1))
    opt.param_groups[0]["lr"] = 1e-2 * (1.0 + 0.1 * k)
    opt.step()
st = opt.state[p]
print(json.dumps({"param": p.detach().tolist(), "exp_avg": st["exp_avg"].tolist(),
                  "exp_avg_sq": st["exp_avg_sq"].tolist()}))
)");
  if (expected.is_null()) GTEST_SKIP() << "QLORA_PYTHON not set or not runnable";
  ASSERT_TRUE(expected.is_object());
  optim::AdamW adamw({0.85, 0.99, 1e-6, 0.05}, kN, at::TensorOptions());
  at::Tensor param = InitialParam();
  for (int k = 0; k < kSteps; ++k) adamw.Step(Lr(k), param, Grad(k));
  EXPECT_EQ(adamw.step(), kSteps);
  auto compare = [&](const at::Tensor& ours, const char* name) {
    at::Tensor theirs = at::tensor(expected[name].get<std::vector<double>>(), at::kDouble);
    const double diff = (ours.to(at::kDouble) - theirs).abs().max().item<double>();
    // Same ops in the same order on fp32: equal up to the last bit or two.
    EXPECT_LE(diff, 1e-7 * std::max(1.0, theirs.abs().max().item<double>())) << name;
  };
  compare(param, "param");
  compare(adamw.exp_avg(), "exp_avg");
  compare(adamw.exp_avg_sq(), "exp_avg_sq");
}

// offload_optimizer: moments waiting in host memory between steps give the device's own numbers
// bit for bit, pinned or pageable, hold no device memory between steps, and read from the host
// right after a step (a checkpoint) are that step's, though the step is still queued behind
// other work. On a CPU the moments are in host memory already: the placement changes nothing.
TEST(ZeroOptim, AdamWMomentsInHostEqualMomentsOnTheDeviceBitForBit) {
  const at::TensorOptions device =
      at::TensorOptions().device(at::hasCUDA() ? at::kCUDA : at::kCPU);
  const optim::AdamWOptions options{0.85, 0.99, 1e-6, 0.05};
  const at::Device on = device.device();
  for (const bool pinned : {true, false}) {
    SCOPED_TRACE(pinned ? "pinned" : "pageable");
    optim::AdamW resident(options, kN, device);
    optim::MomentsPlacement in_host;
    in_host.in_host = true;
    in_host.pinned = pinned;
    optim::AdamW parked(options, kN, device, in_host);
    at::Tensor resident_param = InitialParam().to(on);
    at::Tensor param = InitialParam().to(on);
    for (int k = 0; k < kSteps; ++k) {
      resident.Step(Lr(k), resident_param, Grad(k).to(on));
      const at::Tensor expected_avg = resident.exp_avg().cpu();
      const at::Tensor grad = Grad(k).to(on);
      if (at::hasCUDA()) {  // a queue ahead of the step, so that its copy back comes late
        const at::Tensor a = at::randn({4096, 4096}, device);
        for (int i = 0; i < 8; ++i) (void)at::mm(a, a);
      }
      parked.Step(Lr(k), param, grad);
      EXPECT_TRUE(at::equal(parked.exp_avg().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true),
                            expected_avg))
          << "step " << k;
    }
    EXPECT_EQ(parked.step(), kSteps);
    EXPECT_TRUE(at::equal(param.cpu(), resident_param.cpu()));
    EXPECT_TRUE(at::equal(parked.exp_avg_sq().cpu(), resident.exp_avg_sq().cpu()));
    EXPECT_EQ(resident.DeviceStateBytes(), resident.StateBytes());
    EXPECT_GE(parked.StateBytes(), 2 * kN * 4);
    if (!at::hasCUDA()) {
      EXPECT_FALSE(parked.moments_in_host());
      continue;
    }
    EXPECT_TRUE(parked.moments_in_host());
    EXPECT_TRUE(parked.exp_avg().device().is_cpu());
    EXPECT_EQ(parked.exp_avg().is_pinned(), pinned);
    EXPECT_EQ(parked.exp_avg().numel(), kN);
    EXPECT_EQ(parked.DeviceStateBytes(), 0);
    // Written from the host between steps (a checkpoint's resume): the next step reads it.
    const at::Tensor scaled_avg = resident.exp_avg().mul(0.5);
    resident.exp_avg().copy_(scaled_avg);
    parked.exp_avg().copy_(scaled_avg.cpu());
    resident.Step(Lr(0), resident_param, Grad(0).to(on));
    parked.Step(Lr(0), param, Grad(0).to(on));
    EXPECT_TRUE(at::equal(param.cpu(), resident_param.cpu()));
    EXPECT_TRUE(at::equal(parked.exp_avg().cpu(), resident.exp_avg().cpu()));
  }
}

TEST(ZeroOptim, SchedulesMatchTransformers) {
  const nlohmann::json expected = RunPython(R"(
import json, torch
from transformers import (get_constant_schedule_with_warmup, get_linear_schedule_with_warmup,
                          get_cosine_schedule_with_warmup)
out = {}
for name, make in [("constant", lambda o: get_constant_schedule_with_warmup(o, 3)),
                   ("linear", lambda o: get_linear_schedule_with_warmup(o, 3, 10)),
                   ("cosine", lambda o: get_cosine_schedule_with_warmup(o, 3, 10))]:
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=2e-4)
    sched = make(opt)
    lrs = []
    for _ in range(13):
        lrs.append(sched.get_last_lr()[0])
        opt.step(); sched.step()
    out[name] = lrs
print(json.dumps(out))
)");
  if (expected.is_null()) GTEST_SKIP() << "QLORA_PYTHON not set or not runnable";
  ASSERT_TRUE(expected.is_object());
  const std::pair<const char*, LrScheduler> kinds[] = {
      {"constant", LrScheduler::kConstant}, {"linear", LrScheduler::kLinear},
      {"cosine", LrScheduler::kCosine}};
  for (const auto& [name, kind] : kinds) {
    optim::LrScheduleOptions o{kind, 2e-4, 3, 10, 0.5};
    const std::vector<double> lrs = expected[name].get<std::vector<double>>();
    ASSERT_EQ(lrs.size(), 13u);
    for (int k = 0; k < 13; ++k) {
      EXPECT_NEAR(optim::LearningRate(o, k), lrs[k], 1e-12 * 2e-4) << name << " step " << k;
    }
  }
}

TEST(ZeroOptim, ClipCoefficientIsTorchs) {
  EXPECT_DOUBLE_EQ(optim::ClipCoefficient(4.0, 1.0), 1.0 / (4.0 + 1e-6));
  EXPECT_DOUBLE_EQ(optim::ClipCoefficient(0.5, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(optim::ClipCoefficient(100.0, 0.0), 1.0);  // clipping off
}

}  // namespace
}  // namespace qlora
