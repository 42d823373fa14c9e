"""What Client.watch() yields: one StepRecord per optimizer step and one EventRecord per other
event, assembled from WatchJob's stream, where every rank reports every step.

The rules are those of `qloractl watch -o json` (cli/event_json.cc), so that both clients print
the same steps: a step goes out once every rank has reported it, or once a later step is whole
or another event arrives (the job moved on without the missing ranks); steps go out in order.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Union

from qlora.records import Job, JobState, Progress, field_value, from_proto


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One optimizer step of the job. loss, learning rate and eval loss are the job's (every
    rank reports the same), tokens_per_second the sum over the ranks, elapsed_seconds the
    longest; `ranks` holds each rank's own report, by rank."""

    job_id: str
    step: int
    total_steps: int
    epoch: int
    loss: float
    learning_rate: float
    eval_loss: float               # NaN when not evaluated yet
    tokens_per_second: float
    elapsed_seconds: float
    ranks: tuple[Progress, ...]


@dataclasses.dataclass(frozen=True)
class EventRecord:
    """Any other event: a state change (reason_code e.g. WORKERS_STARTING, COMPLETED,
    CANCELLED_BY_USER) or a notice that leaves the state as it is (RECORDS_WITHOUT_TARGET: some
    records had no target left after truncation; WORKER_NOTICE: a worker's warning, such as an
    MLflow server that does not answer). `job` is the job as the coordinator sent it
    with the event: once ended, its adapter_path and summary."""

    job_id: str
    sequence: int                  # pass to watch(after_sequence=) to resume after it
    time_unix: float
    state: JobState
    reason_code: str
    message: str
    job: Job


WatchRecord = Union[StepRecord, EventRecord]


class StepAssembler:
    """Turns WatchJob responses into records. Not thread-safe: one per stream."""

    def __init__(self) -> None:
        self._job_id = ""
        self._pending: dict[int, dict[int, Any]] = {}  # step -> rank -> its qlora.v1.Progress

    def add(self, response: Any) -> list[WatchRecord]:
        """The records one qlora.v1.WatchJobResponse completes (none while a step waits for
        its other ranks)."""
        self._job_id = response.job.id
        event = response.event
        if event.HasField("progress"):
            progress = event.progress
            if progress.step <= 0:
                return []  # a report before the first step: nothing to say
            ranks = self._pending.setdefault(progress.step, {})
            ranks[progress.rank] = progress
            world = progress.strategy.world_size or response.job.num_workers
            if len(ranks) < max(world, 1):
                return []
            # This step is whole: it and any earlier one that some rank never reported go out.
            return [self._step(s) for s in sorted(self._pending) if s <= progress.step]
        records: list[WatchRecord] = self.flush()
        records.append(EventRecord(
            job_id=self._job_id, sequence=event.sequence, time_unix=event.time_unix,
            state=field_value(event, "state"), reason_code=event.reason_code,
            message=event.message, job=from_proto(Job, response.job)))
        return records

    def flush(self) -> list[StepRecord]:
        """The steps still waiting for ranks that never reported them, in order."""
        return [self._step(s) for s in sorted(self._pending)]

    def _step(self, step: int) -> StepRecord:
        """The record of `step`, which leaves the pending ones."""
        reports = [p for _, p in sorted(self._pending.pop(step).items())]
        first = reports[0]
        return StepRecord(
            job_id=self._job_id, step=step, total_steps=first.total_steps, epoch=first.epoch,
            loss=first.loss, learning_rate=first.learning_rate, eval_loss=first.eval_loss,
            tokens_per_second=sum(p.tokens_per_second for p in reports),
            elapsed_seconds=max(p.elapsed_seconds for p in reports),
            ranks=tuple(from_proto(Progress, p) for p in reports))
