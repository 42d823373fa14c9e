"""Anchor: Unsloth (a single-GPU QLoRA library) at its best, as its users drive it, on the same
folder, shape and batches as bench/anchor_hf.py, and measured as the other anchors are
(bench/anchor_common.py: warm-up steps not timed, then windows of steps, median and min-max, peak
memory over the training steps). Unsloth compiles each decoder layer on its first step (~30 s):
the warm-up steps take that.

As its users load and train it (shared/anchors/unsloth_anchor.py, proven on the GPU machine):
FastLanguageModel.from_pretrained(load_in_4bit=True) quantizes on load through bitsandbytes, NF4
with double quantization and bf16 compute (lm_head stays bf16); get_peft_model puts LoRA r=16,
alpha 32, dropout 0 on all seven projections, run by Unsloth's Triton kernels; checkpointing is its
own "unsloth" flavour by default (the saved layer inputs offloaded to host memory, each layer
recomputed in backward), --gc true plain checkpointing, --no-gc none. A plain loop,
`loss = model(input_ids=ids, labels=ids).loss; loss.backward(); opt.step()`, takes its fast path
(its patched forward computes the loss in chunks, without logits). AdamW, fused, lr 1e-4, as the
HF anchor. No autocast: Unsloth runs in the dtype it loaded (--autocast adds it, to check).

One model load, then one measurement per micro-batch given (all with the same checkpointing: Unsloth
fixes it at load, so bench/fair_bench.sh runs the no-checkpointing setting as a process of its
own). One JSON line per measurement, in anchor_hf.py's format, with "impl": "unsloth".

MODEL_DIR is read as it is, offline (a path, never a Hub id, so Unsloth's name mapper stays away).
Its loader always builds a tokenizer: bench/make_llama_folder.py copies the example tokenizer
into the folder; a folder without a loadable one gets a minimal tokenizer written to a temp folder
(the ids are random anyway). Put the Unsloth site folder first on PYTHONPATH
(scripts/device/unsloth_wheels.sh; run_on_gpu.sh unsloth-install).
  python3 bench/anchor_unsloth.py MODEL_DIR --micro-batches 4 1 [--seq 2048]
      [--gc unsloth|true|false | --no-gc] [--warmup 3 --windows 3 --window-steps 5]
"""
import importlib.metadata
import os
import sys
import tempfile
import time

# The GPU machine has no network: every Hub, statistics and name-mapper lookup stays off. Set
# before unsloth (and through it huggingface_hub and transformers) is imported: they read these once.
for _k, _v in {"UNSLOTH_DISABLE_STATISTICS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "HF_DATASETS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "DO_NOT_TRACK": "1",
               # its generated modules, out of the working directory (the checkout)
               "UNSLOTH_COMPILE_LOCATION": os.path.join(tempfile.gettempdir(), "unsloth_compiled_cache")}.items():
    os.environ.setdefault(_k, _v)

# anchor_common imports torch alone, which Unsloth lets come before it.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from anchor_common import cap_memory, emit, measurement_parser, micro_batches_of, recorded_failure, timed_measure  # noqa: E402

p = measurement_parser()
p.add_argument("--gc", default="unsloth", choices=["unsloth", "true", "false"],
               help="Unsloth's offloaded checkpointing (its default), plain checkpointing, or none")
p.add_argument("--no-gc", action="store_true", help="no activation checkpointing (--gc false)")
p.add_argument("--autocast", action="store_true", help="bf16 autocast around the forward (not Unsloth's way)")
p.add_argument("--lora-r", type=int, default=16)
a = p.parse_args()
a.micro_batches = micro_batches_of(a)
if a.no_gc:
    a.gc = "false"
gc = {"unsloth": "unsloth", "true": True, "false": False}[a.gc]
model_dir = os.path.abspath(a.model)

started = time.perf_counter()
import torch  # noqa: E402
from unsloth import FastLanguageModel  # noqa: E402  first: before transformers and peft, so its patches apply

cap_memory(a)


