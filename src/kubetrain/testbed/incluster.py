"""`kubetrain testbed up --pool real --in-cluster`: kubetrain installed as its users run it.

`deploy/base` is applied as it is, by `kubectl apply -k` on an overlay that changes only
what the testbed differs in (docs/testbed.md, "kubetrain in the cluster"):

* the image: `localhost/kubetrain:testbed`, built without a registry and imported into
  every real node's containerd like the trainer image (images.py);
* the database URL: the `kubetrain-database` Secret the base expects, made by the
  overlay's secretGenerator from a file in the state directory, pointing at Debian's
  PostgreSQL on the Pod network's gateway (postgres.py).

Everything else is the base's: two replicas, the ServiceAccount whose token the kubelet
projects, the RBAC, the Lease, the probes, the Service. The Service is routed by
kube-proxy (iptables mode), built from the same Kubernetes module as the kubelets. It is
one host process for the machine's network namespace, which both real nodes share:

* `--masquerade-all`: every connection to a ClusterIP leaves with the gateway as its
  source, so the answer comes back through the translation whether it comes from a Pod
  on the same bridge (which would otherwise answer the Pod directly) or is meant for
  this machine (whose own address the Pods have no route to);
* no sysctl is changed beyond the bridge's own `forwarding` (a Pod-to-Service-to-Pod
  packet is routed back out of the bridge it came in by): conntrack sizes and timeouts
  are left as they are (`--conntrack-*=0`), and no NodePort on localhost
  (`--iptables-localhost-nodeports=false`, which would set `route_localnet`).

Its rules are the machine's (one network namespace): one in-cluster testbed at a time
per machine. `down` removes them (`kube-proxy --cleanup`).
"""

from __future__ import annotations

import os
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubetrain
from kubetrain.testbed.images import SERVER_IMAGE

NAMESPACE = "kubetrain"
DEPLOYMENT = "kubetrain"
SERVICE = "kubetrain"
LEASE = "kubetrain-controller"
DATABASE_SECRET = "kubetrain-database"  # noqa: S105 (a name: deploy/base reads the URL there)
BASE_IMAGE = "kubetrain"  # the image deploy/base names (kubetrain:0.1.0)
OVERLAY_DIR = "in-cluster"


class InClusterError(RuntimeError):
    """kubetrain could not be installed in the testbed; the message says why."""


@dataclass
class InCluster:
    """What `install` started and made: recorded in testbed.json."""

    overlay: str  # the overlay's directory (kubectl delete -k takes it back)
    postgres: dict[str, Any]  # a postgres.Postgres
    kube_proxy_healthz: int
    kube_proxy_metrics: int
    url: str = ""  # the Service's ClusterIP, http://IP (KUBETRAIN_URL)

    @property
    def token_file(self) -> Path:
        return Path(self.overlay) / "admin-token"


def deploy_base() -> Path:
    """deploy/base of this checkout (the testbed is a tool of the source tree)."""
    base = Path(kubetrain.__file__).resolve().parents[2] / "deploy" / "base"
    if not (base / "kustomization.yaml").is_file():
        raise InClusterError(f"no deploy/base beside kubetrain's source ({base}): use a checkout")
    return base


def new_password() -> str:
    return secrets.token_urlsafe(24)


def write_overlay(directory: Path, base: Path, database_url: str) -> None:
    """The overlay: the base, the testbed's image, and the database Secret. The URL is
    in a file of its own, readable by root only, never in the kustomization."""
    directory.mkdir(parents=True, exist_ok=True)
    env = directory / "database.env"
    env.touch(mode=0o600)
    env.write_text(f"url={database_url}\n")
    name, tag = SERVER_IMAGE.rsplit(":", 1)
    # Kustomize refuses an absolute path to a base.
    relative = os.path.relpath(base, directory)
    (directory / "kustomization.yaml").write_text(
        "# kubetrain in the testbed: deploy/base as it is, with the testbed's image and\n"
        "# database (kubetrain/testbed/incluster.py).\n"
        "apiVersion: kustomize.config.k8s.io/v1beta1\n"
        "kind: Kustomization\n"
        f"resources:\n  - {relative}\n"
        f"images:\n  - name: {BASE_IMAGE}\n    newName: {name}\n    newTag: {tag}\n"
        "secretGenerator:\n"
        f"  - name: {DATABASE_SECRET}\n"
        f"    namespace: {NAMESPACE}\n"
        "    envs: [database.env]\n"
    )


