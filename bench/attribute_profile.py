"""Attributes the step time of a profiled training run to what the GPU did, from a Chrome trace
of the PyTorch/Kineto profiler: ours (worker/run/step_profiler.h, QLORA_PROFILE_STEPS) or an
anchor's (bench/anchor_common.py). Standard library only.

  python3 bench/attribute_profile.py TRACE.json[.gz] [--config MODEL/config.json] [--lora-r 16]
      [--title TEXT] [--json OUT.json]

What is measured. The window is the profiled steps: from the start of the first `qlora::step`
range to the end of the last (the trainer and the anchors name their phases `qlora::step`,
`qlora::forward`, `qlora::loss`, `qlora::backward`, `qlora::grads`, `qlora::optimizer`),
extended to the end of the last GPU activity launched inside it. Work items are the GPU's
kernels, memcpys and memsets of the busiest device (in a trace without GPU activity, the leaf
CPU ops, so that a CPU trace can be read the same way). Each item gets a category (below) and a
phase: the innermost `qlora::*` range containing its launch (the CPU-side runtime call, found by
its correlation id); backward items under ours' checkpoint node (`CheckpointBackward`) and
outside a nested backward node are the recompute. Time is then swept across the window and
shared exclusively: where several items overlap (the NCCL stream beside the compute stream) the
instant is split equally among the non-collective ones, and a collective counts only where
nothing else runs ("exposed"); where nothing runs the GPU is idle: host gaps. So the rows add up
to the window: % of step.

Categories, the first rule that matches wins ("name" is the kernel's name, "ops" the CPU ops
enclosing its launch, innermost last; "dims" the input shapes of the innermost op that has
them, given with record_shapes):
  base weights       launched inside ours' `qlora::base_weights` range (stage 3's gathers and
                     the copies of layers streamed from host memory); like the collectives, it
                     counts only where nothing else runs (the GPU waiting for a layer)
  collectives        name ~ nccl | AllReduce | ReduceScatter | AllGather | Broadcast | SendRecv
  copies             memcpy / memset activities (host<->device and device copies)
  NF4 dequantize     name ~ dequant (ours: Dequantize4bitKernel, DequantizeBlockwise8bitKernel;
                     bitsandbytes: kDequantize*)
  optimizer          phase qlora::optimizer or qlora::grads (AdamW, clipping, ZeRO gradient
                     bookkeeping), or ops ~ Optimizer.step | adam | _foreach_ | lerp_ | addcdiv_
  attention          name ~ flash | fmha | attention | sdpa, or ops ~ scaled_dot_product |
                     flash_attention | efficient_attention | cudnn_attention
  loss               ops ~ CrossEntropy | cross_entropy | nll_loss | log_softmax | LigerFusedLinear,
                     name ~ cross_entropy | nll_loss, phase qlora::loss, or dims hold the vocabulary
                     size (the lm_head GEMM and the logits; the embedding lookup excepted): the
                     loss row includes the lm_head GEMMs of every implementation
  LoRA GEMMs         a GEMM (name ~ gemm | gemv | cutlass | cublas | nvjet | xmma | wgmma | splitK |
                     matmul; on CPU ops aten::mm/addmm/bmm) launched inside ours' `qlora::lora`
                     range (the engine's rank-r GEMMs, whose ops show the layer's shapes, not r:
                     worker/engine/*_function.cc) or whose dims hold the LoRA rank r
  LoRA other         any other item launched there or whose dims hold r (casts, scaling, grads)
  base GEMMs         every other GEMM (the frozen projections, forward, recompute and backward)
  elementwise        the rest, split by name and ops into: norms (rms_norm | layer_norm),
                     rotary (rotary | rope), SwiGLU (silu | swiglu | glu), casts/copies
                     (ops aten::to | _to_copy | copy_ | clone | contiguous), other (residual adds,
                     masks, fills, ours' rotary arithmetic and SwiGLU product, ...)
  kernel bubbles     idle spans shorter than BUBBLE_US between two work items: the GPU's own
                     switch from one kernel to the next (~1.5-2 us each on an H200 under the
                     profiler), which only fewer kernels shorten
  host gaps          longer spans with no GPU activity (the GPU waiting for the host)
Caveats: r and the vocabulary size must differ from every other dimension the ops see (true at
the 7B and 70B shapes with r=16, vocabulary 32000, micro-batch < 16, sequence 2048: tokens per
micro-batch 2048 or 8192); HF's own RMSNorm and rotary are plain PyTorch ops, so without Liger
they land in "elementwise: other"; an anchor's recompute is inside its backward phase
(non-reentrant checkpointing has no node to tell it by).
"""
import argparse
import bisect
import collections
import gzip
import json
import re
import sys

