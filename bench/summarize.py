"""Turns a job's WatchJob events (qloractl watch -o json) into benchmark figures, measured the way
the anchors are (bench/anchor_common.py):

  after `warmup` steps, `windows` consecutive windows of `window_steps` optimizer steps; a
  window's rate on a rank is its tokens / its wall time, where the wall time is the difference of
  the rank's `elapsed_seconds` (steady clock since the start of its first step, read when the
  step's progress is reported) at the window's last step and at the step before its first; its
  tokens are steps x micro-batch x rows per element (2 for preference pairs) x sequence (every
  row of the benchmark's data is full). Packed
  rows (--packing true) end in padding where the next document does not fit, so there a window's
  tokens are the non-padding ones: the sum over its steps of the step's rate (`tokens_per_second`,
  non-padding tokens / the step's time) x the step's share of the elapsed clock (which also holds
  the progress report between steps: a slight overcount, well under 1%). `row_fill` is those
  tokens / steps x micro-batch x sequence. A window's rate per GPU is the mean over ranks; the
  figure is the median of the windows, with their min and max. The mean of the per-step rates (`tokens_per_second` of each progress
  event, what the service shows) is printed beside it for comparison.

Memory: the largest peak allocated and peak reserved bytes any progress event of a rank carried
(the CUDA caching allocator's peaks over the worker's whole process, loading included), and the
largest resident set of its process (host memory, pinned base weights included; getrusage).
MFU and HFU: bench/flops.py, from the model folder's config.json (--model). They count a
training step's work on each token; a DPO step's extra reference forward is not in them, so a
DPO row's MFU understates its use of the GPU.
Standard library only.
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flops import flops_per_token, load_config, utilisation  # noqa: E402


def read_events(path):
    """-> (state, {rank: {step: progress}}), from `qloractl watch -o json`'s lines (a "state" or
    a "step" object each; older builds printed each WatchJob response whole)."""
    progress, state = {}, None
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            m = json.loads(line)
            if m.get("type") == "state":
                state = m.get("state", state)
                continue
            if m.get("type") == "step":
                reports = m.get("ranks", [])
            else:
                state = m.get("job", {}).get("state", state)
                reports = [m.get("event", {}).get("progress") or {}]
            for prog in reports:
                if "step" in prog:
                    progress.setdefault(int(prog.get("rank", 0)), {})[int(prog["step"])] = prog
    return state, progress


def window_tokens(steps, first, last, tokens_per_step, packing):
    """Tokens a rank trained in steps first+1..last: full rows, or the non-padding ones (packing)."""
    if not packing:
        return (last - first) * tokens_per_step
    return sum(float(steps[s].get("tokens_per_second", 0)) *
               (float(steps[s].get("elapsed_seconds", 0)) - float(steps[s - 1].get("elapsed_seconds", 0)))
               for s in range(first + 1, last + 1))


def windows_of(progress, warmup, windows, window_steps, tokens_per_step, packing=False):
    """Per-GPU window rates (mean over ranks), mean window seconds and row fill. A missing step
    boundary is an error: every progress event is stored and replayed by the coordinator."""
    rates, seconds, fills = [], [], []
    for steps in progress.values():
        # Elapsed time counts from the first step's start: with no warm-up, step 0 is that start.
        steps.setdefault(0, {"elapsed_seconds": 0})
    for w in range(windows):
        first, last = warmup + w * window_steps, warmup + (w + 1) * window_steps
        per_rank = []
        for rank, steps in sorted(progress.items()):
            missing = [s for s in (range(first, last + 1) if packing else (first, last)) if s not in steps]
            if missing:
                raise SystemExit(f"rank {rank}: no progress event at step {missing[0]} "
                                 f"(have steps {min(steps)}..{max(steps)}); the job ran fewer steps?")
            dt = float(steps[last].get("elapsed_seconds", 0)) - float(steps[first].get("elapsed_seconds", 0))
            per_rank.append((dt, window_tokens(steps, first, last, tokens_per_step, packing)))
        seconds.append(statistics.mean(dt for dt, _ in per_rank))
        rates.append(statistics.mean(tokens / dt for dt, tokens in per_rank))
        fills.append(statistics.mean(tokens / (window_steps * tokens_per_step) for _, tokens in per_rank))
    return rates, seconds, fills


def main():
    p = argparse.ArgumentParser()
    p.add_argument("events")
    p.add_argument("--gpus", default="0")
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--stage", default="2", help="the job file's stage (auto: the ranks' report)")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--model", help="the model folder (its config.json gives the FLOPs); none: no MFU")
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--checkpointing", default="true", help="true, false or auto")
    p.add_argument("--max-memory-gib", help="auto's budget (trainer.max_memory_gib)")
    p.add_argument("--offloaded-layers", default="0",
                   help="trainer.offload_activation_layers (a count or auto): layers neither recomputed "
                        "nor kept on the GPU; the count the workers report wins")
    p.add_argument("--dequantized-layers", default="",
                   help="trainer.dequantized_weight_layers: a count, auto, or 'auto:N' (auto's choice); "
                        "the count the workers report wins")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--windows", type=int, default=1)
    p.add_argument("--window-steps", type=int, help="default: every step after the warm-up, in one window")
    p.add_argument("--packing", default="false", help="packed rows: count non-padding tokens")
    p.add_argument("--label", default="ours")
    p.add_argument("--float8", default="0", help="1: the base's forward GEMMs ran in FP8")
    p.add_argument("--rows-per-example", type=int, default=1,
                   help="rows a micro-batch element trains: 2 for preference pairs (chosen and rejected)")
    a = p.parse_args()
    state, progress = read_events(a.events)
    if not progress:
        raise SystemExit(f"no progress events in {a.events} (job state {state})")
    last_step = min(max(steps) for steps in progress.values())
    window_steps = a.window_steps or max(1, (last_step - a.warmup) // a.windows)
    tokens_per_step = a.micro_batch * a.rows_per_example * a.seq
    packing = a.packing.lower() in ("1", "true", "yes", "on")
    rates, seconds, fills = windows_of(progress, a.warmup, a.windows, window_steps, tokens_per_step, packing)
    measured = range(a.warmup + 1, a.warmup + a.windows * window_steps + 1)
    per_step_mean = statistics.mean(
        statistics.mean(float(progress[r][s].get("tokens_per_second", 0)) for r in progress) for s in measured)
    peak = {r: max(int(p.get("memory", {}).get("device_peak_bytes", 0)) for p in steps.values())
            for r, steps in progress.items()}
    reserved = {r: max(int(p.get("memory", {}).get("device_reserved_peak_bytes", 0)) for p in steps.values())
                for r, steps in progress.items()}
    host_peak = {r: max(int(p.get("memory", {}).get("host_peak_rss_bytes", 0)) for p in steps.values())
                 for r, steps in progress.items()}
    checkpointing = a.checkpointing.lower() in ("1", "true", "yes", "on")
    fraction = float(checkpointing)
    auto = {}
    if a.checkpointing.lower() == "auto":  # the split each rank reported (the last report)
        reports = [steps[max(steps)].get("checkpointing", {}) for steps in progress.values()]
        layers = max(int(c.get("layers", 0)) for c in reports)
        split = [int(c.get("checkpointed_layers", -1)) for c in reports]
        checkpointing = "auto"
        fraction = max(split) / layers if layers > 0 and max(split) >= 0 else 1.0
        auto = {"checkpointed_layers": split, "layers": layers,
                "max_memory_gib": float(a.max_memory_gib) if a.max_memory_gib else None,
                "planned_peak_gib": [round(int(c.get("planned_peak_bytes", 0)) / 2**30, 2) for c in reports],
                "measured_peak_gib": [round(int(c.get("measured_peak_bytes", 0)) / 2**30, 2) for c in reports]}
    # The stage and base-weight placement the ranks reported (a stage left to the workers is
    # theirs to plan), else the job file's.
    last = [steps[max(steps)].get("strategy", {}) for steps in progress.values()]
    stage = max(int(s.get("zero_stage", -1)) for s in last)
    stage = stage if stage >= 0 else int(a.stage) if a.stage.isdigit() else a.stage
    compute = "fp8 forward" if a.float8 == "1" else "bf16"
    variant = f"nf4-dq+{compute} ZeRO-{stage}" + (" (auto)" if a.stage == "auto" else "")
    if any(s.get("base_weights_in_host_memory") for s in last):
        variant += ", base weights streamed from host memory"
    elif any(s.get("partitioned_base_weights") for s in last):
        variant += ", base weights sharded"
    # Offloaded layers are not recomputed: the count the ranks reported (auto's choice), else the
    # job file's.
    reported = [int(steps[max(steps)].get("checkpointing", {}).get("offloaded_layers", 0))
                for steps in progress.values()]
    offloaded = max(reported) if max(reported) > 0 else (
        int(a.offloaded_layers) if a.offloaded_layers.isdigit() else 0)
    if offloaded > 0 and a.model:
        with open(os.path.join(a.model, "config.json")) as f:
            layers = int(json.load(f)["num_hidden_layers"])
        fraction = max(0.0, fraction - min(offloaded, layers - 1) / layers)
        variant += f", {min(offloaded, layers - 1)} of {layers} layers offloaded"
        if a.offloaded_layers == "auto":
            variant += " (auto)"
        if auto:
            auto["offloaded_layers"] = reported
    if a.dequantized_layers:
        count, _, chosen = a.dequantized_layers.partition(":")
        # The count the ranks reported (checkpointing.dequantized_layers), else the log's / job's.
        held_reported = max(int(steps[max(steps)].get("checkpointing", {}).get("dequantized_layers", 0))
                            for steps in progress.values())
        held = str(held_reported) if held_reported > 0 else (
            (chosen or "?") if count == "auto" else count)
        variant += f", weights of {held} layers held dequantized" + (" (auto)" if count == "auto" else "")
    gpus = len(a.gpus.split(","))
    out = {"impl": "ours", "label": a.label, "variant": variant, "state": state,
           "gpus": gpus, "micro_batch": a.micro_batch, "zero_stage": stage, "seq": a.seq,
           "checkpointing": checkpointing, "recomputed_fraction": round(fraction, 4), "packing": packing, "row_fill": round(statistics.mean(fills), 4),
           "model": os.path.abspath(a.model) if a.model else None,
           "lora_r": a.lora_r,
           "tokens_per_s": round(statistics.median(rates), 1), "tokens_per_s_min": round(min(rates), 1),
           "tokens_per_s_max": round(max(rates), 1), "window_tokens_per_s": [round(r, 1) for r in rates],
           "step_time_s": round(statistics.median(seconds) / window_steps, 4),
           "mean_of_per_step_rates": round(per_step_mean, 1),
           "warmup_steps": a.warmup, "windows": a.windows, "window_steps": window_steps,
           "peak_allocated_gib": round(max(peak.values()) / 2**30, 2),
           "peak_reserved_gib": round(max(reserved.values()) / 2**30, 2),
           "peak_allocated_gib_per_rank": {r: round(b / 2**30, 2) for r, b in sorted(peak.items())},
           "peak_reserved_gib_per_rank": {r: round(b / 2**30, 2) for r, b in sorted(reserved.items())},
           "host_peak_gib_per_rank": {r: round(b / 2**30, 2) for r, b in sorted(host_peak.items())}}
    out.update(auto)
    if a.model and not packing:  # flops.py counts attention over the whole row, not per document
        f = flops_per_token(load_config(a.model), a.seq, a.lora_r, fraction)
        mfu, hfu = utilisation(out["tokens_per_s"], f)
        out.update({"gflop_per_token_model": round(f["model"] / 1e9, 2),
                    "gflop_per_token_hardware": round(f["hardware"] / 1e9, 2),
                    "mfu": round(mfu, 4), "hfu": round(hfu, 4)})
    print(json.dumps(out))
    mfu_text = f" | MFU {out['mfu']:.1%} HFU {out['hfu']:.1%}" if "mfu" in out else ""
    packed = f" seq {a.seq} packed ({out['row_fill']:.1%} full) |" if packing else ""
    print(f"| {a.label} | {gpus} GPU | mb {a.micro_batch} |{packed} ZeRO-{stage} | {out['tokens_per_s']:,.0f} tok/s/GPU "
          f"({out['tokens_per_s_min']:,.0f}-{out['tokens_per_s_max']:,.0f}) | {out['peak_allocated_gib']:.2f} GiB "
          f"({out['peak_reserved_gib']:.2f} reserved, host {max(host_peak.values()) / 2**30:.1f}){mfu_text} |", file=sys.stderr)


if __name__ == "__main__":
    main()
