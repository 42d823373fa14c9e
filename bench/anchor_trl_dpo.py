"""TRL's DPOTrainer at its best, the anchor for our DPO step: the 4-bit model as TRL's users load
it (transformers + bitsandbytes NF4 with double quantization, bf16 compute), a peft LoRA adapter
(r 16, alpha 32, every linear layer), bf16 autocast, gradient checkpointing, Liger's kernels
(use_liger_kernel: its rope, RMSNorm and SwiGLU; TRL 1.16's own chunked LM head computes the
log-probabilities), the reference as the base with the adapter disabled, as with ours.

    anchor_trl_dpo.py MODEL_DIR PAIRS.jsonl [--micro-batch 4] [--seq 1024] [--warmup 3]
                      [--windows 3] [--window-steps 3] [--no-liger]

PAIRS.jsonl: the pairs our DPO job trains on (bench/make_text_data.py --pairs 170,170: pairs of
random words, each side about 1,054 tokens, cut to --seq), cycled if there are too few. Measured as bench/anchor_common.py measures the other anchors, but the tokens of
a window are the tokens TRL trained (both sides, no padding), counted from its batches, as ours
counts them. Prints one JSON line.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig, TrainerCallback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from anchor_common import median_spread  # noqa: E402


def pairs(path, n):
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [rows[i % len(rows)] for i in range(n)]


class Timer(TrainerCallback):
    """Windows of optimizer steps after the warm-up, a device synchronisation at each end."""

    def __init__(self, warmup, window_steps, counter):
        self.warmup, self.window_steps, self.counter = warmup, window_steps, counter
        self.rates, self.seconds = [], []
        self.t0 = self.tokens0 = None

    def on_step_end(self, args, state, control, **kwargs):
        done = state.global_step
        if done < self.warmup or (done - self.warmup) % self.window_steps != 0:
            return
        torch.cuda.synchronize()
        now = time.perf_counter()
        if self.t0 is not None:
            self.seconds.append(now - self.t0)
            self.rates.append((self.counter[0] - self.tokens0) / (now - self.t0))
        if done == self.warmup:
            torch.cuda.reset_peak_memory_stats()
        self.t0, self.tokens0 = now, self.counter[0]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("pairs")
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--window-steps", type=int, default=3)
    p.add_argument("--no-liger", action="store_true")
    a = p.parse_args()
    from trl import DPOConfig, DPOTrainer

    steps = a.warmup + a.windows * a.window_steps
    tokenizer = AutoTokenizer.from_pretrained(a.model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(a.model, quantization_config=quant, dtype=torch.bfloat16,
                                                 device_map={"": 0})
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    args = DPOConfig(output_dir="/tmp/trl-dpo-anchor", per_device_train_batch_size=a.micro_batch,
                     gradient_accumulation_steps=1, learning_rate=1e-4, max_steps=steps, max_length=a.seq,
                     bf16=True, gradient_checkpointing=True, use_liger_kernel=not a.no_liger,
                     logging_steps=1000, report_to=[], save_strategy="no", dataloader_num_workers=0,
                     beta=0.1, loss_type="sigmoid")
    counter = [0]

    class Counting(DPOTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            counter[0] += int(inputs["attention_mask"].sum())
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)

    trainer = Counting(model=model, args=args, train_dataset=Dataset.from_list(pairs(a.pairs, steps * a.micro_batch)),
                       processing_class=tokenizer, peft_config=lora)
    timer = Timer(a.warmup, a.window_steps, counter)
    trainer.add_callback(timer)
    trainer.train()
    out = median_spread(timer.rates)
    import statistics
    out.update({"label": "trl-dpo" + ("" if a.no_liger else "+liger"), "micro_batch_pairs": a.micro_batch,
                "seq": a.seq, "step_time_s": round(statistics.median(timer.seconds) / a.window_steps, 4),
                "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
                "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 2)})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