NCCL = re.compile(r"nccl|allreduce|all_reduce|reducescatter|reduce_scatter|allgather|all_gather|broadcast|sendrecv",
                  re.I)
DEQUANT = re.compile(r"dequant", re.I)
OPTIMIZER_OPS = re.compile(r"optimizer\.step|adamw|\badam|_fused_adam|_foreach_|aten::lerp_|aten::addcdiv_|"
                           r"aten::addcmul_", re.I)
OPTIMIZER_NAME = re.compile(r"adam|multi_tensor_apply", re.I)
ATTENTION_NAME = re.compile(r"flash|fmha|attention|sdpa", re.I)
ATTENTION_OPS = re.compile(r"scaled_dot_product|flash_attention|efficient_attention|cudnn_attention|"
                           r"_fused_attention", re.I)
LOSS_OPS = re.compile(r"crossentropy|cross_entropy|nll_loss|log_softmax|LigerFusedLinear", re.I)
LOSS_NAME = re.compile(r"cross_entropy|nll_loss", re.I)
EMBEDDING_OPS = re.compile(r"embedding", re.I)
GEMM_NAME = re.compile(r"gemm|gemv|cutlass|cublas|nvjet|xmma|wgmma|splitk|s16816|hmma|matmul|"
                       r"^aten::(mm|addmm|bmm|baddbmm|_mm)$", re.I)
NORM = re.compile(r"rms_?norm|layer_?norm|RMSNorm", re.I)
ROTARY = re.compile(r"rotary|rope", re.I)
SWIGLU = re.compile(r"silu|swiglu|swish|glu", re.I)
CAST_OPS = re.compile(r"^aten::(to|_to_copy|copy_|clone|contiguous)$")
CHECKPOINT_NODE = "CheckpointBackward"
NODE_PREFIX = "autograd::engine::evaluate_function: "

CATEGORIES = [
    ("base GEMMs", "base_gemm"),
    ("LoRA GEMMs", "lora_gemm"),
    ("LoRA other (adapter casts, scaling, grads)", "lora_other"),
    ("NF4 dequantize", "dequant"),
    ("attention", "attention"),
    ("elementwise: norms", "ew_norm"),
    ("elementwise: rotary", "ew_rotary"),
    ("elementwise: SwiGLU", "ew_swiglu"),
    ("elementwise: casts/copies", "ew_cast"),
    ("elementwise: other (residual, masks, ...)", "ew_other"),
    ("loss (incl. lm_head GEMMs)", "loss"),
    ("optimizer + gradient bookkeeping", "optimizer"),
    ("collectives (exposed)", "collective"),
    ("base weights: gathers and host copies (exposed)", "base_weights"),
    ("memcpy / memset", "copies"),
    ("kernel bubbles (idle < 5 us between items)", "bubble"),
    ("host gaps (GPU idle)", "idle"),
]
# Ours' engine marks its rank-r GEMMs with this range (worker/engine/linear4bit_internal.cc); not a phase.
LORA_RANGE = "qlora::lora"
# ... and the base-weight store its gathers and host copies (worker/engine/base_weight_store.cc).
BASE_WEIGHTS_RANGE = "qlora::base_weights"
# Categories that count only where nothing else runs: their own time overlaps compute.
EXPOSED_ONLY = ("collective", "base_weights")
BUBBLE_US = 5.0  # shorter idle spans are the switch between kernels, not the host
PHASES = ["forward", "loss", "backward", "recompute", "grads", "optimizer", "step (other)", "outside"]


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    return trace["traceEvents"] if isinstance(trace, dict) else trace


