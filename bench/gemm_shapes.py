"""Times the base projections' bf16 GEMMs of one decoder layer as the engine issues them, and the
alternatives considered for issue 13 (q/k/v and gate/up as one GEMM; accumulate into C or not).

    python3 bench/gemm_shapes.py [--tokens 8192 --hidden 4096 --intermediate 11008 --kv-hidden 4096]

Prints one line per GEMM: the shape, the layout (forward y = x W^T, or backward dx = dy W), beta
(0: write C, 1: accumulate into C, the "badd" kernels), milliseconds (median of 20) and TFLOP/s.
"""
import argparse
import statistics

import torch


def time_ms(fn, reps=20):
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--intermediate", type=int, default=11008)
    p.add_argument("--kv-hidden", type=int, default=4096)
    a = p.parse_args()
    t, h, i, kv = a.tokens, a.hidden, a.intermediate, a.kv_hidden
    dev, dt = "cuda", torch.bfloat16
    print(torch.cuda.get_device_name(), "torch", torch.__version__)

    def forward(n_out, k, beta):  # y[t, n_out] (+)= x[t, k] W[n_out, k]^T
        x = torch.randn(t, k, device=dev, dtype=dt)
        w = torch.randn(n_out, k, device=dev, dtype=dt)
        y = torch.randn(t, n_out, device=dev, dtype=dt)
        if beta:
            return lambda: y.addmm_(x, w.t())
        return lambda: torch.mm(x, w.t(), out=y)

    def backward(n_out, k, beta):  # dx[t, k] (+)= dy[t, n_out] W[n_out, k]
        dy = torch.randn(t, n_out, device=dev, dtype=dt)
        w = torch.randn(n_out, k, device=dev, dtype=dt)
        dx = torch.randn(t, k, device=dev, dtype=dt)
        if beta:
            return lambda: dx.addmm_(dy, w)
        return lambda: torch.mm(dy, w, out=dx)

    cases = [
        ("q/o", h, h), ("k/v", kv, h), ("qkv fused", h + 2 * kv, h),
        ("gate/up", i, h), ("gate+up fused", 2 * i, h), ("down", h, i),
    ]
    total = {}
    for name, n_out, k in cases:
        for layout, make in (("fwd", forward), ("bwd", backward)):
            for beta in (0, 1):
                ms = time_ms(make(n_out, k, beta))
                tflops = 2 * t * n_out * k / ms / 1e9
                total[(name, layout, beta)] = ms
                print(f"{name:14s} {layout} beta={beta} [{t}x{k}]x[{k}x{n_out}] {ms:7.3f} ms "
                      f"{tflops:6.0f} TFLOP/s")
    for beta in (0, 1):
        for layout in ("fwd", "bwd"):
            sep = total[("q/o", layout, beta)] + 2 * total[("k/v", layout, beta)]
            sep_gu = 2 * total[("gate/up", layout, beta)]
            print(f"beta={beta} {layout}: q,k,v separate {sep:.3f} ms, fused "
                  f"{total[('qkv fused', layout, beta)]:.3f}; gate,up separate {sep_gu:.3f}, "
                  f"fused {total[('gate+up fused', layout, beta)]:.3f}")


if __name__ == "__main__":
    main()
