#!/usr/bin/env python3
"""The Python client (clients/python) as a user gets it: its wheel is built with pip from the
checkout (offline) and installed, then every call runs against a real qlora-coordinator training
the demo's tiny model on 2 CPU workers, against one restarted under a watch, and against one with
TLS and bearer tokens. Also, without a server: the records cover every field of the protos, the
steps are assembled as `qloractl watch -o json` assembles them, and the connection reads
qloractl's environment variables.

    python3 tests/client/python_client_test.py BUILD_DIR SOURCE_DIR [unittest arguments]

It runs in $QLORA_PYTHON (or the QLORA_CONFIGURED_PYTHON that ctest passes), re-executing
itself there, since the client needs grpcio and protobuf; exit status 77 (skipped) when no
Python at hand has them.
"""
from __future__ import annotations

import dataclasses
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import zipfile
from pathlib import Path
from typing import Any, Optional
from unittest import mock

SKIPPED = 77
qlora: Any = None  # the client as the wheel installed it: main() imports it before the tests run
STEPS = 5          # the short job's optimizer steps
CPU_WORKERS = 2    # so that every step is reported by two ranks


def reference_python_or_skip() -> None:
    """Re-executes this script under $QLORA_PYTHON where that is another Python; skips (77)
    when the Python it ends up in lacks grpcio or protobuf."""
    python = os.environ.get("QLORA_PYTHON") or os.environ.get("QLORA_CONFIGURED_PYTHON")
    # Compared by environment (PREFIX/bin/python), since a venv's python links to its base's.
    home = os.path.realpath(os.path.join(os.path.dirname(python or "."), os.pardir))
    if python and os.access(python, os.X_OK) and home != os.path.realpath(sys.prefix):
        os.execv(python, [python] + sys.argv)
    try:
        import grpc  # noqa: F401
        import google.protobuf  # noqa: F401
    except ImportError:
        print("SKIPPED: no Python with grpcio and protobuf ($QLORA_PYTHON is not set)")
        sys.exit(SKIPPED)


def run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
    """`command`, which must succeed; its output is in the failure."""
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return done


@dataclasses.dataclass(frozen=True)
class Setup:
    """What every test shares: the folders, the built wheel and where it is installed."""

    build: Path
    source: Path
    work: Path
    wheel: Path
    site: Path          # the wheel's installation, first on sys.path
    model: Path         # the demo's tiny model, with the example tokenizer


def build_and_install(build: Path, source: Path, work: Path) -> Setup:
    """The wheel made by `pip wheel` from the checkout (offline), installed into its own
    folder, and the tiny model."""
    dist, site = work / "dist", work / "site"
    run([sys.executable, "-m", "pip", "wheel", "--no-index", "--no-deps", "-w", str(dist),
         str(source / "clients" / "python")])
    wheels = list(dist.glob("*.whl"))
    assert len(wheels) == 1 and wheels[0].name.endswith("-py3-none-any.whl"), wheels
    run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--target", str(site),
         str(wheels[0])])
    model = work / "tiny"
    run([str(build / "worker" / "engine" / "qlora-make-tiny-model"), str(model),
         f"--flagfile={source / 'examples' / 'tiny-model.flags'}"])
    for f in (source / "examples" / "tokenizer").iterdir():
        shutil.copy(f, model)
    return Setup(build, source, work, wheels[0], site, model)


