"""Turns a job's WatchJob events (qloractl watch -o json) into benchmark figures.

tokens/s per GPU: the mean over ranks of each rank's tokens/s, averaged over the steps after
the first two (warm-up). MFU = tokens/s per GPU x FLOP per token / 989e12 (H200 dense bf16).
FLOP per trained token for LLaMA-2-7B at sequence 2048 with frozen base weights:
  forward 2N + input gradients 2N (no weight gradients) + recompute 2N (activation checkpointing)
  with N = 6.74e9, plus attention 3 x 4 x layers x seq x hidden (fwd, bwd-input ~2x) ≈ 44 GFLOP;
we print MFU with and without the recompute counted.
"""
import argparse
import json
import statistics
import sys

p = argparse.ArgumentParser()
p.add_argument("events")
p.add_argument("--gpus", default="0")
p.add_argument("--micro-batch", type=int, default=1)
p.add_argument("--stage", type=int, default=2)
a = p.parse_args()
per_step = {}
peak = {}
reserved = {}
state = None
for line in open(a.events):
    m = json.loads(line)
    state = m["job"]["state"]
    prog = m.get("event", {}).get("progress")
    if not prog:
        continue
    rank, step = prog.get("rank", 0), int(prog.get("step", 0))
    per_step.setdefault(step, {})[rank] = (prog.get("tokens_per_second", 0.0), prog.get("elapsed_seconds", 0.0))
    mem = prog.get("memory", {})
    peak[rank] = max(peak.get(rank, 0), int(mem.get("device_peak_bytes", 0)))
    reserved[rank] = max(reserved.get(rank, 0), int(mem.get("device_reserved_peak_bytes", 0)))
steps = sorted(s for s in per_step if s > 2) or sorted(per_step)
tps = statistics.mean(statistics.mean(v[0] for v in per_step[s].values()) for s in steps)
n = 6.74e9
attention = 3 * 4 * 32 * 2048 * 4096
flop_with = 6 * n + attention
flop_without = 4 * n + attention * 2 / 3
gpus = len(a.gpus.split(","))
out = {"state": state, "gpus": gpus, "micro_batch": a.micro_batch, "zero_stage": a.stage, "seq": 2048,
       "tokens_per_s_per_gpu": round(tps, 1), "step_time_s": round(a.micro_batch * 2048 / tps, 3),
       "peak_allocated_gib_per_rank": {r: round(b / 2**30, 2) for r, b in sorted(peak.items())},
       "peak_reserved_gib_per_rank": {r: round(b / 2**30, 2) for r, b in sorted(reserved.items())},
       "mfu_counting_recompute": round(tps * flop_with / 989e12, 4),
       "mfu_model_flops_only": round(tps * flop_without / 989e12, 4), "steps_measured": len(steps)}
print(json.dumps(out))
print(f"| ours | {gpus} GPU | mb {a.micro_batch} | ZeRO-{a.stage} | {tps:,.0f} tok/s/GPU | "
      f"{max(peak.values(), default=0) / 2**30:.1f} GiB | MFU {out['mfu_counting_recompute']:.1%} |", file=sys.stderr)
