"""The Python client of the QLoRA training service: submit fine-tuning jobs to a
qlora-coordinator and follow them, over its gRPC API (proto/qlora/v1).

    import qlora
    with qlora.connect() as client:            # QLORA_ADDRESS, QLORA_TOKEN, ... as qloractl
        job = client.submit("job.yaml", dataset="data/train.jsonl")
        for record in client.watch(job.id):
            if isinstance(record, qlora.StepRecord):
                print(record.step, record.loss)
        print(client.generate(job.id, "Write a haiku about GPUs")[0].text)

The generated gRPC modules are qlora.v1.*_pb2 and *_pb2_grpc, for what this layer lacks.
"""
from importlib.metadata import version

from qlora.client import Client, GeneratedPiece, Generation, connect
from qlora.errors import QloraError
from qlora.records import (CheckpointingReport, Job, JobState, MemoryReport, Progress,
                           RecordReport, StrategyReport, TrainSummary)
from qlora.steps import EventRecord, StepRecord, WatchRecord

__version__ = version("qlora-client")  # the project's version (CMakeLists.txt), set at build

__all__ = [
    "CheckpointingReport", "Client", "EventRecord", "GeneratedPiece", "Generation", "Job", "JobState", "MemoryReport",
    "Progress", "QloraError", "RecordReport", "StepRecord", "StrategyReport", "TrainSummary",
    "WatchRecord", "connect", "__version__",
]