class Coordinator:
    """A qlora-coordinator on a free loopback port, with its own state folder."""

    def __init__(self, setup: Setup, name: str, flags: list[str], cpu_workers: int) -> None:
        self.state = setup.work / name
        self.state.mkdir()
        self.log = self.state / "coordinator.log"
        self.command = [str(setup.build / "coordinator" / "qlora-coordinator"), "--state-dir", str(self.state),
                        "--port-file", str(self.state / "port"), "--cpu-workers", str(cpu_workers), *flags]
        self.address = self._start("127.0.0.1:0")

    def _start(self, address: str) -> str:
        """Starts it on `address`; the address it listens on."""
        port_file = self.state / "port"
        port_file.unlink(missing_ok=True)
        with open(self.log, "a") as log:
            self.process = subprocess.Popen(self.command + ["--address", address], stdout=log,
                                            stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the coordinator did not start:\n{self.log_text()}")
            time.sleep(0.05)
        return f"127.0.0.1:{port_file.read_text().strip()}"

    def restart(self) -> None:
        """Stops it and starts it again on the same port and state folder."""
        self.stop()
        self._start(self.address)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def qlora_env(**variables: str) -> Any:
    """os.environ without any QLORA_* variable but `variables`, while in the `with`."""
    kept = {k: v for k, v in os.environ.items() if not k.startswith("QLORA_")}
    return mock.patch.dict(os.environ, {**kept, **variables}, clear=True)


def short_job(setup: Setup, steps: int = STEPS) -> dict[str, Any]:
    """A job as a dict: a few optimizer steps of the tiny model, quick on CPUs. Its dataset is
    relative, to be resolved against base_dir."""
    return {
        "base_model": str(setup.model),
        "dataset": "examples/data/train.jsonl",
        "adapter": {"type": "lora", "target_modules": "all-linear"},
        "trainer": {"batch_size": 1, "gradient_accumulation_steps": 2, "train_steps": steps,
                    "learning_rate": 0.001},
        "data": {"max_sequence_length": 48},
    }


@dataclasses.dataclass
class Context:
    setup: Optional[Setup] = None


CONTEXT = Context()  # set once by main() before the tests run


class InstalledWheelTest(unittest.TestCase):
    def test_the_wheel_carries_the_generated_code_and_its_dependencies(self) -> None:
        setup = CONTEXT.setup
        self.assertTrue(qlora.__file__.startswith(str(setup.site)), qlora.__file__)
        with zipfile.ZipFile(setup.wheel) as wheel:
            names = wheel.namelist()
            metadata = next(wheel.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
        for module in ("qlora/client.py", "qlora/py.typed", "qlora/v1/job_pb2.py",
                       "qlora/v1/job_service_pb2_grpc.py"):
            self.assertIn(module, names)
        self.assertIn("Name: qlora-client", metadata)
        self.assertIn("Requires-Dist: grpcio", metadata)
        self.assertIn("Requires-Dist: protobuf", metadata)
        self.assertRegex(qlora.__version__, r"^\d+\.\d+\.\d+$")

    def test_the_checkout_installs_with_pip(self) -> None:
        setup = CONTEXT.setup
        target = setup.work / "site-from-checkout"
        run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--target", str(target),
             str(setup.source / "clients" / "python")])
        self.assertTrue((target / "qlora" / "v1" / "job_service_pb2_grpc.py").is_file())

    def test_a_build_without_protoc_names_the_debian_package(self) -> None:
        import importlib.util
        if importlib.util.find_spec("grpc_tools") is not None:
            self.skipTest("grpcio-tools is installed: the build falls back to it")
        setup = CONTEXT.setup
        done = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-index", "--no-deps", "-w", str(setup.work / "none"),
             str(setup.source / "clients" / "python")],
            capture_output=True, text=True, env={**os.environ, "PATH": "/nonexistent"})
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("protobuf-compiler-grpc", done.stdout + done.stderr)


