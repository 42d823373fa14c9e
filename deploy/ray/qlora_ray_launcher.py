#!/usr/bin/env python3
"""The driver of one start of a qlora job on a Ray cluster.

The coordinator (coordinator/launch/ray/ray_worker_launcher.h) submits it as a Ray job whose
entrypoint is `python3 qlora_ray_launcher.py`, with the start described in the environment
variable QLORA_RAY_SPEC (JSON: ranks with their argv and environment, the bundle, the placement
strategy, timeouts). It runs on the cluster, in Ray's own Python: it is the one piece of this
project that imports `ray`, because reserving a placement group needs Ray's driver API (the REST
API has no placement groups); the coordinator and the workers stay C++.

What it does:
  1. reserves a placement group of one bundle per rank ({"CPU": n} or {"CPU": n, "GPU": 1}) with
     the requested strategy, waiting at most placement_timeout_s;
  2. runs one Ray task per rank in its bundle; the task starts qlora-worker with the argv and
     environment the coordinator gave (the startup token among them, never in argv), plus
     QLORA_HOST_ADDRESS = the node's address (Gloo binds to it) and, for GPU workers, the GPU Ray
     assigned (CUDA_VISIBLE_DEVICES); the worker dies with the task's process (PR_SET_PDEATHSIG);
  3. forwards each line a rank prints as "QLORA-LOG <rank> <line>" and reports each rank's end as
     a line "QLORA-EXIT <nonce> {json}" (the coordinator reads both through Ray's job logs API;
     the nonce, random per start, tells the driver's lines from anything a worker prints). Ray
     forwards a task's output to the driver asynchronously (its log monitor tails the task's log
     file), so a rank's end could reach the driver's log before its last lines, and the
     coordinator, which stops reading once every rank has ended, would lose them: the driver
     counts the rank lines it has printed and reports an end only once all of that rank's lines
     are through (or after FORWARD_TIMEOUT_S: the lines are normally through within a second,
     but a host busy enough slows Ray's log monitor by more than 15 s: a CI run beside two
     compiles lost a resumed rank's last lines, the job's end reported before them);
  4. on SIGTERM (the coordinator stopped the Ray job) passes SIGTERM to every rank and kills what
     is left after stop_grace_s.
"""
import collections
import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

PR_SET_PDEATHSIG = 1


FORWARD_TIMEOUT_S = 60.0


class ForwardedLines:
    """The driver's stdout, counting the rank lines Ray's log thread prints through it."""

    MARKER = re.compile(r"QLORA-LOG (\d+) ")

    def __init__(self, stream):
        self.stream = stream
        self.counts = collections.Counter()
        self.lock = threading.Lock()

    def write(self, text):
        written = self.stream.write(text)
        with self.lock:
            for match in self.MARKER.finditer(text):
                self.counts[int(match.group(1))] += 1
        return written

    def flush(self):
        self.stream.flush()

    def wait_for(self, rank, lines, timeout_s):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                if self.counts[rank] >= lines:
                    return
            time.sleep(0.05)

    def __getattr__(self, name):
        return getattr(self.stream, name)


def report_exit(nonce, **end):
    # One write of one whole line: Ray's log thread prints rank lines to the same stream.
    sys.stdout.write(f"QLORA-EXIT {nonce} {json.dumps(end)}\n")
    sys.stdout.flush()


