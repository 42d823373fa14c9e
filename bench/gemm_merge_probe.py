"""Probe: one GEMM over the concatenated weights of the projections that share
an input (q/k/v, gate/up) against one GEMM per projection, forward (y_i = x W_i) and backward
(dx = sum_i dy_i W_i^T: beta = 1 after the first, or one GEMM over [dy_1 | dy_2 | ...]), at the 7B
shapes with 8192 tokens, through torch.mm (cuBLAS's pick). Prints ms and TFLOP/s, two repetitions.
On an H200 (bench/reports/kernels_h200_2026-12-01_04.md): forward no faster merged; backward
q/k/v 0-5 % and gate/up 0-4 % faster, i.e. at most ~2-3 ms of a 7B step.

  python3 bench/gemm_merge_probe.py        (a CUDA GPU and torch; not part of the product)
"""
import torch, time
dev = 'cuda'; bf = torch.bfloat16; T = 8192
def mk(*s): return torch.randn(*s, dtype=bf, device=dev) * 0.02
def timed(fn, n=40):
    for _ in range(5): fn()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize(); return (time.perf_counter() - t) / n * 1e3
cases = {'qkv': (4144, [4096] * 3), 'gateup': (4128, [11008] * 2)}
heat = (mk(T, 4096), mk(4096, 4096))
for _ in range(300): torch.mm(*heat)
for rep in range(2):
  for name, (k, ns) in cases.items():
    x = mk(T, k); ws = [mk(k, n) for n in ns]; wcat = torch.cat(ws, 1)
    outs = [torch.empty(T, n, dtype=bf, device=dev) for n in ns]; ocat = torch.empty(T, sum(ns), dtype=bf, device=dev)
    f_sep = lambda: [torch.mm(x, w, out=o) for w, o in zip(ws, outs)]
    f_cat = lambda: torch.mm(x, wcat, out=ocat)
    # backward: dx = sum_i dy_i W_i^T  vs  [dy_1|..] [W_1;..]^T
    dys = [mk(T, n) for n in ns]; dycat = torch.cat(dys, 1); dx = torch.empty(T, k, dtype=bf, device=dev)
    wts = [w.t() for w in ws]; wcatt = wcat.t()
    def b_sep():
        torch.mm(dys[0], wts[0], out=dx)
        for d, w in zip(dys[1:], wts[1:]): dx.addmm_(d, w)
    b_cat = lambda: torch.mm(dycat, wcatt, out=dx)
    flops = 2 * T * k * sum(ns)
    for label, fn in (('fwd sep', f_sep), ('fwd cat', f_cat), ('bwd sep', b_sep), ('bwd cat', b_cat)):
        ms = timed(fn)
        print(f'{rep} {name:7s} {label}: {ms:.3f} ms {flops / ms / 1e9:.0f} TFLOP/s', flush=True)
