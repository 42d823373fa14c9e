#!/usr/bin/env python3
"""Makes the bitsandbytes 4-bit fixtures that tests/kernels/quantize_4bit_fixture_test.cc checks.

Run it where the real bitsandbytes wheel runs, preferably on a CUDA GPU (the semantics we match):

    python3 tests/kernels/make_bnb_fixtures.py --device cuda --out tests/assets/bnb/cuda

With --device cpu it uses bitsandbytes' CPU backend instead (all-zero blocks, the tail block and
value clamping differ from CUDA there); the manifest records the backend that made every file,
and the test relaxes its checks for "cpu" fixtures.

Every case stores raw little-endian files <case>.<field>.bin next to manifest.json:
  input      the input tensor in its dtype (fp32 / fp16 / bf16)
  packed     uint8, (n + 1) / 2 bytes (bitsandbytes' layout: even element in the high nibble)
  absmax     float32 [blocks], or uint8 [blocks] codes when double-quantized
  absmax_f32 float32 [blocks], the raw per-block absmax before double quantization
  nested_absmax float32 [ceil(blocks / 256)] (double quant only)
  dequant    bitsandbytes' dequantize_4bit output, in the input's dtype
The 256-entry dynamic map (nested_quant_map) and the two 16-entry quant maps are stored once.
"""
import argparse
import json
import os
import struct

import numpy as np
import torch

import bitsandbytes
import bitsandbytes.functional as F

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def raw_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().contiguous().cpu().reshape(-1)
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def f32_bits(x: float) -> str:
    return "0x%08x" % struct.unpack("<I", struct.pack("<f", x))[0]


