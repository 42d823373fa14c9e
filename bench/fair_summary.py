"""The fair benchmark's summary (bench/fair_bench.sh): results.jsonl (one JSON line per
measurement, ours from bench/summarize.py and the anchors from anchor_hf.py/anchor_deepspeed.py/
anchor_unsloth.py, each tagged with the part that made it) and parts.jsonl (each part's time and
exit status) -> a markdown report with one table of every setting, ours against the best anchor of
the same setting (and, where the results hold Unsloth, against Unsloth in a column of its own),
then the profile attributions. With --smi (nvidia-smi's samples, run_on_gpu.sh
SMI_LOG=1), the parts' table also gives the SM clock and the power each part held while it kept
the GPUs busy: H200s hold different clocks at their power limit, and a rate compared across runs
means little without it. Standard library only.
  python3 bench/fair_summary.py RESULTS.jsonl --parts PARTS.jsonl [--attribution A.md ...]
      [--header TEXT] [--smi SMI.csv] > summary.md
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flops import PEAK_BF16_FLOPS, flops_per_token, load_config, utilisation  # noqa: E402

METHOD = """\
Each figure: after {warmup} warm-up steps, {windows} consecutive windows of {window_steps} optimizer
steps; a window's rate is tokens trained per GPU in it / its wall time; the table gives the median
window and the min-max of the windows (all windows of one process: the spread is step-to-step noise,
not process-to-process). Ours: wall time from the service's progress events (steady clock of each
worker, progress reporting included, data loading and host-to-device copies included); anchors:
`time.perf_counter()` after `torch.cuda.synchronize()` at both ends of each window, batches
pre-made on the GPU. Peak memory: the CUDA caching allocator's peak allocated / reserved bytes (ours:
the worker's whole process, loading included; anchors: the training steps, after the model is set
up). MFU / HFU: model FLOPs per token from the folder's config.json (bench/flops.py: forward +
activation-gradient backward of the frozen base, LoRA forward + backward, attention as the full
s x s square; HFU adds one forward of the decoder layers for full activation checkpointing) x
tokens/s per GPU / {peak:.0f} TFLOP/s (dense bf16, H100/H200 SXM datasheet)."""


def read_jsonl(path):
    out = []
    if path and os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        out.append(json.loads(line))
                    except json.JSONDecodeError:
                        pass
    return out


def smi_samples(path):
    """nvidia-smi's samples as (timestamp, SM MHz, W, utilization %), from the CSV that
    run_on_gpu.sh writes (index, timestamp, clocks.sm, power.draw, temperature, utilization, ...);
    the timestamp as nvidia-smi prints it, YYYY/MM/DD HH:MM:SS.mmm, which orders as text."""
    out = []
    if not path or not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            cols = [c.strip() for c in line.split(",")]
            if len(cols) < 6:
                continue
            try:
                out.append((cols[1], float(cols[2].split()[0]), float(cols[3].split()[0]),
                            float(cols[5].split()[0])))
            except (ValueError, IndexError):
                continue  # the header, or a sample nvidia-smi could not take
    return out


def median(values):
    values = sorted(values)
    n = len(values)
    return None if n == 0 else (values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2)


def busy_clock(samples, started, ended, busy_percent=90):
    """The median SM clock (MHz) and power (W) of the samples between started and ended (the
    part's own timestamps, in nvidia-smi's format) with the GPU more than busy_percent utilized
    (loading and idle moments left out), and how many there were; None without any."""
    inside = [s for s in samples if started <= s[0] <= ended and s[3] > busy_percent]
    if not inside:
        return None
    return median([s[1] for s in inside]), median([s[2] for s in inside]), len(inside)


def name_of(r):
    if r.get("impl") == "ours":
        return f"**ours** ({r.get('variant', '')})"
    if r.get("impl") == "unsloth":  # its own offloaded checkpointing unless it says plain
        return "Unsloth" + (" (plain checkpointing)" if r.get("unsloth_gc") == "true" else "") + \
            (" + autocast" if r.get("autocast") else "")
    if r.get("impl") == "deepspeed":
        return "DeepSpeed ZeRO-2 + HF + peft + bnb" + (" + autocast" if r.get("autocast") else "") + \
            (" + Liger" if r.get("liger") else "")
    base = "HF + peft + bnb" if "bitsandbytes" in r.get("anchor", "") else "HF + peft, bf16 base"
    return base + (" + autocast" if r.get("autocast") else "") + (" + Liger" if r.get("liger") else "")


def recomputed_fraction(r):
    """The share of decoder layers recomputed in backward: 1 or 0, auto's split, or what ours
    reported (offloaded layers are not recomputed)."""
    if "recomputed_fraction" in r:
        return r["recomputed_fraction"]
    c = r.get("checkpointing", True)
    if c == "auto":
        split, layers = r.get("checkpointed_layers") or [], r.get("layers") or 0
        return max(split) / layers if split and layers else 1.0
    return 1.0 if c else 0.0


def mode_of(r):
    """The setting's checkpointing column: on, off, or auto with its budget."""
    c = r.get("checkpointing", True)
    if c == "auto":
        return f"auto, {r.get('max_memory_gib') or 'free'} GiB budget"
    return "checkpointing" if c else "no checkpointing"


