"""What the anchors (anchor_hf.py, anchor_deepspeed.py) share: the measurement, made the same way
as ours is measured from the service's progress events (bench/summarize.py):

  warm-up steps (not timed; Triton and bitsandbytes compile and tune on first use), then
  `windows` consecutive windows of `window_steps` optimizer steps each; a window's rate is
  tokens trained in it / its wall time (clock read after a device synchronisation at each end
  of the window, nothing synchronised inside it). The figure is the median of the windows, with
  their min and max. Memory: the CUDA caching allocator's peak allocated and reserved bytes over
  the training steps (peaks reset after the model is set up; ours report their whole process).

The batches are made on the device before timing, so no host-to-device copy is timed (ours
tokenizes and copies its batches inside the timed steps).
"""
import argparse
import contextlib
import json
import statistics
import time
import traceback

import torch


def measurement_parser():
    """The arguments every single-process anchor takes: the model folder, the micro-batches to
    measure (one after the other in one process) and the measurement's warm-up and windows."""
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--micro-batches", type=int, nargs="+", default=[4])
    p.add_argument("--micro-batch", type=int, help="one micro-batch (the older interface)")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--window-steps", type=int, default=5)
    p.add_argument("--max-memory-gib", type=float,
                   help="cap the caching allocator at this many GiB (as our trainer.max_memory_gib "
                        "caps ours): an 80 GB card's limit on a larger one")
    return p


def cap_memory(args):
    """--max-memory-gib: the process's share of GPU 0 set so that its allocator stays under it."""
    if args.max_memory_gib:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.max_memory_gib * 2**30 / total), 0)


def micro_batches_of(args):
    """--micro-batch N, where given, stands for --micro-batches N."""
    return [args.micro_batch] if args.micro_batch else args.micro_batches


def apply_liger():
    """Liger's kernels in transformers' LLaMA (rope, RMSNorm, SwiGLU, fused linear cross-entropy),
    as its users apply them: before the model is built, since the patch replaces transformers'
    classes and functions. Returns liger-kernel's version."""
    import importlib.metadata

    from liger_kernel.transformers import apply_liger_kernel_to_llama

    apply_liger_kernel_to_llama(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                fused_linear_cross_entropy=True)
    return importlib.metadata.version("liger-kernel")


def median_spread(rates):
    return {"tokens_per_s": round(statistics.median(rates), 1), "tokens_per_s_min": round(min(rates), 1),
            "tokens_per_s_max": round(max(rates), 1), "window_tokens_per_s": [round(r, 1) for r in rates]}


def measure(step, micro_batch, seq, warmup, windows, window_steps, device="cuda"):
    """Runs `step()` (one optimizer step) warmup + windows * window_steps times; returns the
    figures as a dict (rates are per GPU: micro_batch * seq tokens per step on this GPU)."""
    cuda = str(device).startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    sync()
    warmup_s = time.perf_counter() - t0
    rates, seconds = [], []
    for _ in range(windows):
        t0 = time.perf_counter()
        for _ in range(window_steps):
            step()
        sync()
        dt = time.perf_counter() - t0
        seconds.append(dt)
        rates.append(window_steps * micro_batch * seq / dt)
    out = median_spread(rates)
    out.update({"step_time_s": round(statistics.median(seconds) / window_steps, 4), "warmup_s": round(warmup_s, 2),
                "warmup_steps": warmup, "windows": windows, "window_steps": window_steps,
                "micro_batch": micro_batch, "seq": seq})
    if cuda:
        out["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        out["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 2)
    return out


def timed_measure(step, micro_batch, args, device="cuda"):
    """measure() with the warm-up and windows of `args` (measurement_parser's), and the wall time
    it took (wall_s)."""
    t0 = time.perf_counter()
    out = measure(step, micro_batch, args.seq, args.warmup, args.windows, args.window_steps, device)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out


@contextlib.contextmanager
def recorded_failure(record):
    """Runs the block; an exception in it is printed and named in record["error"] instead of
    raised, so that one failed measurement does not lose the others (the caller emits the record
    and exits non-zero when it holds an error)."""
    try:
        yield
    except Exception as e:  # noqa: BLE001  (any failure of the measured stack)
        traceback.print_exc()
        record["error"] = f"{type(e).__name__}: {e}"[:500]


def profile(step, steps, path, device="cuda"):
    """A Chrome trace of `steps` more steps (CPU ops with shapes, CUDA kernels), for
    bench/attribute_profile.py; the step function names its phases (qlora::*)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if str(device).startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    sync()
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        for _ in range(steps):
            step()
        sync()
    prof.export_chrome_trace(path)


def scope(name):
    """A named range in the trace, the same names as ours (worker/run/step_profiler.h)."""
    return torch.profiler.record_function(name)


def emit(record):
    print(json.dumps(record), flush=True)
