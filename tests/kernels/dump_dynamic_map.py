#!/usr/bin/env python3
"""Prints bitsandbytes' 256-entry dynamic map as the C++ initializer in kernels/codebooks_4bit.h.

It re-implements bitsandbytes.functional.create_dynamic_map(signed=True, max_exponent_bits=7,
total_bits=8) with torch (same float32 linspace and arithmetic), and, when given the
dynamic_map.bin that tests/kernels/make_bnb_fixtures.py dumped from the real library, checks
that both agree bit for bit before printing. Run once; the printed table is embedded, not
regenerated at run time.

    $QLORA_PYTHON tests/kernels/dump_dynamic_map.py tests/assets/bnb/cuda/dynamic_map.bin
"""
import sys

import numpy as np
import torch


def create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8):
    data = []
    non_sign_bits = total_bits - 1
    additional_items = 2 ** (non_sign_bits - max_exponent_bits) - 1
    for i in range(max_exponent_bits):
        fraction_items = int(2 ** (i + non_sign_bits - max_exponent_bits) + 1 if signed
                             else 2 ** (i + non_sign_bits - max_exponent_bits + 1) + 1)
        boundaries = torch.linspace(0.1, 1, fraction_items)
        means = (boundaries[:-1] + boundaries[1:]) / 2.0
        data += ((10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
        if signed:
            data += (-(10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
    if additional_items > 0:
        boundaries = torch.linspace(0.1, 1, additional_items + 1)
        means = (boundaries[:-1] + boundaries[1:]) / 2.0
        data += ((10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
        if signed:
            data += (-(10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
    data.append(0)
    data.append(1.0)
    assert len(data) == 2 ** total_bits
    data.sort()
    return torch.tensor(data, dtype=torch.float32)


def main():
    table = create_dynamic_map().numpy()
    if len(sys.argv) > 1:
        dumped = np.fromfile(sys.argv[1], dtype="<f4")
        if not np.array_equal(dumped.view(np.uint32), table.view(np.uint32)):
            sys.exit("re-implementation differs from the bitsandbytes dump")
        print("// matches bitsandbytes' dump bit for bit", file=sys.stderr)
    items = [np.format_float_positional(v, unique=True, trim="0") + "f" for v in table]
    for row in range(0, 256, 4):
        print("    " + ", ".join(items[row:row + 4]) + ",")


if __name__ == "__main__":
    main()
