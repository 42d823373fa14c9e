"""The client of the coordinator's JobService: connect(), then submit, get, list, cancel,
validate, watch, logs and generate, each taking and returning the typed records of qlora.records and
qlora.steps, and raising QloraError.

Unary calls carry a deadline (`timeout`, 30 s as in qloractl); watch() and a followed logs()
have none, as they last as long as the job.
"""
from __future__ import annotations

import codecs
import dataclasses
import json
import os
import time
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, TypeVar, Union

import grpc

from qlora.connection import Connection, PathLike, open_connection
from qlora.errors import QloraError, from_rpc_error
from qlora.records import Job, JobState, field_value, from_proto
from qlora.steps import StepAssembler, WatchRecord

try:
    from qlora.v1 import job_pb2
    from qlora.v1 import job_service_pb2 as pb
    from qlora.v1 import job_service_pb2_grpc as pb_grpc
except ModuleNotFoundError as e:  # imported from the source folder, where nothing is generated
    raise ImportError(
        "qlora.v1, the gRPC code generated from proto/, is missing: install the client with "
        "`pip install ./clients/python` (it is generated then) rather than importing it from "
        "the source folder") from e

# A job given as a file or as the parsed document.
JobSpec = Union[PathLike, Mapping[str, Any]]
T = TypeVar("T")

_GENERATION_SETTINGS = {"max_new_tokens", "min_new_tokens", "do_sample", "temperature", "top_k",
                        "top_p", "repetition_penalty", "seed"}


@dataclasses.dataclass(frozen=True)
class GeneratedPiece:
    """The next text of one prompt's output; with done, that output is complete and the
    finish reason ("eos", "length", "stop", "context") and token counts are set."""
    prompt_index: int
    text: str
    done: bool
    finish_reason: str
    prompt_tokens: int
    generated_tokens: int


@dataclasses.dataclass(frozen=True)
class Generation:
    """One prompt's whole output."""
    prompt: str
    text: str
    finish_reason: str
    prompt_tokens: int
    generated_tokens: int


# watch() after a lost stream (the coordinator restarted): tries, and the pause between them.
_WATCH_ATTEMPTS = 30
_WATCH_RETRY_PAUSE_S = 1.0