def kubectl(kubeconfig: Path, *args: str, timeout: float = 120) -> str:
    try:
        done = subprocess.run(
            ["kubectl", f"--kubeconfig={kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError:
        raise InClusterError(
            "`kubectl` is not on PATH: the in-cluster install applies deploy/base "
            "with `kubectl apply -k`, as an operator does"
        ) from None
    if done.returncode != 0:
        raise InClusterError(f"`kubectl {' '.join(args)}` failed: {done.stderr.strip()}")
    return done.stdout


def kube_proxy_argv(
    bin_dir: Path,
    kubeconfig: Path,
    node_name: str,
    cluster_cidr: str,
    healthz_port: int,
    metrics_port: int,
) -> list[str]:
    return [
        str(bin_dir / "kube-proxy"),
        f"--kubeconfig={kubeconfig}",
        "--proxy-mode=iptables",
        f"--hostname-override={node_name}",
        f"--cluster-cidr={cluster_cidr}",
        "--masquerade-all",
        f"--healthz-bind-address=127.0.0.1:{healthz_port}",
        f"--metrics-bind-address=127.0.0.1:{metrics_port}",
        # Leave the machine's conntrack table and timeouts as they are.
        "--conntrack-max-per-core=0",
        "--conntrack-min=0",
        "--conntrack-tcp-timeout-established=0",
        "--conntrack-tcp-timeout-close-wait=0",
        "--iptables-localhost-nodeports=false",
        # Lowering its own OOM score takes CAP_SYS_RESOURCE, which this sandbox lacks.
        "--oom-score-adj=0",
        "--v=1",
    ]


# What `kube-proxy --cleanup` leaves (seen with 1.33 here): its canaries, an empty
# KUBE-FIREWALL still jumped to from INPUT and OUTPUT, and KUBE-MARK-MASQ.
_LEFTOVERS = [
    ("filter", ["-D", "INPUT", "-j", "KUBE-FIREWALL"]),
    ("filter", ["-D", "OUTPUT", "-j", "KUBE-FIREWALL"]),
    *[
        (table, [verb, chain])
        for table, chain in (
            ("filter", "KUBE-FIREWALL"),
            ("filter", "KUBE-PROXY-CANARY"),
            ("nat", "KUBE-MARK-MASQ"),
            ("nat", "KUBE-PROXY-CANARY"),
            ("mangle", "KUBE-PROXY-CANARY"),
        )
        for verb in ("-F", "-X")
    ],
]


def kube_proxy_cleanup(bin_dir: Path) -> str:
    """Remove kube-proxy's rules: `kube-proxy --cleanup` (every mode's; the nftables part
    fails where there is no `nft`, and says so), then the chains it leaves, IPv4 and
    IPv6. What was said, for the log."""
    said = []
    commands = [[str(bin_dir / "kube-proxy"), "--cleanup", "--proxy-mode=iptables"]]
    for tool in ("iptables", "ip6tables"):
        commands += [[tool, "-w", "-t", table, *args] for table, args in _LEFTOVERS]
    for argv in commands:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            said.append(f"{argv[0]}: {exc}\n")
            continue
        said.append(done.stdout + done.stderr)
    return "".join(said)


def check_no_other_kube_proxy() -> None:
    """kube-proxy owns its chains in the machine's one network namespace: a second one
    would rewrite the first's rules at every sync."""
    found = subprocess.run(
        ["iptables", "-w", "-t", "nat", "-S", "KUBE-SERVICES"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if found.returncode == 0:
        raise InClusterError(
            "kube-proxy's rules are already on this machine (iptables -t nat -S "
            "KUBE-SERVICES): another in-cluster testbed runs here; `kubetrain testbed down` "
            "it first (one per machine: its rules are the machine's)"
        )


def enable_forwarding(bridge: str) -> None:
    """Routing on the bridge only (packets that came in on it): a Pod's packet to a
    ClusterIP arrives at the gateway and leaves, translated, by the same bridge."""
    Path(f"/proc/sys/net/ipv4/conf/{bridge}/forwarding").write_text("1\n")


def rolled_out(deployment: Any) -> bool:
    """`kubectl rollout status`'s test: the newest spec observed, every replica updated,
    available and ready, and none of an older ReplicaSet left."""
    spec, status, meta = deployment.spec, deployment.status, deployment.metadata
    if status is None or spec is None or meta is None:
        return False
    want = spec.replicas if spec.replicas is not None else 1
    return bool(
        (status.observedGeneration or 0) >= (meta.generation or 0)
        and (status.updatedReplicas or 0) == want
        and (status.replicas or 0) == want
        and (status.availableReplicas or 0) == want
        and (status.readyReplicas or 0) == want
    )