class RecordsTest(unittest.TestCase):
    """The typed layer without a server."""

    def test_every_proto_field_has_a_record_field(self) -> None:
        from qlora import records
        from qlora.v1 import job_pb2
        for full_name, record in records.MESSAGE_RECORDS.items():
            descriptor = job_pb2.DESCRIPTOR.message_types_by_name[full_name.split(".")[-1]]
            self.assertEqual([f.name for f in dataclasses.fields(record)],
                             [f.name for f in descriptor.fields], full_name)
        event_fields = {f.name for f in job_pb2.JobEvent.DESCRIPTOR.fields} - {"progress"}
        self.assertLessEqual(event_fields, {f.name for f in dataclasses.fields(qlora.EventRecord)})

    def test_steps_go_out_once_every_rank_reported_them_or_the_job_moved_on(self) -> None:
        from qlora.steps import StepAssembler
        from qlora.v1 import job_pb2, job_service_pb2

        def progress(rank: int, step: int, world: int = 2) -> Any:
            p = job_pb2.Progress(rank=rank, step=step, total_steps=9, loss=1.0 + step,
                                 tokens_per_second=100.0 + rank, elapsed_seconds=step + rank,
                                 eval_loss=math.nan, strategy=job_pb2.StrategyReport(world_size=world))
            return job_service_pb2.WatchJobResponse(
                job=job_pb2.Job(id="job-7", num_workers=2, state=job_pb2.JOB_STATE_RUNNING),
                event=job_pb2.JobEvent(progress=p, state=job_pb2.JOB_STATE_RUNNING))

        assembler = StepAssembler()
        self.assertEqual(assembler.add(progress(0, 1)), [])
        [one] = assembler.add(progress(1, 1))
        self.assertEqual((one.job_id, one.step, one.total_steps), ("job-7", 1, 9))
        self.assertEqual(one.tokens_per_second, 201.0)  # summed over the ranks
        self.assertEqual(one.elapsed_seconds, 2.0)      # the longest
        self.assertEqual([r.rank for r in one.ranks], [0, 1])
        self.assertTrue(math.isnan(one.eval_loss))
        self.assertEqual(assembler.add(progress(0, 0)), [])  # before the first step: nothing
        # Step 2 lacks rank 1's report; it goes out when step 3 is whole.
        self.assertEqual(assembler.add(progress(0, 2)), [])
        self.assertEqual(assembler.add(progress(0, 3)), [])
        self.assertEqual([(r.step, len(r.ranks)) for r in assembler.add(progress(1, 3))], [(2, 1), (3, 2)])
        # Without a strategy report, the job's workers count.
        self.assertEqual(assembler.add(progress(0, 4, world=0)), [])
        # Another event: the steps still waiting go out first.
        ended = job_service_pb2.WatchJobResponse(
            job=job_pb2.Job(id="job-7", state=job_pb2.JOB_STATE_CANCELLED),
            event=job_pb2.JobEvent(sequence=12, state=job_pb2.JOB_STATE_CANCELLED,
                                   reason_code="CANCELLED_BY_USER", message="cancelled"))
        step, event = assembler.add(ended)
        self.assertIsInstance(step, qlora.StepRecord)
        self.assertEqual(step.step, 4)
        self.assertIsInstance(event, qlora.EventRecord)
        self.assertEqual((event.sequence, event.state, event.reason_code), (12, qlora.JobState.CANCELLED,
                                                                           "CANCELLED_BY_USER"))
        self.assertTrue(event.state.ended)
        self.assertEqual((str(event.state), f"{event.state}"), ("CANCELLED", "CANCELLED"))
        self.assertEqual(event.job.state, "CANCELLED")
        self.assertEqual(assembler.flush(), [])


class ConnectionTest(unittest.TestCase):
    """connect()'s settings without a server."""

    def test_address_and_token_come_from_qloractls_variables(self) -> None:
        from qlora.connection import DEFAULT_ADDRESS, open_connection
        token_file = CONTEXT.setup.work / "token"
        token_file.write_text("from-the-file\n")
        self.assertEqual(open_connection(env={}).address, DEFAULT_ADDRESS)
        self.assertEqual(open_connection(env={}).metadata, ())
        connection = open_connection(env={"QLORA_ADDRESS": "10.1.2.3:7", "QLORA_TOKEN": "t"})
        self.assertEqual((connection.address, connection.metadata), ("10.1.2.3:7", (("authorization", "Bearer t"),)))
        # The file wins over the variable, as in qloractl; an argument over both.
        env = {"QLORA_TOKEN": "t", "QLORA_TOKEN_FILE": str(token_file)}
        self.assertEqual(open_connection(env=env).metadata, (("authorization", "Bearer from-the-file"),))
        self.assertEqual(open_connection(env=env, token="arg").metadata, (("authorization", "Bearer arg"),))

    def test_bad_credentials_files_are_named(self) -> None:
        from qlora.connection import open_connection
        empty = CONTEXT.setup.work / "empty-token"
        empty.write_text("\n")
        with self.assertRaises(qlora.QloraError) as raised:
            open_connection(env={"QLORA_TOKEN_FILE": str(empty)})
        self.assertEqual(raised.exception.code, "INVALID_ARGUMENT")
        self.assertIn("empty-token is empty", raised.exception.message)
        with self.assertRaises(qlora.QloraError) as raised:
            open_connection(env={"QLORA_TLS_CA": "/no/such/ca.crt"})
        self.assertIn("/no/such/ca.crt", raised.exception.message)
        with self.assertRaises(qlora.QloraError) as raised:
            open_connection(env={"QLORA_TLS_CERT": str(empty)})
        self.assertIn("needs its key", raised.exception.message)