def dims_of(e):
    d = e.get("args", {}).get("Input Dims")
    if not d:
        return None
    flat = []
    for x in d:
        if isinstance(x, list):
            flat.extend(v for v in x if isinstance(v, int))
        elif isinstance(x, int):
            flat.append(x)
    return flat


class Thread:
    """The CPU ops and ranges of one thread, for 'what encloses time t' queries."""

    def __init__(self, events):
        self.events = sorted(events, key=lambda e: (e["ts"], -e.get("dur", 0)))
        self.starts = [e["ts"] for e in self.events]
        # parent index of each event (properly nested ranges on one thread)
        self.parent = [-1] * len(self.events)
        stack = []
        for i, e in enumerate(self.events):
            while stack and self.events[stack[-1]]["ts"] + self.events[stack[-1]].get("dur", 0) <= e["ts"]:
                stack.pop()
            if stack:
                self.parent[i] = stack[-1]
            stack.append(i)

    def enclosing(self, t):
        """Indices of the events containing t, innermost last. The last event to start at or
        before t either contains it or is nested in (or before) the one that does: walk up."""
        i = bisect.bisect_right(self.starts, t) - 1
        while i >= 0 and not self._contains(i, t):
            i = self.parent[i]
        chain = []
        while i >= 0:
            chain.append(i)
            i = self.parent[i]
        return chain[::-1]

    def op_names(self, indices):
        """The names of the CPU ops among these events (annotations left out)."""
        return [self.events[i]["name"] for i in indices
                if str(self.events[i].get("cat", "")).lower() == "cpu_op"]

    def chain(self, i):
        out = []
        while i >= 0:
            out.append(i)
            i = self.parent[i]
        return out[::-1]

    def _contains(self, i, t):
        e = self.events[i]
        return e["ts"] <= t <= e["ts"] + e.get("dur", 0)


def category_of(item, r, vocab):
    name, ops, dims, phase = item["name"], item["ops"], item["dims"], item["phase"]
    ops_text = "\n".join(ops)
    innermost_op = ops[-1] if ops else ""
    if item.get("base_weights"):
        return "base_weights"
    if NCCL.search(name):
        return "collective"
    if item["kind"] in ("gpu_memcpy", "gpu_memset"):
        return "copies"
    if DEQUANT.search(name) or DEQUANT.search(ops_text):
        return "dequant"
    if phase in ("optimizer", "grads") or OPTIMIZER_OPS.search(ops_text) or OPTIMIZER_NAME.search(name):
        return "optimizer"
    if ATTENTION_NAME.search(name) or ATTENTION_OPS.search(ops_text):
        return "attention"
    has_vocab = vocab and dims and vocab in dims and not EMBEDDING_OPS.search(ops_text)
    if LOSS_OPS.search(ops_text) or LOSS_NAME.search(name) or phase == "loss" or has_vocab:
        return "loss"
    gemm = bool(GEMM_NAME.search(name))
    if item.get("lora") or (dims and r in dims):
        return "lora_gemm" if gemm else "lora_other"
    if gemm:
        return "base_gemm"
    if NORM.search(name) or NORM.search(ops_text):
        return "ew_norm"
    if ROTARY.search(name) or ROTARY.search(ops_text):
        return "ew_rotary"
    if SWIGLU.search(name) or SWIGLU.search(ops_text):
        return "ew_swiglu"
    if CAST_OPS.match(innermost_op):
        return "ew_cast"
    return "ew_other"


def phase_of(t, ranges, ops):
    """The innermost qlora:: range containing t; backward under the checkpoint node and outside a
    nested backward node is the recompute."""
    best = None
    for start, end, name in ranges:
        if start <= t < end and (best is None or start >= best[0]):
            best = (start, end, name)
    if best is None:
        return "outside"
    phase = best[2].split("::", 1)[1]
    if phase == "step":
        phase = "step (other)"
    if phase == "backward":
        nodes = [o for o in ops if o.startswith(NODE_PREFIX) or o.endswith("Backward") or "Backward0" in o]
        if nodes and CHECKPOINT_NODE in nodes[-1]:
            return "recompute"
    return phase if phase in PHASES else "step (other)"


