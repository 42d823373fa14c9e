"""TRL's own trainers as the reference for preference tuning (tests/run/preference_reference_test.cc).

    reference_preference.py DIR                 train with TRL, write the reference
    reference_preference.py --make-adapter DIR  write DIR/start-adapter: a LoRA adapter with B != 0

DIR holds model/ (HF folder), pairs.jsonl (prompt/chosen/rejected), init-adapter/ (PEFT, our
rank 0's initial adapter), batches-rank<r>.safetensors (s<step>.m<i>.input_ids / .labels /
.lengths: every micro-batch each rank trained on) and reference.json (the job's settings).

First TRL tokenizes pairs.jsonl; every recorded micro-batch row must be the ids TRL gives one of
its pairs (chosen rows first, then the rejected ones, completion labels where TRL's completion
mask is), which also names the pairs in the order we trained them. Then TRL's DPOTrainer or
ORPOTrainer (peft, torch AdamW, fp32 on the CPU, sequential sampling) trains the initial adapter
on those pairs in that order: its micro-batch is ours, its gradient accumulation covers every
rank's micro-batches of a step. Writes DIR/reference-adapter.safetensors and
DIR/reference-steps.json ([{loss, metrics}] per step, TRL's metric names).
"""
import dataclasses
import json
import os
import sys

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import torch
from datasets import Dataset
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer, LlamaForCausalLM, TrainerCallback

MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# TRL's ORPO averages its logits over prompt and padding too, a figure that depends on how wide
# a batch is padded: ours is DPO's (docs/preference.md), so those two are not compared.
ORPO_UNCOMPARED = {"logits/chosen", "logits/rejected"}
DPO_METRICS = ["rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
               "logps/chosen", "logps/rejected", "logits/chosen", "logits/rejected"]
ORPO_METRICS = DPO_METRICS + ["nll_loss", "log_odds_ratio", "log_odds_chosen"]


def make_adapter(d):
    torch.manual_seed(3)
    base = LlamaForCausalLM.from_pretrained(f"{d}/model", dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=MODULES))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    model.save_pretrained(f"{d}/start-adapter")


def trl_classes(kind):
    if kind == "dpo":
        from trl import DPOConfig, DPOTrainer
        return DPOConfig, DPOTrainer
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer
    return ORPOConfig, ORPOTrainer


def make_trainer(cfg, d, records, steps):
    config_class, trainer_class = trl_classes(cfg["type"])

    class Recording(trainer_class):
        """Keeps each training micro-batch's loss exactly (the logged one is rounded)."""

        micro_losses = []

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            out = super().compute_loss(model, inputs, return_outputs=return_outputs,
                                       num_items_in_batch=num_items_in_batch)
            if model.training:
                self.micro_losses.append(float((out[0] if return_outputs else out).detach()))
            return out

    settings = dict(
        output_dir=f"{d}/trl-out", per_device_train_batch_size=cfg["pairs"],
        gradient_accumulation_steps=cfg["world"] * cfg["accumulation"], learning_rate=cfg["lr"],
        max_steps=steps, lr_scheduler_type="cosine", warmup_steps=cfg["warmup_steps"],
        weight_decay=cfg["weight_decay"], adam_beta1=cfg["beta1"], adam_beta2=cfg["beta2"],
        adam_epsilon=cfg["eps"], max_grad_norm=cfg["max_grad_norm"], optim="adamw_torch",
        logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, bf16=False, fp16=False,
        gradient_checkpointing=False, train_sampling_strategy="sequential", dataloader_num_workers=0,
        seed=0, beta=cfg["beta"], max_length=cfg["max_length"], disable_dropout=True,
        remove_unused_columns=False)
    if cfg["type"] == "dpo":
        settings.update(loss_type=cfg["loss_type"], label_smoothing=cfg["label_smoothing"])
    known = {f.name for f in dataclasses.fields(config_class)}
    args = config_class(**{k: v for k, v in settings.items() if k in known})
    tokenizer = AutoTokenizer.from_pretrained(f"{d}/model")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    torch.manual_seed(0)
    base = LlamaForCausalLM.from_pretrained(f"{d}/model", dtype=torch.float32)
    model = PeftModel.from_pretrained(base, f"{d}/init-adapter", is_trainable=True)
    trainer = Recording(model=model, args=args, train_dataset=Dataset.from_list(records),
                        processing_class=tokenizer)
    trainer.micro_losses = []
    return trainer


