"""Kueue on the testbed (`kubetrain testbed up --kueue`): its configuration, certificates,
CRDs, webhooks and visibility API, wired for a control plane on loopback.

* Webhooks and the CRDs' conversion webhook name Kueue by `clientConfig.url`
  (https://127.0.0.1:PORT/...) with the testbed's CA as `caBundle`: no Service and no
  kube-proxy. Kueue's internal certificate management (which wants a Service and a Secret)
  is off; it serves a certificate the testbed's CA signs.
* Only the webhooks of Kueue's own kinds and of the one integration turned on (batch/job)
  are installed: the others would route every Pod, Deployment and StatefulSet of the
  testbed through Kueue for nothing.
* `waitForPodsReady` is on, so a job's Pods are admitted all or nothing.
* The visibility API (pending workloads and their positions) is an aggregated API. An
  APIService must name a Service; with `--enable-aggregator-routing` the API server dials
  the Service's Endpoints, and Endpoints refuse loopback addresses. So Kueue's visibility
  server listens on this machine's own non-loopback IPv4 address (the default route's
  source), which the Endpoints name. A machine with no such address runs Kueue without
  the visibility API (said in `testbed status`).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import ipaddress
import socket
import time
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import yaml

from kubetrain.testbed import pki as pki_mod
from kubetrain.testbed.kueue_build import KueueBuild

NAMESPACE = "kueue-system"
WEBHOOK_SERVICE = "kueue-webhook-service"
VISIBILITY_SERVICE = "kueue-visibility-server"
VISIBILITY_VERSIONS = ("v1beta1", "v1beta2")
FRAMEWORKS = ("batch/job",)
# Webhooks whose rules touch only these API groups are installed (see the module doc).
_WEBHOOK_GROUPS = frozenset({"kueue.x-k8s.io", "batch"})
# An admitted job's Pods must all be Ready within this, or Kueue evicts and requeues it.
PODS_READY_TIMEOUT = "5m"


def host_address(fib_trie: Path = Path("/proc/net/fib_trie")) -> str | None:
    """A local IPv4 address that Endpoints accept (not loopback, not link-local), or None:
    the source address of the default route, which lasts as long as the machine's network
    (a bridge another testbed made may vanish with it); else the first in the kernel's
    table of local addresses."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        # A UDP connect sends nothing: the kernel only picks the route and source address.
        probe.connect(("198.51.100.1", 9))  # TEST-NET-2: routed by the default route only
        if _acceptable(address := probe.getsockname()[0]):
            return str(address)
    return local_address(fib_trie)


def local_address(fib_trie: Path) -> str | None:
    """The first acceptable address in the kernel's table of local addresses."""
    try:
        lines = fib_trie.read_text().splitlines()
    except OSError:
        return None
    for previous, line in pairwise(lines):
        if line.strip() == "/32 host LOCAL":
            address = previous.strip().removeprefix("|-- ").removeprefix("+-- ")
            if _acceptable(address):
                return address
    return None


def _acceptable(address: str) -> bool:
    try:
        ip = ipaddress.IPv4Address(address)
    except ValueError:
        return False
    return not (ip.is_loopback or ip.is_link_local or ip.is_unspecified)


def directory(state_dir: Path) -> Path:
    return state_dir / "kueue"


def config_path(state_dir: Path) -> Path:
    return directory(state_dir) / "config.yaml"


def write_certificates(pki: pki_mod.Pki, state_dir: Path, address: str | None) -> None:
    """One serving certificate for Kueue's three servers, where each reads it: the
    webhook server from its configured certDir; the metrics and visibility servers from
    the paths relative to the state dir the build gave them (see kueue_build)."""
    certs = directory(state_dir) / "certs"
    dns = [f"{name}.{NAMESPACE}.svc" for name in (WEBHOOK_SERVICE, VISIBILITY_SERVICE)]
    pki_mod.issue(
        pki,
        certs / "tls.crt",
        certs / "tls.key",
        "kueue",
        dns_names=["localhost", *dns],
        ips=["127.0.0.1", *([address] if address else [])],
    )
    for relative in ("etc/kueue/metrics/certs", "visibility"):
        target = state_dir / relative
        target.mkdir(parents=True, exist_ok=True)
        for name in ("tls.crt", "tls.key"):
            (target / name).write_bytes((certs / name).read_bytes())
            (target / name).chmod(0o600)


def configuration(
    state_dir: Path,
    webhook: int,
    health: int,
    metrics: int,
    visibility: int,
    address: str | None,
    pods_ready_timeout: str = PODS_READY_TIMEOUT,
) -> dict[str, Any]:
    """Kueue's Configuration. `pods_ready_timeout` is waitForPodsReady.timeout: the
    recorder shortens it on a testbed of its own to record Kueue's PodsReadyTimeout
    eviction in seconds (tests/fixtures/record.py); every other testbed keeps the default."""
    config: dict[str, Any] = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics}"},
        "webhook": {
            "host": "127.0.0.1",
            "port": webhook,
            "certDir": str(directory(state_dir) / "certs"),
        },
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "waitForPodsReady": {"timeout": pods_ready_timeout, "blockAdmission": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": list(FRAMEWORKS)},
        # A loopback testbed has no other tenant to protect (as for the controller manager).
        "clientConnection": {"qps": 1000, "burst": 2000},
    }
    if address:
        config["visibilityServer"] = {"bindAddress": address, "bindPort": visibility}
    else:
        config["featureGates"] = {"VisibilityOnDemand": False}
    return config


