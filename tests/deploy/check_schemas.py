#!/usr/bin/env python3
"""Validates every object that deploy/k8s renders to against its schema, strictly and offline.

    check_schemas.py SOURCE_DIR [--kuberay-crd FILE]

The base and every overlay of deploy/k8s are rendered with `kubectl kustomize` (as
check_deploy.py does) and each object is validated with the `jsonschema` package against:
  - for Kubernetes' own kinds, the JSON schemas of Kubernetes v1.32.0, "local-strict" (every
    object closed with additionalProperties: false, so a misspelled or misplaced field fails),
    in tests/assets/deploy/kubernetes-v1.32.0 (their source: tests/assets/README.md);
  - for RayCluster (ray.io/v1), tests/assets/deploy/raycluster-ray.io-v1.json: this project's
    closed schema of KubeRay v1.7.0's RayCluster (the field names, types and required fields of
    spec, headGroupSpec and workerGroupSpecs as its CRD gives them; pod templates as Kubernetes'
    PodTemplateSpec, metadata as ObjectMeta). The CRD itself (ray.io_rayclusters.yaml) is not
    redistributed in this repository; where it is at hand — --kuberay-crd FILE, or
    ../shared/fixtures/kuberay-v1.7.0/ray.io_rayclusters.yaml.gz beside SOURCE_DIR — RayClusters
    are validated against it too: its openAPIV3Schema made strict as the API server reads a
    structural schema (an object with `properties` and without x-kubernetes-preserve-unknown-fields
    is closed: the API server would drop an unknown field silently, here it is an error;
    `nullable` admits null), after checking the file is KubeRay v1.7.0's byte for byte (SHA-256).
A kind with no schema here is an error too: add its schema (tests/assets/README.md says
how).
Not checked: CEL rules (x-kubernetes-validations), formats, what admission webhooks decide.

Python: the jsonschema, referencing and PyYAML packages. Where $QLORA_RAYENV is set (scripts/test.sh
sets it), the script runs in that environment's Python, whose versions scripts/requirements-ray.txt
pins (jsonschema 4.26.0); otherwise in the Python that runs it.

Exit status 0 when every object validates; 1 with one line per violation (the target, the object,
the field's path, the message) or when a schema or a package is missing; 77 (skipped) only where
there is no kubectl that can render the kustomizations.
"""
import gzip
import hashlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.normpath(os.path.join(HERE, os.pardir, "assets", "deploy"))
KUBERNETES_SCHEMAS = os.path.join(FIXTURES, "kubernetes-v1.32.0")
DEFINITIONS_ID = "https://kubernetes.io/api/_definitions.json"  # the $id the kinds' $refs resolve to
KUBERAY_CRD = os.path.join("kuberay-v1.7.0", "ray.io_rayclusters.yaml.gz")
KUBERAY_CRD_DIR = os.path.join("..", "shared", "fixtures")  # beside SOURCE_DIR
RAYCLUSTER_SCHEMA = os.path.join(FIXTURES, "raycluster-ray.io-v1.json")
# ray-operator/config/crd/bases/ray.io_rayclusters.yaml at KubeRay's tag v1.7.0 (uncompressed).
KUBERAY_CRD_SHA256 = "c44704442eef0c6721ad40c1d66782c8bd3fdab9d3344306a5820910a679baa1"


def in_pinned_python():
    """Re-runs this script in $QLORA_RAYENV's Python where that is set and not this one."""
    rayenv = os.environ.get("QLORA_RAYENV")
    python = os.path.join(rayenv, "bin", "python") if rayenv else None
    if python and os.access(python, os.X_OK) and os.path.realpath(sys.prefix) != os.path.realpath(rayenv):
        os.execv(python, [python] + sys.argv)


def read_maybe_gzipped(path):
    with open(path, "rb") as f:
        data = f.read()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def kubernetes_schemas():
    """({(apiVersion, kind): schema}, the definitions they refer to), from the fixtures."""
    definitions = json.loads(read_maybe_gzipped(os.path.join(KUBERNETES_SCHEMAS, "_definitions.json.gz")))
    schemas = {}
    for name in sorted(os.listdir(KUBERNETES_SCHEMAS)):
        if name.endswith(".json") and not name.startswith("_"):
            with open(os.path.join(KUBERNETES_SCHEMAS, name), encoding="utf-8") as f:
                schema = json.load(f)
            for gvk in schema.get("x-kubernetes-group-version-kind") or []:
                api_version = f"{gvk['group']}/{gvk['version']}" if gvk["group"] else gvk["version"]
                schemas[(api_version, gvk["kind"])] = schema
    with open(RAYCLUSTER_SCHEMA, encoding="utf-8") as f:
        raycluster = json.load(f)
    schemas[("ray.io/v1", "RayCluster")] = raycluster
    return schemas, definitions


