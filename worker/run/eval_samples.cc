// EvalSampler (see eval_samples.h).
#include "worker/run/eval_samples.h"

#include <algorithm>

#include "common/status_macros.h"
#include "common/text/utf8.h"
#include "worker/engine/generation.h"
#include "worker/run/generation_run.h"

namespace qlora::worker {

absl::StatusOr<std::unique_ptr<EvalSampler>> EvalSampler::ForJob(const JobConfig& job) {
  const TrainerConfig& t = job.trainer;
  if (t.eval_prompts.empty() && t.eval_samples == 0) return nullptr;
  auto sampler = std::unique_ptr<EvalSampler>(new EvalSampler());
  QLORA_ASSIGN_OR_RETURN(sampler->tokenizer_, data::LoadTokenizer(job.base_model_path));
  QLORA_ASSIGN_OR_RETURN(data::GenerationPrompts prompts,
                         data::GenerationPrompts::ForJob(job, sampler->tokenizer_.get(), 1 << 20));
  if (!t.eval_prompts.empty()) {
    for (const std::string& prompt : t.eval_prompts) {
      QLORA_ASSIGN_OR_RETURN(std::vector<int32_t> ids, prompts.Ids(prompt));
      sampler->prompts_.push_back(std::move(ids));
    }
  } else {
    QLORA_ASSIGN_OR_RETURN(std::vector<data::Record> records,
                           data::GenerationPrompts::FirstRecords(job, *sampler->tokenizer_, t.eval_samples));
    for (const data::Record& record : records) {
      QLORA_ASSIGN_OR_RETURN(std::vector<int32_t> ids, prompts.IdsOfRecord(record));
      if (!ids.empty()) sampler->prompts_.push_back(std::move(ids));
    }
  }
  sampler->max_new_tokens_ = job.generation.max_new_tokens.value_or(64);
  return sampler;
}

absl::StatusOr<std::vector<EvalSample>> EvalSampler::Generate(const engine::LlamaForCausalLM& model) const {
  engine::GenerationOptions options;
  options.max_new_tokens = max_new_tokens_;
  options.eos_token_ids = EndOfSequenceIds(model.config(), *tokenizer_, /*end_of_turn=*/true);
  std::vector<EvalSample> samples;
  for (const std::vector<int32_t>& ids : prompts_) {
    QLORA_ASSIGN_OR_RETURN(engine::GenerationResult result,
                           engine::Generate(model, std::vector<int64_t>(ids.begin(), ids.end()), options));
    std::vector<int32_t> generated;
    for (int64_t token : result.tokens) {
      if (std::find(options.eos_token_ids.begin(), options.eos_token_ids.end(), token) ==
          options.eos_token_ids.end()) {
        generated.push_back(static_cast<int32_t>(token));
      }
    }
    EvalSample sample;
    // Bytes that make no character (a byte-level model may end inside one) as U+FFFD: the
    // texts go to JSON, TensorBoard and the log.
    QLORA_ASSIGN_OR_RETURN(const std::string prompt, tokenizer_->Decode(ids));
    QLORA_ASSIGN_OR_RETURN(const std::string output, tokenizer_->Decode(generated));
    sample.prompt = ValidUtf8(prompt);
    sample.output = ValidUtf8(output);
    samples.push_back(std::move(sample));
  }
  return samples;
}

}  // namespace qlora::worker