def tokenized_sides(cfg, row):
    """(chosen ids, rejected ids, chosen completion start, rejected completion start) as TRL has them."""
    m = cfg["max_length"]
    if cfg["type"] == "dpo":
        prompt = row["prompt_ids"]
        return ((prompt + row["chosen_ids"])[:m], (prompt + row["rejected_ids"])[:m], len(prompt), len(prompt))
    starts = [next((i for i, l in enumerate(row[f"{side}_labels"]) if l != -100), None)
              for side in ("chosen", "rejected")]
    return row["chosen_input_ids"], row["rejected_input_ids"], starts[0], starts[1]


def ordered_pairs(cfg, d, records):
    """The records of every recorded micro-batch, in training order, after checking the ids."""
    tokenized = make_trainer(cfg, d, records, 1).train_dataset
    by_ids = {}
    for i, row in enumerate(tokenized):
        chosen, rejected, c_start, r_start = tokenized_sides(cfg, row)
        by_ids[tuple(chosen)] = (i, rejected, c_start, r_start)
    ranks = [load_file(f"{d}/batches-rank{r}.safetensors") for r in range(cfg["world"])]
    order = []
    for step in range(cfg["total_steps"]):
        for r, batches in enumerate(ranks):
            for m in range(cfg["accumulation"]):
                key = f"s{step}.m{m}"
                ids, labels, lengths = (batches[f"{key}.{k}"] for k in ("input_ids", "labels", "lengths"))
                n = ids.shape[0] // 2
                for row in range(n):
                    chosen = ids[row, : lengths[row]].tolist()
                    found = by_ids.get(tuple(chosen))
                    if found is None:
                        sys.exit(f"rank {r} {key} row {row}: ids {chosen} are none of TRL's pairs")
                    index, rejected, c_start, r_start = found
                    theirs_rejected = ids[n + row, : lengths[n + row]].tolist()
                    if theirs_rejected != list(rejected):
                        sys.exit(f"rank {r} {key}: rejected ids {theirs_rejected} != TRL's {list(rejected)}")
                    for side, start, length in ((row, c_start, lengths[row]), (n + row, r_start, lengths[n + row])):
                        want = [p >= start for p in range(int(length))]
                        got = [bool(l != -100) for l in labels[side, :length].tolist()]
                        if got != want:
                            sys.exit(f"rank {r} {key} row {side}: completion mask {got} != TRL's {want}")
                    order.append(index)
    return [records[i] for i in order]


def main(d):
    cfg = json.load(open(f"{d}/reference.json"))
    torch.set_num_threads(2)
    records = [json.loads(line) for line in open(f"{d}/pairs.jsonl")]
    pairs = ordered_pairs(cfg, d, records)
    trainer = make_trainer(cfg, d, pairs, cfg["total_steps"])
    names = DPO_METRICS if cfg["type"] == "dpo" else [n for n in ORPO_METRICS if n not in ORPO_UNCOMPARED]
    logged = []

    class Metrics(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and names[0] in logs:
                logged.append({n: logs[n] for n in names})

    trainer.add_callback(Metrics())
    trainer.train()
    per_step = cfg["world"] * cfg["accumulation"]
    losses = trainer.micro_losses
    if len(losses) != per_step * cfg["total_steps"] or len(logged) != cfg["total_steps"]:
        sys.exit(f"TRL ran {len(losses)} micro-batches and logged {len(logged)} steps")
    steps = [{"loss": sum(losses[s * per_step:(s + 1) * per_step]) / per_step, "metrics": logged[s]}
             for s in range(cfg["total_steps"])]
    json.dump(steps, open(f"{d}/reference-steps.json", "w"))
    state = {k: v.detach().contiguous()
             for k, v in get_peft_model_state_dict(trainer.model, adapter_name="default").items()}
    save_file(state, f"{d}/reference-adapter.safetensors")


if __name__ == "__main__":
    if sys.argv[1] == "--make-adapter":
        make_adapter(sys.argv[2])
    else:
        main(sys.argv[1])
