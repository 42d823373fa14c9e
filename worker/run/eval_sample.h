// One evaluation sample (eval_samples.h makes them, run_metrics.h records them). Torch-free.
#pragma once

#include <string>

namespace qlora::worker {

struct EvalSample {
  std::string prompt;  // the prompt as the model sees it (template included)
  std::string output;
};

}  // namespace qlora::worker
