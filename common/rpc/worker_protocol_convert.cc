// Worker protocol struct <-> protobuf (see worker_protocol_convert.h).
#include "common/rpc/worker_protocol_convert.h"

#include <algorithm>

#include "common/text/utf8.h"

namespace qlora {
namespace {

void ToProto(const data::ShardSpec& in, v1::DatasetShard* out) {
  out->set_path(in.path);
  out->set_begin(in.begin);
  out->set_end(in.end);
  out->set_first_line(in.first_line);
  out->set_stride(in.stride);
  out->set_phase(in.phase);
}

data::ShardSpec FromProto(const v1::DatasetShard& in) {
  data::ShardSpec s;
  s.path = in.path();
  s.begin = in.begin();
  s.end = in.end();
  s.first_line = in.first_line();
  s.stride = in.stride() < 1 ? 1 : in.stride();  // 0: a sender without interleaving
  s.phase = in.phase();
  return s;
}

void ToProto(const RecordCounts& in, v1::RecordReport* out) {
  out->set_trained(in.trained);
  out->set_left_over(in.left_over);
  out->set_malformed(in.malformed);
  out->set_without_target(in.without_target);
}

RecordCounts FromProto(const v1::RecordReport& in) {
  return {in.trained(), in.left_over(), in.malformed(), in.without_target()};
}

}  // namespace

void ToProto(const ProgressSnapshot& in, v1::Progress* out) {
  out->set_rank(in.rank);
  out->set_step(in.step);
  out->set_total_steps(in.total_steps);
  out->set_epoch(in.epoch);
  out->set_loss(in.loss);
  out->set_learning_rate(in.learning_rate);
  out->set_tokens_per_second(in.tokens_per_second);
  out->set_eval_loss(in.eval_loss);
  out->set_elapsed_seconds(in.elapsed_seconds);
  v1::MemoryReport* m = out->mutable_memory();
  m->set_device_allocated_bytes(in.memory.device_allocated_bytes);
  m->set_device_peak_bytes(in.memory.device_peak_bytes);
  m->set_master_weight_bytes(in.memory.master_weight_bytes);
  m->set_optimizer_state_bytes(in.memory.optimizer_state_bytes);
  m->set_gradient_bytes(in.memory.gradient_bytes);
  m->set_comm_buffer_bytes(in.memory.comm_buffer_bytes);
  m->set_host_rss_bytes(in.memory.host_rss_bytes);
  m->set_device_reserved_peak_bytes(in.memory.device_reserved_peak_bytes);
  m->set_host_peak_rss_bytes(in.memory.host_peak_rss_bytes);
  v1::StrategyReport* s = out->mutable_strategy();
  s->set_zero_stage(in.strategy.zero_stage);
  s->set_world_size(in.strategy.world_size);
  s->set_trainable_elements(in.strategy.trainable_elements);
  s->set_partition_elements(in.strategy.partition_elements);
  s->set_partitioned_optimizer(in.strategy.partitioned_optimizer);
  s->set_partitioned_gradients(in.strategy.partitioned_gradients);
  s->set_partitioned_base_weights(in.strategy.partitioned_base_weights);
  s->set_base_weights_in_host_memory(in.strategy.base_weights_in_host_memory);
  s->set_base_weight_gathered_bytes(in.strategy.base_weight_gathered_bytes);
  s->set_base_weight_copied_bytes(in.strategy.base_weight_copied_bytes);
  s->set_base_weight_wait_seconds(in.strategy.base_weight_wait_seconds);
  ToProto(in.epoch_records, out->mutable_epoch_records());
  ToProto(in.total_records, out->mutable_total_records());
  for (const std::string& notice : in.notices) out->add_notices(ValidUtf8(notice));
  for (const auto& [name, value] : in.metrics) (*out->mutable_metrics())[name] = value;
  v1::CheckpointingReport* c = out->mutable_checkpointing();
  c->set_checkpointed_layers(in.checkpointing.checkpointed_layers);
  c->set_layers(in.checkpointing.layers);
  c->set_planned_peak_bytes(in.checkpointing.planned_peak_bytes);
  c->set_budget_bytes(in.checkpointing.budget_bytes);
  c->set_measured_peak_bytes(in.checkpointing.measured_peak_bytes);
  c->set_offloaded_layers(in.checkpointing.offloaded_layers);
  c->set_dequantized_layers(in.checkpointing.dequantized_layers);
}

ProgressSnapshot FromProto(const v1::Progress& in) {
  ProgressSnapshot p;
  p.rank = in.rank();
  p.step = in.step();
  p.total_steps = in.total_steps();
  p.epoch = in.epoch();
  p.loss = in.loss();
  p.learning_rate = in.learning_rate();
  p.tokens_per_second = in.tokens_per_second();
  p.eval_loss = in.eval_loss();
  p.elapsed_seconds = in.elapsed_seconds();
  p.metrics.assign(in.metrics().begin(), in.metrics().end());
  std::sort(p.metrics.begin(), p.metrics.end());  // a map's order on the wire is unspecified
  const v1::MemoryReport& m = in.memory();
  p.memory = {m.device_allocated_bytes(), m.device_peak_bytes(), m.master_weight_bytes(),
              m.optimizer_state_bytes(), m.gradient_bytes(), m.comm_buffer_bytes(),
              m.host_rss_bytes(), m.device_reserved_peak_bytes(), m.host_peak_rss_bytes()};
  const v1::StrategyReport& s = in.strategy();
  p.strategy = {s.zero_stage(),
                s.world_size(),
                s.trainable_elements(),
                s.partition_elements(),
                s.partitioned_optimizer(),
                s.partitioned_gradients(),
                s.partitioned_base_weights(),
                s.base_weights_in_host_memory(),
                s.base_weight_gathered_bytes(),
                s.base_weight_copied_bytes(),
                s.base_weight_wait_seconds()};
  p.epoch_records = FromProto(in.epoch_records());
  p.total_records = FromProto(in.total_records());
  p.notices.assign(in.notices().begin(), in.notices().end());
  if (in.has_checkpointing()) {
    const v1::CheckpointingReport& c = in.checkpointing();
    p.checkpointing = {c.checkpointed_layers(), c.layers(), c.planned_peak_bytes(),
                       c.budget_bytes(), c.measured_peak_bytes(), c.offloaded_layers(),
                       c.dequantized_layers()};
  }
  return p;
}

void ToProto(const TrainSummary& in, v1::TrainSummary* out) {
  out->set_train_runtime_seconds(in.train_runtime_seconds);
  out->set_train_loss(in.train_loss);
  out->set_final_train_loss(in.final_train_loss);
  out->set_steps(in.steps);
  out->set_global_step(in.global_step);
  out->set_samples(in.samples);
  out->set_tokens(in.tokens);
  out->set_train_samples_per_second(in.train_samples_per_second);
  out->set_train_steps_per_second(in.train_steps_per_second);
  out->set_tokens_per_second(in.tokens_per_second);
  out->set_peak_memory_bytes(in.peak_memory_bytes);
  out->set_eval_loss(in.eval_loss);
  out->set_best_eval_loss(in.best_eval_loss);
}

TrainSummary FromProto(const v1::TrainSummary& in) {
  TrainSummary s;
  s.train_runtime_seconds = in.train_runtime_seconds();
  s.train_loss = in.train_loss();
  s.final_train_loss = in.final_train_loss();
  s.steps = in.steps();
  s.global_step = in.global_step();
  s.samples = in.samples();
  s.tokens = in.tokens();
  s.train_samples_per_second = in.train_samples_per_second();
  s.train_steps_per_second = in.train_steps_per_second();
  s.tokens_per_second = in.tokens_per_second();
  s.peak_memory_bytes = in.peak_memory_bytes();
  s.eval_loss = in.eval_loss();
  s.best_eval_loss = in.best_eval_loss();
  return s;
}

void ToProto(const WorkerAssignment& in, v1::Assignment* out) {
  out->set_job_id(in.job_id);
  out->set_rank(in.rank);
  out->set_world_size(in.world_size);
  out->set_device(in.device == DeviceKind::kCuda ? "cuda" : "cpu");
  out->set_resolved_config_yaml(in.resolved_config_yaml);
  for (const data::ShardSpec& s : in.train_shards) ToProto(s, out->add_train_shards());
  for (const data::ShardSpec& s : in.validation_shards) ToProto(s, out->add_validation_shards());
  out->set_nccl_unique_id(in.nccl_unique_id);
  out->set_generation(in.generation);
  out->set_output_dir(in.output_dir);
  out->set_job_uid(in.job_uid);
}

WorkerAssignment FromProto(const v1::Assignment& in) {
  WorkerAssignment a;
  a.job_id = in.job_id();
  a.rank = in.rank();
  a.world_size = in.world_size();
  a.device = in.device() == "cuda" ? DeviceKind::kCuda : DeviceKind::kCpu;
  a.resolved_config_yaml = in.resolved_config_yaml();
  for (const v1::DatasetShard& s : in.train_shards()) a.train_shards.push_back(FromProto(s));
  for (const v1::DatasetShard& s : in.validation_shards()) a.validation_shards.push_back(FromProto(s));
  a.nccl_unique_id = in.nccl_unique_id();
  a.generation = in.generation();
  a.output_dir = in.output_dir();
  a.job_uid = in.job_uid();
  return a;
}

}  // namespace qlora