def strict(schema):
    """An OpenAPI v3 structural schema (a CRD's) as a closed JSON schema, recursively."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in ("properties", "patternProperties", "definitions"):
            out[key] = {name: strict(sub) for name, sub in value.items()}
        elif key == "enum" or key == "default" or key == "example":
            out[key] = value
        else:
            out[key] = strict(value)
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    if out.get("nullable") is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = list(out["enum"]) + [None]
    return out


def crd_schemas(path, yaml):
    """{(apiVersion, kind): strict schema} of every served version of the CRD at `path`."""
    data = read_maybe_gzipped(path)
    digest = hashlib.sha256(data).hexdigest()
    if digest != KUBERAY_CRD_SHA256:
        raise ValueError(f"{path}: SHA-256 {digest}, not that of KubeRay v1.7.0's ray.io_rayclusters.yaml "
                         f"({KUBERAY_CRD_SHA256})")
    crd = yaml.safe_load(data)
    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
    schemas = {}
    for version in crd["spec"]["versions"]:
        if version.get("served"):
            schema = strict(version["schema"]["openAPIV3Schema"])
            # The API server checks metadata itself, as ObjectMeta; the CRD says only "object".
            schema["properties"]["metadata"] = {
                "$ref": f"{DEFINITIONS_ID}#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
            schemas[(f"{group}/{version['name']}", kind)] = schema
    return schemas


def violations(where, doc, schema, registry, jsonschema):
    validator_class = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    validator = validator_class(schema, registry=registry)
    lines = []
    for error in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))):
        # Of a oneOf/anyOf that failed, the branch that got furthest says the most.
        best = jsonschema.exceptions.best_match([error])
        message = best.message if len(best.message) <= 240 else best.message[:240] + " ..."
        lines.append(f"{where}: {best.json_path}: {message}")
    return lines


def main():
    args = sys.argv[1:]
    crd_path = None
    if len(args) == 3 and args[1] == "--kuberay-crd":
        crd_path = args[2]
    elif len(args) != 1:
        sys.exit(__doc__)
    source_dir = args[0]
    if crd_path is None:
        beside = os.path.join(source_dir, KUBERAY_CRD_DIR, KUBERAY_CRD)
        crd_path = beside if os.path.exists(beside) else None

    in_pinned_python()
    try:
        import jsonschema
        import referencing
        import yaml
    except ImportError as missing:
        print(f"FAILED: {sys.executable} lacks {missing.name} (jsonschema, referencing, PyYAML); "
              "run scripts/setup.sh and set QLORA_RAYENV, as scripts/test.sh does")
        sys.exit(1)
    sys.path.insert(0, HERE)
    from check_deploy import SKIPPED, kubectl_kustomize, kustomize_targets, render

    kubectl, why_not = kubectl_kustomize()
    if kubectl is None:
        print(f"SKIPPED: {why_not}: cannot render the kustomizations")
        sys.exit(SKIPPED)

    schemas, definitions = kubernetes_schemas()
    failures = []
    upstream = {}  # the KubeRay CRD's schemas, where the CRD is at hand
    if crd_path is not None:
        try:
            upstream = crd_schemas(crd_path, yaml)
        except (OSError, ValueError) as error:
            failures.append(f"the KubeRay CRD: {error} (tests/assets/README.md says where it comes from)")
    print("RayCluster: this project's schema" + (f" and KubeRay's CRD ({crd_path})" if upstream else
          " (KubeRay's CRD not at hand: --kuberay-crd FILE adds it)"))
    registry = referencing.Registry().with_resource(
        DEFINITIONS_ID, referencing.Resource.from_contents(definitions))

    for target in kustomize_targets(source_dir):
        docs, error = render(kubectl, source_dir, target)
        if error:
            failures.append(error)
            continue
        for doc in docs:
            key = (doc.get("apiVersion"), doc.get("kind"))
            where = f"deploy/k8s/{target}: {key[1]} {(doc.get('metadata') or {}).get('name')}"
            if key not in schemas:
                failures.append(f"{where}: no schema for {key[0]} {key[1]} in {os.path.relpath(FIXTURES, source_dir)}")
                continue
            failures += violations(where, doc, schemas[key], registry, jsonschema)
            if key in upstream:
                failures += violations(where + " (KubeRay's CRD)", doc, upstream[key], registry, jsonschema)
        print(f"deploy/k8s/{target}: {len(docs)} object(s) validated")
    for failure in failures:
        print(failure)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
