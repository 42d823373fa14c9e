"""Anchor: transformers + peft (+ bitsandbytes) at its best, as its users run it, on the same
folder, shape and settings as our benchmark: sequence 2048, LoRA r=16 (alpha 32) on all linear
layers, NF4 + double quantization + bf16 compute (or --bf16-base: LoRA on an unquantized bf16
base), AdamW (fused, HF Trainer's default optimizer), SDPA attention, activation checkpointing
(non-reentrant), and `torch.autocast("cuda", dtype=torch.bfloat16)` around the forward (what HF
Trainer's bf16=True does; without it peft runs the LoRA branch in fp32). --liger patches the
model with Liger kernels before it is built (RoPE, RMSNorm, SwiGLU, fused linear cross-entropy).

One model load, then one measurement per micro-batch given (bench/anchor_common.py: warm-up
steps, then windows of steps timed as tokens / wall time; median, min, max), and optionally the
first one again without activation checkpointing. One JSON line per measurement.
  python3 bench/anchor_hf.py MODEL_DIR --micro-batches 1 4 [--liger] [--no-checkpointing-too]
      [--warmup 3 --windows 3 --window-steps 5] [--profile-out trace.json --profile-micro-batch 4]
"""
import argparse
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from anchor_common import apply_liger, emit, measure, profile, scope  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("--micro-batches", type=int, nargs="+", default=[4])
p.add_argument("--micro-batch", type=int, help="one micro-batch (the older interface)")
p.add_argument("--seq", type=int, default=2048)
p.add_argument("--warmup", type=int, default=3)
p.add_argument("--windows", type=int, default=3)
p.add_argument("--window-steps", type=int, default=5)
p.add_argument("--steps", type=int, help="the older interface: 2 warm-up steps, one window of the rest")
p.add_argument("--liger", action="store_true", help="Liger kernels (liger-kernel wheel)")
p.add_argument("--no-autocast", action="store_true", help="the older, weakened anchor (LoRA in fp32)")
p.add_argument("--bf16-base", action="store_true", help="LoRA on an unquantized bf16 base")
p.add_argument("--no-checkpointing-too", action="store_true",
               help="after the others, the first micro-batch again without activation checkpointing")
p.add_argument("--profile-out", help="a Chrome trace of --profile-steps steps after the measurement")
p.add_argument("--profile-micro-batch", type=int, help="which micro-batch to profile (default: the first)")
p.add_argument("--profile-steps", type=int, default=2)
p.add_argument("--lora-r", type=int, default=16)
p.add_argument("--device", default="cuda", help="cuda (the benchmark) or cpu (a dry run of this script)")
a = p.parse_args()
if a.micro_batch:
    a.micro_batches = [a.micro_batch]
if a.steps:
    a.warmup, a.windows, a.window_steps = 2, 1, max(1, a.steps - 2)
cuda = a.device.startswith("cuda")
autocast = not a.no_autocast

started = time.perf_counter()
liger_version = apply_liger() if a.liger else None  # before the model is built

from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

kwargs = {"dtype": torch.bfloat16, "device_map": {"": 0} if cuda else {"": "cpu"}, "attn_implementation": "sdpa"}
bnb_version = None
if not a.bf16_base:
    import importlib.metadata

    from transformers import BitsAndBytesConfig

    bnb_version = importlib.metadata.version("bitsandbytes")
    kwargs["quantization_config"] = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16)
model = AutoModelForCausalLM.from_pretrained(a.model, **kwargs)
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
model.enable_input_require_grads()
model = get_peft_model(model, LoraConfig(r=a.lora_r, lora_alpha=2 * a.lora_r, lora_dropout=0.0,
                                         target_modules="all-linear", task_type="CAUSAL_LM"))
model.train()  # from_pretrained returns eval mode, where checkpointing is silently skipped
params = [q for q in model.parameters() if q.requires_grad]
opt = torch.optim.AdamW(params, lr=1e-4, fused=cuda)  # HF Trainer's default: adamw_torch_fused
load_s = time.perf_counter() - started
vocab = model.config.vocab_size
gen = torch.Generator().manual_seed(0)
variant = ("bf16-base" if a.bf16_base else "nf4-dq") + ("+autocast" if autocast else "") + ("+liger" if a.liger else "")
print(f"# anchor hf {variant}: loaded and set up in {load_s:.1f} s; trainable {sum(q.numel() for q in params):,}",
      file=sys.stderr, flush=True)


def make_step(micro_batch):
    # A pool of batches on the device, made before timing (random ids, as the old anchors).
    pool = [torch.randint(3, min(vocab, 500), (micro_batch, a.seq), generator=gen).to(a.device) for _ in range(4)]
    state = {"i": 0}

    def step():
        ids = pool[state["i"] % len(pool)]
        state["i"] += 1
        with scope("qlora::step"):
            with scope("qlora::forward"), torch.autocast(a.device.split(":")[0], dtype=torch.bfloat16,
                                                         enabled=autocast):
                loss = model(input_ids=ids, labels=ids).loss
            with scope("qlora::backward"):
                loss.backward()
            with scope("qlora::optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
        return loss

    return step


runs = [(mb, True) for mb in a.micro_batches]
if a.no_checkpointing_too:
    runs.append((a.micro_batches[0], False))
profile_mb = a.profile_micro_batch or a.micro_batches[0]
failed = False
for mb, checkpointing in runs:
    record = {"impl": "hf", "anchor": "transformers+peft" + ("" if a.bf16_base else "+bitsandbytes"),
              "variant": variant, "gpus": 1, "micro_batch": mb, "seq": a.seq, "checkpointing": checkpointing,
              "autocast": autocast, "liger": a.liger, "model": os.path.abspath(a.model), "lora_r": a.lora_r,
              "load_s": round(load_s, 1), "versions": {"torch": torch.__version__, "bitsandbytes": bnb_version,
                                                       "liger_kernel": liger_version}}
    try:
        if not checkpointing:
            model.gradient_checkpointing_disable()
            model.train()
        step = make_step(mb)
        t0 = time.perf_counter()
        record.update(measure(step, mb, a.seq, a.warmup, a.windows, a.window_steps, a.device))
        record["wall_s"] = round(time.perf_counter() - t0, 1)
        if a.profile_out and checkpointing and mb == profile_mb:
            t0 = time.perf_counter()
            profile(step, a.profile_steps, a.profile_out, a.device)
            record["profile"] = a.profile_out
            record["profile_s"] = round(time.perf_counter() - t0, 1)
    except Exception as e:  # one failed measurement must not lose the others
        failed = True
        traceback.print_exc()
        record["error"] = f"{type(e).__name__}: {e}"[:500]
    emit(record)
    opt.zero_grad(set_to_none=True)
sys.exit(1 if failed else 0)
