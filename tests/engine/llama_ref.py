"""Reference side of the engine tests: transformers' model for the folder's model_type
(LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM through AutoModelForCausalLM) and
peft, in float32, with transformers' sdpa attention (its sliding-window masks included).

  logits MODEL INPUTS OUT
      OUT["logits"] = AutoModelForCausalLM(MODEL)(INPUTS["input_ids"]).logits
  peft MODEL ADAPTER INPUTS OUT
      Loads MODEL, then our ADAPTER with PeftModel.from_pretrained (exit 3 if any LoRA key is
      missing or unexpected), and writes into OUT: logits, loss_sum (sum of token CE over the
      shifted labels, ignore -100), grad.<peft name> for every LoRA parameter, and
      merged.<name> for every tensor of merge_and_unload()'s state dict.
  generate MODEL INPUTS OUT OPTIONS_JSON
      OUT["tokens"] = the new tokens of AutoModelForCausalLM(MODEL).generate(INPUTS["input_ids"],
      **OPTIONS_JSON) (batch 1; the generation keys of HF's GenerationConfig).
  scores INPUTS OUT OPTIONS_JSON
      OUT["scores"] = HF's logits processors and warpers for OPTIONS_JSON applied to
      INPUTS["logits"] [1, vocab] after INPUTS["input_ids"] [1, n], as generate builds them.
"""
import json
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM


def load_base(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 attn_implementation="sdpa")
    model.eval()
    return model


def logits(model_dir, inputs_path, out_path):
    inputs = load_file(inputs_path)
    with torch.no_grad():
        out = load_base(model_dir)(input_ids=inputs["input_ids"]).logits
    save_file({"logits": out.contiguous()}, out_path)


def peft_check(model_dir, adapter_dir, inputs_path, out_path):
    from peft import PeftModel
    from peft.utils import load_peft_weights, set_peft_model_state_dict

    inputs = load_file(inputs_path)
    model = PeftModel.from_pretrained(load_base(model_dir), adapter_dir, is_trainable=True)
    result = set_peft_model_state_dict(model, load_peft_weights(adapter_dir))
    missing = [k for k in result.missing_keys if "lora_" in k]
    if missing or result.unexpected_keys:
        print("missing:", missing, "unexpected:", result.unexpected_keys)
        sys.exit(3)
    model.eval()  # no dropout: the C++ side runs with dropout 0 as well

    out = model(input_ids=inputs["input_ids"]).logits
    labels = inputs["labels"][:, 1:].reshape(-1)
    loss_sum = torch.nn.functional.cross_entropy(
        out[:, :-1].reshape(-1, out.size(-1)).float(), labels, ignore_index=-100, reduction="sum")
    loss_sum.backward()
    tensors = {"logits": out.detach().contiguous(), "loss_sum": loss_sum.detach()}
    for name, p in model.named_parameters():
        if p.requires_grad:
            tensors["grad." + name.replace(".default", "")] = p.grad.contiguous()

    merged = model.merge_and_unload()
    for name, t in merged.state_dict().items():
        tensors["merged." + name] = t.detach().contiguous().clone()
    save_file(tensors, out_path)


def generate(model_dir, inputs_path, out_path, options_json):
    inputs = load_file(inputs_path)
    ids = inputs["input_ids"]
    with torch.no_grad():
        out = load_base(model_dir).generate(ids, attention_mask=torch.ones_like(ids),
                                            **json.loads(options_json))
    save_file({"tokens": out[:, ids.size(1):].contiguous()}, out_path)


def scores(inputs_path, out_path, options_json):
    from transformers import GenerationConfig
    from transformers.generation import logits_process as lp

    inputs = load_file(inputs_path)
    config = GenerationConfig(**json.loads(options_json))
    processors = lp.LogitsProcessorList()
    if config.repetition_penalty not in (None, 1.0):
        processors.append(lp.RepetitionPenaltyLogitsProcessor(config.repetition_penalty))
    if config.do_sample:
        if config.temperature not in (None, 1.0):
            processors.append(lp.TemperatureLogitsWarper(config.temperature))
        if config.top_k not in (None, 0):
            processors.append(lp.TopKLogitsWarper(config.top_k))
        if config.top_p not in (None, 1.0):
            processors.append(lp.TopPLogitsWarper(config.top_p))
    out = processors(inputs["input_ids"], inputs["logits"].clone())
    save_file({"scores": out.contiguous()}, out_path)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "logits":
        logits(*sys.argv[2:5])
    elif mode == "peft":
        peft_check(*sys.argv[2:6])
    elif mode == "generate":
        generate(*sys.argv[2:6])
    elif mode == "scores":
        scores(*sys.argv[2:5])
    else:
        sys.exit(f"unknown mode {mode}")
