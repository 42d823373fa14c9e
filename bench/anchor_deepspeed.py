"""Anchor: transformers + peft + bitsandbytes QLoRA under DeepSpeed ZeRO-2 on several GPUs, at its
best: same folder, shape and settings as our benchmark (sequence 2048, LoRA r=16 on all linear
layers, NF4 + double quantization, bf16 compute, activation checkpointing, AdamW), with
`torch.autocast("cuda", dtype=torch.bfloat16)` around the forward and, with --liger, Liger
kernels (RoPE, RMSNorm, SwiGLU, fused linear cross-entropy). DeepSpeed's bf16 mode would cast the
whole model (refused for 4-bit weights), so it runs without it: the LoRA weights and their
ZeRO-2-partitioned optimizer state stay fp32, as ours do; the client optimizer is torch's AdamW
(on ZeRO-2's one flat partition; DeepSpeed's own FusedAdam would compile its extension on first
use).

Measured as bench/anchor_common.py says (warm-up, windows of steps as tokens / wall time).
  torchrun --nproc_per_node 2 bench/anchor_deepspeed.py MODEL_DIR --micro-batch 4 --liger
Rank 0 prints one JSON line: tokens/s per GPU (median, min, max of the windows), step time, its
peak allocated and reserved memory.
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from anchor_common import apply_liger, emit, profile, recorded_failure, scope, timed_measure  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("--micro-batch", type=int, default=4)
p.add_argument("--seq", type=int, default=2048)
p.add_argument("--warmup", type=int, default=3)
p.add_argument("--windows", type=int, default=3)
p.add_argument("--window-steps", type=int, default=5)
p.add_argument("--steps", type=int, help="the older interface: 2 warm-up steps, one window of the rest")
p.add_argument("--liger", action="store_true")
p.add_argument("--no-autocast", action="store_true")
p.add_argument("--profile-out", help="rank 0 writes a Chrome trace of --profile-steps steps after the measurement")
p.add_argument("--profile-steps", type=int, default=2)
p.add_argument("--lora-r", type=int, default=16)
a = p.parse_args()
if a.steps:
    a.warmup, a.windows, a.window_steps = 2, 1, max(1, a.steps - 2)
autocast = not a.no_autocast
started = time.perf_counter()
liger_version = apply_liger() if a.liger else None  # before the model is built

import deepspeed  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM, BitsAndBytesConfig  # noqa: E402

deepspeed.init_distributed()
rank = int(os.environ.get("LOCAL_RANK", 0))
torch.cuda.set_device(rank)
quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                           bnb_4bit_compute_dtype=torch.bfloat16)
model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, device_map={"": rank},
                                             attn_implementation="sdpa", quantization_config=quant)
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
model.enable_input_require_grads()
model = get_peft_model(model, LoraConfig(r=a.lora_r, lora_alpha=2 * a.lora_r, lora_dropout=0.0,
                                         target_modules="all-linear", task_type="CAUSAL_LM"))
model.train()
params = [q for q in model.parameters() if q.requires_grad]
config = {"train_micro_batch_size_per_gpu": a.micro_batch, "gradient_accumulation_steps": 1,
          "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True, "steps_per_print": 1000000}
engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(params, lr=1e-4),
                                       model_parameters=params, config=config)
load_s = time.perf_counter() - started
vocab = model.config.vocab_size
gen = torch.Generator().manual_seed(rank)
pool = [torch.randint(3, min(vocab, 500), (a.micro_batch, a.seq), generator=gen).cuda() for _ in range(4)]
state = {"i": 0}


def step():
    ids = pool[state["i"] % len(pool)]
    state["i"] += 1
    with scope("qlora::step"):
        with scope("qlora::forward"), torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = engine(input_ids=ids, labels=ids).loss
        with scope("qlora::backward"):
            engine.backward(loss)
        with scope("qlora::optimizer"):
            engine.step()
    return loss


variant = "nf4-dq" + ("+autocast" if autocast else "") + ("+liger" if a.liger else "") + "+deepspeed-zero2"
record = {"impl": "deepspeed", "anchor": "transformers+peft+bitsandbytes+deepspeed-zero2", "variant": variant,
          "gpus": engine.world_size, "micro_batch": a.micro_batch, "seq": a.seq, "checkpointing": True,
          "autocast": autocast, "liger": a.liger, "model": os.path.abspath(a.model), "lora_r": a.lora_r,
          "load_s": round(load_s, 1), "versions": {"torch": torch.__version__, "deepspeed": deepspeed.__version__,
                                                   "liger_kernel": liger_version}}
with recorded_failure(record):
    record.update(timed_measure(step, a.micro_batch, a))
    if a.profile_out:
        path = a.profile_out if rank == 0 else a.profile_out + f".rank{rank}"
        profile(step, a.profile_steps, path)
        if rank == 0:
            record["profile"] = path
if rank == 0:
    emit(record)
sys.exit(1 if "error" in record else 0)