def make_input(kind: str, n: int, blocksize: int, dtype: torch.dtype, gen: torch.Generator):
    if kind == "normal":
        x = torch.randn(n, generator=gen)
    elif kind == "weights":  # LLM-like scale with a spread of per-block scales
        blocks = -(-n // blocksize)
        scale = torch.exp(torch.randn(blocks, generator=gen)).repeat_interleave(blocksize)[:n]
        x = 0.02 * torch.randn(n, generator=gen) * scale
    elif kind == "zero_block":  # the second block is all zeros, the tail block too when short
        x = torch.randn(n, generator=gen)
        x[blocksize:2 * blocksize] = 0.0
    elif kind == "all_zero":
        x = torch.zeros(n)
    elif kind == "outliers":
        x = torch.randn(n, generator=gen)
        idx = torch.randint(0, n, (max(1, n // 97),), generator=gen)
        x[idx] = 1e4 * torch.sign(torch.randn(idx.numel(), generator=gen))
    elif kind == "thresholds":
        # Values exactly on (and one ulp beside) the NF4 and FP4 decision thresholds, with an
        # absmax of 1 in every block so the scaled value equals the input exactly.
        nf4 = [-0.8480964004993439, -0.6106329262256622, -0.4599952697753906,
               -0.33967943489551544, -0.23460740596055984, -0.13791173323988914,
               -0.045525018125772476, 0.03979014977812767, 0.1202552504837513,
               0.2035212516784668, 0.2920137718319893, 0.3893125355243683,
               0.5016634166240692, 0.6427869200706482, 0.8614784181118011]
        fp4 = [0.29166667, 0.583333, 0.8333333, 0.4166667, 0.0859375, 0.20833333, 0.00260417]
        t = torch.tensor(nf4 + fp4 + [-v for v in fp4], dtype=torch.float32)
        vals = torch.cat([t, torch.nextafter(t, torch.tensor(2.0)), torch.nextafter(t, torch.tensor(-2.0))])
        x = vals.repeat(-(-n // vals.numel()))[:n].clone()
        x[::blocksize] = 1.0
    else:
        raise ValueError(kind)
    return x.to(dtype)


def case_list():
    cases = []
    for dtype in DTYPES:
        for qt in ("nf4", "fp4"):
            for dq in (False, True):
                for n in (1, 63, 65, 1000, 4097):
                    cases.append(dict(dtype=dtype, quant_type=qt, double_quant=dq, blocksize=64,
                                      n=n, kind="normal" if n != 1000 else "weights"))
                cases.append(dict(dtype=dtype, quant_type=qt, double_quant=dq, blocksize=64,
                                  n=300, kind="zero_block"))
                cases.append(dict(dtype=dtype, quant_type=qt, double_quant=dq, blocksize=64,
                                  n=777, kind="outliers"))
                cases.append(dict(dtype=dtype, quant_type=qt, double_quant=dq, blocksize=64,
                                  n=512, kind="thresholds"))
    for qt in ("nf4", "fp4"):
        for dq in (False, True):
            cases.append(dict(dtype="bfloat16", quant_type=qt, double_quant=dq, blocksize=64,
                              n=128, kind="all_zero"))
            for bs in (32, 128, 4096):
                cases.append(dict(dtype="bfloat16", quant_type=qt, double_quant=dq, blocksize=bs,
                                  n=10001, kind="weights"))
        # More than 256 blocks: several nested blocks, the last one partial.
        cases.append(dict(dtype="bfloat16", quant_type=qt, double_quant=True, blocksize=64,
                          n=20001, kind="weights"))
    cases.append(dict(dtype="float32", quant_type="nf4", double_quant=True, blocksize=64,
                      n=17000, kind="normal"))
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()

    dev = torch.device(args.device)
    os.makedirs(args.out, exist_ok=True)
    gen = torch.Generator().manual_seed(args.seed)
    total = 0

    def save(name, t):
        nonlocal total
        data = raw_bytes(t)
        with open(os.path.join(args.out, name), "wb") as f:
            f.write(data)
        total += len(data)
        return name

    manifest = {
        "generator": "tests/kernels/make_bnb_fixtures.py",
        "bitsandbytes": bitsandbytes.__version__,
        "torch": torch.__version__,
        "backend": args.device,
        "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "seed": args.seed,
        "cases": [],
    }
    dynamic_map = F.create_dynamic_map(signed=True).to(torch.float32)
    manifest["dynamic_map"] = save("dynamic_map.bin", dynamic_map)
    manifest["quant_map"] = {qt: save(f"quant_map_{qt}.bin", F.get_4bit_type(qt, device="cpu"))
                             for qt in ("nf4", "fp4")}

    for i, c in enumerate(case_list()):
        name = "c%03d_%s_%s_%s_bs%d_n%d_%s" % (i, c["dtype"], c["quant_type"],
                                              "dq" if c["double_quant"] else "plain",
                                              c["blocksize"], c["n"], c["kind"])
        x = make_input(c["kind"], c["n"], c["blocksize"], DTYPES[c["dtype"]], gen).to(dev)
        packed, st = F.quantize_4bit(x, blocksize=c["blocksize"], quant_type=c["quant_type"],
                                     compress_statistics=c["double_quant"])
        deq = F.dequantize_4bit(packed, st)
        # The same kernel once more, for the raw fp32 absmax that double quantization consumes.
        packed_raw, absmax_f32 = torch.ops.bitsandbytes.quantize_4bit.default(
            x, c["blocksize"], c["quant_type"], torch.uint8)
        assert torch.equal(packed_raw, packed), "quantize_4bit is not deterministic"
        entry = dict(c, name=name, shape=list(x.shape),
                     input=save(name + ".input.bin", x),
                     packed=save(name + ".packed.bin", packed),
                     absmax=save(name + ".absmax.bin", st.absmax),
                     absmax_f32=save(name + ".absmax_f32.bin", absmax_f32.float()),
                     dequant=save(name + ".dequant.bin", deq))
        assert deq.dtype == x.dtype and packed.numel() == (c["n"] + 1) // 2
        if c["double_quant"]:
            assert torch.equal(st.state2.code.cpu(), dynamic_map), "nested code differs"
            offset = float(st.offset.item())
            entry.update(nested_absmax=save(name + ".nested_absmax.bin", st.state2.absmax),
                         nested_blocksize=int(st.state2.blocksize),
                         nested_offset=offset, nested_offset_bits=f32_bits(offset))
        manifest["cases"].append(entry)

    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"{len(manifest['cases'])} cases, {total / 1e6:.2f} MB of data in {args.out}")


if __name__ == "__main__":
    main()
