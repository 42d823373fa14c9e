#!/usr/bin/env python3
"""Checks `cmake --install` of a build: the layout, --version and --help of every program, the
worker finding the SentencePiece module in PREFIX/lib, and every library resolving.

    check_install.py BUILD_DIR

Installs into a temporary PREFIX, then:
  - PREFIX/bin holds qloractl, qlora-coordinator, qlora-worker, qlora-make-tiny-model and
    qlora_ray_launcher.py (beside qlora-worker); PREFIX/lib holds libqlora_spm.so;
  - each program's --version prints "PROGRAM VERSION" (CMake's project version) and exits 0, and
    its --help exits 0;
  - `qlora-worker --check_spm_module` loads PREFIX/lib/libqlora_spm.so (QLORA_SPM_MODULE unset);
  - ldd finds every library of every program and of the module (RUNPATH).
Exit status 0 when all hold; 1 with one line per failure.
"""
import os
import re
import subprocess
import sys
import tempfile

PROGRAMS = ("qloractl", "qlora-coordinator", "qlora-worker", "qlora-make-tiny-model")


def project_version(build_dir):
    with open(os.path.join(build_dir, "CMakeCache.txt")) as f:
        match = re.search(r"^CMAKE_PROJECT_VERSION:\w+=(.+)$", f.read(), re.M)
    return match.group(1).strip() if match else None


def run(args, env=None):
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)


def check(build_dir, prefix):
    failures = []
    installed = run(["cmake", "--install", build_dir, "--prefix", prefix])
    if installed.returncode != 0:
        return [f"cmake --install failed: {installed.stderr.strip()}"]
    bin_dir, lib_dir = os.path.join(prefix, "bin"), os.path.join(prefix, "lib")
    expected = [os.path.join(bin_dir, p) for p in PROGRAMS + ("qlora_ray_launcher.py",)]
    expected.append(os.path.join(lib_dir, "libqlora_spm.so"))
    failures += [f"not installed: {os.path.relpath(p, prefix)}" for p in expected if not os.path.isfile(p)]
    if failures:
        return failures
    version = project_version(build_dir)
    env = {k: v for k, v in os.environ.items() if k not in ("QLORA_SPM_MODULE", "LD_LIBRARY_PATH")}
    for program in PROGRAMS:
        path = os.path.join(bin_dir, program)
        out = run([path, "--version"], env)
        if out.returncode != 0 or out.stdout.strip() != f"{program} {version}":
            failures.append(f"{program} --version: exit {out.returncode}, printed {out.stdout!r} "
                            f"(expected '{program} {version}') {out.stderr.strip()}")
        out = run([path, "--help"], env)
        if out.returncode != 0 or "--version" not in out.stdout:
            failures.append(f"{program} --help: exit {out.returncode}, printed {out.stdout[:200]!r}")
        ldd = run(["ldd", path], env)
        missing = [line.strip() for line in ldd.stdout.splitlines() if "not found" in line]
        if missing:
            failures.append(f"{program}: libraries not found: {', '.join(missing)}")
    module = run([os.path.join(bin_dir, "qlora-worker"), "--check_spm_module"], env)
    want = os.path.realpath(os.path.join(lib_dir, "libqlora_spm.so"))
    if module.returncode != 0 or os.path.realpath(module.stdout.strip()) != want:
        failures.append(f"qlora-worker --check_spm_module: exit {module.returncode}, loaded "
                        f"{module.stdout.strip()!r} (expected {want}) {module.stderr.strip()}")
    return failures


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with tempfile.TemporaryDirectory(prefix="qlora-install-") as prefix:
        failures = check(os.path.abspath(sys.argv[1]), prefix)
    for failure in failures:
        print(f"FAIL: {failure}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