def whole_steps(ranges):
    """The profiled optimizer steps as (start, end) windows, each one whole. Ours' profiler
    switches on at micro-batch 0 of its first step, inside that step's `qlora::step` range (so
    the trace lacks it), and off at micro-batch 0 of the step after the last, inside that one's
    range (so the trace holds its beginning, with the GPU idle): a `qlora::step` range alone
    would drop a whole step and count a cut one, whose idle tail then reads as host gaps. A step
    here is a `qlora::optimizer` range and what precedes it back to the previous one: from its
    `qlora::step` range's start when the trace has it, else from its first `qlora::forward`."""
    by_name = collections.defaultdict(list)
    for s, t, n in ranges:
        by_name[n].append((s, t))
    optimizers = sorted(by_name["qlora::optimizer"])
    if not optimizers:
        return sorted(by_name["qlora::step"])
    forwards = sorted(s for s, _ in by_name["qlora::forward"])
    step_ranges = sorted(by_name["qlora::step"])
    out = []
    previous_end = None
    for s, t in optimizers:
        enclosing = [r for r in step_ranges if r[0] <= s and t <= r[1]]
        if enclosing:
            start, end = enclosing[-1]
        else:
            starts = [f for f in forwards if f <= s and (previous_end is None or f >= previous_end)]
            start, end = (starts[0] if starts else s), t
        out.append((start, max(end, t)))
        previous_end = t
    return out


def cpu_threads(events):
    """The CPU ops and annotations of each thread, keyed by (pid, tid), as Threads; and the
    trainer's qlora:: ranges as (start, end, name)."""
    cpu = collections.defaultdict(list)
    ranges = []
    for e in events:
        cat = str(e.get("cat", "")).lower()
        if e.get("ph") == "X" and cat in ("cpu_op", "user_annotation"):
            cpu[(e.get("pid"), e.get("tid"))].append(e)
            name = str(e.get("name", ""))
            if cat == "user_annotation" and name.startswith("qlora::") and name not in (LORA_RANGE, BASE_WEIGHTS_RANGE):
                ranges.append((e["ts"], e["ts"] + e.get("dur", 0), name))
    return {k: Thread(v) for k, v in cpu.items()}, ranges


def analyse(events, r=16, vocab=None):
    threads, ranges = cpu_threads(events)
    runtime = {}
    gpu = []
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = str(e.get("cat", "")).lower()
        if cat in ("cuda_runtime", "cuda_driver", "runtime", "driver"):
            c = e.get("args", {}).get("correlation")
            if c is not None:
                runtime[c] = e
        elif cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            gpu.append(e)
    steps = whole_steps(ranges)
    items = []

    def context(thread_key, t, index=None):
        """The CPU ops enclosing t on the thread (innermost last), the innermost input dims,
        and whether t lies in a `qlora::lora` range."""
        th = threads.get(thread_key)
        if th is None:
            return [], None, False
        indices = th.chain(index) if index is not None else th.enclosing(t)
        chain = [th.events[i] for i in indices]
        ops = th.op_names(indices)
        dims = None
        for c in reversed(chain):
            dims = dims_of(c)
            if dims:
                break
        ranges_here = {c.get("name") for c in chain}
        return ops, dims, (LORA_RANGE in ranges_here, BASE_WEIGHTS_RANGE in ranges_here)

    if gpu:
        by_device = collections.Counter()
        for e in gpu:
            by_device[e.get("args", {}).get("device", e.get("pid"))] += e.get("dur", 0)
        device = by_device.most_common(1)[0][0]
        for e in gpu:
            if e.get("args", {}).get("device", e.get("pid")) != device:
                continue
            launch = runtime.get(e.get("args", {}).get("correlation"))
            launch_t = launch["ts"] if launch else e["ts"]
            ops, dims, (lora, base) = context((launch.get("pid"), launch.get("tid")), launch_t) if launch \
                else ([], None, (False, False))
            items.append({"name": e.get("name", ""), "kind": str(e.get("cat")).lower(), "start": e["ts"],
                          "end": e["ts"] + e.get("dur", 0), "launch": launch_t, "ops": ops, "dims": dims,
                          "lora": lora, "base_weights": base})
        mode = f"GPU {device}"
    else:
        # A CPU-only trace: the CPU ops are the work, each op's own time (outside its children:
        # the sweep gives an instant to the innermost op running).
        for key, th in threads.items():
            for i, e in enumerate(th.events):
                if str(e.get("cat", "")).lower() != "cpu_op":
                    continue
                ops, dims, (lora, base) = context(key, e["ts"], index=i)
                items.append({"name": e.get("name", ""), "kind": "cpu_op", "start": e["ts"],
                              "end": e["ts"] + e.get("dur", 0), "launch": e["ts"], "ops": ops, "dims": dims,
                              "lora": lora, "base_weights": base})
        mode = "CPU (ops' own time)"
    if not items:
        raise SystemExit("no GPU activity and no CPU ops in the trace")
    for it in items:
        it["phase"] = phase_of(it["launch"], ranges, it["ops"])
        it["category"] = category_of(it, r, vocab)
    if steps:
        w0, w1 = steps[0][0], steps[-1][1]
        inside = [it for it in items if w0 <= it["launch"] <= w1]
        w1 = max([w1] + [it["end"] for it in inside])
        nsteps = len(steps)
    else:
        inside = items
        w0, w1 = min(it["start"] for it in items), max(it["end"] for it in items)
        nsteps = 1
    return sweep(inside, w0, w1, nsteps, mode, nested=not gpu)


