"""Reads a GGUF file with the gguf package (llama.cpp's own Python reader and quantizers) and
checks it against the Hugging Face folder it was made from:

  python gguf_check.py MODEL_DIR FILE.gguf TYPE

- every key llama.cpp needs, with the config's values, and the tokenizer (tokens in id order,
  merges, types, BOS/EOS, chat template);
- every tensor under llama.cpp's name, shape and type, its bytes equal to what gguf's quantizer
  makes of the HF tensor in float32 (after llama.cpp's q/k row permutation for LLaMA), norms and
  biases in F32, Q8_0 rows not a multiple of 32 in F16;
- LLaMA-3 rope frequency factors as llama.cpp's converter computes them.
Exit 0 when all holds; prints what failed otherwise.
"""
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from gguf.quants import quantize
from safetensors.torch import load_file

model_dir, path, kind = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
config = json.loads((model_dir / "config.json").read_text())
reader = GGUFReader(path)
failures = []


def field(key):
    f = reader.fields.get(key)
    if f is None:
        failures.append(f"missing key {key}")
        return None
    return f.contents()


def expect(key, want):
    got = field(key)
    if got is not None and (got != want if not isinstance(want, float) else abs(got - want) > 1e-6 * abs(want)):
        failures.append(f"{key}: {got!r}, expected {want!r}")


family = config["model_type"]
arch = "qwen2" if family == "qwen2" else "llama"
heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
head_dim = config.get("head_dim") or config["hidden_size"] // heads
expect("general.architecture", arch)
expect("general.file_type", {"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32}[kind])
expect(f"{arch}.block_count", config["num_hidden_layers"])
expect(f"{arch}.embedding_length", config["hidden_size"])
expect(f"{arch}.feed_forward_length", config["intermediate_size"])
expect(f"{arch}.context_length", config["max_position_embeddings"])
expect(f"{arch}.attention.head_count", heads)
expect(f"{arch}.attention.head_count_kv", kv_heads)
expect(f"{arch}.rope.dimension_count", head_dim)
expect(f"{arch}.attention.key_length", head_dim)
expect(f"{arch}.attention.value_length", head_dim)
expect("general.type", "model")
expect(f"{arch}.attention.layer_norm_rms_epsilon", float(config["rms_norm_eps"]))
rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
theta = config.get("rope_theta", rope.get("rope_theta", 10000.0))
expect(f"{arch}.rope.freq_base", float(theta))

tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
by_id = {i: t for t, i in tokenizer["model"]["vocab"].items()}
by_id.update({a["id"]: a["content"] for a in tokenizer["added_tokens"]})
tokens = [by_id.get(i, f"[PAD{i}]") for i in range(config["vocab_size"])]
expect("tokenizer.ggml.model", "gpt2")
expect("tokenizer.ggml.tokens", tokens)
merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
expect("tokenizer.ggml.merges", merges)
specials = {a["id"] for a in tokenizer["added_tokens"] if a["special"]}
types = [3 if i in specials else (1 if i in by_id else 5) for i in range(config["vocab_size"])]
expect("tokenizer.ggml.token_type", types)
tok_config = json.loads((model_dir / "tokenizer_config.json").read_text())
ids = {t: i for i, t in enumerate(tokens)}
expect("tokenizer.ggml.bos_token_id", ids[tok_config["bos_token"]])
expect("tokenizer.ggml.eos_token_id", ids[tok_config["eos_token"]])
if "chat_template" in tok_config:
    expect("tokenizer.chat_template", tok_config["chat_template"])


def permute(w, n_head):  # llama.cpp's convert_hf_to_gguf LlamaModel.permute
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


state = {}
for f in sorted(model_dir.glob("*.safetensors")):
    state.update(load_file(f))
names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
         "lm_head.weight": "output.weight"}
hf_layer = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
            "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
            "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
            "mlp.down_proj": "ffn_down"}
for name in state:
    if name.startswith("model.layers."):
        _, _, i, *rest = name.split(".")
        module, suffix = ".".join(rest[:-1]), rest[-1]
        names[name] = f"blk.{i}.{hf_layer[module]}.{suffix}"
wanted_type = {"f32": Q.F32, "f16": Q.F16, "bf16": Q.BF16, "q8_0": Q.Q8_0}[kind]
tensors = {t.name: t for t in reader.tensors}
seen = set()
for hf, name in names.items():
    if hf not in state:
        continue
    seen.add(name)
    t = tensors.get(name)
    if t is None:
        failures.append(f"tensor {name} ({hf}) missing")
        continue
    data = state[hf].float().numpy()
    if arch == "llama" and ".attn_q." in name:
        data = permute(data, heads)
    if arch == "llama" and ".attn_k." in name:
        data = permute(data, kv_heads)
    qtype = Q.F32 if data.ndim < 2 else wanted_type
    if qtype == Q.Q8_0 and data.shape[-1] % 32:
        qtype = Q.F16
    if t.tensor_type != qtype:
        failures.append(f"{name}: type {t.tensor_type.name}, expected {qtype.name}")
        continue
    if list(t.shape) != list(reversed(data.shape)):
        failures.append(f"{name}: shape {list(t.shape)}, expected {list(reversed(data.shape))}")
    expected = quantize(np.ascontiguousarray(data, dtype=np.float32), qtype)
    if expected.tobytes() != np.asarray(t.data).tobytes():
        failures.append(f"{name}: bytes differ from gguf.quants.quantize(..., {qtype.name})")
if rope.get("rope_type") == "llama3":
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    factors = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            factors.append(1)
        elif wavelen > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    t = tensors.get("rope_freqs.weight")
    seen.add("rope_freqs.weight")
    if t is None or not np.allclose(np.asarray(t.data), np.array(factors, dtype=np.float32), rtol=1e-6):
        failures.append("rope_freqs.weight missing or wrong")
extra = set(tensors) - seen
if extra:
    failures.append(f"unexpected tensors {sorted(extra)}")
if failures:
    print("\n".join(failures[:20]))
    sys.exit(1)
print(f"{path}: {len(tensors)} tensors and {len(reader.fields)} keys as gguf reads them")
