"""Reference side of tests/engine/outputs_test.cc: transformers and peft read what the engine
writes for serving.

  merged SHARDED SINGLE INPUTS OUT
      Loads the merged folder SHARDED (shards + index) and SINGLE (one model.safetensors) with
      AutoModelForCausalLM, SHARDED's tokenizer with AutoTokenizer and its GenerationConfig;
      runs generate on a tokenized prompt; writes OUT["sharded"], OUT["single"] (logits of
      INPUTS["input_ids"]) and OUT["generated"].
  adapter_config ADAPTER R ALPHA DROPOUT USE_RSLORA TARGETS BASE
      Builds peft's LoraConfig with these values (TARGETS comma-separated), saves it as
      save_pretrained does, and checks that ADAPTER/adapter_config.json has every key peft
      wrote with an equal value (exit 3 otherwise).
"""
import json
import math
import os
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file


def merged(sharded_dir, single_dir, inputs_path, out_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    ids = load_file(inputs_path)["input_ids"]
    out = {}
    for key, folder in (("sharded", sharded_dir), ("single", single_dir)):
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        model.eval()
        with torch.no_grad():
            out[key] = model(input_ids=ids).logits.contiguous()
    tokenizer = AutoTokenizer.from_pretrained(sharded_dir)
    generation = GenerationConfig.from_pretrained(sharded_dir)
    assert generation.bos_token_id is not None and generation.eos_token_id is not None, generation
    prompt = tokenizer("Tell me a story", return_tensors="pt")
    with torch.no_grad():
        generated = model.generate(**prompt, max_new_tokens=6, do_sample=False)
    assert generated.shape[1] > prompt["input_ids"].shape[1], generated.shape
    print("generated:", repr(tokenizer.decode(generated[0])))
    out["generated"] = generated.contiguous()
    save_file(out, out_path)


def same(ours, theirs):
    if isinstance(theirs, float) or isinstance(ours, float):
        return isinstance(ours, (int, float)) and math.isclose(float(ours), float(theirs), rel_tol=1e-9)
    return ours == theirs


def adapter_config(adapter_dir, r, alpha, dropout, use_rslora, targets, base):
    from peft import LoraConfig

    config = LoraConfig(task_type="CAUSAL_LM", r=int(r), lora_alpha=float(alpha), lora_dropout=float(dropout),
                        use_rslora=use_rslora == "true", target_modules=targets.split(","),
                        base_model_name_or_path=base, inference_mode=True)
    with tempfile.TemporaryDirectory() as tmp:
        config.save_pretrained(tmp)
        with open(os.path.join(tmp, "adapter_config.json")) as f:
            theirs = json.load(f)
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        ours = json.load(f)
    missing = sorted(set(theirs) - set(ours))
    differ = []
    for key in sorted(set(theirs) & set(ours)):
        a, b = ours[key], theirs[key]
        if key == "target_modules":
            a, b = sorted(a), sorted(b)
        if key == "peft_version":  # the format we write, whatever peft runs the check
            if not (isinstance(a, str) and a.count(".") == 2):
                differ.append(f"peft_version: ours {a!r} is not a version")
            continue
        if not same(a, b):
            differ.append(f"{key}: ours {a!r}, peft {b!r}")
    extra = sorted(set(ours) - set(theirs))
    print(f"peft wrote {len(theirs)} keys; ours {len(ours)}; extra in ours: {extra}")
    if missing or differ:
        print("missing:", missing)
        print("different:", differ)
        sys.exit(3)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "merged":
        merged(*sys.argv[2:6])
    elif mode == "adapter_config":
        adapter_config(*sys.argv[2:9])
    else:
        sys.exit(f"unknown mode {mode}")
