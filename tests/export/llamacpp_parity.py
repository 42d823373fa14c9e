#!/usr/bin/env python3
"""Our GGUF export against llama.cpp's own converter (convert_hf_to_gguf.py, kept by
scripts/setup.sh in $QLORA_LLAMACPP_CONVERTER): the same tiny bf16 LLaMA folder with a
SentencePiece tokenizer, exported by both in f16, q8_0 and bf16, must give the same tensors
(names, types, shapes, bytes) and the same values for every key llama.cpp writes, but its naming
niceties (general.name, general.size_label, ...).
    python3 tests/export/llamacpp_parity.py BUILD_DIR SOURCE_DIR
Runs in $QLORA_PYTHON (torch, transformers, sentencepiece: the converter's needs), re-executing
itself there; exit status 77 (skipped) without it or without the converter.
"""
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SKIPPED = 77
# Keys of llama.cpp's that only name or describe the file.
DESCRIPTIVE = {"general.name", "general.size_label", "general.basename", "general.finetune",
               "general.quantization_version"}


def main() -> None:
    python = os.environ.get("QLORA_PYTHON") or os.environ.get("QLORA_CONFIGURED_PYTHON", "")
    converter = os.environ.get("QLORA_LLAMACPP_CONVERTER", "")
    home = os.path.realpath(os.path.join(os.path.dirname(python or "."), os.pardir))
    if python and os.access(python, os.X_OK) and home != os.path.realpath(sys.prefix):
        os.execv(python, [python] + sys.argv)
    if not converter or not Path(converter, "convert_hf_to_gguf.py").is_file():
        print("SKIPPED: no llama.cpp converter ($QLORA_LLAMACPP_CONVERTER is not set)")
        sys.exit(SKIPPED)
    build, source = Path(sys.argv[1]), Path(sys.argv[2])
    sys.path.insert(0, str(Path(converter, "gguf-py")))  # the converter's own gguf package
    import numpy as np
    from gguf import GGUFReader

    work = Path(tempfile.mkdtemp(prefix="qlora-gguf-parity-"))
    try:
        model = work / "tiny"
        subprocess.run([str(build / "worker" / "engine" / "qlora-make-tiny-model"), str(model),
                        "--vocab", "600", "--bos_token_id", "1", "--eos_token_id", "2",
                        "--dtype", "bfloat16", "--init_std", "0.1", "--heads", "4", "--kv_heads", "2"],
                       check=True, capture_output=True)
        for f in (source / "tests" / "assets" / "spm_bpe").iterdir():
            shutil.copy(f, model)
        failures = []
        for kind in ("f16", "q8_0", "bf16"):
            theirs, ours = work / f"llamacpp-{kind}.gguf", work / f"ours-{kind}.gguf"
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(converter, "gguf-py")), converter]))
            done = subprocess.run([sys.executable, str(Path(converter, "convert_hf_to_gguf.py")), str(model),
                                   "--outfile", str(theirs), "--outtype", kind], env=env, capture_output=True, text=True)
            if done.returncode != 0:
                print(done.stdout[-2000:], done.stderr[-2000:])
                sys.exit(1)
            subprocess.run([str(build / "worker" / "export" / "qlora-export-gguf"), str(model), str(ours),
                            "--type", kind], check=True, capture_output=True)
            ref, got = GGUFReader(str(theirs)), GGUFReader(str(ours))
            ref_tensors = {t.name: t for t in ref.tensors}
            got_tensors = {t.name: t for t in got.tensors}
            if set(ref_tensors) != set(got_tensors):
                failures.append(f"{kind}: tensors differ: {sorted(set(ref_tensors) ^ set(got_tensors))}")
            for name, t in ref_tensors.items():
                g = got_tensors.get(name)
                if g is None:
                    continue
                if (t.tensor_type, list(t.shape)) != (g.tensor_type, list(g.shape)):
                    failures.append(f"{kind} {name}: {g.tensor_type.name} {list(g.shape)}, llama.cpp "
                                    f"{t.tensor_type.name} {list(t.shape)}")
                elif np.asarray(t.data).tobytes() != np.asarray(g.data).tobytes():
                    failures.append(f"{kind} {name}: bytes differ from llama.cpp's")
            for key, field in ref.fields.items():
                if key.startswith("GGUF.") or key in DESCRIPTIVE:
                    continue
                mine = got.fields.get(key)
                if mine is None:
                    failures.append(f"{kind}: key {key} missing ({str(field.contents())[:60]})")
                elif mine.contents() != field.contents():
                    failures.append(f"{kind}: {key} is {str(mine.contents())[:60]}, llama.cpp {str(field.contents())[:60]}")
            print(f"{kind}: {len(got_tensors)} tensors byte-identical to llama.cpp's and "
                  f"{len([k for k in ref.fields if not k.startswith('GGUF.') and k not in DESCRIPTIVE])} keys equal")
        if failures:
            print("\n".join(failures[:30]))
            sys.exit(1)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
