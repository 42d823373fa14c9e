"""Shows ATen's cuDNN attention backward going wrong when a shape's incoming gradient changes layout.

For each shape: which backend SDPA picks by default, then two calls in a row whose output
gradients are laid out differently ([batch, heads, seq, dim] contiguous, "bhsd", and the layout
the model's o_proj hands back, "bshd"), in both orders, for SDPA's default, forced cuDNN and forced
flash. Prints each call's worst q/k/v gradient error relative to the float32 math result: ~0.005
is bf16 rounding; ~1.5 is a wrong gradient. worker/engine/cudnn_attention.h says why the engine
has its own node.

  python3 bench/cudnn_gradient_layout.py
"""
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

F = torch.nn.functional
NAMES = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}


def call_error(b, h, hkv, s, d, layout, backend, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rows(heads):
        return torch.randn(b, s, heads, d, device="cuda", generator=g,
                           dtype=torch.bfloat16).transpose(1, 2).requires_grad_()

    q, k, v = rows(h), rows(hkv), rows(hkv)
    w = torch.randn(b, h, s, d, device="cuda", generator=g, dtype=torch.bfloat16)
    if layout == "bshd":
        w = w.transpose(1, 2).contiguous().transpose(1, 2)
    gqa = h != hkv
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.MATH):
        ref = F.scaled_dot_product_attention(qf, kf, vf, is_causal=True, enable_gqa=gqa)
        ref_grads = torch.autograd.grad(ref, (qf, kf, vf), w.float())
    ctx = sdpa_kernel(backend) if backend is not None else torch.enable_grad()
    with ctx:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        grads = torch.autograd.grad(out, (q, k, v), w)
    return max((a.float() - r).abs().max().item() / max(r.abs().max().item(), 1)
               for a, r in zip(grads, ref_grads))


def main():
    print(torch.__version__, "cuDNN", torch.backends.cudnn.version(), torch.cuda.get_device_name())
    shapes = [(1, 8, 8, 256, 128), (2, 8, 8, 256, 128), (1, 8, 2, 256, 128), (2, 8, 2, 256, 128),
              (1, 32, 32, 2048, 128), (1, 32, 8, 2048, 128), (4, 32, 8, 2048, 128)]
    for b, h, hkv, s, d in shapes:
        q = torch.empty(b, h, s, d, device="cuda", dtype=torch.bfloat16)
        k = torch.empty(b, hkv, s, d, device="cuda", dtype=torch.bfloat16)
        choice = torch._fused_sdp_choice(q, k, k, None, 0.0, True, enable_gqa=h != hkv)
        results = []
        for backend in [None, SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]:
            for order in [("bhsd", "bshd"), ("bshd", "bhsd")]:
                errors = [call_error(b, h, hkv, s, d, lay, backend, i) for i, lay in enumerate(order)]
                name = "default" if backend is None else backend.name[:5]
                results.append(f"{name} {order[0]}->{order[1]}: {errors[0]:.3f},{errors[1]:.3f}")
        print(f"b{b} h{h} kv{hkv} s{s} default={NAMES.get(choice, choice)} | " + " | ".join(results),
              flush=True)


if __name__ == "__main__":
    main()