def sweep(items, w0, w1, nsteps, mode, nested=False):
    points = []
    for i, it in enumerate(items):
        s, e = max(it["start"], w0), min(it["end"], w1)
        if e > s:
            points.append((s, 1, i))
            points.append((e, -1, i))
    points.sort(key=lambda p: (p[0], p[1]))
    by_cat = collections.Counter()
    by_phase = collections.Counter()
    by_kernel = collections.defaultdict(lambda: [0.0, 0, None, None])
    # The same time by kernel, phase and the input shapes of the op that launched it (to tell
    # apart GEMMs of one kernel name), and the host gaps with the items on either side.
    by_shape = collections.defaultdict(lambda: [0.0, 0])
    gaps = []
    previous = None
    collective_total = 0.0
    active = set()
    last = w0
    for t, kind, i in points:
        d = t - last
        if d > 0:
            if not active:
                by_cat["bubble" if d < BUBBLE_US and last > w0 else "idle"] += d
                if d >= BUBBLE_US and previous is not None:
                    gaps.append((d, items[previous]["name"][:80], items[i]["name"][:80], items[i]["phase"]))
            else:
                if nested:  # CPU ops: the innermost one running has the instant
                    share = [max(active, key=lambda j: (items[j]["start"], -items[j]["end"]))]
                else:
                    compute = [j for j in active if items[j]["category"] not in EXPOSED_ONLY]
                    share = compute or list(active)
                for j in share:
                    it = items[j]
                    by_cat[it["category"]] += d / len(share)
                    by_phase[it["phase"]] += d / len(share)
                    k = by_kernel[(it["name"], it["category"])]
                    k[0] += d / len(share)
                    k[2], k[3] = it["category"], it["phase"]
                    by_shape[(it["name"][:80], it["phase"], str(it["dims"]))][0] += d / len(share)
                if any(items[j]["category"] == "collective" for j in active):
                    collective_total += d
            last = t
        if kind > 0:
            active.add(i)
        else:
            active.discard(i)
            previous = i
    if w1 > last:
        by_cat["idle"] += w1 - last
    for it in items:
        by_kernel[(it["name"], it["category"])][1] += 1
        by_shape[(it["name"][:80], it["phase"], str(it["dims"]))][1] += 1
    window = w1 - w0
    return {"mode": mode, "steps": nsteps, "window_us": window, "step_ms": window / nsteps / 1000,
            "categories": {k: by_cat.get(k, 0.0) for _, k in CATEGORIES},
            "phases": {p: by_phase.get(p, 0.0) for p in PHASES},
            "collectives_total_us": collective_total, "items": len(items),
            "counts": collections.Counter(it["category"] for it in items),
            "top": sorted(((v[0], n, v[1], c, v[3]) for (n, c), v in by_kernel.items()), reverse=True)[:25],
            "by_shape": sorted(((v[0], v[1], n, p, d) for (n, p, d), v in by_shape.items()), reverse=True)[:300],
            "gaps": sorted(gaps, reverse=True)[:60]}