def budget_of(mode):
    """auto's budget in GiB from mode_of's text, else None."""
    if mode.startswith("auto, "):
        try:
            return float(mode.split()[1])
        except ValueError:
            return None
    return None


def shape_of(r):
    """The setting's model and row shape: the folder's name, the sequence length, packed or not."""
    return (os.path.basename((r.get("model") or "").rstrip("/")) or "?", r.get("seq", 2048), bool(r.get("packing")))


def shape_text(shape):
    """'' for the 7B folder at sequence 2048, unpacked; else what differs, ending in ', '."""
    folder, seq, packed = shape
    parts = [] if folder in ("llama7b", "?") else [folder]
    if seq != 2048 or packed:
        parts.append(f"{'packed rows of' if packed else 'seq'} {seq}")
    return "".join(p + ", " for p in parts)


def figures(r, flop_cache):
    model = r.get("model")
    mfu = hfu = None
    if model and "tokens_per_s" in r and not r.get("packing"):  # flops.py: attention over whole rows
        key = (model, r.get("seq", 2048), r.get("lora_r", 16), recomputed_fraction(r))
        if key not in flop_cache:
            try:
                flop_cache[key] = flops_per_token(load_config(model), *key[1:])
            except (OSError, KeyError, ValueError):
                flop_cache[key] = None
        if flop_cache[key]:
            mfu, hfu = utilisation(r["tokens_per_s"], flop_cache[key])
    return mfu, hfu