def tokenizer_kwargs():
    """{} when MODEL_DIR's own tokenizer loads, else tokenizer_name= a minimal one in a temp folder."""
    from transformers import AutoTokenizer
    try:
        AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        return {}
    except Exception as e:  # noqa: BLE001  (any failure: the folder's tokenizer is not usable)
        print(f"# anchor unsloth: no loadable tokenizer in {model_dir} ({type(e).__name__}); writing a minimal one",
              file=sys.stderr, flush=True)
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    # LLaMA-2's ids for what the config names: <unk>=0, <s>=1 (bos), </s>=2 (eos); a real pad token
    # distinct from eos, so Unsloth's pad fix neither adds a token nor resizes the embedding.
    vocab = {t: i for i, t in enumerate(["<unk>", "<s>", "</s>", "<pad>"])}
    for c in "abcdefghijklmnopqrstuvwxyz0123456789":
        vocab.setdefault(c, len(vocab))
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                  pad_token="<pad>", model_max_length=a.seq)
    folder = tempfile.mkdtemp(prefix="unsloth-anchor-tok-")
    tok.save_pretrained(folder)
    return {"tokenizer_name": folder}


def quantization(model):
    """What the load really did, so the record shows the quantization it measured."""
    try:
        import bitsandbytes as bnb
        q = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
        qs = q[0].weight.quant_state if q else None
        head = model.get_output_embeddings()
        return {"linear4bit_layers": len(q), "quant_type": getattr(qs, "quant_type", None),
                "double_quant": getattr(qs, "nested", None), "blocksize": getattr(qs, "blocksize", None),
                "compute_dtype": str(getattr(q[0], "compute_dtype", None)) if q else None,
                "lm_head": f"{type(head).__name__}/{head.weight.dtype}",
                "embed_device": str(model.get_input_embeddings().weight.device)}
    except Exception as e:  # noqa: BLE001  (a report, never a reason to stop)
        return {"error": f"{type(e).__name__}: {e}"[:200]}


tok_kwargs = tokenizer_kwargs()
model, _ = FastLanguageModel.from_pretrained(
    model_name=model_dir, max_seq_length=a.seq, dtype=torch.bfloat16, load_in_4bit=True,
    use_gradient_checkpointing=gc, local_files_only=True, **tok_kwargs)
model = FastLanguageModel.get_peft_model(
    model, r=a.lora_r, lora_alpha=2 * a.lora_r, lora_dropout=0, bias="none",
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    use_gradient_checkpointing=gc)
FastLanguageModel.for_training(model)
params = [q for q in model.parameters() if q.requires_grad]
opt = torch.optim.AdamW(params, lr=1e-4, fused=True)  # as the HF anchor (HF Trainer's default)
load_s = time.perf_counter() - started
vocab = model.config.vocab_size
gen = torch.Generator().manual_seed(0)
quant = quantization(model)
variant = f"nf4-dq+gc-{a.gc}" + ("+autocast" if a.autocast else "")
versions = {}
for name in ("torch", "unsloth", "unsloth_zoo", "bitsandbytes", "transformers", "peft", "triton"):
    try:
        versions[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        versions[name] = None
print(f"# anchor unsloth {variant}: loaded and set up in {load_s:.1f} s; trainable "
      f"{sum(q.numel() for q in params):,} in {len(params)} tensors ({sorted({str(q.dtype) for q in params})}); "
      f"{quant}; unsloth {versions['unsloth']}", file=sys.stderr, flush=True)


def make_step(micro_batch):
    # A pool of batches on the device, made before timing (random ids, as anchor_hf.py makes them).
    pool = [torch.randint(3, min(vocab, 500), (micro_batch, a.seq), generator=gen).cuda() for _ in range(4)]
    state = {"i": 0}

    def step():
        ids = pool[state["i"] % len(pool)]
        state["i"] += 1
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.autocast):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


failed = False
for mb in a.micro_batches:
    record = {"impl": "unsloth", "anchor": "unsloth+bitsandbytes", "variant": variant, "gpus": 1,
              "micro_batch": mb, "seq": a.seq, "checkpointing": gc is not False, "unsloth_gc": a.gc,
              "packing": False, "autocast": a.autocast, "liger": False, "model": model_dir, "lora_r": a.lora_r,
              "load_s": round(load_s, 1), "tokenizer": "minimal" if tok_kwargs else "folder",
              "quantization": quant, "versions": versions}
    with recorded_failure(record):
        record.update(timed_measure(make_step(mb), mb, a))
    failed = failed or "error" in record
    emit(record)
    opt.zero_grad(set_to_none=True)
sys.exit(1 if failed else 0)
