"""Writes a LLaMA-2-7B-shaped Hugging Face folder with random bf16 weights (config.json, sharded
model-*.safetensors with an index, and the example tokenizer), so the benchmark runs the real
loading and quantizing path. Nothing can be downloaded on the GPU machine.
  python3 bench/make_llama_folder.py OUT_DIR [--layers 32]
LLaMA-3.1-8B's shape (grouped-query attention, its vocabulary and rotary base):
  python3 bench/make_llama_folder.py OUT_DIR --intermediate 14336 --kv-heads 8 --vocab 128256 \
      --rope-theta 500000 --max-positions 131072
"""
import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--layers", type=int, default=32)
p.add_argument("--hidden", type=int, default=4096)
p.add_argument("--intermediate", type=int, default=11008)
p.add_argument("--heads", type=int, default=32)
p.add_argument("--kv-heads", type=int, default=None, help="default: --heads (no grouping)")
p.add_argument("--vocab", type=int, default=32000)
p.add_argument("--rope-theta", type=float, default=10000.0)
p.add_argument("--max-positions", type=int, default=4096)
args = p.parse_args()
kv_heads = args.kv_heads or args.heads
if args.heads % kv_heads or args.hidden % args.heads:
    p.error("--heads must divide --hidden, and --kv-heads --heads")
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
h, i, v = args.hidden, args.intermediate, args.vocab
config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h,
          "intermediate_size": i, "num_hidden_layers": args.layers, "num_attention_heads": args.heads,
          "num_key_value_heads": kv_heads, "max_position_embeddings": args.max_positions,
          "rms_norm_eps": 1e-5, "rope_theta": args.rope_theta, "rope_scaling": None, "vocab_size": v, "tie_word_embeddings": False,
          "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
          "attention_bias": False}
(out / "config.json").write_text(json.dumps(config, indent=2))
dev = "cuda" if torch.cuda.is_available() else "cpu"
gen = torch.Generator(device=dev).manual_seed(0)


def rand(*shape):
    return (torch.randn(*shape, generator=gen, device=dev, dtype=torch.float32) * 0.02).to(torch.bfloat16).cpu()


index = {"metadata": {}, "weight_map": {}}
shards = [("model.embed_tokens.weight", lambda: rand(v, h))]
for l in range(args.layers):
    pre = f"model.layers.{l}."
    shards += [(pre + "input_layernorm.weight", lambda: torch.ones(h, dtype=torch.bfloat16)),
               (pre + "post_attention_layernorm.weight", lambda: torch.ones(h, dtype=torch.bfloat16))]
    kv = h // args.heads * kv_heads  # k's and v's rows
    for name, rows in [("q_proj", h), ("k_proj", kv), ("v_proj", kv), ("o_proj", h)]:
        shards.append((pre + f"self_attn.{name}.weight", lambda rows=rows: rand(rows, h)))
    shards += [(pre + "mlp.gate_proj.weight", lambda: rand(i, h)), (pre + "mlp.up_proj.weight", lambda: rand(i, h)),
               (pre + "mlp.down_proj.weight", lambda: rand(h, i))]
shards += [("model.norm.weight", lambda: torch.ones(h, dtype=torch.bfloat16)), ("lm_head.weight", lambda: rand(v, h))]
# About 2 GB per file.
files, current, size = [], {}, 0
for name, make in shards:
    t = make()
    current[name] = t
    size += t.numel() * 2
    if size > 2 << 30:
        files.append(current)
        current, size = {}, 0
if current:
    files.append(current)
for n, tensors in enumerate(files):
    fname = f"model-{n + 1:05d}-of-{len(files):05d}.safetensors"
    save_file(tensors, str(out / fname), metadata={"format": "pt"})
    for k in tensors:
        index["weight_map"][k] = fname
(out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
tok = Path(__file__).resolve().parent.parent / "examples" / "tokenizer"
for f in tok.iterdir():
    shutil.copy(f, out / f.name)
print(f"wrote {out}: {sum(t.numel() for f in files for t in f.values()) / 1e9:.2f}B parameters in {len(files)} files")
