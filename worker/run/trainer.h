// One rank's training run as named phases:
//
//   Create   join the other ranks (Gloo on CPU, NCCL on GPU), load the model (NF4 base + LoRA),
//            build the ZeRO strategy, choose the activation-checkpointed layers (auto: for the
//            memory budget), open this rank's data, plan the steps and the LR schedule
//   Resume   restore the newest complete checkpoint of this job (else the one the job continues,
//            trainer.resume_from_checkpoint) and replay the data order to it
//   Step     one optimizer step: accumulate the step's micro-batches, reduce, clip, AdamW
//   After    evaluate, checkpoint and report progress as the job's settings ask
//   Finish   final evaluation, gather the weights, write the PEFT adapter with its model card and
//            the merged model if asked (rank 0), and summarize the run (TrainSummary)
//
// Run() is all of them in order; each is public so that tests can drive them one by one. Every
// phase but the accessors is collective: all ranks call them in the same order. Torch side.
//
// Run() keeps the device busy between steps: it reads a step's values (loss, gradient norm) and
// runs its After once the next step's work is queued, so that the host's reporting and the next
// step's first launches overlap the GPU's end of this one, instead of the GPU waiting for them
// (a drained queue at every step start). A step is finished before the next is queued wherever
// its After reads or changes the model (a checkpoint, by steps or by time, an evaluation, the
// run's last step) or the memory plans may still change it (the run's first two steps), and with
// more than one rank (their sums are a collective that would wait for the next step's work
// anyway: every step is finished first there, as before).
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <c10/core/Device.h>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/comm/communicator.h"
#include "worker/engine/base_weight_store.h"
#include "worker/engine/llama_model.h"
#include "worker/optim/lr_schedule.h"
#include "worker/memory/checkpointing_budget.h"
#include "worker/memory/dequantized_weights.h"
#include "worker/run/eval_samples.h"
#include "worker/run/micro_batches.h"
#include "worker/run/run_metrics.h"
#include "worker/run/step_batches.h"
#include "worker/run/training_job.h"
#include "worker/run/training_objective.h"
#include "worker/strategy/strategy.h"

namespace qlora::worker {

// What one optimizer step did.
struct StepResult {
  int64_t step = 0;                 // 1-based: optimizer steps done
  double loss = 0;                  // mean token loss of the global batch (all ranks)
  int64_t global_loss_units = 0;    // what the loss is a mean over: target tokens (preference
                                    // tuning: micro-batches) of every rank
  int64_t local_input_tokens = 0;   // this rank's non-padding tokens
  int64_t global_input_tokens = 0;  // every rank's
  int64_t global_rows = 0;          // sequences (rows) of every rank's micro-batches
  double seconds = 0;
  bool checkpoint_due = false;      // trainer.checkpoint_every_minutes passed (rank 0's clock)
  strategy::StepReport report;      // lr, grad norm, clip coefficient
  // Where the data stood after this step's micro-batches (its progress report's epoch figures).
  int epoch = 0;
  bool epoch_finished = false;
  RecordCounts epoch_records;
  RecordCounts total_records;
  // The objective's metrics (preference tuning: TRL's), averaged over every rank's micro-batches.
  std::vector<std::pair<std::string, double>> metrics;
};

class Trainer {
 public:
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const TrainingContext& context);

  absl::StatusOr<TrainingOutcome> Run();

  // Phases.
  absl::StatusOr<int64_t> Resume();            // the step to start at (0 without a checkpoint)
  absl::StatusOr<StepResult> Step(int64_t step);  // `step` is 0-based
  absl::Status After(const StepResult& result);
  absl::StatusOr<TrainingOutcome> Finish();

  int64_t total_steps() const { return total_steps_; }
  const strategy::DistributedStrategy& strategy() const { return *strategy_; }
  // The activation checkpointing this rank runs (the progress reports carry it too).
  // With the layers whose weights are kept dequantized (trainer.dequantized_weight_layers).
  CheckpointingReport checkpointing() const;

