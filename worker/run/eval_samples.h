// Samples during evaluation (trainer.eval_prompts / eval_samples): at each evaluation the model
// as it is then generates, greedily, for a few prompts laid out as the job lays out its records,
// so a user sees its answers change while it trains. Every rank generates the same (a
// partitioned base makes each forward collective); rank 0 records them (run_metrics.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/job_config.h"
#include "worker/data/generation_prompt.h"
#include "worker/data/tokenizer.h"
#include "worker/engine/llama_model.h"
#include "worker/run/eval_sample.h"

namespace qlora::worker {

class EvalSampler {
 public:
  // Null when the job asks for no samples. The prompts are built now (the first records read
  // once); max_new_tokens is the generation section's, else 64.
  static absl::StatusOr<std::unique_ptr<EvalSampler>> ForJob(const JobConfig& job);

  absl::StatusOr<std::vector<EvalSample>> Generate(const engine::LlamaForCausalLM& model) const;

 private:
  std::unique_ptr<data::Tokenizer> tokenizer_;
  std::vector<std::vector<int32_t>> prompts_;
  int64_t max_new_tokens_ = 64;
};

}  // namespace qlora::worker
