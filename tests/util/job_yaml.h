// The one builder of test jobs' training sections: the `trainer:` and `data:` lines that a suite
// appends to a job file (the service suites through TinyJobYaml, tests/service/service_harness.h),
// from a few fields instead of a YAML string copied into every test file. TrainingYaml({}) is
//
//   trainer: {type: finetune, batch_size: 1, gradient_accumulation_steps: 2, train_steps: 4,
//             learning_rate: 0.001}  (on one line)
//   data: {max_sequence_length: 48}
//
// and TrainingYaml({.gradient_accumulation_steps = 1, .train_steps = 240,
// .steps_per_checkpoint = 40}) a longer run with checkpoints.
#pragma once

#include <string>

#include "absl/strings/str_cat.h"

namespace qlora::testing {

// Fields at 0 (or empty) are left out of the YAML, so that the job file's defaults apply. Keys are
// written in this order.
struct TestTraining {
  int batch_size = 1;
  int gradient_accumulation_steps = 2;
  int epochs = 0;
  int train_steps = 4;
  int steps_per_checkpoint = 0;
  double learning_rate = 0.001;
  int eval_steps = 0;
  std::string more_trainer;  // further trainer keys, written last: "max_restarts: 0"
  int max_sequence_length = 48;
  std::string more_data;     // further data keys, written last: "validation_fraction: 0.25"
};

// `trainer: {type: finetune, ...}` and `data: {...}`, one flow-style line each (the data line
// only when it has a key).
inline std::string TrainingYaml(const TestTraining& t) {
  std::string trainer = "type: finetune";
  auto add = [](std::string& keys, const char* key, auto value) {
    if (value != 0) absl::StrAppend(&keys, keys.empty() ? "" : ", ", key, ": ", value);
  };
  add(trainer, "batch_size", t.batch_size);
  add(trainer, "gradient_accumulation_steps", t.gradient_accumulation_steps);
  add(trainer, "epochs", t.epochs);
  add(trainer, "train_steps", t.train_steps);
  add(trainer, "steps_per_checkpoint", t.steps_per_checkpoint);
  add(trainer, "learning_rate", t.learning_rate);
  add(trainer, "eval_steps", t.eval_steps);
  if (!t.more_trainer.empty()) absl::StrAppend(&trainer, ", ", t.more_trainer);
  std::string data;
  add(data, "max_sequence_length", t.max_sequence_length);
  if (!t.more_data.empty()) absl::StrAppend(&data, data.empty() ? "" : ", ", t.more_data);
  return absl::StrCat("trainer: {", trainer, "}\n",
                      data.empty() ? "" : absl::StrCat("data: {", data, "}\n"));
}

// A few optimizer steps: quick on a CPU.
inline TestTraining ShortTraining() { return {}; }
// Runs long enough to be cancelled, killed or looked at while it trains.
inline TestTraining LongTraining() {
  return {.gradient_accumulation_steps = 1, .train_steps = 100000};
}

}  // namespace qlora::testing