 private:
  explicit Trainer(const TrainingContext& context);
  absl::Status Connect();
  absl::Status LoadModel();
  // A stage left to the workers (StrategyConfig::zero_stage_auto): the base-weight placement
  // planned for the smallest budget of the ranks (collective), written into config_.
  absl::Status PlanBaseWeightPlacement();
  // The host memory offloaded activations may pin on this rank (trainer.max_host_memory_gib, else
  // the default share of what the host has available).
  int64_t ActivationHostBytes() const;
  // adapter.pretrained_adapter_weights: the adapters start from that folder's weights, whose
  // settings must be the job's (InvalidArgument naming both otherwise).
  absl::Status StartFromAdapter();
  // Where the base weights go as they load: partitioned (the strategy's plan), in host memory
  // (offload_param), or null (whole on the device).
  absl::StatusOr<std::shared_ptr<engine::BaseWeightStore>> MakeBaseWeightStore();
  absl::Status BuildStrategy();
  absl::Status ChooseCheckpointing();
  absl::Status OpenData();
  absl::Status PlanSchedule();
  void Log(const std::string& line) const;
  // A step whose work is queued on the device, its values (loss, gradient norm) maybe still on
  // their way to the host.
  struct QueuedStep {
    StepResult result;  // all but what Resolve reads
    double start = 0;   // steady-clock seconds when it began
    double queued = 0;  // ... and when its work was all queued (on a CPU: done)
    double loss_scale = 0;
    int64_t local_rows = 0;  // this rank's sequences, summed over ranks by Resolve
    int64_t local_micro_batches = 0;
    strategy::ScalarRead local_metrics;  // the objective's metrics summed over this rank's micro-batches
    bool due_here = false;  // rank 0's clock: a time-based checkpoint is due (rank 0 only)
    strategy::ScalarRead local_loss;
    strategy::PendingStepReport report;
  };
  absl::StatusOr<QueuedStep> QueueStep(int64_t step);
  // The step's values (collective: summed over ranks), the run's totals and the memory plans'
  // look at the peak.
  absl::StatusOr<StepResult> Resolve(const QueuedStep& queued);
  // Whether Run() must finish `queued` before queuing the next step (see the header comment).
  bool MustResolveBeforeNext(const QueuedStep& queued) const;
  // Rank 0: the step's metrics into runs/ and metrics.jsonl (opened on first use; a failure is
  // logged once and stops metrics, never training).
  void RecordMetrics(const StepResult& result, const ProgressSnapshot& p, bool evaluated);
  // Evaluation samples (eval_samples.h): generated by every rank at an evaluation step, then
  // recorded by rank 0 once that step's metrics are.
  absl::Status GenerateSamples(int64_t step);
  void RecordSamples(int64_t step);
  // The MLflow reporter of report_to: mlflow (null, with a warning, without MLFLOW_TRACKING_URI).
  std::shared_ptr<tracking::MlflowReporter> StartMlflow(const std::vector<tensorboard::HParam>& hparams);
  void RecordFinalEvaluation();
  // Not const: the base weights' figures are those since the previous report.
  ProgressSnapshot Progress(const StepResult& result);
  void NoteEvalLoss(double loss);
  // Collective: the full LoRA weights (gathered from the ZeRO partitions) into the model; then
  // rank 0 writes them as a PEFT adapter folder.
  absl::Status WriteAdapter(const std::string& dir);
  // Collective (the peak memory is the largest over ranks).
  absl::StatusOr<TrainSummary> Summarize();

  const TrainingContext& context_;
  JobConfig config_;  // the job's, with the stage planned when the job left it to the workers
  const WorkerAssignment& assignment_;
  const at::Device device_;
  std::unique_ptr<comm::Communicator> communicator_;
  std::unique_ptr<engine::LlamaForCausalLM> model_;
  engine::BaseWeightStats reported_base_stats_;  // the store's totals at the last report
  std::vector<strategy::TrainableParam> params_;
  std::unique_ptr<strategy::DistributedStrategy> strategy_;
  std::unique_ptr<TrainingObjective> objective_;  // finetune, dpo or orpo
  std::optional<memory::CheckpointingBudget> checkpointing_;
  std::optional<memory::DequantizedWeights> dequantized_;  // trainer.dequantized_weight_layers
  std::unique_ptr<MicroBatchSource> train_;
  std::unique_ptr<MicroBatchSource> validation_;   // null without validation data
  std::unique_ptr<StepBatches> steps_;
  optim::LrScheduleOptions schedule_;
  int64_t total_steps_ = 0;
  double eval_loss_;                                // NaN until evaluated
  std::vector<std::pair<std::string, double>> eval_metrics_;  // the objective's, last evaluation
  double started_ = 0;                              // steady-clock seconds at the first step
  double last_checkpoint_ = 0;                      // steady-clock seconds of the last save (or start)
  std::unique_ptr<RunMetrics> metrics_;             // rank 0, once opened
  absl::Mutex notices_mu_;                          // the MLflow reporter's thread adds
  std::vector<std::string> notices_ ABSL_GUARDED_BY(notices_mu_);  // for the next progress report
  std::unique_ptr<EvalSampler> sampler_;            // null: no samples asked for
  bool sampler_made_ = false;
  std::vector<EvalSample> samples_;                 // of samples_step_, until recorded
  int64_t samples_step_ = -1;
  bool metrics_failed_ = false;
  double run_started_ = 0;                          // steady-clock seconds when Resume() began
  double last_ready_ = 0;  // steady-clock seconds when the last resolved step's values were ready
  // This run's figures for its TrainSummary.
  struct RunTotals {
    int64_t steps = 0;
    int64_t last_step = 0;
    double loss_sum = 0;
    double last_loss = NAN;
    int64_t tokens = 0;
    int64_t samples = 0;
    double best_eval_loss = NAN;
  };
  RunTotals totals_;
};

}  // namespace qlora::worker
