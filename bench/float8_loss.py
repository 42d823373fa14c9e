#!/usr/bin/env python3
"""FP8 against bf16 over one training run each (quantization.float8_base_forward, docs/float8.md).

Reads the two jobs' `qloractl watch -o json` event files and prints, at every evaluation, both
validation losses and their relative difference, then the largest one and whether it is within
the bar (1 %). Also the training loss, averaged over the steps between evaluations.

  float8_loss.py BF16_EVENTS FP8_EVENTS [--bar 0.01] [--markdown OUT]
"""
import argparse
import json
import sys


def steps(path):
    out = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            if event.get("type") == "step":
                out[event["step"]] = event
    return out


def evaluations(events):
    """(step, eval_loss) where the eval loss changes (an evaluation just ran)."""
    out, last = [], None
    for step in sorted(events):
        loss = events[step].get("eval_loss")
        if loss is not None and loss > 0 and loss != last:
            out.append((step, loss))
            last = loss
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("bf16")
    parser.add_argument("fp8")
    parser.add_argument("--bar", type=float, default=0.01)
    parser.add_argument("--markdown")
    args = parser.parse_args()
    a, b = steps(args.bf16), steps(args.fp8)
    ea, eb = dict(evaluations(a)), dict(evaluations(b))
    common = sorted(set(ea) & set(eb))
    if not common:
        print("no evaluation in both runs", file=sys.stderr)
        return 1
    lines = ["| step | eval loss, bf16 | eval loss, FP8 | relative difference | train loss since last, bf16 | FP8 |",
             "|---:|---:|---:|---:|---:|---:|"]
    worst, previous = 0.0, 0
    for step in common:
        rel = abs(eb[step] - ea[step]) / ea[step]
        worst = max(worst, rel)
        window = [s for s in a if previous < s <= step and s in b and a[s].get("loss") and b[s].get("loss")]
        ta = sum(a[s]["loss"] for s in window) / max(len(window), 1)
        tb = sum(b[s]["loss"] for s in window) / max(len(window), 1)
        lines.append(f"| {step} | {ea[step]:.4f} | {eb[step]:.4f} | {100 * rel:.2f} % | {ta:.4f} | {tb:.4f} |")
        previous = step
    verdict = "within" if worst <= args.bar else "OUTSIDE"
    lines.append("")
    lines.append(f"largest relative difference of the eval loss: {100 * worst:.2f} % over "
                 f"{len(common)} evaluations: {verdict} the {100 * args.bar:.0f} % bar")
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    return 0 if worst <= args.bar else 2


if __name__ == "__main__":
    sys.exit(main())
