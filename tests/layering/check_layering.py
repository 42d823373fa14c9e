#!/usr/bin/env python3
"""Checks the module layering of the source tree, from its #include lines and CMake link lines.

Layers, lowest first; a folder may use its own layer and the ones below, never one above or
beside it:

    kernels, common  <  coordinator, worker  <  cli, tests, bench

(kernels and common are independent of each other except that nothing in either reaches up;
the coordinator and the worker never use each other's code: they meet only through common/ and
proto/). Exit status 0 when every rule holds; otherwise each violation is printed as
`path:line: rule` and the status is 1.

    check_layering.py SOURCE_DIR
"""
import os
import re
import sys

# folder -> folders whose headers and CMake targets it must not use
FORBIDDEN = {
    "common": ("worker", "coordinator", "cli", "kernels"),
    "kernels": ("worker", "coordinator", "cli", "common/rpc"),
    "proto": ("worker", "coordinator", "cli", "common", "kernels"),
    "coordinator": ("worker", "cli", "kernels"),
    "worker": ("coordinator", "cli"),
}
SOURCE_SUFFIXES = (".h", ".cc", ".cu", ".cuh", ".cpp", ".hpp")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
ADD_TARGET = re.compile(r"^\s*add_(?:library|executable)\(\s*([A-Za-z0-9_.+-]+)", re.M)
LINK = re.compile(r"target_link_libraries\(\s*([A-Za-z0-9_.+-]+)(.*?)\)", re.S)


def top(rel):
    """The layer of a repository-relative path ('common/rpc' is its own layer)."""
    if rel.startswith("common/rpc/"):
        return "common/rpc"
    return rel.split("/", 1)[0]


def layer_of(rel):
    t = top(rel)
    return "common" if t == "common/rpc" else t


def walk(root):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "build"]
        for name in filenames:
            yield os.path.relpath(os.path.join(dirpath, name), root)


def include_violations(root):
    for rel in walk(root):
        if not rel.endswith(SOURCE_SUFFIXES):
            continue
        layer = layer_of(rel)
        forbidden = FORBIDDEN.get(layer, ())
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                target = m.group(1)
                if layer == "common" and top(rel) != "common/rpc" and target.startswith("proto/"):
                    yield f"{rel}:{number}: common/ (outside common/rpc) includes generated protobuf {target}"
                for bad in forbidden:
                    if target.startswith(bad + "/"):
                        yield f"{rel}:{number}: {layer}/ must not include {target}"


def cmake_targets(root):
    """target name -> the folder (layer) whose CMakeLists.txt defines it."""
    owners = {}
    for rel in walk(root):
        if os.path.basename(rel) != "CMakeLists.txt":
            continue
        text = open(os.path.join(root, rel), encoding="utf-8").read()
        for m in ADD_TARGET.finditer(text):
            owners[m.group(1)] = (top(rel), rel)
    return owners


def link_violations(root):
    owners = cmake_targets(root)
    for rel in walk(root):
        if os.path.basename(rel) != "CMakeLists.txt":
            continue
        layer = layer_of(rel)
        forbidden = FORBIDDEN.get(layer, ())
        text = open(os.path.join(root, rel), encoding="utf-8").read()
        for m in LINK.finditer(text):
            for word in m.group(2).split():
                owner = owners.get(word)
                if owner is None:
                    continue
                if any(owner[0] == bad or owner[0].startswith(bad + "/") for bad in forbidden):
                    number = text.count("\n", 0, m.start()) + 1
                    yield f"{rel}:{number}: {m.group(1)} ({layer}/) links {word} from {owner[1]}"


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    problems = list(include_violations(root)) + list(link_violations(root))
    for p in problems:
        print(p)
    print(f"layering: {len(problems)} violation(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
