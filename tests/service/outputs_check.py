"""Checks a finished job's servable outputs with the Hugging Face libraries themselves:
  python outputs_check.py BASE_MODEL_DIR ADAPTER_DIR MERGED_DIR
- ADAPTER_DIR/README.md is a model card huggingface_hub parses, with peft's front matter
  (base_model, library_name: peft, the base_model:adapter tag) and the run's results;
- MERGED_DIR loads with AutoModelForCausalLM and AutoTokenizer (and its GenerationConfig), and
  generate() runs on a tokenized prompt.
Exit 0 when all holds; an assertion names what failed otherwise.
"""
import sys

import torch
from huggingface_hub import ModelCard
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

base_dir, adapter_dir, merged_dir = sys.argv[1:4]

card = ModelCard.load(f"{adapter_dir}/README.md")
assert card.data.library_name == "peft", card.data
assert card.data.base_model == base_dir, (card.data.base_model, base_dir)
assert f"base_model:adapter:{base_dir}" in card.data.tags, card.data.tags
assert "train_loss" in card.text and "train_runtime" in card.text, card.text

tokenizer = AutoTokenizer.from_pretrained(merged_dir)
model = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)
generation = GenerationConfig.from_pretrained(merged_dir)
assert generation.eos_token_id is not None, generation
prompt = tokenizer("Write a haiku about", return_tensors="pt")
with torch.no_grad():
    out = model.generate(**prompt, max_new_tokens=5, do_sample=False)
assert out.shape[1] > prompt["input_ids"].shape[1], out.shape
print("merged model generated:", repr(tokenizer.decode(out[0])))
