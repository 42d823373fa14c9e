#!/usr/bin/env python3
"""Checks that the image and the Kubernetes manifests in deploy/ stay hardened.

    check_deploy.py image SOURCE_DIR
        deploy/Dockerfile runs as a numeric non-root USER, hides no command's failure
        (`|| true`), ships the SentencePiece module and never passes --insecure; .dockerignore
        keeps build folders and .git out of the build context.
    check_deploy.py manifests SOURCE_DIR
        The base and every overlay of deploy/k8s, rendered with `kubectl kustomize`:
        - every pod runs as the Dockerfile's user (runAsNonRoot, runAsUser, runAsGroup, fsGroup),
          under seccomp RuntimeDefault, without a service-account token;
        - every container: no privilege escalation, every capability dropped, a read-only root
          file system, not privileged; CPU and memory requests and limits; GPUs only as limits;
          an image pinned by tag or digest, never :latest; never --insecure;
        - the coordinator serves TLS and checks tokens, from Secrets mounted read-only and whole
          (no subPath: the kubelet then updates them, and the coordinator reloads them);
          readiness and liveness probes on one of its ports;
        - a NetworkPolicy selects each pod and admits only TCP to its declared ports.

Exit status 0 when every rule holds; 1 with one line per broken rule; 77 (skipped) when the
manifests cannot be rendered here (no PyYAML, no kubectl with kustomize v4 or later).
"""
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys

SKIPPED = 77
TLS_AND_AUTH_FLAGS = ("--tls-cert", "--tls-key", "--auth-tokens")
SECRET_FILE_FLAGS = TLS_AND_AUTH_FLAGS + ("--tls-ca", "--tls-client-ca")


def skip(reason):
    print(f"SKIPPED: {reason}")
    sys.exit(SKIPPED)


def dockerfile_user(source_dir):
    """(uid, gid) of the Dockerfile's last USER instruction, or None where it is not numeric."""
    users = re.findall(r"^USER\s+(\S+)", read(source_dir, "deploy/Dockerfile"), re.M)
    match = re.fullmatch(r"(\d+)(?::(\d+))?", users[-1]) if users else None
    if not match:
        return None
    return int(match.group(1)), int(match.group(2) or match.group(1))


def read(source_dir, rel):
    with open(os.path.join(source_dir, rel), encoding="utf-8") as f:
        return f.read()


def check_image(source_dir):
    failures = []
    dockerfile = read(source_dir, "deploy/Dockerfile")
    user = dockerfile_user(source_dir)
    if user is None or 0 in user:
        failures.append("deploy/Dockerfile: the last USER must be a numeric non-root uid:gid")
    if re.search(r"\|\|\s*true", dockerfile):
        failures.append("deploy/Dockerfile: `|| true` hides a failed command")
    if "--insecure" in dockerfile:
        failures.append("deploy/Dockerfile: passes --insecure")
    if "libqlora_spm.so" not in dockerfile:
        failures.append("deploy/Dockerfile: does not ship libqlora_spm.so (SentencePiece jobs)")
    ignore = [line.strip().rstrip("/") for line in read(source_dir, ".dockerignore").splitlines()
              if line.strip() and not line.startswith("#")]
    for path in ("build", "build-release", ".git"):
        if not any(fnmatch.fnmatchcase(path, pattern) for pattern in ignore):
            failures.append(f".dockerignore: does not keep {path}/ out of the build context")
    return failures