def die_with_parent(prctl, parent):
    """In the worker process, before exec: end when the Ray task's process ends. `prctl` was
    looked up in the parent (no dlopen or dlsym between fork and exec)."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl
        os._exit(1)


@ray.remote(max_retries=0)
def run_rank(rank, argv, env, use_gpu, stop_grace_s):
    host = ray.util.get_node_ip_address()
    full_env = dict(os.environ)
    for key in ("QLORA_RAY_SPEC",):  # the spec holds every token and the nonce: not for the worker
        full_env.pop(key, None)
    full_env.update(env)
    full_env["QLORA_HOST_ADDRESS"] = host
    if use_gpu:  # the GPU Ray assigned to this task, not the coordinator's local numbering
        full_env["CUDA_VISIBLE_DEVICES"] = ",".join(str(int(g)) for g in ray.get_gpu_ids())
    # Loaded here, in the Ray worker's process: a module-level handle would be pickled with this
    # function and be meaningless in another process.
    prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    parent = os.getpid()
    proc = subprocess.Popen(argv, env=full_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, preexec_fn=lambda: die_with_parent(prctl, parent),
                            bufsize=1, text=True, errors="replace")
    print(f"QLORA-LOG {rank} [qlora-ray] rank {rank} started on {host}, pid {proc.pid}", flush=True)
    lines = 1
    try:
        for line in proc.stdout:
            sys.stdout.write(f"QLORA-LOG {rank} {line.rstrip(chr(10))}\n")
            sys.stdout.flush()
            lines += 1
        code = proc.wait()
    except BaseException:  # cancelled (KeyboardInterrupt) or the task is being torn down
        proc.terminate()
        try:
            code = proc.wait(timeout=stop_grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
    return {"rank": rank, "host": host, "pid": proc.pid,
            "code": code if code >= 0 else 0, "signal": -code if code < 0 else 0, "lines": lines}


def main():
    spec = json.loads(os.environ["QLORA_RAY_SPEC"])
    nonce = spec["nonce"]
    ranks = spec["ranks"]
    use_gpu = bool(spec["use_gpu"])
    bundle = {"CPU": float(spec["cpus_per_worker"])}
    if use_gpu:
        bundle["GPU"] = 1.0
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())

    forwarded = ForwardedLines(sys.stdout)
    sys.stdout = forwarded  # Ray's log thread looks the stream up at each print
    ray.init(log_to_driver=True)
    pg = placement_group([dict(bundle) for _ in ranks], strategy=spec["placement"])
    deadline = time.monotonic() + float(spec["placement_timeout_s"])
    while True:
        ready, _ = ray.wait([pg.ready()], timeout=1.0)
        if ready:
            break
        if stopping.is_set() or time.monotonic() > deadline:
            why = ("stopped while waiting for room on the cluster" if stopping.is_set() else
                   f"the Ray cluster could not place {len(ranks)} bundles of {bundle} "
                   f"({spec['placement']}) within {spec['placement_timeout_s']:.0f} s")
            report_exit(nonce, rank=-1, cause=why)
            remove_placement_group(pg)
            sys.exit(3)
    print(f"qlora-ray: placement group ready: {len(ranks)} x {bundle}, {spec['placement']}", flush=True)

    pending = {}
    for index, r in enumerate(ranks):
        task = run_rank.options(
            num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0),
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=index),
        ).remote(r["rank"], r["argv"], r["env"], use_gpu, float(spec["stop_grace_s"]))
        pending[task] = r["rank"]

    cancelled = False
    while pending:
        if stopping.is_set() and not cancelled:
            for task in pending:
                ray.cancel(task, force=False)  # KeyboardInterrupt in the task: SIGTERM, grace, SIGKILL
            cancelled = True
        done, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
        for task in done:
            rank = pending.pop(task)
            try:
                end = ray.get(task)
            except Exception as error:  # a lost node, a crashed Ray worker, a cancellation
                first = str(error).strip().splitlines()[0] if str(error).strip() else ""
                if len(first) > 160:  # Ray's messages go on with advice; the first sentences say it
                    first = first[:160].rsplit(" ", 1)[0] + " ..."
                report_exit(nonce, rank=rank, cause=f"its Ray task ended without an exit status: "
                                             f"{type(error).__name__}: {first}")
                continue
            forwarded.wait_for(rank, end.pop("lines"), FORWARD_TIMEOUT_S)
            report_exit(nonce, **end)
    remove_placement_group(pg)


if __name__ == "__main__":
    main()
