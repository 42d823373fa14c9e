"""Probe: does memory-bound work on a side stream hide under the base GEMMs?

One 7B decoder layer's forward GEMMs (8192 tokens; q/k/v with the widened K of the LoRA columns,
o, gate/up, down) run back to back ("gemms"), each after a uint8 -> bf16 conversion of its
weight's size standing in for the NF4 dequantize ("serial"), and with that conversion on a second
stream while the previous GEMM runs ("overlapped"); "copies" alone for scale. Milliseconds per
layer, three repetitions. On an H200 at its 700 W limit
(bench/reports/kernels_h200_2026-12-01_04.md) overlapping was slower than serial: the GEMMs hold
the power limit and the persistent GEMM kernels leave no room on the SMs, so memory-bound passes
do not hide under them.

  python3 bench/gemm_overlap_probe.py      (a CUDA GPU and torch; not part of the product)
"""
import torch, time
dev = 'cuda'; bf = torch.bfloat16; T = 8192
shapes = [(4144, 4096)] * 3 + [(4096, 4096)] + [(4128, 11008)] * 2 + [(11008, 4096)]
xs = {k: torch.randn(T, k, dtype=bf, device=dev) for k in {s[0] for s in shapes}}
ws = [torch.randn(k, n, dtype=bf, device=dev) for k, n in shapes]
outs = [torch.empty(T, n, dtype=bf, device=dev) for k, n in shapes]
src = [torch.randint(0, 255, (k * n,), dtype=torch.uint8, device=dev) for k, n in shapes]
dst = [[torch.empty(k * n, dtype=bf, device=dev) for k, n in shapes] for _ in range(2)]
side = torch.cuda.Stream()
main = torch.cuda.current_stream()
def gemms(layers):
    for _ in range(layers):
        for j in range(7): torch.mm(xs[shapes[j][0]], ws[j], out=outs[j])
def serial(layers):
    for _ in range(layers):
        for j in range(7):
            dst[0][j].copy_(src[j]); torch.mm(xs[shapes[j][0]], ws[j], out=outs[j])
def overlapped(layers):
    ev = [torch.cuda.Event() for _ in range(7)]
    for _ in range(layers):
        for j in range(7):
            side.wait_stream(main)
            with torch.cuda.stream(side):
                dst[1][j].copy_(src[j]); ev[j].record(side)
            torch.mm(xs[shapes[j][0]], ws[j], out=outs[j])
            main.wait_event(ev[j])
def copies(layers):
    for _ in range(layers):
        for j in range(7): dst[0][j].copy_(src[j])
def timed(fn, layers=64):
    torch.cuda.synchronize(); t = time.perf_counter(); fn(layers); torch.cuda.synchronize()
    return (time.perf_counter() - t) / layers * 1e3
gemms(200)
for rep in range(3):
    r = {f.__name__: timed(f) for f in (gemms, copies, serial, overlapped, gemms, serial, overlapped)}
    print(rep, ' '.join(f'{k}={v:.3f}ms/layer' for k, v in r.items()), flush=True)
