"""The typed records the client returns: frozen dataclasses with the fields of the qlora.v1
messages (proto/qlora/v1/job.proto) under the same names.

Integers are Python ints (int64 included), doubles are floats, the job state is a `JobState`,
repeated fields are tuples, and a message field the server left unset is None (a Job's
`summary` before it succeeds). A NaN stays a float NaN, as in the proto: an `eval_loss` before
the first evaluation, a `train_loss` of a run that took no step. Test with `math.isnan`.
"""
from __future__ import annotations

import dataclasses
import enum
import types
from typing import Any, Mapping, TypeVar


class JobState(str, enum.Enum):
    """A job's state: the proto's JobState without its JOB_STATE_ prefix (a str, so that
    `job.state == "SUCCEEDED"` holds)."""

    UNSPECIFIED = "UNSPECIFIED"
    QUEUED = "QUEUED"          # accepted, waiting for workers (see Job.state_reason_code)
    STARTING = "STARTING"      # workers spawned, waiting for all to register
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    def __str__(self) -> str:  # "RUNNING" in print() and f-strings, not "JobState.RUNNING"
        return self.value

    @property
    def ended(self) -> bool:
        """SUCCEEDED, FAILED or CANCELLED: the job will not change again."""
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)

    @property
    def proto_name(self) -> str:
        """The proto's name, e.g. JOB_STATE_RUNNING."""
        return "JOB_STATE_" + self.value

    @classmethod
    def parse(cls, name: JobState | str) -> JobState:
        """A state from its name in any case, with or without the JOB_STATE_ prefix."""
        if isinstance(name, JobState):
            return name
        return cls(name.upper().removeprefix("JOB_STATE_"))


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    """Resource figures a rank reports with its progress (bytes)."""

    device_allocated_bytes: int
    device_peak_bytes: int
    master_weight_bytes: int
    optimizer_state_bytes: int
    gradient_bytes: int
    comm_buffer_bytes: int
    host_rss_bytes: int
    device_reserved_peak_bytes: int
    host_peak_rss_bytes: int


@dataclasses.dataclass(frozen=True)
class StrategyReport:
    """The data-parallel strategy a rank actually runs."""

    zero_stage: int
    world_size: int
    trainable_elements: int
    partition_elements: int
    partitioned_optimizer: bool
    partitioned_gradients: bool
    partitioned_base_weights: bool
    base_weights_in_host_memory: bool
    base_weight_gathered_bytes: int
    base_weight_copied_bytes: int
    base_weight_wait_seconds: float


@dataclasses.dataclass(frozen=True)
class RecordReport:
    """What became of a rank's training records."""

    trained: int
    left_over: int
    malformed: int
    without_target: int


@dataclasses.dataclass(frozen=True)
class CheckpointingReport:
    """The activation checkpointing a rank runs (-1 checkpointed_layers: not reported)."""

    checkpointed_layers: int
    layers: int
    planned_peak_bytes: int
    budget_bytes: int
    measured_peak_bytes: int
    offloaded_layers: int
    dequantized_layers: int


@dataclasses.dataclass(frozen=True)
class Progress:
    """One rank's report of an optimizer step."""

    rank: int
    step: int
    total_steps: int
    epoch: int
    loss: float
    learning_rate: float
    tokens_per_second: float       # this rank
    eval_loss: float               # NaN when not evaluated yet
    memory: MemoryReport | None
    elapsed_seconds: float
    strategy: StrategyReport | None
    epoch_records: RecordReport | None
    total_records: RecordReport | None
    checkpointing: CheckpointingReport | None
    notices: tuple[str, ...]       # warnings since the rank's last report
    # The objective's metrics (dpo, orpo: TRL's names, rewards/chosen, ...; eval_ prefixed after
    # an evaluation); empty for finetune.
    metrics: Mapping[str, float]


@dataclasses.dataclass(frozen=True)
class TrainSummary:
    """The end of a successful run, as Hugging Face's Trainer.train() reports it."""

    train_runtime_seconds: float
    train_loss: float
    final_train_loss: float
    steps: int
    global_step: int
    samples: int
    tokens: int
    train_samples_per_second: float
    train_steps_per_second: float
    tokens_per_second: float
    peak_memory_bytes: int
    eval_loss: float
    best_eval_loss: float


@dataclasses.dataclass(frozen=True)
class Job:
    """A job as the coordinator reports it (GetJob, ListJobs, CancelJob, SubmitJob)."""

    id: str
    name: str
    state: JobState
    state_reason_code: str
    state_message: str
    created_unix: float
    started_unix: float            # 0 until it starts
    finished_unix: float           # 0 until it ends
    job_yaml: str                  # empty in list() results
    resolved_config_yaml: str      # empty in list() results
    num_workers: int
    zero_stage: int
    output_dir: str
    adapter_path: str              # the PEFT adapter folder once SUCCEEDED
    progress: tuple[Progress, ...]  # the latest report of each rank
    last_sequence: int
    owner: str
    restarts: int
    restart_causes: tuple[str, ...]
    summary: TrainSummary | None   # once SUCCEEDED
    merged_path: str


# The record of each message type, by its full proto name (read-only).
MESSAGE_RECORDS: Mapping[str, type] = types.MappingProxyType({
    "qlora.v1.MemoryReport": MemoryReport,
    "qlora.v1.StrategyReport": StrategyReport,
    "qlora.v1.RecordReport": RecordReport,
    "qlora.v1.CheckpointingReport": CheckpointingReport,
    "qlora.v1.Progress": Progress,
    "qlora.v1.TrainSummary": TrainSummary,
    "qlora.v1.Job": Job,
})

R = TypeVar("R")


def _is_repeated(field: Any) -> bool:
    # Recent protobuf releases have is_repeated (7 dropped `label`); older ones only the label.
    if hasattr(field, "is_repeated"):
        return bool(field.is_repeated)
    return field.label == field.LABEL_REPEATED


def field_value(message: Any, name: str) -> Any:
    """Field `name` of a qlora.v1 message as a record field: a record (None when unset), a
    tuple for a repeated field, a read-only mapping for a map field, a JobState for the state (JobState is the API's only enum;
    UNSPECIFIED for a number this client does not know), else the value itself."""
    field = message.DESCRIPTOR.fields_by_name[name]
    value = getattr(message, name)
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        return types.MappingProxyType(dict(value))
    if field.message_type is not None:
        record = MESSAGE_RECORDS[field.message_type.full_name]
        if _is_repeated(field):
            return tuple(from_proto(record, m) for m in value)
        return from_proto(record, value) if message.HasField(name) else None
    if field.enum_type is not None:
        known = field.enum_type.values_by_number.get(value)
        return JobState.parse(known.name) if known is not None else JobState.UNSPECIFIED
    return tuple(value) if _is_repeated(field) else value


def from_proto(record: type[R], message: Any) -> R:
    """`message` (a qlora.v1 message) as `record`, field by field under the same names."""
    return record(**{f.name: field_value(message, f.name) for f in dataclasses.fields(record)})
