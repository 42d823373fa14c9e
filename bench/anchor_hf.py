"""Anchor: transformers + peft (+ bitsandbytes) on the same folder, shape, tokens and settings as
our benchmark: sequence 2048, LoRA r=16 on all linear layers, AdamW, activation checkpointing,
NF4 + double quantization + bf16 compute (or --bf16-base for LoRA on an unquantized bf16 base).
Prints one JSON line: tokens/s, step time, peak allocated and reserved memory.
  python3 bench/anchor_hf.py MODEL_DIR --micro-batch 4 [--bf16-base] [--steps 8]
"""
import argparse
import json
import time

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("--micro-batch", type=int, default=4)
p.add_argument("--seq", type=int, default=2048)
p.add_argument("--steps", type=int, default=8)
p.add_argument("--bf16-base", action="store_true")
a = p.parse_args()
kwargs = {"dtype": torch.bfloat16, "device_map": {"": 0}, "attn_implementation": "sdpa"}
if not a.bf16_base:
    kwargs["quantization_config"] = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16)
model = AutoModelForCausalLM.from_pretrained(a.model, **kwargs)
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
model.enable_input_require_grads()
model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear",
                                         task_type="CAUSAL_LM"))
model.train()  # from_pretrained returns eval mode, where checkpointing is silently skipped
opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-4)
gen = torch.Generator().manual_seed(0)
times = []
torch.cuda.reset_peak_memory_stats()
for step in range(a.steps):
    ids = torch.randint(3, 500, (a.micro_batch, a.seq), generator=gen).cuda()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
measured = times[2:] if len(times) > 3 else times
step = sum(measured) / len(measured)
print(json.dumps({"anchor": "transformers+peft" + ("" if a.bf16_base else "+bitsandbytes"),
                  "base": "bf16" if a.bf16_base else "nf4-dq", "micro_batch": a.micro_batch, "seq": a.seq,
                  "tokens_per_s": round(a.micro_batch * a.seq / step, 1), "step_time_s": round(step, 3),
                  "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
                  "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 2)}))
