"""Checks that a PEFT adapter written by a job loads in peft as is: no missing or unexpected LoRA
keys, the r/alpha/target modules of the job, and trained (non-zero) lora_B weights. The base
model is whatever family its config.json names (LLaMA, Mistral, Qwen2).
  python peft_loads.py BASE_MODEL_DIR ADAPTER_DIR EXPECTED_R EXPECTED_ALPHA
Exit 0 when all holds; prints what failed otherwise.
"""
import sys

import torch
from peft import PeftConfig, PeftModel
from peft.utils import load_peft_weights, set_peft_model_state_dict
from transformers import AutoModelForCausalLM

base_dir, adapter_dir, r, alpha = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
config = PeftConfig.from_pretrained(adapter_dir)
assert config.r == r and float(config.lora_alpha) == alpha, (config.r, config.lora_alpha)
model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32),
                                  adapter_dir)
result = set_peft_model_state_dict(model, load_peft_weights(adapter_dir))
missing = [k for k in result.missing_keys if "lora_" in k]
if missing or result.unexpected_keys:
    print("missing:", missing, "unexpected:", result.unexpected_keys)
    sys.exit(3)
lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
assert lora_b and all(p.abs().sum() > 0 for p in lora_b), "lora_B untrained"
with torch.no_grad():
    out = model(input_ids=torch.tensor([[1, 5, 9, 42]])).logits
assert torch.isfinite(out).all()
print(f"peft loaded {len(lora_b)} LoRA pairs, r={config.r}, alpha={config.lora_alpha}, "
      f"targets={sorted(config.target_modules)}")
