// The worker protocol's progress report through its protobuf message and back
// (common/rpc/worker_protocol_convert.h): every field, each set to a value of its own, arrives as
// sent, so that a field left out of either direction (as a new one easily is) fails here.
#include "common/rpc/worker_protocol_convert.h"

#include <gtest/gtest.h>

namespace qlora {
namespace {

// Which failures a restart may cure: not a wrong job, and not running out of memory before the
// run's first step (issue 58: an out-of-memory start was retried unchanged, twice); running out
// later (fragmentation, a longer batch) may pass.
TEST(CommonWorkerProtocol, OutOfMemoryBeforeTheFirstStepIsNotRetried) {
  const absl::Status oom = absl::ResourceExhaustedError("out of memory: tried to allocate 512 GiB");
  const WorkerCompletion at_start = FailedCompletion(oom, /*stepped=*/false);
  EXPECT_FALSE(at_start.ok);
  EXPECT_FALSE(at_start.retryable);
  EXPECT_NE(at_start.error.find("tried to allocate 512 GiB (before the first step"),
            std::string::npos)
      << at_start.error;
  EXPECT_TRUE(FailedCompletion(oom, /*stepped=*/true).retryable);
  EXPECT_TRUE(FailedCompletion(absl::UnavailableError("peer lost"), /*stepped=*/false).retryable);
  EXPECT_FALSE(FailedCompletion(absl::InvalidArgumentError("bad record")).retryable);
}

TEST(CommonWorkerProtocol, ProgressRoundTripsEveryField) {
  ProgressSnapshot in;
  in.rank = 3;
  in.step = 17;
  in.total_steps = 90;
  in.epoch = 2;
  in.loss = 1.25;
  in.learning_rate = 2e-4;
  in.tokens_per_second = 19864.5;
  in.eval_loss = 1.5;
  in.elapsed_seconds = 42.75;
  in.memory = {101, 102, 103, 104, 105, 106, 107, 108, 109};
  in.strategy = {2, 4, 201, 202, true, true, true, true, 203, 204, 0.25};
  in.epoch_records = {301, 302, 303, 304};
  in.total_records = {401, 402, 403, 404};
  in.checkpointing = {13, 32, 501, 502, 503, 10, 26};

  v1::Progress wire;
  ToProto(in, &wire);
  const ProgressSnapshot out = FromProto(v1::Progress(wire));

  EXPECT_EQ(out.rank, in.rank);
  EXPECT_EQ(out.step, in.step);
  EXPECT_EQ(out.total_steps, in.total_steps);
  EXPECT_EQ(out.epoch, in.epoch);
  EXPECT_EQ(out.loss, in.loss);
  EXPECT_EQ(out.learning_rate, in.learning_rate);
  EXPECT_EQ(out.tokens_per_second, in.tokens_per_second);
  EXPECT_EQ(out.eval_loss, in.eval_loss);
  EXPECT_EQ(out.elapsed_seconds, in.elapsed_seconds);
  const MemorySnapshot& m = out.memory;
  EXPECT_EQ(m.device_allocated_bytes, 101);
  EXPECT_EQ(m.device_peak_bytes, 102);
  EXPECT_EQ(m.master_weight_bytes, 103);
  EXPECT_EQ(m.optimizer_state_bytes, 104);
  EXPECT_EQ(m.gradient_bytes, 105);
  EXPECT_EQ(m.comm_buffer_bytes, 106);
  EXPECT_EQ(m.host_rss_bytes, 107);
  EXPECT_EQ(m.device_reserved_peak_bytes, 108);
  EXPECT_EQ(m.host_peak_rss_bytes, 109);
  const StrategySnapshot& s = out.strategy;
  EXPECT_EQ(s.zero_stage, 2);
  EXPECT_EQ(s.world_size, 4);
  EXPECT_EQ(s.trainable_elements, 201);
  EXPECT_EQ(s.partition_elements, 202);
  EXPECT_TRUE(s.partitioned_optimizer);
  EXPECT_TRUE(s.partitioned_gradients);
  EXPECT_TRUE(s.partitioned_base_weights);
  EXPECT_TRUE(s.base_weights_in_host_memory);
  EXPECT_EQ(s.base_weight_gathered_bytes, 203);
  EXPECT_EQ(s.base_weight_copied_bytes, 204);
  EXPECT_EQ(s.base_weight_wait_seconds, 0.25);
  for (const auto& [got, want] : {std::pair{out.epoch_records, in.epoch_records},
                                  std::pair{out.total_records, in.total_records}}) {
    EXPECT_EQ(got.trained, want.trained);
    EXPECT_EQ(got.left_over, want.left_over);
    EXPECT_EQ(got.malformed, want.malformed);
    EXPECT_EQ(got.without_target, want.without_target);
  }
  const CheckpointingReport& c = out.checkpointing;
  EXPECT_EQ(c.checkpointed_layers, 13);
  EXPECT_EQ(c.layers, 32);
  EXPECT_EQ(c.planned_peak_bytes, 501);
  EXPECT_EQ(c.budget_bytes, 502);
  EXPECT_EQ(c.measured_peak_bytes, 503);
  EXPECT_EQ(c.offloaded_layers, 10);
  EXPECT_EQ(c.dequantized_layers, 26);

  // A report without checkpointing (an older worker) keeps "not reported".
  wire.clear_checkpointing();
  EXPECT_EQ(FromProto(wire).checkpointing.checkpointed_layers, -1);
}

}  // namespace
}  // namespace qlora
