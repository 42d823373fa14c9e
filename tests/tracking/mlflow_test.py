#!/usr/bin/env python3
"""report_to: mlflow against a real MLflow tracking server (`mlflow server`, started here on a
free loopback port with a SQLite store and its artifact proxy): a job on a real coordinator and
CPU workers reports its params, every step's metrics and its adapter, and ends the run FINISHED;
read back with mlflow's own client. A server that is down does not fail the job nor hold it up,
and the worker's log says so once. A coordinator without MLFLOW_TRACKING_URI refuses such a job
at submit, and report_to: wandb is refused with its reason.
    python3 tests/tracking/mlflow_test.py BUILD_DIR SOURCE_DIR
It runs in $QLORA_MLFLOW_PYTHON (the mlflow environment scripts/setup.sh makes), re-executing
itself there; exit status 77 (skipped) without it.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

SKIPPED = 77
STEPS = 4


def mlflow_python_or_skip() -> None:
    python = os.environ.get("QLORA_MLFLOW_PYTHON", "")
    home = os.path.realpath(os.path.join(os.path.dirname(python or "."), os.pardir))
    if python and os.access(python, os.X_OK) and home != os.path.realpath(sys.prefix):
        os.execv(python, [python] + sys.argv)
    try:
        import mlflow  # noqa: F401
    except ImportError:
        print("SKIPPED: no Python with mlflow ($QLORA_MLFLOW_PYTHON is not set)")
        sys.exit(SKIPPED)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(command, **kwargs):
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, command))} exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return done


class Coordinator:
    """A qlora-coordinator on a free loopback port, with `env` added to its environment."""

    def __init__(self, build: Path, state: Path, env: dict[str, str]) -> None:
        state.mkdir(parents=True)
        self.state, self.build = state, build
        self.log = state / "coordinator.log"
        environment = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        environment.update(env)
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                [str(build / "coordinator" / "qlora-coordinator"), "--state-dir", str(state),
                 "--port-file", str(state / "port"), "--cpu-workers", "1", "--address", "127.0.0.1:0"],
                stdout=log, stderr=subprocess.STDOUT, env=environment)
        deadline = time.monotonic() + 30
        while not ((state / "port").exists() and (state / "port").read_text().strip()):
            assert self.process.poll() is None and time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.05)
        self.address = f"127.0.0.1:{(state / 'port').read_text().strip()}"

    def ctl(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.build / "cli" / "qloractl"), "--address", self.address, *args],
                              capture_output=True, text=True)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)


class MlflowTest(unittest.TestCase):
    build: Path
    source: Path

    @classmethod
    def setUpClass(cls) -> None:
        cls.work = Path(tempfile.mkdtemp(prefix="qlora-mlflow-"))
        cls.addClassCleanup(shutil.rmtree, cls.work, ignore_errors=True)
        cls.model = cls.work / "tiny"
        run([str(cls.build / "worker" / "engine" / "qlora-make-tiny-model"), str(cls.model),
             f"--flagfile={cls.source / 'examples' / 'tiny-model.flags'}"])
        for f in (cls.source / "examples" / "tokenizer").iterdir():
            shutil.copy(f, cls.model)
        port = free_port()
        cls.uri = f"http://127.0.0.1:{port}"
        cls.server_log = open(cls.work / "mlflow.log", "w")
        cls.server = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
             "--backend-store-uri", f"sqlite:///{cls.work / 'mlflow.db'}",
             "--artifacts-destination", str(cls.work / "artifacts"), "--workers", "1"],
            stdout=cls.server_log, stderr=subprocess.STDOUT)
        cls.addClassCleanup(cls.stop_server)
        import urllib.request
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(cls.uri + "/health", timeout=2)
                break
            except OSError:
                assert cls.server.poll() is None and time.monotonic() < deadline, (cls.work / "mlflow.log").read_text()
                time.sleep(0.5)

    @classmethod
    def stop_server(cls) -> None:
        cls.server.terminate()
        try:
            cls.server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            cls.server.kill()
        cls.server_log.close()

    def job_file(self, name: str, report_to: object = ("tensorboard", "mlflow")) -> Path:
        path = self.work / f"{name}.yaml"
        path.write_text(json.dumps({
            "name": name,
            "base_model": str(self.model),
            "dataset": str(self.source / "examples" / "data" / "train.jsonl"),
            "adapter": {"type": "lora", "target_modules": "all-linear"},
            "trainer": {"batch_size": 1, "gradient_accumulation_steps": 2, "train_steps": STEPS,
                        "learning_rate": 0.001, "report_to": report_to if isinstance(report_to, str) else list(report_to)},
            "data": {"max_sequence_length": 48},
        }))
        return path

    def run_job(self, coordinator: Coordinator, name: str) -> tuple[str, float]:
        submitted = coordinator.ctl("submit", str(self.job_file(name)))
        self.assertEqual(submitted.returncode, 0, submitted.stdout + submitted.stderr)
        job = submitted.stdout.split()[0]
        start = time.monotonic()
        watched = coordinator.ctl("watch", job)
        self.assertEqual(watched.returncode, 0, watched.stdout + watched.stderr)
        return job, time.monotonic() - start

    def test_a_job_reports_params_metrics_and_its_adapter(self) -> None:
        import mlflow
        from mlflow.tracking import MlflowClient
        coordinator = Coordinator(self.build, self.work / "up", {
            "MLFLOW_TRACKING_URI": self.uri, "MLFLOW_EXPERIMENT_NAME": "qlora-tests"})
        self.addCleanup(coordinator.stop)
        job, _ = self.run_job(coordinator, "tracked")
        client = MlflowClient(self.uri)
        experiment = client.get_experiment_by_name("qlora-tests")
        self.assertIsNotNone(experiment)
        [run] = client.search_runs([experiment.experiment_id])
        self.assertEqual(run.info.run_name, "tracked")
        self.assertEqual(run.info.status, "FINISHED")
        self.assertEqual(run.data.tags["qlora.job_id"], job)
        self.assertEqual(run.data.params["trainer.learning_rate"], "0.001")
        self.assertIn("adapter.r", run.data.params)
        losses = client.get_metric_history(run.info.run_id, "loss")
        self.assertEqual([m.step for m in losses], list(range(1, STEPS + 1)))
        metrics_file = self.work / "up" / "jobs" / job / "output" / "metrics.jsonl"
        written = [json.loads(line) for line in metrics_file.read_text().splitlines() if '"loss"' in line]
        self.assertEqual([m.value for m in losses], [w["loss"] for w in written])
        for key in ("learning_rate", "grad_norm", "epoch", "tokens_per_second"):
            self.assertEqual(len(client.get_metric_history(run.info.run_id, key)), STEPS, key)
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "adapter")}
        self.assertIn("adapter/adapter_model.safetensors", artifacts)
        self.assertIn("adapter/adapter_config.json", artifacts)
        local = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="adapter",
                                                    tracking_uri=self.uri, dst_path=str(self.work / "dl"))
        adapter = self.work / "up" / "jobs" / job / "output" / "adapter"
        self.assertEqual((Path(local) / "adapter_model.safetensors").read_bytes(),
                         (adapter / "adapter_model.safetensors").read_bytes())

    def test_a_server_that_is_down_neither_fails_nor_holds_the_job(self) -> None:
        down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
        plain = Coordinator(self.build, self.work / "plain", {})
        self.addCleanup(plain.stop)
        submitted = plain.ctl("submit", str(self.job_file("refused")))
        self.assertEqual(submitted.returncode, 3, submitted.stdout + submitted.stderr)  # FAILED_PRECONDITION
        self.assertIn("MLFLOW_TRACKING_URI", submitted.stderr)
        coordinator = Coordinator(self.build, self.work / "down", {"MLFLOW_TRACKING_URI": down})
        self.addCleanup(coordinator.stop)
        job, seconds = self.run_job(coordinator, "unreachable")
        self.assertEqual(coordinator.ctl("get", job).returncode, 0)
        logs = coordinator.ctl("logs", job).stdout
        self.assertEqual(logs.count("WARNING: MLflow:"), 1, logs)
        # The warning is an event of the job too, which `qloractl watch` shows.
        history = coordinator.ctl("watch", job, "-o", "json").stdout
        notices = [json.loads(line) for line in history.splitlines() if "WORKER_NOTICE" in line]
        self.assertEqual(len(notices), 1, history)
        self.assertIn("rank 0: MLflow:", notices[0]["message"])
        self.assertLess(seconds, 30, "the job waited on the tracking server")

    def test_wandb_is_refused_with_its_reason(self) -> None:
        validated = subprocess.run([str(self.build / "cli" / "qloractl"), "validate", "--no-data",
                                    str(self.job_file("wandb", "wandb"))], capture_output=True, text=True)
        self.assertEqual(validated.returncode, 3, validated.stdout + validated.stderr)
        self.assertIn("Weights & Biases is not supported", validated.stderr)


def main() -> None:
    mlflow_python_or_skip()
    MlflowTest.build = Path(sys.argv[1]).resolve()
    MlflowTest.source = Path(sys.argv[2]).resolve()
    unittest.main(argv=[sys.argv[0], "-v", *sys.argv[3:]])


if __name__ == "__main__":
    main()