class ServiceTest(unittest.TestCase):
    """Every call against a coordinator with 2 CPU workers, in plaintext on loopback."""

    coordinator: Coordinator
    client: Any

    @classmethod
    def setUpClass(cls) -> None:
        cls.coordinator = Coordinator(CONTEXT.setup, "plain", [], CPU_WORKERS)
        cls.addClassCleanup(cls.coordinator.stop)
        cls.client = qlora.connect(cls.coordinator.address)
        cls.addClassCleanup(cls.client.close)

    def watch_records(self, job_id: str, **kwargs: Any) -> list[Any]:
        return list(self.client.watch(job_id, **kwargs))

    def test_a_dict_job_trains_to_the_end_one_record_per_step(self) -> None:
        setup = CONTEXT.setup
        job = self.client.submit(short_job(setup), base_dir=setup.source, name="from-a-dict")
        self.assertEqual(job.name, "from-a-dict")
        records = self.watch_records(job.id)
        log = self.coordinator.log_text()

        steps = [r for r in records if isinstance(r, qlora.StepRecord)]
        self.assertEqual([s.step for s in steps], list(range(1, STEPS + 1)), log)
        for s in steps:
            self.assertIs(type(s.step), int)
            self.assertIs(type(s.total_steps), int)
            self.assertIs(type(s.epoch), int)
            self.assertEqual(s.total_steps, STEPS)
            self.assertIs(type(s.loss), float)
            self.assertTrue(math.isfinite(s.loss) and s.loss > 0, s.loss)
            self.assertEqual([r.rank for r in s.ranks], list(range(CPU_WORKERS)))  # one record, every rank
            self.assertAlmostEqual(s.tokens_per_second, sum(r.tokens_per_second for r in s.ranks))
            self.assertEqual(s.elapsed_seconds, max(r.elapsed_seconds for r in s.ranks))
            self.assertIs(type(s.ranks[0].memory.host_rss_bytes), int)
            self.assertIs(type(s.ranks[0].total_records.trained), int)
        events = [r for r in records if isinstance(r, qlora.EventRecord)]
        self.assertEqual((events[0].state, events[0].reason_code), (qlora.JobState.QUEUED, "SUBMITTED"))
        self.assertEqual([e.sequence for e in events], sorted({e.sequence for e in events}))
        end = records[-1]
        self.assertIsInstance(end, qlora.EventRecord)
        self.assertEqual(end.state, qlora.JobState.SUCCEEDED, f"{end.message}\n{log}")
        self.assertTrue((Path(end.job.adapter_path) / "adapter_config.json").is_file(), end.job.adapter_path)

        got = self.client.get(job.id)
        self.assertEqual((got.id, got.state), (job.id, qlora.JobState.SUCCEEDED))
        self.assertIs(type(got.summary.steps), int)
        self.assertEqual(got.summary.steps, STEPS)
        self.assertIn("all-linear", got.job_yaml)  # the dict, sent as JSON
        self.assertIn(job.id, [j.id for j in self.client.list()])
        self.assertIn(job.id, [j.id for j in self.client.list(states=["succeeded"])])
        self.assertNotIn(job.id, [j.id for j in self.client.list(states=[qlora.JobState.CANCELLED])])

        # From the current state: the end alone.
        [now] = self.watch_records(job.id, from_start=False)
        self.assertEqual(now.state, qlora.JobState.SUCCEEDED)

        self.assertIn(f"step 1/{STEPS} loss", "".join(self.client.logs(job.id)))
        self.assertIn(f"step {STEPS}/{STEPS} loss", "".join(self.client.logs(job.id, follow=True)))
        self.assertIn("[rank 1]", "".join(self.client.logs(job.id, rank=1)))

        # Generation with the trained adapter: pieces as they come, or gathered per prompt,
        # as qloractl generate gives them; a seed repeats a sampled text.
        pieces = list(self.client.generate_stream(job.id, ["Name a colour.", "Hi"], max_new_tokens=8))
        self.assertEqual([p.prompt_index for p in pieces if p.done], [0, 1])
        done = [p for p in pieces if p.done]
        self.assertTrue(all(p.finish_reason in ("eos", "length") and 1 <= p.generated_tokens <= 8
                            for p in done), done)
        gathered = self.client.generate(job.id, ["Name a colour.", "Hi"], max_new_tokens=8)
        self.assertEqual([g.text for g in gathered],
                         ["".join(p.text for p in pieces if p.prompt_index == i) for i in (0, 1)])
        sampled = [self.client.generate(job.id, "Hi", do_sample=True, temperature=2.0, top_k=0,
                                        min_new_tokens=8, max_new_tokens=8, seed=5)[0].text
                   for _ in range(2)]
        self.assertEqual(sampled[0], sampled[1])
        with self.assertRaises(qlora.QloraError) as bad:
            self.client.generate(job.id, "Hi", top_p=2.0)
        self.assertEqual(bad.exception.code, "INVALID_ARGUMENT")
        with self.assertRaises(qlora.QloraError):
            self.client.generate(job.id, "Hi", beams=2)

    def test_a_job_file_with_relative_paths_is_cancelled(self) -> None:
        setup = CONTEXT.setup
        folder = setup.work / "user"
        (folder / "data").mkdir(parents=True)
        shutil.copy(setup.source / "examples" / "data" / "train.jsonl", folder / "data")
        (folder / "long.yaml").write_text(
            f"base_model: {setup.model}\nadapter: {{type: lora}}\n"
            "trainer: {batch_size: 1, train_steps: 100000, learning_rate: 0.001}\n"
            "data: {max_sequence_length: 48}\n")
        cwd = os.getcwd()
        os.chdir(folder)  # the file and the dataset are relative to the current folder
        try:
            job = self.client.submit("long.yaml", dataset="data/train.jsonl")
        finally:
            os.chdir(cwd)
        records = []
        for record in self.client.watch(job.id):
            records.append(record)
            if isinstance(record, qlora.StepRecord) and record.step == 1:
                self.assertEqual(self.client.cancel(job.id).id, job.id)
        end = records[-1]
        self.assertEqual((end.state, end.reason_code), (qlora.JobState.CANCELLED, "CANCELLED_BY_USER"),
                         self.coordinator.log_text())
        self.assertGreaterEqual(len([r for r in records if isinstance(r, qlora.StepRecord)]), 1)
        self.assertEqual(self.client.get(job.id).state, qlora.JobState.CANCELLED)
        # Cancelled after one step, long before its first checkpoint: nothing to continue.
        with self.assertRaises(qlora.QloraError) as raised:
            self.client.submit(resume_from=job.id)
        self.assertEqual(raised.exception.code, "FAILED_PRECONDITION")
        self.assertIn("no complete checkpoint", raised.exception.message)

    def test_errors_carry_the_status_code_and_the_reason(self) -> None:
        setup = CONTEXT.setup
        with self.assertRaises(qlora.QloraError) as raised:
            self.client.get("job-999999")
        self.assertEqual(raised.exception.code, "NOT_FOUND")
        self.assertIn("job-999999", raised.exception.message)
        with self.assertRaises(qlora.QloraError) as raised:
            list(self.client.watch("job-999999"))
        self.assertEqual(raised.exception.code, "NOT_FOUND")
        with self.assertRaises(qlora.QloraError) as raised:
            self.client.submit(setup.work / "no-such-job.yaml")
        self.assertEqual(raised.exception.code, "INVALID_ARGUMENT")
        self.assertIn("no-such-job.yaml", raised.exception.message)
        misspelled = short_job(setup)
        misspelled["trainer"]["batch_sise"] = misspelled["trainer"].pop("batch_size")
        with self.assertRaises(qlora.QloraError) as raised:
            self.client.submit(misspelled, base_dir=setup.source)
        self.assertEqual(raised.exception.code, "INVALID_ARGUMENT")
        self.assertIn("batch_size", raised.exception.message)  # the closest valid name
        with self.assertRaises(qlora.QloraError) as raised:
            next(self.client.logs("job-000001", rank=-1))
        self.assertEqual(raised.exception.code, "INVALID_ARGUMENT")
        nowhere = qlora.connect("127.0.0.1:1", timeout=10)
        for call in (nowhere.list, lambda: list(nowhere.watch("job-000001"))):
            with self.assertRaises(qlora.QloraError) as raised:
                call()
            self.assertEqual(raised.exception.code, "UNAVAILABLE")
            self.assertIn("nothing answered at 127.0.0.1:1", raised.exception.message)

    def test_validate_resolves_without_storing(self) -> None:
        setup = CONTEXT.setup
        before = len(self.client.list())
        resolved = self.client.validate(short_job(setup), base_dir=setup.source)
        self.assertIn(f"train_steps: {STEPS}", resolved)
        self.assertIn(str(setup.source / "examples" / "data" / "train.jsonl"), resolved)
        self.assertEqual(len(self.client.list()), before)