class Client:
    """A connection to one coordinator. Safe to share between threads (gRPC channels are);
    close() it, or use it as a context manager, when done."""

    def __init__(self, connection: Connection, timeout: float = 30.0) -> None:
        self._connection = connection
        self._stub = pb_grpc.JobServiceStub(connection.channel)
        self._timeout = timeout

    @property
    def address(self) -> str:
        return self._connection.address

    def close(self) -> None:
        self._connection.channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- jobs -------------------------------------------------------------------------------

    def submit(self, job: Optional[JobSpec] = None, *, dataset: Optional[PathLike] = None,
               validation_dataset: Optional[PathLike] = None, name: Optional[str] = None,
               base_dir: Optional[PathLike] = None, resume_from: Optional[str] = None) -> Job:
        """Submits a job: a job file's path, or the job as a dict (sent as JSON, which is
        YAML). Relative paths, in the job and in `dataset` / `validation_dataset`, are the
        caller's: they resolve against `base_dir`, by default the current folder, as qloractl's
        do. `dataset` and `validation_dataset` replace the job's; `name` its name.
        `resume_from` (a job id) continues that cancelled or failed job from its newest
        checkpoint, with `job` or, when it is None, that job's own resolved file; the returned
        job's state_message says what changed (`qloractl submit --resume-from`). Returns the
        queued job."""
        if job is None and not resume_from:
            raise QloraError("INVALID_ARGUMENT", "submit() needs a job, or resume_from")
        request = self._submission(job, dataset, validation_dataset, name, base_dir)
        request.resume_from = resume_from or ""
        return from_proto(Job, self._call(self._stub.SubmitJob, request).job)

    def validate(self, job: JobSpec, *, dataset: Optional[PathLike] = None,
                 validation_dataset: Optional[PathLike] = None,
                 base_dir: Optional[PathLike] = None) -> str:
        """The job file with every default resolved, as the coordinator would run it (nothing
        is stored). Takes what submit() takes; INVALID_ARGUMENT names what is wrong."""
        request = self._submission(job, dataset, validation_dataset, None, base_dir)
        return self._call(self._stub.ValidateJob, request).resolved_config_yaml

    def get(self, job_id: str) -> Job:
        """The job `job_id`: NOT_FOUND when there is none."""
        return from_proto(Job, self._call(self._stub.GetJob, pb.GetJobRequest(id=job_id)))

    def list(self, states: Iterable[Union[JobState, str]] = ()) -> list[Job]:
        """Every job in submission order, or those in `states` (JobState or names such as
        "running"), without their job files (get() has them)."""
        request = pb.ListJobsRequest(states=[JobState.parse(s).proto_name for s in states],
                                     page_size=500)
        jobs: list[Job] = []
        while True:  # a page per call, each with its own deadline
            page = self._call(self._stub.ListJobs, request)
            jobs.extend(from_proto(Job, j) for j in page.jobs)
            if not page.next_page_token:
                return jobs
            request.page_token = page.next_page_token

    def cancel(self, job_id: str) -> Job:
        """Cancels a queued or running job; returns it as the coordinator left it (the
        workers stop within seconds: watch() sees CANCELLED)."""
        return from_proto(Job, self._call(self._stub.CancelJob, pb.CancelJobRequest(id=job_id)))

    # -- streams ----------------------------------------------------------------------------

    def watch(self, job_id: str, *, from_start: bool = True,
              after_sequence: int = 0) -> Iterator[WatchRecord]:
        """Follows a job until it ends: a StepRecord per optimizer step (not per rank) and an
        EventRecord per state change or notice; the last record is the EventRecord of the end
        (its `job` has the adapter path and the summary). By default the job's whole stored
        history comes first, so that every step is seen however late the watch starts;
        from_start=False starts from the current state, after_sequence=N after event N. A
        stream lost to a coordinator restart is resumed after the last event seen."""
        assembler = StepAssembler()
        seen, state, answered = after_sequence, JobState.UNSPECIFIED, False
        for attempt in range(_WATCH_ATTEMPTS):
            request = pb.WatchJobRequest(id=job_id, after_sequence=seen,
                                         from_start=from_start and seen == 0)
            stream = self._stub.WatchJob(request, metadata=self._connection.metadata)
            try:
                for response in stream:
                    seen, answered = max(seen, response.event.sequence), True
                    state = field_value(response.job, "state")
                    yield from assembler.add(response)
            except grpc.RpcError as e:
                # Only a stream that was up is resumed: where nothing ever answered, the
                # address is wrong or the coordinator down, and waiting would only hide it.
                if e.code() != grpc.StatusCode.UNAVAILABLE or not answered or attempt + 1 == _WATCH_ATTEMPTS:
                    raise from_rpc_error(e, self.address) from e
                time.sleep(_WATCH_RETRY_PAUSE_S)
                continue
            finally:
                stream.cancel()
            if state.ended:
                yield from assembler.flush()
                return
        raise QloraError("UNAVAILABLE", f"lost the coordinator at {self.address} while watching {job_id}")

    def logs(self, job_id: str, rank: int = 0, *, follow: bool = False) -> Iterator[str]:
        """Rank `rank`'s worker log, as text chunks: what it holds now, or with follow=True
        also what it gains until the job ends."""
        if rank < 0:
            raise QloraError("INVALID_ARGUMENT", f"rank must be 0 or more, not {rank}")
        request = pb.StreamLogsRequest(id=job_id, rank=rank, follow=follow)
        stream = self._stub.StreamLogs(request, metadata=self._connection.metadata,
                                       timeout=None if follow else self._timeout)
        # A chunk may end inside a UTF-8 sequence: decode across chunks.
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            for chunk in stream:
                text = decoder.decode(chunk.data)
                if text:
                    yield text
        except grpc.RpcError as e:
            raise from_rpc_error(e, self.address) from e
        finally:
            stream.cancel()
        tail = decoder.decode(b"", final=True)
        if tail:
            yield tail

    def generate_stream(self, job_id: str, prompts: Union[str, Iterable[str]], *,
                        checkpoint: str = "", stop: Iterable[str] = (),
                        **settings: Any) -> Iterator[GeneratedPiece]:
        """Generates with a succeeded job's adapter (or `checkpoint`, "step-N"), on a worker the
        coordinator starts on a free slot; yields each piece of text as it comes, prompt after
        prompt. A prompt is text, or a JSON object with the template's columns or a
        conversation (`messages`). `settings` are HF GenerationConfig's names: max_new_tokens,
        min_new_tokens, do_sample, temperature, top_k, top_p, repetition_penalty, and seed;
        unset ones come from the job's generation: section, then the model's
        generation_config.json (greedy by default)."""
        prompt_list = [prompts] if isinstance(prompts, str) else list(prompts)
        unknown = sorted(set(settings) - _GENERATION_SETTINGS)
        if unknown:
            raise QloraError("INVALID_ARGUMENT", f"unknown generation setting(s) {unknown}; "
                             f"known: {sorted(_GENERATION_SETTINGS)}")
        parameters = job_pb2.GenerationParameters(stop=list(stop), **settings)
        request = pb.GenerateRequest(job_id=job_id, prompts=prompt_list, parameters=parameters,
                                     checkpoint=checkpoint)
        stream = self._stub.Generate(request, metadata=self._connection.metadata)
        try:
            for piece in stream:
                yield GeneratedPiece(prompt_index=piece.prompt_index, text=piece.text,
                                     done=piece.done, finish_reason=piece.finish_reason,
                                     prompt_tokens=piece.prompt_tokens,
                                     generated_tokens=piece.generated_tokens)
        except grpc.RpcError as e:
            raise from_rpc_error(e, self.address) from e
        finally:
            stream.cancel()

    def generate(self, job_id: str, prompts: Union[str, Iterable[str]], **kwargs: Any) -> list[Generation]:
        """generate_stream(), gathered: one Generation per prompt, in order."""
        prompt_list = [prompts] if isinstance(prompts, str) else list(prompts)
        texts: dict[int, list[str]] = {}
        out: list[Generation] = []
        for piece in self.generate_stream(job_id, prompt_list, **kwargs):
            texts.setdefault(piece.prompt_index, []).append(piece.text)
            if piece.done:
                out.append(Generation(prompt=prompt_list[piece.prompt_index],
                                      text="".join(texts.pop(piece.prompt_index)),
                                      finish_reason=piece.finish_reason,
                                      prompt_tokens=piece.prompt_tokens,
                                      generated_tokens=piece.generated_tokens))
        return out

    # -- helpers ----------------------------------------------------------------------------

    def _call(self, method: Callable[..., T], request: Any) -> T:
        try:
            return method(request, metadata=self._connection.metadata, timeout=self._timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e, self.address) from e

    @staticmethod
    def _submission(job: Optional[JobSpec], dataset: Optional[PathLike],
                    validation_dataset: Optional[PathLike], name: Optional[str],
                    base_dir: Optional[PathLike]) -> Any:
        folder = os.path.abspath(base_dir if base_dir is not None else os.getcwd())

        def absolute(path: Optional[PathLike]) -> str:
            return os.path.join(folder, path) if path else ""

        if job is None:
            text, source = "", ""  # resume_from alone: the continued job's resolved file
        elif isinstance(job, Mapping):
            try:
                # JSON is YAML; indented, so that the line numbers in errors point somewhere.
                text, source = json.dumps(job, indent=2, allow_nan=False), "the job dict"
            except (TypeError, ValueError) as e:
                raise QloraError("INVALID_ARGUMENT", f"the job dict is not plain data: {e}") from e
        else:
            source = os.fspath(job)
            try:
                with open(job, encoding="utf-8") as f:
                    text = f.read()
            except OSError as e:
                raise QloraError("INVALID_ARGUMENT", f"job file {source}: {e.strerror}") from e
        return pb.SubmitJobRequest(job_yaml=text, source_name=source, base_dir=folder,
                                   dataset=absolute(dataset),
                                   validation_dataset=absolute(validation_dataset),
                                   name=name or "")


def connect(address: Optional[str] = None, *, token: Optional[str] = None,
            token_file: Optional[PathLike] = None, tls: Optional[bool] = None,
            tls_ca: Optional[PathLike] = None, tls_cert: Optional[PathLike] = None,
            tls_key: Optional[PathLike] = None, tls_server_name: Optional[str] = None,
            timeout: float = 30.0) -> Client:
    """A client of the coordinator at `address`. Every argument left out comes from the
    environment variable qloractl reads (see qlora.connection): QLORA_ADDRESS (default
    127.0.0.1:50051), QLORA_TLS, QLORA_TLS_CA, QLORA_TLS_CERT, QLORA_TLS_KEY,
    QLORA_TLS_SERVER_NAME, QLORA_TOKEN_FILE, QLORA_TOKEN. Nothing is dialled until the first
    call. `timeout`: the deadline of each unary call, in seconds."""
    return Client(open_connection(address, token=token, token_file=token_file, tls=tls,
                                  tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key,
                                  tls_server_name=tls_server_name), timeout)