def table(results):
    flop_cache = {}
    rows = [r for r in results if "tokens_per_s" in r and not r.get("error")]
    order = {"checkpointing": 0, "no checkpointing": 1}
    settings = sorted({(shape_of(r), r.get("gpus", 1), r.get("micro_batch"), mode_of(r)) for r in rows},
                      key=lambda s: (s[0][0] != "llama7b", s[0], s[1], order.get(s[3], 2), -s[2]))
    # A "vs Unsloth" column only where the results hold Unsloth: older results read as before.
    with_unsloth = any(r.get("impl") == "unsloth" for r in rows)
    lines = ["| setting | implementation | tokens/s per GPU: median (min-max) | step time | peak allocated "
             "| peak reserved | MFU | HFU | vs best anchor |" + (" vs Unsloth |" if with_unsloth else ""),
             "|---|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if with_unsloth else "")]
    for shape, gpus, mb, mode in settings:
        group = [r for r in rows
                 if (shape_of(r), r.get("gpus", 1), r.get("micro_batch"), mode_of(r)) == (shape, gpus, mb, mode)]
        budget = budget_of(mode)
        if budget is not None:  # auto: against every anchor of the same size whose peak fits the budget
            group += [r for r in rows if r.get("impl") != "ours" and (shape_of(r), r.get("gpus", 1), r.get("micro_batch"))
                      == (shape, gpus, mb) and r.get("peak_allocated_gib", float("inf")) <= budget]
        anchors = [r for r in group if r.get("impl") != "ours"]
        best = max(anchors, key=lambda r: r["tokens_per_s"]) if anchors else None
        unsloths = [r for r in anchors if r.get("impl") == "unsloth"]
        unsloth = max(unsloths, key=lambda r: r["tokens_per_s"]) if unsloths else None
        setting = f"{shape_text(shape)}{gpus} GPU{'s' if gpus > 1 else ''}, mb {mb}, {mode}"
        for r in sorted(group, key=lambda r: (r.get("impl") != "ours", -r["tokens_per_s"])):
            mfu, hfu = figures(r, flop_cache)
            vs = ""
            if best is not None:
                vs = "best anchor" if r is best else f"{r['tokens_per_s'] / best['tokens_per_s']:.2f}x"
            vs_unsloth = ""
            if with_unsloth:
                vs_unsloth = " — |" if unsloth is None else (
                    " Unsloth |" if r is unsloth else f" {r['tokens_per_s'] / unsloth['tokens_per_s']:.2f}x |")
            lo, hi = r.get("tokens_per_s_min", r["tokens_per_s"]), r.get("tokens_per_s_max", r["tokens_per_s"])
            name = name_of(r)
            if r.get("checkpointing") == "auto" and r.get("checkpointed_layers"):
                name += f", {max(r['checkpointed_layers'])} of {r.get('layers')} layers checkpointed"
            elif budget is not None and r.get("impl") != "ours":
                name += f" ({mode_of(r)})"
            lines.append(
                f"| {setting} | {name} | {r['tokens_per_s']:,.0f} ({lo:,.0f}-{hi:,.0f}) | "
                f"{r.get('step_time_s', 0):.3f} s | {r.get('peak_allocated_gib', float('nan')):.2f} GiB | "
                f"{r.get('peak_reserved_gib', float('nan')):.2f} GiB | "
                f"{'' if mfu is None else f'{mfu:.1%}'} | {'' if hfu is None else f'{hfu:.1%}'} | {vs} |{vs_unsloth}")
    return "\n".join(lines)


def unsloth_note(results):
    """What the Unsloth anchor ran, under the table, where the results hold it."""
    rows = [r for r in results if r.get("impl") == "unsloth" and "tokens_per_s" in r and not r.get("error")]
    if not rows:
        return []
    version = (rows[0].get("versions") or {}).get("unsloth", "?")
    return [f"Unsloth {version} (bench/anchor_unsloth.py): FastLanguageModel 4-bit (bitsandbytes NF4, double "
            "quantization, bf16 compute), LoRA r=16 on all seven projections through its Triton kernels, its "
            "offloaded checkpointing unless the setting says none, a plain loop; its compile on the first steps "
            "falls in the warm-up. \"vs Unsloth\": the row's rate over Unsloth's in the same setting.", ""]


def packing_notes(results):
    """Ours packed against ours unpacked at the same row length, and how the anchors packed."""
    rows = [r for r in results if "tokens_per_s" in r and not r.get("error")]
    lines = []
    for r in rows:
        if r.get("impl") != "ours" or not r.get("packing"):
            continue
        same = [u for u in rows if u.get("impl") == "ours" and not u.get("packing") and
                shape_of(u)[:2] == shape_of(r)[:2] and (u.get("gpus", 1), u.get("micro_batch"), mode_of(u)) ==
                (r.get("gpus", 1), r.get("micro_batch"), mode_of(r))]
        fill = f", rows {r['row_fill']:.1%} full" if "row_fill" in r else ""
        if same:
            u = same[0]
            lines.append(f"- seq {r.get('seq')}: ours packed {r['tokens_per_s']:,.0f} non-padding tok/s{fill} against "
                         f"ours unpacked {u['tokens_per_s']:,.0f} tok/s: {r['tokens_per_s'] / u['tokens_per_s']:.2f}x")
        else:
            lines.append(f"- seq {r.get('seq')}: ours packed {r['tokens_per_s']:,.0f} non-padding tok/s{fill} "
                         "(no unpacked run at this length)")
    for r in rows:
        if r.get("impl") != "ours" and r.get("packing"):
            docs = r.get("documents_per_row") or []
            mean_docs = f"{sum(docs) / len(docs):.1f}" if docs else "?"
            detected = r.get("packing_detected_by_transformers")
            attention = {True: "transformers detects the packing and builds a dense block-diagonal causal mask "
                               "[batch, 1, seq, seq] bool, so SDPA runs with a mask, without its flash kernel",
                         False: "transformers does not detect the packing: documents attend to each other"}.get(
                detected, "whether transformers detects the packing is unknown (no find_packed_sequence_indices)")
            lines.append(
                f"- seq {r.get('seq')}: {name_of(r)} packed with {r.get('packing_collator', '?')} (documents of "
                f"{r.get('doc_tokens')} tokens, {mean_docs} per row; position ids restart at 0, no attention "
                f"mask, use_cache=False), attn_implementation sdpa, transformers "
                f"{(r.get('versions') or {}).get('transformers', '?')}: {attention}")
    if not lines:
        return []
    return ["Packed rows (ours: varlen flash attention per document; MFU left out, since flops.py counts "
            "attention over whole rows):", ""] + lines + [""]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("results")
    p.add_argument("--parts")
    p.add_argument("--attribution", nargs="*", default=[])
    p.add_argument("--header", default="")
    p.add_argument("--smi")
    a = p.parse_args()
    results = read_jsonl(a.results)
    parts = read_jsonl(a.parts)
    first = next((r for r in results if "window_steps" in r), {})
    out = [f"# Fair benchmark: ours against the anchors at their best{(' - ' + a.header) if a.header else ''}", ""]
    out.append(METHOD.format(warmup=first.get("warmup_steps", "?"), windows=first.get("windows", "?"),
                             window_steps=first.get("window_steps", "?"), peak=PEAK_BF16_FLOPS / 1e12))
    out += ["", table(results), ""]
    out += unsloth_note(results)
    out += packing_notes(results)
    ours = [r for r in results if r.get("impl") == "ours" and "mean_of_per_step_rates" in r]
    if ours:
        out += ["Ours, the mean of the per-step rates over the same steps (what the service's progress shows; "
                "it leaves out the time between steps, where the progress is reported): " +
                "; ".join(f"{r.get('label')} {r['mean_of_per_step_rates']:,.0f}" for r in ours) + ".", ""]
    errors = [r for r in results if r.get("error")]
    if errors:
        out += ["Failed measurements:", ""]
        out += [f"- {r.get('part')}: {name_of(r)}, mb {r.get('micro_batch')}: `{r['error']}`" for r in errors]
        out.append("")
    if parts:
        samples = smi_samples(a.smi)
        clocks = {id(q): busy_clock(samples, q["started"], q["ended"]) for q in parts
                  if "started" in q and "ended" in q}
        if any(clocks.values()):
            out += ["| part | exit status | seconds | SM clock while busy (median) | power (median) | note |",
                    "|---|---:|---:|---:|---:|---|"]
            for q in parts:
                c = clocks.get(id(q))
                clock = f"{c[0]:,.0f} MHz ({c[2]} sample{'' if c[2] == 1 else 's'})" if c else ""
                power = f"{c[1]:.0f} W" if c else ""
                out.append(f"| {q.get('part')} | {q.get('rc', '')} | {q.get('seconds', '')} | {clock} | {power} | "
                           f"{q.get('note', '')} |")
        else:
            out += ["| part | exit status | seconds | note |", "|---|---:|---:|---|"]
            for q in parts:
                out.append(f"| {q.get('part')} | {q.get('rc', '')} | {q.get('seconds', '')} | {q.get('note', '')} |")
        out.append("")
    versions = {}
    for r in results:
        for k, v in (r.get("versions") or {}).items():
            if v:
                versions[k] = v
    if versions:
        out += ["Versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())), ""]
    for path in a.attribution:
        if os.path.exists(path):
            with open(path) as f:
                out += ["", f.read()]
    print("\n".join(out))


if __name__ == "__main__":
    main()
