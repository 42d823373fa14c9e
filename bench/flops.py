"""FLOPs per trained token of LoRA/QLoRA on a LLaMA-shaped model, from its config.json.

Standard library only (the summaries run anywhere). The model, per token, for a frozen base with
LoRA adapters of rank r on every linear layer of the decoder (q, k, v, o, gate, up, down; not
lm_head), sequence s:

  N_layers = L * (h*(nh*dh) + 2*h*(nkv*dh) + (nh*dh)*h + 3*h*i)   decoder matmul weights
  N_head   = V * h                                                  lm_head (the embedding is a lookup)
  N_lora   = L * r * sum over the 7 projections of (in + out)
  A        = 4 * s * nh * dh * L     attention scores + weighted sum, forward, full s x s square
                                     (PaLM appendix B's convention; a causal kernel does about
                                     half of it, so A overstates the work by A/2, ~1.8% of the
                                     total at the 7B shape and s = 2048)

  forward   = 2*(N_layers + N_head) + 2*N_lora + A
  backward  = 2*(N_layers + N_head) + 4*N_lora + 2*A   activation gradients only for the frozen
                                                       base (no weight gradients), both for LoRA
  model     = forward + backward                       the MFU basis (~ 4N)
  recompute = 2*N_layers + 2*N_lora + A                one more forward of the decoder layers
                                                       under full activation checkpointing
  hardware  = model + recompute (with checkpointing)   the HFU basis (~ 6N)

The same convention for every implementation: what a run executes beyond this (ours recomputes
the lm_head logits in the chunked loss's backward; Liger's fused loss does not) is not counted.
LLaMA-2-7B at s = 2048, r = 16: model 29.9 GFLOP/token, hardware 44.0 GFLOP/token.
"""
import json

# Dense bf16 peak of an H100/H200 SXM (datasheet), the denominator of MFU and HFU.
PEAK_BF16_FLOPS = 989e12


def load_config(path):
    """config.json of a folder (or the file itself) -> dict."""
    if not path.endswith(".json"):
        path = path.rstrip("/") + "/config.json"
    with open(path) as f:
        return json.load(f)


def shape_of(config):
    h = int(config["hidden_size"])
    nh = int(config["num_attention_heads"])
    return {
        "hidden": h,
        "intermediate": int(config["intermediate_size"]),
        "layers": int(config["num_hidden_layers"]),
        "heads": nh,
        "kv_heads": int(config.get("num_key_value_heads") or nh),
        "head_dim": int(config.get("head_dim") or h // nh),
        "vocab": int(config["vocab_size"]),
    }


def flops_per_token(config, seq, lora_r=16, checkpointing=True):
    """dict: forward, backward, recompute, model (MFU basis), hardware (HFU basis), in FLOP/token,
    and the parameter counts they come from."""
    c = shape_of(config)
    h, i, L, nh, nkv, dh, v = (c[k] for k in ("hidden", "intermediate", "layers", "heads", "kv_heads",
                                              "head_dim", "vocab"))
    q, kv = nh * dh, nkv * dh
    n_layers = L * (h * q + 2 * h * kv + q * h + 3 * h * i)
    n_head = v * h
    # (in, out) of q, k, v, o, gate, up, down
    projections = [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]
    n_lora = L * lora_r * sum(a + b for a, b in projections)
    attention = 4 * seq * nh * dh * L
    forward = 2 * (n_layers + n_head) + 2 * n_lora + attention
    backward = 2 * (n_layers + n_head) + 4 * n_lora + 2 * attention
    # checkpointing: True (every layer recomputed), False, or the fraction of layers (auto)
    recompute = (2 * n_layers + 2 * n_lora + attention) * float(checkpointing)
    model = forward + backward
    return {"forward": forward, "backward": backward, "recompute": recompute, "model": model,
            "hardware": model + recompute, "n_layers": n_layers, "n_head": n_head, "n_lora": n_lora,
            "attention_forward": attention, "seq": seq, "lora_r": lora_r, "checkpointing": checkpointing}


def utilisation(tokens_per_s_per_gpu, flops, peak=PEAK_BF16_FLOPS):
    """(MFU, HFU) of a per-GPU token rate."""
    return tokens_per_s_per_gpu * flops["model"] / peak, tokens_per_s_per_gpu * flops["hardware"] / peak


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("config", help="a model folder or its config.json")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--no-checkpointing", action="store_true")
    a = p.parse_args()
    f = flops_per_token(load_config(a.config), a.seq, a.lora_r, not a.no_checkpointing)
    print(json.dumps({k: (round(x / 1e9, 3) if isinstance(x, int) and x > 1e6 else x) for k, x in f.items()}))
