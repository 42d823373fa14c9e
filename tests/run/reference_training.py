"""Independent reference for the training loop (tests/run/trainer_reference_test.cc).

Trains the same LoRA adapter as our workers with transformers + peft + torch.optim.AdamW in fp32:
the same initial adapter, the same micro-batches in the same order (every rank's micro-batches
of a step make one global batch), the loss of a step = sum of every token loss / the number of
target tokens of the whole global batch, clipping by torch.nn.utils.clip_grad_norm_, and the
learning rate from transformers' get_*_schedule_with_warmup.

    reference_training.py DIR

DIR holds model/ (HF folder), init-adapter/ (PEFT), batches-rank<r>.safetensors
(s<step>.m<i>.input_ids / .labels) and reference.json (hyperparameters). Writes
DIR/reference-adapter.safetensors (peft's state-dict names) and DIR/reference-losses.json.
"""
import json
import sys

import torch
import torch.nn.functional as F
from peft import PeftModel, get_peft_model_state_dict
from safetensors.torch import load_file, save_file
from transformers import (LlamaForCausalLM, get_constant_schedule_with_warmup,
                          get_cosine_schedule_with_warmup, get_linear_schedule_with_warmup)


def main(d):
    cfg = json.load(open(f"{d}/reference.json"))
    torch.manual_seed(0)
    torch.set_num_threads(2)
    base = LlamaForCausalLM.from_pretrained(f"{d}/model", torch_dtype=torch.float32)
    model = PeftModel.from_pretrained(base, f"{d}/init-adapter", is_trainable=True)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]),
                            eps=cfg["eps"], weight_decay=cfg["weight_decay"])
    total, warmup = cfg["total_steps"], cfg["warmup_steps"]
    sched = {"cosine": lambda: get_cosine_schedule_with_warmup(opt, warmup, total),
             "linear": lambda: get_linear_schedule_with_warmup(opt, warmup, total),
             "none": lambda: get_constant_schedule_with_warmup(opt, warmup)}[cfg["schedule"]]()
    ranks = [load_file(f"{d}/batches-rank{r}.safetensors") for r in range(cfg["world"])]
    vocab = base.config.vocab_size
    losses = []
    for step in range(total):
        micro = [(r[f"s{step}.m{i}.input_ids"], r[f"s{step}.m{i}.labels"])
                 for r in ranks for i in range(cfg["accumulation"])]
        tokens = sum(int((labels[:, 1:] != -100).sum()) for _, labels in micro)
        opt.zero_grad(set_to_none=True)
        loss_total = 0.0
        for ids, labels in micro:
            logits = model(input_ids=ids).logits.float()
            loss_sum = F.cross_entropy(logits[:, :-1].reshape(-1, vocab),
                                       labels[:, 1:].reshape(-1), ignore_index=-100,
                                       reduction="sum")
            (loss_sum / tokens).backward()
            loss_total += loss_sum.item()
        if cfg["max_grad_norm"] > 0:
            torch.nn.utils.clip_grad_norm_(params, cfg["max_grad_norm"])
        opt.step()
        sched.step()
        losses.append(loss_total / tokens)
    state = {k: v.detach().contiguous() for k, v in get_peft_model_state_dict(model).items()}
    save_file(state, f"{d}/reference-adapter.safetensors")
    json.dump(losses, open(f"{d}/reference-losses.json", "w"))


if __name__ == "__main__":
    main(sys.argv[1])