class RestartTest(unittest.TestCase):
    """watch() across a restart of the coordinator: it resumes after the last event it saw."""

    def test_a_watch_outlives_a_coordinator_restart(self) -> None:
        setup = CONTEXT.setup
        coordinator = Coordinator(setup, "restarted", [], cpu_workers=1)
        self.addCleanup(coordinator.stop)
        with qlora.connect(coordinator.address) as client:
            job = client.submit(short_job(setup, steps=100000), base_dir=setup.source)
            restarted_after, cancelled = 0, False
            records = []
            for record in client.watch(job.id):
                records.append(record)
                if isinstance(record, qlora.StepRecord) and not restarted_after:
                    restarted_after = len(records)
                    coordinator.restart()  # the job is queued again
                elif restarted_after and not cancelled:  # the watch resumed at the new coordinator
                    client.cancel(job.id)
                    cancelled = True
        after = records[restarted_after:]
        self.assertTrue(restarted_after, coordinator.log_text())
        self.assertIn(qlora.JobState.QUEUED, [r.state for r in after if isinstance(r, qlora.EventRecord)])
        self.assertEqual(records[-1].state, qlora.JobState.CANCELLED, coordinator.log_text())
        sequences = [r.sequence for r in records if isinstance(r, qlora.EventRecord)]
        self.assertEqual(sequences, sorted(set(sequences)))  # nothing seen twice


