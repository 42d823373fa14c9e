"""Anchor: transformers + peft + bitsandbytes QLoRA under DeepSpeed ZeRO-2 on several GPUs, same
folder, shape and settings as our benchmark (sequence 2048, LoRA r=16 on all linear layers,
NF4 + double quantization, bf16 compute, activation checkpointing, AdamW). DeepSpeed's bf16 mode
would cast the whole model (refused for 4-bit weights), so it runs without it: the LoRA weights
and their ZeRO-2-partitioned optimizer state stay fp32, as ours do.
  torchrun --nproc_per_node 2 bench/anchor_deepspeed.py MODEL_DIR --micro-batch 4
Rank 0 prints one JSON line: tokens/s per GPU, step time, peak allocated and reserved memory.
"""
import argparse
import json
import os
import time

import deepspeed
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("--micro-batch", type=int, default=4)
p.add_argument("--seq", type=int, default=2048)
p.add_argument("--steps", type=int, default=8)
a = p.parse_args()
deepspeed.init_distributed()
rank = int(os.environ.get("LOCAL_RANK", 0))
torch.cuda.set_device(rank)
quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                           bnb_4bit_compute_dtype=torch.bfloat16)
model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, device_map={"": rank},
                                             attn_implementation="sdpa", quantization_config=quant)
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
model.enable_input_require_grads()
model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear",
                                         task_type="CAUSAL_LM"))
model.train()
params = [q for q in model.parameters() if q.requires_grad]
config = {"train_micro_batch_size_per_gpu": a.micro_batch, "gradient_accumulation_steps": 1,
          "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True, "steps_per_print": 1000000}
engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(params, lr=1e-4),
                                       model_parameters=params, config=config)
gen = torch.Generator().manual_seed(rank)
times = []
torch.cuda.reset_peak_memory_stats()
for step in range(a.steps):
    ids = torch.randint(3, 500, (a.micro_batch, a.seq), generator=gen).cuda()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    engine.step()
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
measured = times[2:] if len(times) > 3 else times
step = sum(measured) / len(measured)
if rank == 0:
    print(json.dumps({"anchor": "transformers+peft+bitsandbytes+deepspeed-zero2", "gpus": engine.world_size,
                      "micro_batch": a.micro_batch, "seq": a.seq,
                      "tokens_per_s_per_gpu": round(a.micro_batch * a.seq / step, 1), "step_time_s": round(step, 3),
                      "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
                      "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 2)}))
