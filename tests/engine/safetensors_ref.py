"""Reference side of the safetensors tests, using the real `safetensors` package.

  write DIR   writes files with many dtypes/shapes (one file, and a 2-shard folder with its
              index) and DIR/manifest.json: name -> {dtype, shape, hex bytes}
  check FILE  loads a file our writer made with safe_open and checks it against the values the
              C++ test wrote (see safetensors_test.cc: ExpectedValue)
"""
import json
import os
import struct
import sys

import torch
from safetensors import safe_open
from safetensors.torch import save_file

NAMES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
         torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
         torch.uint8: "U8", torch.bool: "BOOL"}


def raw_bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def write(out):
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for i, dtype in enumerate(NAMES):
        shape = [(3 + i) % 5 + 1, 7]
        if dtype.is_floating_point:
            tensors[f"t.{NAMES[dtype]}"] = torch.randn(shape, generator=g).to(dtype)
        elif dtype == torch.bool:
            tensors[f"t.{NAMES[dtype]}"] = torch.randint(0, 2, shape, generator=g).bool()
        else:
            tensors[f"t.{NAMES[dtype]}"] = torch.randint(-100 if dtype != torch.uint8 else 0, 100,
                                                         shape, generator=g).to(dtype)
    tensors["empty"] = torch.zeros(0, 3)
    tensors["scalar"] = torch.tensor(2.5)
    tensors["odd.u8"] = torch.arange(5, dtype=torch.uint8)
    save_file(tensors, os.path.join(out, "single.safetensors"), metadata={"format": "pt"})

    shard_dir = os.path.join(out, "sharded")
    os.makedirs(shard_dir)
    names = sorted(tensors)
    shards = [names[: len(names) // 2], names[len(names) // 2:]]
    weight_map = {}
    for k, part in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: tensors[n] for n in part}, os.path.join(shard_dir, fname))
        weight_map.update({n: fname for n in part})
    with open(os.path.join(shard_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)

    manifest = {n: {"dtype": NAMES[t.dtype], "shape": list(t.shape), "hex": raw_bytes(t).hex()}
                for n, t in tensors.items()}
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f)


def check(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = f.read(n)
    assert n % 8 == 0, f"header length {n} is not a multiple of 8"
    assert header.rstrip(b" ").endswith(b"}"), "header padding must be spaces"
    with safe_open(path, framework="pt") as f:
        assert f.metadata() == {"format": "pt"}, f.metadata()
        keys = sorted(f.keys())
        assert keys == ["a.f32", "b.bf16", "c.u8", "d.i64", "e.empty", "f.scalar"], keys
        for k in keys:
            t = f.get_tensor(k)
            flat = t.reshape(-1).to(torch.float64)
            expected = torch.tensor([(i * 7 % 13) - 6.0 for i in range(flat.numel())],
                                    dtype=torch.float64)
            if k == "c.u8":
                expected = expected + 6
            assert torch.equal(flat, expected), (k, flat, expected)
        assert list(f.get_tensor("a.f32").shape) == [3, 5]
        assert f.get_tensor("b.bf16").dtype == torch.bfloat16
        assert list(f.get_tensor("c.u8").shape) == [7]
        assert list(f.get_tensor("e.empty").shape) == [0, 4]
        assert list(f.get_tensor("f.scalar").shape) == []
    print("python safe_open: OK")


if __name__ == "__main__":
    {"write": write, "check": check}[sys.argv[1]](sys.argv[2])