class SecureServiceTest(unittest.TestCase):
    """A coordinator with TLS and bearer tokens, reached through qloractl's variables."""

    TOKEN = "alice-token-0123456789abcdef"
    coordinator: Coordinator
    pki: Path

    @classmethod
    def setUpClass(cls) -> None:
        setup = CONTEXT.setup
        cls.pki = setup.work / "pki"
        cls.pki.mkdir()
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        run(["openssl", "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=test-ca"], cwd=cls.pki)
        run(["openssl", "req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost"],
            cwd=cls.pki)
        (cls.pki / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        run(["openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "server.ext"], cwd=cls.pki)
        # The tokens file, made as an operator makes it.
        line = run([str(setup.build / "cli" / "qloractl"), "hash-token", "--user", "alice"],
                   input=cls.TOKEN + "\n").stdout
        tokens = setup.work / "tokens"
        tokens.write_text(line)
        tokens.chmod(0o600)
        cls.coordinator = Coordinator(setup, "secure", [
            "--tls-cert", str(cls.pki / "server.crt"), "--tls-key", str(cls.pki / "server.key"),
            "--tls-ca", str(cls.pki / "ca.crt"), "--auth-tokens", str(tokens)], cpu_workers=1)
        cls.addClassCleanup(cls.coordinator.stop)

    def connect(self, **variables: str) -> Any:
        with qlora_env(QLORA_ADDRESS=self.coordinator.address, QLORA_TLS_CA=str(self.pki / "ca.crt"),
                       **variables):
            return qlora.connect()

    def test_calls_without_a_valid_token_are_unauthenticated(self) -> None:
        for variables, reason in (({}, "no credentials"), ({"QLORA_TOKEN": "guessed-token-0123456789"}, "not valid")):
            with self.connect(**variables) as client, self.assertRaises(qlora.QloraError) as raised:
                client.list()
            self.assertEqual(raised.exception.code, "UNAUTHENTICATED")
            self.assertIn(reason, raised.exception.message)

    def test_the_token_from_the_environment_or_a_file_authenticates(self) -> None:
        setup = CONTEXT.setup
        with self.connect(QLORA_TOKEN=self.TOKEN) as client:
            job = client.submit(short_job(setup, steps=2), base_dir=setup.source)
            self.assertEqual(job.owner, "alice")
            client.cancel(job.id)
            self.assertTrue(list(client.watch(job.id))[-1].state.ended)
        token_file = setup.work / "alice.token"
        token_file.write_text(self.TOKEN + "\n")
        with self.connect(QLORA_TOKEN_FILE=str(token_file)) as client:
            self.assertEqual(client.get(job.id).owner, "alice")
        with qlora_env(), qlora.connect(self.coordinator.address, tls_ca=self.pki / "ca.crt",
                                        token_file=token_file) as client:
            self.assertIn(job.id, [j.id for j in client.list()])


def main() -> int:
    reference_python_or_skip()
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    build, source = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    with tempfile.TemporaryDirectory(prefix="qlora-python-client-") as work:
        setup = build_and_install(build, source, Path(work))
        sys.path.insert(0, str(setup.site))
        global qlora
        import qlora
        CONTEXT.setup = setup
        program = unittest.main(argv=[sys.argv[0]] + sys.argv[3:], exit=False, verbosity=2)
        return 0 if program.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