def kubectl_kustomize():
    """The kubectl to render with, or a reason why there is none."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return None, "kubectl not found"
    version = subprocess.run([kubectl, "version", "--client", "-o", "json"],
                             capture_output=True, text=True)
    try:
        minor = int(re.match(r"\d+", json.loads(version.stdout)["clientVersion"]["minor"]).group())
    except (ValueError, KeyError, AttributeError):
        return None, "cannot read kubectl's version"
    if minor < 21:  # kubectl 1.21 bundles kustomize v4, the first with inline JSON patches
        return None, f"kubectl 1.{minor} bundles a kustomize older than v4"
    return kubectl, None


def pod_specs(doc):
    """(labels, pod spec) of every pod that `doc` makes."""
    kind, spec = doc.get("kind"), doc.get("spec") or {}
    if kind == "Pod":
        return [((doc.get("metadata") or {}).get("labels") or {}, spec)]
    if kind == "CronJob":
        spec = (spec.get("jobTemplate") or {}).get("spec") or {}
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob"):
        template = spec.get("template") or {}
        return [((template.get("metadata") or {}).get("labels") or {}, template.get("spec") or {})]
    return []


def image_is_pinned(image):
    if "@sha256:" in image:
        return True
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag != "latest"


def flag_values(args, flag):
    return [arg.split("=", 1)[1] for arg in args if arg.startswith(flag + "=")]


def check_pod(where, labels, pod, user, policies):
    failures = []
    def expect(ok, what):
        if not ok:
            failures.append(f"{where}: {what}")

    context = pod.get("securityContext") or {}
    expect(context.get("runAsNonRoot") is True, "pod securityContext.runAsNonRoot is not true")
    if user is not None:
        uid, gid = user
        expect(context.get("runAsUser") == uid, f"pod runAsUser is not the image's uid {uid}")
        expect(context.get("runAsGroup") == gid, f"pod runAsGroup is not the image's gid {gid}")
        expect(context.get("fsGroup") == gid, f"pod fsGroup is not the image's gid {gid}")
    expect((context.get("seccompProfile") or {}).get("type") == "RuntimeDefault",
           "pod seccompProfile is not RuntimeDefault")
    expect(pod.get("automountServiceAccountToken") is False,
           "pod mounts a service-account token (automountServiceAccountToken is not false)")
    expect(not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC"),
           "pod shares a host namespace")

    volumes = {v.get("name"): v for v in pod.get("volumes") or []}
    pod_ports = set()  # numbers and names
    containers = (pod.get("initContainers") or []) + (pod.get("containers") or [])
    for container in containers:
        name = f"container {container.get('name')}"
        sc = container.get("securityContext") or {}
        expect(sc.get("allowPrivilegeEscalation") is False,
               f"{name}: allowPrivilegeEscalation is not false")
        expect(sc.get("readOnlyRootFilesystem") is True, f"{name}: readOnlyRootFilesystem is not true")
        expect("ALL" in ((sc.get("capabilities") or {}).get("drop") or []),
               f"{name}: capabilities are not all dropped")
        expect(not ((sc.get("capabilities") or {}).get("add")), f"{name}: adds capabilities")
        expect(not sc.get("privileged"), f"{name}: is privileged")
        expect(sc.get("runAsNonRoot") is not False and sc.get("runAsUser", 1) != 0,
               f"{name}: runs as root")

        resources = container.get("resources") or {}
        for kind in ("requests", "limits"):
            for resource in ("cpu", "memory"):
                expect(resource in (resources.get(kind) or {}), f"{name}: no {resource} {kind}")
        gpu_request = (resources.get("requests") or {}).get("nvidia.com/gpu")
        expect(gpu_request is None or gpu_request == (resources.get("limits") or {}).get("nvidia.com/gpu"),
               f"{name}: GPU request without an equal limit")

        image = container.get("image") or ""
        expect(image_is_pinned(image), f"{name}: image {image!r} is not pinned by tag or digest")
        args = [str(a) for a in (container.get("command") or []) + (container.get("args") or [])]
        expect(not any(a.startswith("--insecure") for a in args), f"{name}: passes --insecure")

        mounts = container.get("volumeMounts") or []
        for flag in SECRET_FILE_FLAGS:
            for path in flag_values(args, flag):
                mount = next((m for m in mounts
                              if path.startswith(m.get("mountPath", "").rstrip("/") + "/")), None)
                volume = volumes.get(mount.get("name")) if mount else None
                expect(volume is not None and "secret" in volume and mount.get("readOnly") is True
                       and not mount.get("subPath"),
                       f"{name}: {flag}={path} is not in a whole Secret mounted read-only")

        ports = container.get("ports") or []
        pod_ports.update(p.get("containerPort") for p in ports)
        pod_ports.update(p["name"] for p in ports if "name" in p)
        if container in (pod.get("containers") or []) and ports:
            names = {p.get("name") for p in ports} | {p.get("containerPort") for p in ports}
            for probe in ("readinessProbe", "livenessProbe"):
                action = container.get(probe) or {}
                port = next((action[k].get("port") for k in ("grpc", "tcpSocket", "httpGet") if k in action), None)
                expect(port is not None and port in names, f"{name}: no {probe} on one of its ports")
        if container.get("name") == "coordinator":
            for flag in TLS_AND_AUTH_FLAGS:
                expect(flag_values(args, flag), f"{name}: no {flag} (TLS and tokens are required)")

    selecting = [p for p in policies
                 if ((p.get("spec") or {}).get("podSelector") or {}).get("matchLabels", {}).items() <= labels.items()
                 and "Ingress" in ((p.get("spec") or {}).get("policyTypes") or [])]
    expect(selecting, "no NetworkPolicy restricts the pod's ingress")
    for policy in selecting:
        for rule in (policy.get("spec") or {}).get("ingress") or []:
            rule_ports = rule.get("ports") or []
            expect(rule_ports, f"NetworkPolicy {policy['metadata']['name']}: a rule admits every port")
            for port in rule_ports:
                expect(port.get("protocol", "TCP") == "TCP" and port.get("port") in pod_ports
                       and "endPort" not in port,
                       f"NetworkPolicy {policy['metadata']['name']}: admits {port}, not TCP to the pod's port")
    return failures


def check_manifests(source_dir):
    try:
        import yaml
    except ImportError:
        python = os.environ.get("QLORA_PYTHON") or os.environ.get("QLORA_CONFIGURED_PYTHON")
        if python and os.access(python, os.X_OK) and os.path.realpath(python) != os.path.realpath(sys.executable):
            os.execv(python, [python] + sys.argv)
        skip("PyYAML is missing (and no $QLORA_PYTHON has it)")
    kubectl, why_not = kubectl_kustomize()
    if kubectl is None:
        skip(f"{why_not}: cannot render the kustomizations")

    k8s = os.path.join(source_dir, "deploy", "k8s")
    targets = ["base"] + [os.path.join("overlays", o) for o in sorted(os.listdir(os.path.join(k8s, "overlays")))]
    user = dockerfile_user(source_dir)
    failures = []
    for target in targets:
        rendered = subprocess.run([kubectl, "kustomize", os.path.join(k8s, target)],
                                  capture_output=True, text=True)
        if rendered.returncode != 0:
            failures.append(f"deploy/k8s/{target}: kubectl kustomize failed: {rendered.stderr.strip()}")
            continue
        docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
        policies = [d for d in docs if d.get("kind") == "NetworkPolicy"]
        pods = [(d, labels, pod) for d in docs for labels, pod in pod_specs(d)]
        if not pods:
            failures.append(f"deploy/k8s/{target}: no pods")
        for doc, labels, pod in pods:
            where = f"deploy/k8s/{target}: {doc['kind']} {doc['metadata']['name']}"
            failures += check_pod(where, labels, pod, user, policies)
        print(f"deploy/k8s/{target}: {len(pods)} pod template(s), {len(policies)} NetworkPolicy(ies) checked")
    return failures


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("image", "manifests"):
        sys.exit(__doc__)
    check = check_image if sys.argv[1] == "image" else check_manifests
    failures = check(sys.argv[2])
    for failure in failures:
        print(failure)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
