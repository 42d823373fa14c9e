#!/usr/bin/env python3
"""Where a profiled step's GPU memory peaks: reads a Kineto trace with the caching allocator's
[memory] events (QLORA_PROFILE_MEMORY=1, or BENCH_PROFILE_MEMORY=1 for bench/run_service_bench.sh)
and prints the peak of allocated bytes, the phase and the CPU ops running at that moment, and the
tensors alive then that were allocated inside the trace (grouped by the op that allocated them:
the innermost autograd node or op and the size), largest first. What was allocated before the
trace (weights, optimizer state, and anything older than the profiled steps) is one line.

  bench/memory_peak.py trace.json[.gz] [--top 20]
"""
import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attribute_profile as ap  # noqa: E402

CUDA = 1  # "Device Type" of a CUDA allocation in Kineto's [memory] events


def op_label(ops):
    """The innermost autograd node (if any) and the innermost op: who asked for the bytes."""
    nodes = [o for o in ops if o.startswith("autograd::engine::evaluate_function")]
    node = nodes[-1].split(": ", 1)[-1] if nodes else ""
    node = node.replace("torch::autograd::CppNode<", "").replace("(anonymous namespace)::", "")
    inner = ops[-1] if ops else "(no op)"
    return f"{node[:70]} / {inner[:50]}" if node else inner[:90]


def analyse(events):
    threads, ranges = ap.cpu_threads(events)
    memory = [e for e in events
              if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == CUDA]
    if not memory:
        raise SystemExit("no CUDA [memory] events: profile with QLORA_PROFILE_MEMORY=1")

    def ops_at(e):
        th = threads.get((e.get("pid"), e.get("tid")))
        return th.op_names(th.enclosing(e["ts"])) if th else []

    memory.sort(key=lambda e: e["ts"])
    live = {}
    peak, peak_event, peak_live = -1, None, {}
    for e in memory:
        args = e["args"]
        size, addr = int(args.get("Bytes", 0)), args.get("Addr")
        if size > 0:
            live[addr] = (size, e)
        else:
            live.pop(addr, None)
        total = int(args.get("Total Allocated", 0))
        if total > peak:
            peak, peak_event, peak_live = total, e, dict(live)
    groups = collections.defaultdict(lambda: [0, 0])
    for size, e in peak_live.values():
        g = groups[(op_label(ops_at(e)), size)]
        g[0] += 1
        g[1] += size
    ops = ops_at(peak_event)
    return {"peak": peak, "phase": ap.phase_of(peak_event["ts"], ranges, ops), "ops": ops,
            "in_trace": sum(s for s, _ in peak_live.values()), "groups": groups,
            "reserved": int(peak_event["args"].get("Total Reserved", 0))}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trace")
    p.add_argument("--top", type=int, default=20)
    a = p.parse_args()
    r = analyse(ap.load(a.trace))
    mib = lambda b: b / 2**20  # noqa: E731
    print(f"peak allocated {mib(r['peak']):.1f} MiB ({r['peak'] / 2**30:.2f} GiB; reserved then "
          f"{r['reserved'] / 2**30:.2f} GiB), phase {r['phase']}")
    print("ops running: " + " > ".join(o[:60] for o in r["ops"][-4:]))
    print(f"allocated before the trace: {mib(r['peak'] - r['in_trace']):.1f} MiB; inside it, alive "
          f"at the peak: {mib(r['in_trace']):.1f} MiB")
    print("\n| allocated by (node / op) | bytes each | count | MiB |\n|---|---:|---:|---:|")
    rows = sorted(r["groups"].items(), key=lambda kv: -kv[1][1])
    for (label, size), (count, total) in rows[:a.top]:
        print(f"| {label.replace('|', '/')} | {size} | {count} | {mib(total):.1f} |")


if __name__ == "__main__":
    main()