def report(res, title):
    n = res["steps"]
    per = lambda us: us / n / 1000  # noqa: E731
    total = res["window_us"]
    lines = [f"### {title}", "",
             f"{res['mode']}: {n} step(s) profiled, {res['step_ms']:.1f} ms per step (window "
             f"{total / 1000:.1f} ms), {res['items']} work items.", "",
             "| category | ms per step | % of step | items per step |", "|---|---:|---:|---:|"]
    elementwise = sum(v for k, v in res["categories"].items() if k.startswith("ew_"))
    for label, key in CATEGORIES:
        if key == "ew_norm":
            lines.append(f"| elementwise (all) | {per(elementwise):.1f} | {100 * elementwise / total:.1f} | "
                         f"{sum(c for k, c in res['counts'].items() if k.startswith('ew_')) / n:.0f} |")
        v = res["categories"][key]
        prefix = "&nbsp;&nbsp;" if key.startswith("ew_") else ""
        count = "" if key in ("idle", "bubble") else f"{res['counts'].get(key, 0) / n:.0f}"
        lines.append(f"| {prefix}{label} | {per(v):.1f} | {100 * v / total:.1f} | {count} |")
    lines.append(f"| **step** | **{res['step_ms']:.1f}** | **100.0** | {res['items'] / n:.0f} |")
    lines += ["", f"Collectives running at all (overlapped or not): {per(res['collectives_total_us']):.1f} ms "
              "per step.", "", "| phase (GPU busy time by launch) | ms per step | % of step |", "|---|---:|---:|"]
    for p in PHASES:
        v = res["phases"][p]
        if v > 0:
            lines.append(f"| {p} | {per(v):.1f} | {100 * v / total:.1f} |")
    lines += ["", "| top items (exclusive time) | category | phase | ms per step | calls per step |",
              "|---|---|---|---:|---:|"]
    for us, name, calls, cat, phase in res["top"][:20]:
        short = name if len(name) <= 90 else name[:87] + "..."
        short = short.replace("|", "\\|")
        lines.append(f"| `{short}` | {cat} | {phase} | {per(us):.2f} | {calls / n:.0f} |")
    return "\n".join(lines) + "\n"


def slim(events, path):
    """Writes a smaller gzip copy of a trace that still reads the same here: no flow arrows, no
    strides, concrete inputs or dtypes (the shapes stay)."""
    keep = []
    drop_args = ("Input Strides", "Concrete Inputs", "Input type", "Ev Idx", "Record function id",
                 "Sequence number", "Fwd thread id")
    for e in events:
        if e.get("ph") in ("s", "f", "t") or str(e.get("cat", "")).lower() in ("ac2g", "fwdbwd"):
            continue
        args = e.get("args")
        if args:
            e = dict(e, args={k: v for k, v in args.items() if k not in drop_args})
        keep.append(e)
    with gzip.open(path, "wt", compresslevel=9) as f:
        json.dump({"traceEvents": keep}, f, separators=(",", ":"))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trace")
    p.add_argument("--config", help="the model's config.json (its vocab_size marks the loss's GEMMs)")
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--vocab", type=int)
    p.add_argument("--title")
    p.add_argument("--json", help="also write the figures as JSON")
    p.add_argument("--slim", help="also write a smaller gzip copy of the trace there")
    a = p.parse_args()
    vocab = a.vocab
    if a.config and not vocab:
        path = a.config if a.config.endswith(".json") else a.config.rstrip("/") + "/config.json"
        vocab = json.load(open(path)).get("vocab_size")
    events = load(a.trace)
    res = analyse(events, a.lora_r, vocab)
    if a.slim:
        slim(events, a.slim)
    print(report(res, a.title or a.trace))
    if a.json:
        out = dict(res)
        out["counts"] = dict(res["counts"])
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
