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

--packed packs rows the way HF users do: transformers' DataCollatorWithFlattening over documents
of --doc-tokens MIN MAX tokens (uniform; the last one cut so each row holds exactly --seq tokens),
which gives one row of input_ids, labels with -100 at each document's first token and
position_ids restarting at 0 per document, and no attention mask. Under attn_implementation
"sdpa" transformers (5.x: masking_utils.find_packed_sequence_indices, then sdpa_mask) turns
those position ids into a dense block-diagonal causal mask [batch, 1, seq, seq] bool, so SDPA runs
with a mask (no flash kernel). It looks for packing only when no cache is in use (use_cache=False,
which checkpointing implies and the packed batches pass; with a cache, documents would silently
see each other). The JSON line records whether transformers detects the packing.
  python3 bench/anchor_hf.py MODEL_DIR --micro-batches 1 4 [--liger] [--no-checkpointing-too]
      [--warmup 3 --windows 3 --window-steps 5] [--profile-out trace.json --profile-micro-batch 4]
      [--packed --doc-tokens 500 4000]
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from anchor_common import (apply_liger, emit, measurement_parser, micro_batches_of, profile, recorded_failure,  # noqa: E402
                           scope, timed_measure)

p = measurement_parser()
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
p.add_argument("--packed", action="store_true", help="rows of several documents (DataCollatorWithFlattening)")
p.add_argument("--doc-tokens", type=int, nargs=2, default=[500, 4000], metavar=("MIN", "MAX"),
               help="document lengths for --packed (uniform)")
a = p.parse_args()
a.micro_batches = micro_batches_of(a)
if a.steps:
    a.warmup, a.windows, a.window_steps = 2, 1, max(1, a.steps - 2)
cuda = a.device.startswith("cuda")
autocast = not a.no_autocast

started = time.perf_counter()
liger_version = apply_liger() if a.liger else None  # before the model is built

from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers import __version__ as transformers_version  # noqa: E402

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
variant = ("bf16-base" if a.bf16_base else "nf4-dq") + ("+autocast" if autocast else "") + ("+liger" if a.liger else "") + \
    ("+packed" if a.packed else "")
print(f"# anchor hf {variant}: loaded and set up in {load_s:.1f} s; trainable {sum(q.numel() for q in params):,}",
      file=sys.stderr, flush=True)


def packed_row():
    """One row of --seq tokens: random documents through DataCollatorWithFlattening."""
    from transformers import DataCollatorWithFlattening

    features, total = [], 0
    while total < a.seq:
        length = int(torch.randint(a.doc_tokens[0], a.doc_tokens[1] + 1, (1,), generator=gen))
        length = min(length, a.seq - total)
        features.append({"input_ids": torch.randint(3, min(vocab, 500), (length,), generator=gen).tolist()})
        total += length
    batch = DataCollatorWithFlattening(return_tensors="pt")(features)
    assert "attention_mask" not in batch and batch["input_ids"].shape == (1, a.seq)
    return batch, len(features)


def packing_detected(position_ids):
    """Whether transformers sees packed documents in these position ids (None: no such check)."""
    try:
        from transformers.masking_utils import find_packed_sequence_indices
    except ImportError:
        return None
    return find_packed_sequence_indices(position_ids) is not None


def make_step(micro_batch, record):
    # A pool of batches on the device, made before timing (random ids, as the old anchors).
    pool = []
    for _ in range(4):
        if not a.packed:
            ids = torch.randint(3, min(vocab, 500), (micro_batch, a.seq), generator=gen).to(a.device)
            pool.append({"input_ids": ids, "labels": ids})
            continue
        rows = [packed_row() for _ in range(micro_batch)]
        inputs = {k: torch.cat([r[k] for r, _ in rows]).to(a.device) for k in ("input_ids", "labels", "position_ids")}
        # transformers looks for packed documents only without a cache (checkpointing implies it)
        pool.append(dict(inputs, use_cache=False))
        record.setdefault("documents_per_row", []).extend(n for _, n in rows)
    if a.packed:
        record["packing_collator"] = "DataCollatorWithFlattening"
        record["doc_tokens"] = a.doc_tokens
        record["packing_detected_by_transformers"] = packing_detected(pool[0]["position_ids"])
    state = {"i": 0}

    def step():
        inputs = pool[state["i"] % len(pool)]
        state["i"] += 1
        with scope("qlora::step"):
            with scope("qlora::forward"), torch.autocast(a.device.split(":")[0], dtype=torch.bfloat16,
                                                         enabled=autocast):
                loss = model(**inputs).loss
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
              "packing": a.packed,
              "autocast": autocast, "liger": a.liger, "model": os.path.abspath(a.model), "lora_r": a.lora_r,
              "load_s": round(load_s, 1), "versions": {"torch": torch.__version__, "bitsandbytes": bnb_version,
                                                       "liger_kernel": liger_version,
                                                       "transformers": transformers_version}}
    with recorded_failure(record):
        if not checkpointing:
            model.gradient_checkpointing_disable()
            model.train()
        step = make_step(mb, record)
        record.update(timed_measure(step, mb, a, a.device))
        if a.profile_out and checkpointing and mb == profile_mb:
            t0 = time.perf_counter()
            profile(step, a.profile_steps, a.profile_out, a.device)
            record["profile"] = a.profile_out
            record["profile_s"] = round(time.perf_counter() - t0, 1)
    failed = failed or "error" in record
    emit(record)
    opt.zero_grad(set_to_none=True)
sys.exit(1 if failed else 0)
