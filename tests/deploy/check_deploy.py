#!/usr/bin/env python3
"""Checks that the image and the Kubernetes manifests in deploy/ stay hardened.

    check_deploy.py image SOURCE_DIR
        deploy/Dockerfile: the default target (the last stage, the coordinator) and the ray-node
        target run as one numeric non-root USER; no `|| true` hides a command's failure; the
        image is laid out by `cmake --install` (no build output copied by hand), whose rules
        (cmake/Install.cmake) put the programs in bin/, the Ray job's driver
        qlora_ray_launcher.py beside qlora-worker and the SentencePiece module in lib/, where
        the worker looks; the run-time stages copy only that installed tree from the build stage
        and install no compilers or -dev packages; the ray-node target installs Ray from the
        pinned scripts/requirements-ray.txt; never --insecure. .dockerignore keeps build
        folders, out/, .device-* and .git out of the build context.
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
        - a NetworkPolicy selects each pod and admits only TCP to its declared ports;
        - the pods of a KubeRay RayCluster (head and worker groups) are checked as above, with
          KubeRay's labels (ray.io/cluster, ray.io/node-type, ray.io/group); their probes are
          KubeRay's (HTTP, for the rayVersion it is told, which must be the image's pinned Ray);
          Ray and the training processes talk on ports chosen at run time, so a NetworkPolicy
          may admit every TCP port to a Ray pod, but only from the pods of the same RayCluster;
          every rule admitting traffic to a Ray pod names its peers, each a podSelector alone
          (this namespace) selecting pods that these manifests make (the same RayCluster, or
          e.g. the coordinator for the dashboard): never from everywhere;
        - /dev/shm of a Ray pod is a memory emptyDir with a sizeLimit (Ray's object store);
        - a coordinator with --ray-address names a RayCluster of the same manifests, through
          KubeRay's head Service (<cluster>-head-svc) and the head's dashboard port, and has an
          --advertise-address; that cluster's worker pods mount the coordinator's data volume
          (the claim of --read-roots and --output-root) at the same path and the --tls-ca file
          from a Secret, read-only.

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
RAY_REQUIREMENTS = "scripts/requirements-ray.txt"
RAY_CLUSTER_LABEL = "ray.io/cluster"  # KubeRay labels every pod of a RayCluster with its name


def skip(reason):
    print(f"SKIPPED: {reason}")
    sys.exit(SKIPPED)


def stage_user(text):
    """(uid, gid) of the last USER instruction in `text`, or None where it is not numeric."""
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    match = re.fullmatch(r"(\d+)(?::(\d+))?", users[-1]) if users else None
    if not match:
        return None
    return int(match.group(1)), int(match.group(2) or match.group(1))


def dockerfile_user(source_dir):
    """(uid, gid) of the Dockerfile's last USER instruction (the default target's)."""
    return stage_user(read(source_dir, "deploy/Dockerfile"))


def dockerfile_stages(dockerfile):
    """{stage name: its text}, in order; an unnamed stage is named by its index."""
    stages = {}
    parts = re.split(r"^(?=FROM\s)", dockerfile, flags=re.M)
    for index, part in enumerate(p for p in parts if p.startswith("FROM")):
        name = re.match(r"FROM\s+\S+(?:\s+AS\s+(\S+))?", part, re.I).group(1)
        stages[name or str(index)] = part
    return stages


def pinned_ray_version(source_dir):
    """The Ray version scripts/requirements-ray.txt pins, or None."""
    try:
        text = read(source_dir, RAY_REQUIREMENTS)
    except FileNotFoundError:
        return None
    match = re.search(r"^ray(?:\[[^]]*\])?==(\S+)\s*$", text, re.M)
    return match.group(1) if match else None


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
    # The image's layout is the install's: cmake --install, never binaries copied by hand.
    if not re.search(r"^RUN\s+cmake --install build --prefix /out/opt/qlora\b", dockerfile, re.M):
        failures.append("deploy/Dockerfile: does not lay out the image with `cmake --install build --prefix "
                        "/out/opt/qlora`")
    if re.search(r"\binstall\s+-[^\n]*\bbuild/", dockerfile):
        failures.append("deploy/Dockerfile: copies build outputs by hand (use cmake --install)")
    failures += check_install_rules(source_dir)
    # The run-time stages hold the installed tree only: no sources, wheels, headers or compilers.
    for name, text in dockerfile_stages(dockerfile).items():
        if name == "build":
            continue
        for source in re.findall(r"^COPY\s+--from=build\s+(\S+)", text, re.M):
            if source != "/out/opt/qlora":
                failures.append(f"deploy/Dockerfile: stage {name} copies {source} from the build stage "
                                "(only /out/opt/qlora, the installed tree)")
        if re.search(r"apt-get install[^\n]*\b(build-essential|cmake|g\+\+|gcc|ninja-build|\S+-dev)\b", text):
            failures.append(f"deploy/Dockerfile: stage {name} installs build tools or headers")
    stages = dockerfile_stages(dockerfile)
    last = list(stages)[-1] if stages else None
    if "ray-node" not in stages:
        failures.append("deploy/Dockerfile: no ray-node stage (the image of the Ray cluster's pods)")
    elif last == "ray-node":
        failures.append("deploy/Dockerfile: ray-node is the last stage, so the default target is not the coordinator")
    else:
        ray_user = stage_user(stages["ray-node"])
        if ray_user is None or ray_user != user:
            failures.append("deploy/Dockerfile: the ray-node stage's last USER is not the coordinator's "
                            "numeric non-root uid:gid")
        if not re.search(r"pip install\b[^\n]*-r\s+\S*requirements-ray\.txt", stages["ray-node"]):
            failures.append(f"deploy/Dockerfile: the ray-node stage does not install {RAY_REQUIREMENTS}")
        if pinned_ray_version(source_dir) is None:
            failures.append(f"{RAY_REQUIREMENTS}: does not pin ray==VERSION")
    ignore = [line.strip().rstrip("/") for line in read(source_dir, ".dockerignore").splitlines()
              if line.strip() and not line.startswith("#")]
    for path in ("build", "build-release", ".git", "out", ".device-x"):
        if not any(fnmatch.fnmatchcase(path, pattern) for pattern in ignore):
            failures.append(f".dockerignore: does not keep {path}/ out of the build context")
    return failures


def check_install_rules(source_dir):
    """cmake/Install.cmake puts the programs in bin/, the Ray job's driver beside qlora-worker (the
    coordinator's --ray-launcher-script default) and the SentencePiece module in lib/ (where the
    worker looks: ../lib from its folder)."""
    failures = []
    rules = read(source_dir, "cmake/Install.cmake")
    if not re.search(r"install\(TARGETS\s+\$\{qlora_programs\}\s+RUNTIME DESTINATION bin\)", rules) \
            or "qlora-worker" not in rules:
        failures.append("cmake/Install.cmake: does not install the programs (qlora-worker among them) to bin/")
    if not re.search(r"install\(PROGRAMS\s+\S*deploy/ray/qlora_ray_launcher\.py\s+DESTINATION bin\)", rules):
        failures.append("cmake/Install.cmake: does not install qlora_ray_launcher.py to bin/, beside qlora-worker")
    if not re.search(r"install\(TARGETS\s+qlora_spm\s+LIBRARY DESTINATION lib\)", rules):
        failures.append("cmake/Install.cmake: does not install libqlora_spm.so to lib/")
    if '"/lib/libqlora_spm.so"' not in read(source_dir, "worker/data/spm_model.cc"):
        failures.append("worker/data/spm_model.cc: the worker does not look for libqlora_spm.so in ../lib")
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


def ray_templates(doc):
    """(node type, group name, pod template) of every pod group of a RayCluster."""
    spec = doc.get("spec") or {}
    groups = [("head", "headgroup", (spec.get("headGroupSpec") or {}).get("template") or {})]
    groups += [("worker", g.get("groupName"), g.get("template") or {})
               for g in spec.get("workerGroupSpecs") or []]
    return groups


def kustomize_targets(source_dir):
    """The base and every overlay of deploy/k8s, as paths relative to deploy/k8s."""
    k8s = os.path.join(source_dir, "deploy", "k8s")
    return ["base"] + [os.path.join("overlays", o) for o in sorted(os.listdir(os.path.join(k8s, "overlays")))]


def render(kubectl, source_dir, target):
    """(the objects `kubectl kustomize` renders deploy/k8s/TARGET to, None) or (None, its error)."""
    rendered = subprocess.run([kubectl, "kustomize", os.path.join(source_dir, "deploy", "k8s", target)],
                              capture_output=True, text=True)
    if rendered.returncode != 0:
        return None, f"deploy/k8s/{target}: kubectl kustomize failed: {rendered.stderr.strip()}"
    import yaml
    return [d for d in yaml.safe_load_all(rendered.stdout) if d], None


def pod_specs(doc):
    """(labels, pod spec) of every pod that `doc` makes."""
    kind, spec = doc.get("kind"), doc.get("spec") or {}
    if kind == "Pod":
        return [((doc.get("metadata") or {}).get("labels") or {}, spec)]
    if kind == "RayCluster":  # with the labels KubeRay gives the pods (common/pod.go, labelPod)
        name = (doc.get("metadata") or {}).get("name")
        return [({**((template.get("metadata") or {}).get("labels") or {}),
                  RAY_CLUSTER_LABEL: name, "ray.io/node-type": node_type, "ray.io/group": group,
                  "ray.io/is-ray-node": "yes"}, template.get("spec") or {})
                for node_type, group, template in ray_templates(doc)]
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


def selects(selector, labels):
    """Whether a label selector (matchLabels alone) selects pods labelled `labels`."""
    selector = selector or {}
    return not selector.get("matchExpressions") and (selector.get("matchLabels") or {}).items() <= labels.items()


def check_pod(where, labels, pod, user, policies, all_labels):
    """`all_labels`: the labels of every pod the same manifests make (NetworkPolicy peers)."""
    failures = []
    ray_cluster = labels.get(RAY_CLUSTER_LABEL)
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
        # KubeRay gives a Ray container its probes (check_ray_cluster checks what it needs for them).
        if container in (pod.get("containers") or []) and ports and not ray_cluster:
            names = {p.get("name") for p in ports} | {p.get("containerPort") for p in ports}
            for probe in ("readinessProbe", "livenessProbe"):
                action = container.get(probe) or {}
                port = next((action[k].get("port") for k in ("grpc", "tcpSocket", "httpGet") if k in action), None)
                expect(port is not None and port in names, f"{name}: no {probe} on one of its ports")
        if container.get("name") == "coordinator":
            for flag in TLS_AND_AUTH_FLAGS:
                expect(flag_values(args, flag), f"{name}: no {flag} (TLS and tokens are required)")

    if ray_cluster:
        shm = next((volumes.get(m.get("name")) for m in (pod.get("containers") or [{}])[0].get("volumeMounts") or []
                    if m.get("mountPath") == "/dev/shm"), None) or {}
        expect((shm.get("emptyDir") or {}).get("medium") == "Memory" and (shm.get("emptyDir") or {}).get("sizeLimit"),
               "the Ray container's /dev/shm is not a memory emptyDir with a sizeLimit (Ray's object store)")

    # Policies are additive: every rule of every policy that selects the pod is traffic it gets.
    selecting = [p for p in policies
                 if ((p.get("spec") or {}).get("podSelector") or {}).get("matchLabels", {}).items() <= labels.items()
                 and "Ingress" in ((p.get("spec") or {}).get("policyTypes") or [])]
    expect(selecting, "no NetworkPolicy restricts the pod's ingress")
    for policy in selecting:
        name = f"NetworkPolicy {policy['metadata']['name']}"
        for rule in (policy.get("spec") or {}).get("ingress") or []:
            rule_ports = rule.get("ports") or []
            peers = rule.get("from") or []
            expect(rule_ports, f"{name}: a rule admits every port")
            # A Ray pod: peers named, each a podSelector alone (this namespace), selecting pods of
            # these manifests; every TCP port only from the pod's own RayCluster.
            if ray_cluster:
                expect(peers, f"{name}: admits traffic to a Ray pod from everywhere (no `from`)")
                for peer in peers:
                    expect(set(peer) == {"podSelector"} and (peer["podSelector"] or {}).get("matchLabels")
                           and any(selects(peer["podSelector"], other) for other in all_labels),
                           f"{name}: peer {peer} of a Ray pod is not a podSelector of pods these manifests make")
            own_cluster_only = bool(peers) and all(
                set(peer) == {"podSelector"} and not (peer["podSelector"] or {}).get("matchExpressions")
                and ((peer["podSelector"] or {}).get("matchLabels") or {}).get(RAY_CLUSTER_LABEL) == ray_cluster
                for peer in peers)
            for port in rule_ports:
                if ray_cluster and "port" not in port and port.get("protocol", "TCP") == "TCP":
                    expect(own_cluster_only,
                           f"{name}: admits every TCP port to a Ray pod from peers outside RayCluster {ray_cluster}")
                    continue
                expect(port.get("protocol", "TCP") == "TCP" and port.get("port") in pod_ports
                       and "endPort" not in port,
                       f"{name}: admits {port}, not TCP to the pod's port")
    return failures


def mount_for(path, container, volumes):
    """(mount, volume) of `container` that holds `path` (the longest mountPath above it)."""
    mounts = [m for m in container.get("volumeMounts") or []
              if (path.rstrip("/") + "/").startswith(m.get("mountPath", "").rstrip("/") + "/")]
    if not mounts:
        return None, None
    mount = max(mounts, key=lambda m: len(m.get("mountPath", "")))
    return mount, volumes.get(mount.get("name")) or {}


def check_ray_coordinator(where, container, coordinator_pod, docs, source_dir):
    """A coordinator with --ray-address and the RayCluster it names (see the module's doc)."""
    failures = []
    def expect(ok, what):
        if not ok:
            failures.append(f"{where}: {what}")

    args = [str(a) for a in (container.get("command") or []) + (container.get("args") or [])]
    address = flag_values(args, "--ray-address")[-1]
    expect(flag_values(args, "--advertise-address"),
           "--ray-address without --advertise-address (what the Ray nodes' workers dial)")
    match = re.fullmatch(r"https?://([^/:]+):(\d+)/?", address)
    clusters = {}
    for doc in docs:
        if doc.get("kind") == "RayCluster":
            head = (doc.get("spec") or {}).get("headGroupSpec") or {}
            service = ((head.get("headService") or {}).get("metadata") or {}).get("name")
            clusters[service or f"{doc['metadata']['name']}-head-svc"] = doc  # KubeRay's name
    cluster = clusters.get(match.group(1).split(".")[0]) if match else None
    if cluster is None:
        failures.append(f"{where}: --ray-address={address} is not http://<head Service of a RayCluster here>:PORT "
                        f"(head Services: {sorted(clusters) or 'none'})")
        return failures
    name = f"RayCluster {cluster['metadata']['name']}"
    pinned = pinned_ray_version(source_dir)
    expect(pinned is not None and str((cluster.get("spec") or {}).get("rayVersion")) == pinned,
           f"{name}: rayVersion is not the image's Ray ({RAY_REQUIREMENTS}: {pinned}); KubeRay picks its "
           "probes by it (HTTP from 2.53 on; older ones need wget in the image)")
    groups = ray_templates(cluster)
    head = ((groups[0][2].get("spec") or {}).get("containers") or [{}])[0]
    dashboard = next((p.get("containerPort") for p in head.get("ports") or [] if p.get("name") == "dashboard"), 8265)
    expect(int(match.group(2)) == dashboard, f"--ray-address={address}: not the head's dashboard port {dashboard}")

    coordinator_volumes = {v.get("name"): v for v in coordinator_pod.get("volumes") or []}
    data_paths = [p for flag in ("--read-roots", "--output-root") for v in flag_values(args, flag)
                  for p in v.split(",") if p]
    tls_ca = flag_values(args, "--tls-ca")
    for node_type, group, template in groups[1:]:
        pod = template.get("spec") or {}
        volumes = {v.get("name"): v for v in pod.get("volumes") or []}
        worker = (pod.get("containers") or [{}])[0]
        for path in data_paths:
            mount, volume = mount_for(path, container, coordinator_volumes)
            claim = ((volume or {}).get("persistentVolumeClaim") or {}).get("claimName")
            theirs, their_volume = mount_for(path, worker, volumes)
            expect(claim and theirs and theirs.get("mountPath") == mount.get("mountPath")
                   and ((their_volume or {}).get("persistentVolumeClaim") or {}).get("claimName") == claim,
                   f"{name} group {group}: {path} is not on the coordinator's volume "
                   f"(claim {claim}) at the coordinator's path")
        for path in tls_ca:
            theirs, their_volume = mount_for(path, worker, volumes)
            secret = (their_volume or {}).get("secret")
            relative = path[len((theirs or {}).get("mountPath", "").rstrip("/")) + 1:]
            expect(secret is not None and theirs.get("readOnly") is True and not theirs.get("subPath")
                   and (not secret.get("items") or relative in [i.get("path") for i in secret["items"]]),
                   f"{name} group {group}: --tls-ca={path} (the workers' CA) is not there, from a Secret read-only")
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

    user = dockerfile_user(source_dir)
    failures = []
    for target in kustomize_targets(source_dir):
        docs, error = render(kubectl, source_dir, target)
        if error:
            failures.append(error)
            continue
        policies = [d for d in docs if d.get("kind") == "NetworkPolicy"]
        pods = [(d, labels, pod) for d in docs for labels, pod in pod_specs(d)]
        if not pods:
            failures.append(f"deploy/k8s/{target}: no pods")
        all_labels = [labels for _, labels, _ in pods]
        for doc, labels, pod in pods:
            where = f"deploy/k8s/{target}: {doc['kind']} {doc['metadata']['name']}"
            if RAY_CLUSTER_LABEL in labels and doc["kind"] == "RayCluster":
                where += f" ({labels['ray.io/node-type']} group {labels['ray.io/group']})"
            failures += check_pod(where, labels, pod, user, policies, all_labels)
            for container in pod.get("containers") or []:
                if container.get("name") == "coordinator" and flag_values(
                        [str(a) for a in container.get("args") or []], "--ray-address"):
                    failures += check_ray_coordinator(where, container, pod, docs, source_dir)
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
