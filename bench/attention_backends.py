"""Times causal attention forward and backward under each of PyTorch's SDPA backends.

The engine's unpacked rows call at::scaled_dot_product_attention, which takes whichever backend
ATen's priority order picks; this prints what each backend would cost at the benchmark's shapes,
in the engine's layout (q/k/v as transposed views of [batch, seq, heads, head_dim] rows), and
how far each backend's output and gradients are from the math backend in float32.

  python3 bench/attention_backends.py [--shapes 4x32x2048x128,4x64x2048x128] [--repeat 20]
"""
import argparse

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def inputs(batch, heads, seq, dim, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    rows = [torch.randn(batch, seq, heads * dim, device="cuda", generator=g, dtype=torch.bfloat16)
            for _ in range(3)]
    qkv = [r.view(batch, seq, heads, dim).transpose(1, 2).requires_grad_() for r in rows]
    grad = torch.randn(batch, heads, seq, dim, device="cuda", generator=g, dtype=torch.bfloat16)
    return qkv, grad


def time_ms(fn, repeat):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeat):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2], times[0], times[-1]


def run(shape, repeat):
    batch, heads, seq, dim = shape
    (q, k, v), grad = inputs(*shape)
    # Causal FLOPs: QK^T and PV, half of the square each; backward 2.5x forward.
    fwd_flop = 4 * batch * heads * seq * seq * dim / 2
    with sdpa_kernel(SDPBackend.MATH):
        qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
        ref = torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, is_causal=True)
        ref_grads = torch.autograd.grad(ref, (qf, kf, vf), grad.float())
    for name, backend in BACKENDS.items():
        try:
            with sdpa_kernel(backend):
                def fwd():
                    with torch.no_grad():
                        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

                def fwd_bwd():
                    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                    torch.autograd.grad(out, (q, k, v), grad)

                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                grads = torch.autograd.grad(out, (q, k, v), grad)
                err = max([(out.float() - ref).abs().max().item()] +
                          [(a.float() - b).abs().max().item() for a, b in zip(grads, ref_grads)])
                f, fmin, fmax = time_ms(fwd, repeat)
                fb, fbmin, fbmax = time_ms(fwd_bwd, repeat)
            b = fb - f
            print(f"{'x'.join(map(str, shape))} {name:9s} fwd {f:7.3f} ms ({fwd_flop / f / 1e9:6.1f} "
                  f"TFLOP/s)  bwd {b:7.3f} ms ({2.5 * fwd_flop / b / 1e9:6.1f})  fwd+bwd {fb:7.3f} "
                  f"[{fbmin:.3f}, {fbmax:.3f}]  max|err| vs fp32 math {err:.4f}", flush=True)
        except RuntimeError as e:
            print(f"{'x'.join(map(str, shape))} {name:9s} unavailable: {str(e).splitlines()[0]}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="4x32x2048x128,1x32x2048x128,4x64x2048x128")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.get_device_name())
    for s in args.shapes.split(","):
        run(tuple(int(x) for x in s.split("x")), args.repeat)


if __name__ == "__main__":
    main()
