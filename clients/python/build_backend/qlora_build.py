"""The build backend of qlora-client (PEP 517): generates the gRPC code from the repository's
proto/ and writes a pure-Python wheel of the qlora package with it.

It writes the wheel itself rather than through setuptools because setuptools before 70.1 needs
the `wheel` package for that, which the environments this is built in may lack (the reference
environment has neither it nor an index to fetch it from); a pure-Python wheel is a zip file
with three metadata files. The code is generated with protoc and grpc_python_plugin (Debian's
protobuf-compiler-grpc), else with grpcio-tools where it is installed.

The name, dependencies and readme come from pyproject.toml's [project]; the version is the
project's, from the repository's CMakeLists.txt (the one place it is written).
"""
from __future__ import annotations

import base64
import hashlib
import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent.parent   # clients/python
REPO = HERE.parent.parent                       # the repository's root
PROTO_DIR = REPO / "proto"
PROTO_FILES = ("qlora/v1/job.proto", "qlora/v1/job_service.proto")
TAG = "py3-none-any"
ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed, so that a build of the same sources is the same bytes


class BuildError(Exception):
    """A build that cannot go on, with what to do about it: shown without a traceback."""


def _project() -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # get_requires_for_build_wheel asked for it
        import tomli as tomllib
    with open(HERE / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def _version() -> str:
    cmake = REPO / "CMakeLists.txt"
    match = re.search(r"project\(\s*qlora\s+VERSION\s+([0-9.]+)", cmake.read_text(encoding="utf-8"))
    if match is None:
        raise BuildError(f"qlora-client: no `project(qlora VERSION x.y.z)` in {cmake}")
    return match.group(1)


def _protoc_command(out: str) -> list[str]:
    """The command that generates the code into `out`: the system's protoc, else grpcio-tools."""
    outputs = [f"--python_out={out}", f"--pyi_out={out}", f"--grpc_python_out={out}"]
    protoc, plugin = shutil.which("protoc"), shutil.which("grpc_python_plugin")
    if protoc and plugin:
        return [protoc, f"--plugin=protoc-gen-grpc_python={plugin}", f"-I{PROTO_DIR}", *outputs]
    if importlib.util.find_spec("grpc_tools") is not None:
        return [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_DIR}", *outputs]
    raise BuildError(
        "qlora-client: generating the gRPC code needs protoc and grpc_python_plugin (Debian: "
        "`apt-get install protobuf-compiler-grpc`, which scripts/setup.sh installs) or the "
        "grpcio-tools package, and neither was found")


def _generated_files() -> dict[str, bytes]:
    """qlora/v1/: the modules generated from the protos, by their paths in the wheel."""
    if not all((PROTO_DIR / p).is_file() for p in PROTO_FILES):
        raise BuildError(f"qlora-client: the protos are not in {PROTO_DIR}: build the client from "
                         "a checkout of the repository (pip install ./clients/python)")
    with tempfile.TemporaryDirectory() as out:
        run = subprocess.run(_protoc_command(out) + list(PROTO_FILES), capture_output=True, text=True)
        if run.returncode != 0:
            raise BuildError(f"qlora-client: protoc failed:\n{run.stderr}")
        files = {p.relative_to(out).as_posix(): p.read_bytes()
                 for p in sorted(Path(out).rglob("*")) if p.is_file()}
    files["qlora/v1/__init__.py"] = b"# Generated from proto/qlora/v1 when the wheel is built.\n"
    return files


def _package_files() -> dict[str, bytes]:
    """The hand-written qlora package (one folder): its modules and the py.typed marker."""
    package = HERE / "qlora"
    return {p.relative_to(HERE).as_posix(): p.read_bytes()
            for p in sorted(package.glob("*.py")) + [package / "py.typed"]}


def _metadata(project: dict[str, Any], version: str) -> bytes:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project['name']}",
        f"Version: {version}",
        f"Summary: {project['description']}",
        f"Requires-Python: {project['requires-python']}",
        *(f"Requires-Dist: {d}" for d in project["dependencies"]),
        "Description-Content-Type: text/markdown",
    ]
    readme = (HERE / project["readme"]).read_text(encoding="utf-8")
    return ("\n".join(lines) + "\n\n" + readme).encode("utf-8")


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def _write_wheel(directory: str, files: dict[str, bytes]) -> str:
    project, version = _project(), _version()
    stem = f"{project['name'].replace('-', '_')}-{version}"
    dist_info = f"{stem}.dist-info"
    files = dict(files)
    files[f"{dist_info}/METADATA"] = _metadata(project, version)
    files[f"{dist_info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: qlora_build\n"
                                   f"Root-Is-Purelib: true\nTag: {TAG}\n").encode()
    record = [_record_line(path, data) for path, data in files.items()] + [f"{dist_info}/RECORD,,"]
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    name = f"{stem}-{TAG}.whl"
    with zipfile.ZipFile(Path(directory) / name, "w") as wheel:
        for path, data in files.items():
            info = zipfile.ZipInfo(path, ZIP_TIME)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, data)
    return name


# -- PEP 517 hooks ---------------------------------------------------------------------------

def get_requires_for_build_wheel(config_settings: Optional[dict[str, Any]] = None) -> list[str]:
    """Nothing from 3.11 on, whose standard library reads pyproject.toml (tomllib)."""
    return [] if sys.version_info >= (3, 11) else ["tomli"]


def build_wheel(wheel_directory: str, config_settings: Optional[dict[str, Any]] = None,
                metadata_directory: Optional[str] = None) -> str:
    try:
        return _write_wheel(wheel_directory, {**_package_files(), **_generated_files()})
    except BuildError as e:
        # A short message in pip's output rather than a traceback through the backend.
        sys.exit(str(e))