def write_configuration(state_dir: Path, config: dict[str, Any]) -> Path:
    path = config_path(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def argv(binary: Path, state_dir: Path, kubeconfig: Path) -> list[str]:
    return [
        str(binary),
        f"--config={config_path(state_dir)}",
        f"--kubeconfig={kubeconfig}",
        "--zap-log-level=info",
    ]


def _yaml_documents(path: Path) -> Iterator[dict[str, Any]]:
    for doc in yaml.safe_load_all(path.read_text()):
        if isinstance(doc, dict):
            yield doc


def crds(build: KueueBuild, webhook_base: str, ca_bundle: str) -> list[dict[str, Any]]:
    """The module's CRDs; those its kustomization gives a conversion webhook get one by URL."""
    converted = {
        doc["metadata"]["name"]
        for patch in conversion_patches(build)
        for doc in _yaml_documents(patch)
    }
    found = []
    for path in sorted((build.manifests / "crd" / "bases").glob("*.yaml")):
        for crd in _yaml_documents(path):
            if crd["metadata"]["name"] in converted:
                crd["spec"]["conversion"] = {
                    "strategy": "Webhook",
                    "webhook": {
                        "clientConfig": {"url": f"{webhook_base}/convert", "caBundle": ca_bundle},
                        "conversionReviewVersions": ["v1"],
                    },
                }
            found.append(crd)
    return found


def conversion_patches(build: KueueBuild) -> list[Path]:
    """The conversion-webhook patches the CRDs' kustomization applies (`patches:`), not
    every file beside it: a patch it leaves commented out names a conversion the binary
    does not serve, and the API server's watch cache of that CRD's other version would
    fail to list, again every second."""
    crd = build.manifests / "crd"
    kustomization = yaml.safe_load((crd / "kustomization.yaml").read_text()) or {}
    listed = [p["path"] if isinstance(p, dict) else p for p in kustomization.get("patches") or []]
    return [crd / p for p in listed if Path(p).name.startswith("webhook_in_")]


def webhook_configurations(
    build: KueueBuild, webhook_base: str, ca_bundle: str
) -> list[dict[str, Any]]:
    found = []
    for doc in _yaml_documents(build.manifests / "webhook" / "manifests.yaml"):
        doc = copy.deepcopy(doc)
        doc["metadata"]["name"] = f"kueue-{doc['metadata']['name']}"
        kept = []
        for hook in doc["webhooks"]:
            groups = {g for rule in hook.get("rules", []) for g in rule.get("apiGroups", [])}
            if not groups or not groups <= _WEBHOOK_GROUPS:
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"{webhook_base}{path}", "caBundle": ca_bundle}
            kept.append(hook)
        doc["webhooks"] = kept
        found.append(doc)
    return found


def visibility_objects(address: str, port: int, ca_bundle: str) -> list[dict[str, Any]]:
    """A selector-less Service whose Endpoints name Kueue's visibility server, and the
    APIServices (as Kueue's config/components/visibility, with our CA instead of
    insecureSkipTLSVerify)."""
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": VISIBILITY_SERVICE, "namespace": NAMESPACE},
        "spec": {"ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": port}]},
    }
    endpoints = {
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": {"name": VISIBILITY_SERVICE, "namespace": NAMESPACE},
        "subsets": [
            {
                "addresses": [{"ip": address}],
                "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
            }
        ],
    }
    apiservices = [
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": f"{version}.visibility.kueue.x-k8s.io"},
            "spec": {
                "group": "visibility.kueue.x-k8s.io",
                "version": version,
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
                "caBundle": ca_bundle,
                "service": {"name": VISIBILITY_SERVICE, "namespace": NAMESPACE, "port": 443},
            },
        }
        for version in VISIBILITY_VERSIONS
    ]
    return [service, endpoints, *apiservices]


def ca_bundle(pki: pki_mod.Pki) -> str:
    return base64.b64encode(pki.ca_cert.read_bytes()).decode()


def install(
    kubeconfig: Path,
    build: KueueBuild,
    pki: pki_mod.Pki,
    webhook_port: int,
    visibility: tuple[str, int] | None,
    deadline: float,
) -> None:
    """Create Kueue's namespace, CRDs (and wait until they are established), webhook
    configurations and, with an address, the visibility API's Service and APIServices."""
    from lightkube import Client
    from lightkube.codecs import from_dict
    from lightkube.config.kubeconfig import KubeConfig
    from lightkube.resources.apiextensions_v1 import CustomResourceDefinition

    client = Client(config=KubeConfig.from_file(kubeconfig), field_manager="testbed")
    bundle = ca_bundle(pki)
    base = f"https://127.0.0.1:{webhook_port}"
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    definitions = crds(build, base, bundle)
    for obj in [namespace, *definitions, *webhook_configurations(build, base, bundle)]:
        made: Any = from_dict(obj)
        client.create(made)
    if visibility is not None:
        for obj in visibility_objects(*visibility, bundle):
            later: Any = from_dict(obj)
            client.create(later)
    pending = {crd["metadata"]["name"] for crd in definitions}
    while pending and time.monotonic() < deadline:
        for name in sorted(pending):
            status = client.get(CustomResourceDefinition, name).status
            conditions = (status and status.conditions) or []
            if any(c.type == "Established" and c.status == "True" for c in conditions):
                pending.discard(name)
        if pending:
            time.sleep(0.1)
    if pending:
        raise TimeoutError(f"Kueue's CRDs not established in time: {', '.join(sorted(pending))}")


def visibility_available(kubeconfig: Path) -> bool:
    from lightkube import Client
    from lightkube.config.kubeconfig import KubeConfig
    from lightkube.resources.apiregistration_v1 import APIService

    client = Client(config=KubeConfig.from_file(kubeconfig))
    for version in VISIBILITY_VERSIONS:
        service = client.get(APIService, f"{version}.visibility.kueue.x-k8s.io")
        conditions = (service.status and service.status.conditions) or []
        if not any(c.type == "Available" and c.status == "True" for c in conditions):
            return False
    return True
