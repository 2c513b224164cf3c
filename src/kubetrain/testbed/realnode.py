"""Real nodes: a containerd, a kubelet and a device plugin per node, on this machine.

The arrangement (docs/testbed.md, "Real nodes", says why):

* One mount namespace per node, made by `unshare` when its containerd starts; the
  kubelet and the device plugin join it with `nsenter`. The kubelet's
  device-plugin socket is fixed at /var/lib/kubelet/device-plugins/kubelet.sock
  and its container-log links at /var/log/containers, whatever --root-dir says,
  and containerd keeps shim sockets and runc state under /run/containerd and
  Pod network namespaces under /run/netns: in each namespace those are bind
  mounts of the node's own directories (NODE_BINDS), so two nodes do not meet
  there and nothing is left on the host. Every other path is the
  node's own: containerd's root, state and socket, the kubelet's root-dir,
  podLogsDir and cgroupRoot.
* Networking: one Linux bridge per testbed holding the gateway of the Pod
  network (x.y.0.1/16) and one address per node (x.y.0.10+i/32: kubelets refuse
  loopback node IPs). Each node's host-local IPAM hands out its own /24 of the
  /16, so Pods of different nodes talk over the one bridge. The Pods get no
  default route, only one to the Service network via the gateway (routed there by
  kube-proxy with `up --in-cluster`, see incluster.py), and the bridge forwards
  nowhere else: traffic stays on this machine.
* cgroups (v1 here, cgroupfs driver): each kubelet gets a cgroupRoot of its own,
  so neither takes the other's Pods for orphans.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kubetrain.testbed import processes
from kubetrain.testbed.images import PAUSE_IMAGE, TRAINER_IMAGE, Image, host_mounts
from kubetrain.testbed.pools import Pool

GPU_RESOURCE = "nvidia.com/gpu"
CGROUP_FS = Path("/sys/fs/cgroup")
# Fixed paths that each node's mount namespace replaces with a directory of its
# own (host path -> the node's subdirectory): the kubelet's device-plugin socket
# and container-log links, the network namespaces containerd pins for its Pods,
# and containerd's shim sockets and runc's state.
NODE_BINDS = {
    Path("/var/lib/kubelet/device-plugins"): "device-plugins",
    Path("/var/log/containers"): "container-logs",
    Path("/run/netns"): "run/netns",
    Path("/run/containerd"): "run/containerd",
}
# The API server's --service-cluster-ip-range: the Pods route it to the gateway.
SERVICE_CIDR = "10.96.0.0/12"
# Pod networks tried in turn: the first not on an interface of this machine.
_POD_NETWORKS = [f"10.{second}.0.0/16" for second in range(244, 252)]
SYSTEM_PACKAGES = {
    "containerd": "containerd",
    "runc": "runc",
    "/usr/lib/cni/bridge": "containernetworking-plugins",
}


class RealNodeError(RuntimeError):
    """A real node could not be set up; the message says what is missing."""


@dataclass
class Network:
    bridge: str
    cidr: str  # the Pod network, x.y.0.0/16
    gateway: str  # on the bridge: cluster DNS and the host as Pods see it
    dns_health_port: int = 0  # CoreDNS's health endpoint, on 127.0.0.1

    @classmethod
    def choose(cls, testbed_id: str) -> Network:
        """The first free Pod network, reserved at once: its bridge is made with the
        gateway's address under a machine-wide lock, so that two testbeds starting
        together (two test workers) never pick the same one (seen: two bridges on
        10.245.0.0/16, and one pool's Pods could not reach the host)."""
        bridge = f"kt{testbed_id[:10]}"
        with _network_lock():
            _delete_bridge(bridge)  # a crashed run's, same state directory
            taken = _local_networks()
            for cidr in _POD_NETWORKS:
                net = ipaddress.ip_network(cidr)
                if not any(net.overlaps(t) for t in taken):
                    network = cls(
                        bridge=bridge,
                        cidr=cidr,
                        gateway=str(net[1]),
                        dns_health_port=processes.pick_free_ports(1)[0],
                    )
                    network._reserve()
                    return network
        raise RealNodeError(f"no free Pod network among {', '.join(_POD_NETWORKS)}")

    def _reserve(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        prefix = ipaddress.ip_network(self.cidr).prefixlen
        _ip("addr", "add", f"{self.gateway}/{prefix}", "dev", self.bridge)

    def node_ip(self, index: int) -> str:
        return str(ipaddress.ip_network(self.cidr)[10 + index])

    def pod_range(self, index: int) -> tuple[str, str]:
        base = ipaddress.ip_network(self.cidr).network_address + (index + 1) * 256
        return str(base + 2), str(base + 254)

    def up(self, node_count: int) -> None:
        # Made afresh (a restarted testbed's bridge may hold its old addresses), under
        # the lock that keeps the network ours while it is briefly gone.
        with _network_lock():
            self.down()
            self._reserve()
            for index in range(node_count):
                _ip("addr", "add", f"{self.node_ip(index)}/32", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")

    def down(self) -> None:
        _delete_bridge(self.bridge)


@dataclass
class RealNode:
    name: str
    index: int
    directory: str
    ip: str
    kubelet_port: int
    healthz_port: int
    stream_port: int
    gpus: int
    labels: dict[str, str]
    taints: list[str]
    cgroup: str  # the kubelet's cgroupRoot, under every hierarchy

    @property
    def dir(self) -> Path:
        return Path(self.directory)

    @property
    def socket(self) -> Path:
        return self.dir / "containerd.sock"

    def component(self, what: str) -> str:
        return f"{what}/{self.name}"


def check_system() -> None:
    """The Debian packages real nodes need (the Makefile installs them)."""
    missing = [
        package
        for binary, package in SYSTEM_PACKAGES.items()
        if not (Path(binary).exists() if binary.startswith("/") else shutil.which(binary))
    ]
    for tool in ("unshare", "nsenter", "ip", "ctr"):
        if shutil.which(tool) is None:
            missing.append(tool)
    if missing:
        raise RealNodeError(
            f"real nodes need {', '.join(sorted(set(missing)))}: run `make testbed` "
            "(it installs containerd, runc and containernetworking-plugins)"
        )
    if os.geteuid() != 0:
        raise RealNodeError("real nodes start containerd and kubelets: run as root")


def plan(pool: Pool, state_dir: Path, network: Network, testbed_id: str) -> list[RealNode]:
    nodes = []
    index = 0
    for group in pool.real_groups():
        for name in group.node_names():
            ports = processes.pick_free_ports(3)
            taints = [f"{t.key}={t.value}:{t.effect}" for t in group.taints]
            nodes.append(
                RealNode(
                    name=name,
                    index=index,
                    directory=str(state_dir / "nodes" / name),
                    ip=network.node_ip(index),
                    kubelet_port=ports[0],
                    healthz_port=ports[1],
                    stream_port=ports[2],
                    gpus=group.gpus,
                    labels=pool.labels(group, name),
                    taints=taints,
                    cgroup=f"kubetrain-{testbed_id[:10]}-{name}",
                )
            )
            index += 1
    return nodes


def to_dict(node: RealNode) -> dict[str, Any]:
    return asdict(node)


# -- configuration ---------------------------------------------------------------------


def write_configs(node: RealNode, network: Network, pki: Any, kubeconfig: Path) -> None:
    d = node.dir
    for sub in ("containerd", "cni/net.d", "cni/ipam", "kubelet", "pod-logs", *NODE_BINDS.values()):
        (d / sub).mkdir(parents=True, exist_ok=True)
    (d / "containerd" / "config.toml").write_text(_containerd_config(node))
    (d / "containerd" / "base-spec.json").write_text(json.dumps(_base_spec()))
    first, last = network.pod_range(node.index)
    cni = {
        "cniVersion": "0.4.0",
        "name": "kubetrain",
        "plugins": [
            {
                "type": "bridge",
                "bridge": network.bridge,
                # The testbed owns the bridge and its address; no default route
                # and no masquerading: Pods reach the Pod network and the gateway only.
                "isGateway": False,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(d / "cni" / "ipam"),
                    # ClusterIPs via the gateway, where kube-proxy's rules (when it
                    # runs) translate them; without it they go nowhere, as before.
                    "routes": [{"dst": SERVICE_CIDR, "gw": network.gateway}],
                    "ranges": [
                        [
                            {
                                "subnet": network.cidr,
                                "rangeStart": first,
                                "rangeEnd": last,
                                "gateway": network.gateway,
                            }
                        ]
                    ],
                },
            }
        ],
    }
    (d / "cni" / "net.d" / "10-kubetrain.conflist").write_text(json.dumps(cni, indent=2))
    (d / "kubelet" / "config.yaml").write_text(json.dumps(_kubelet_config(node, network, pki)))


def _containerd_config(node: RealNode) -> str:
    d = node.dir / "containerd"
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    runc = shutil.which("runc") or "runc"
    return f"""version = 2
root = "{d / "root"}"
state = "{d / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{node.socket}"

[ttrpc]
  address = "{node.socket}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d / "opt"}"

[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  # This machine's sandbox lacks CAP_SYS_RESOURCE: the runtime must not try to
  # lower a container's oom_score_adj below its own.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "{node.stream_port}"
  enable_selinux = false
  disable_apparmor = true

[{cri}.cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "{node.dir / "cni" / "net.d"}"

[{cri}.containerd]
  default_runtime_name = "runc"
  snapshotter = "overlayfs"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  base_runtime_spec = "{d / "base-spec.json"}"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = "{runc}"
"""


def _base_spec() -> dict[str, Any]:
    """containerd's default container spec plus this machine's Python environment,
    read-only at the same paths (the trainer image's entrypoint lives there)."""
    spec: dict[str, Any] = json.loads(
        subprocess.run(["ctr", "oci", "spec"], capture_output=True, check=True, timeout=30).stdout
    )
    spec["mounts"] += [
        {"destination": path, "type": "bind", "source": path, "options": ["rbind", "ro"]}
        for path in host_mounts()
    ]
    return spec


def _kubelet_config(node: RealNode, network: Network, pki: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node.ip,
        "port": node.kubelet_port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": node.healthz_port,
        "containerRuntimeEndpoint": f"unix://{node.socket}",
        # cgroup v1 controllers with a v2 hierarchy beside them, and no systemd.
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{node.cgroup}",
        "failCgroupV1": False,
        "failSwapOn": False,
        "podLogsDir": str(node.dir / "pod-logs"),
        "volumePluginDir": str(node.dir / "volume-plugins"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki.ca_cert)},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDomain": "cluster.local",
        "clusterDNS": [network.gateway],
        # Pods never see this machine's resolver: a name outside the cluster is
        # not asked about anywhere else.
        "resolvConf": "",
        "makeIPTablesUtilChains": False,
        "serializeImagePulls": False,
        "shutdownGracePeriod": "0s",
        "nodeStatusReportFrequency": "10s",
        # The nodes share this machine's disk, whose free share is the machine's, not the
        # node's: the default thresholds (imagefs.available<15%) put a busy shared disk under
        # DiskPressure and evict every Pod, and image GC at 85% used deletes the imported
        # images, which no registry can give back. Every signal is named: one left out is 0.
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
            "imagefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
    }


def corefile(network: Network, kubeconfig: Path) -> str:
    """Cluster DNS on the bridge's gateway: Services and Pods of cluster.local, and
    reverse lookups, from the API server. No forward plugin: any other name is
    refused here and asked about nowhere else."""
    return f"""cluster.local:53 in-addr.arpa:53 ip6.arpa:53 {{
    bind {network.gateway}
    health 127.0.0.1:{network.dns_health_port}
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        ttl 5
    }}
}}
"""


def coredns_argv(bin_dir: Path, conf: Path) -> list[str]:
    return [str(bin_dir / "coredns"), "-conf", str(conf)]


# -- storage: rancher's local-path-provisioner behind the default StorageClass ---------

STORAGE_CLASS = "local-path"
PROVISIONER = "rancher.io/local-path"
STORAGE_NAMESPACE = "local-path-storage"
STORAGE_SERVICE_ACCOUNT = "local-path-provisioner"
# The provisioner's helper Pods mount these scripts from this ConfigMap (the
# upstream deploy/local-path-storage.yaml's own `setup` and `teardown`).
STORAGE_CONFIGMAP = "local-path-config"
_SETUP = '#!/bin/sh\nset -eu\nmkdir -m 0777 -p "$VOL_DIR"\n'
_TEARDOWN = '#!/bin/sh\nset -eu\nrm -rf "$VOL_DIR"\n'


def volume_dir(node: RealNode) -> Path:
    """Where the provisioner makes the node's volumes: inside the node's directory,
    under the testbed's state directory (gone with it at `down`)."""
    return node.dir / "local-path"


def provisioner_config(nodes: list[RealNode]) -> dict[str, Any]:
    """config.json: each real node's own volume directory. No default entry: a claim
    can only be provisioned on a real node (a KWOK node has no disk)."""
    return {
        "nodePathMap": [{"node": node.name, "paths": [str(volume_dir(node))]} for node in nodes]
    }


def helper_pod() -> dict[str, Any]:
    """The template of the Pods that make and remove a volume's directory on its node:
    the trainer image, already in every node's containerd (it has sh, mkdir and rm
    from this machine's /usr); never pulled, there is no registry."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "helper-pod"},
        "spec": {
            # The scripts need no API access.
            "automountServiceAccountToken": False,
            "containers": [
                {"name": "helper-pod", "image": TRAINER_IMAGE, "imagePullPolicy": "Never"}
            ],
        },
    }


def storage_objects(nodes: list[RealNode]) -> list[dict[str, Any]]:
    """What the provisioner needs in the cluster: its namespace (the helper Pods run
    there), their ServiceAccount, the scripts, and the default StorageClass, offered
    on the real nodes only (the scheduler places a claim's first consumer there)."""
    meta = {"namespace": STORAGE_NAMESPACE}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": STORAGE_NAMESPACE}},
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": STORAGE_SERVICE_ACCOUNT, **meta},
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": STORAGE_CONFIGMAP, **meta},
            "data": {"setup": _SETUP, "teardown": _TEARDOWN},
        },
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": STORAGE_CLASS,
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": PROVISIONER,
            "reclaimPolicy": "Delete",
            # The volume is made on the node the scheduler picks for its first Pod.
            "volumeBindingMode": "WaitForFirstConsumer",
            "allowedTopologies": [
                {
                    "matchLabelExpressions": [
                        {"key": "kubernetes.io/hostname", "values": [n.name for n in nodes]}
                    ]
                }
            ],
        },
    ]


def provisioner_argv(bin_dir: Path, config: Path, helper: Path, kubeconfig: Path) -> list[str]:
    """Out of cluster, with the testbed's admin kubeconfig (it stands in for the
    upstream RBAC: PVs, PVCs, helper Pods, events)."""
    return [
        str(bin_dir / "local-path-provisioner"),
        "start",
        f"--config={config}",
        f"--helper-pod-file={helper}",
        f"--kubeconfig={kubeconfig}",
        f"--provisioner-name={PROVISIONER}",
        f"--namespace={STORAGE_NAMESPACE}",
        f"--service-account-name={STORAGE_SERVICE_ACCOUNT}",
        f"--configmap-name={STORAGE_CONFIGMAP}",
        # Required by its CLI; the helper Pod template names the image.
        f"--helper-image={TRAINER_IMAGE}",
    ]


def cgroup_hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy (v1 controllers and the v2 one beside them)."""
    return sorted(p for p in CGROUP_FS.iterdir() if p.is_dir() and not p.is_symlink())


def make_cgroups(node: RealNode) -> None:
    for hierarchy in cgroup_hierarchies():
        path = hierarchy / node.cgroup
        path.mkdir(exist_ok=True)
        if hierarchy.name == "cpuset":
            # A new cpuset has no CPUs and no memory nodes until given its parent's.
            for name in ("cpuset.cpus", "cpuset.mems"):
                (path / name).write_text((hierarchy / name).read_text())


def remove_cgroups(node: RealNode) -> None:
    """Kill what is left in the node's cgroups (Pods, once the kubelet is gone), then
    remove them, deepest first."""
    for _ in range(50):
        pids: set[int] = set()
        for hierarchy in cgroup_hierarchies():
            for path in _cgroup_tree(hierarchy / node.cgroup):
                with contextlib.suppress(OSError, ValueError):
                    pids.update(int(p) for p in (path / "cgroup.procs").read_text().split())
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    for hierarchy in cgroup_hierarchies():
        root = hierarchy / node.cgroup
        if not root.exists():
            continue
        for path in reversed(_cgroup_tree(root)):  # deepest first
            with contextlib.suppress(OSError):
                path.rmdir()


def _cgroup_tree(root: Path) -> list[Path]:
    """`root` and every cgroup under it, parents first. os.walk skips a directory
    that vanishes while it looks (the runtime removes a dead container's cgroup
    meanwhile), where Path.rglob raised."""
    return [Path(top) for top, _, _ in os.walk(root)]


# -- processes -------------------------------------------------------------------------


def containerd_argv(node: RealNode) -> list[str]:
    binary = shutil.which("containerd") or "containerd"
    # Pairs of arguments (the node's directory, the fixed path), then containerd.
    script = (
        'while [ "$#" -gt 2 ]; do mount --bind "$1" "$2" || exit 1; shift 2; done; '
        'exec "$1" --config "$2" --log-level warn'
    )
    binds = [str(arg) for host, sub in NODE_BINDS.items() for arg in (node.dir / sub, host)]
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "/bin/sh",
        "-c",
        script,
        "node-namespace",
        *binds,
        binary,
        str(node.dir / "containerd" / "config.toml"),
    ]


def in_namespace(containerd_pid: int, argv: list[str]) -> list[str]:
    """Run argv in the node's mount namespace (nsenter execs it: the pid is argv's)."""
    return ["nsenter", f"--mount=/proc/{containerd_pid}/ns/mnt", "--", *argv]


def kubelet_argv(node: RealNode, bin_dir: Path, kubeconfig: Path) -> list[str]:
    labels = ",".join(f"{k}={v}" for k, v in node.labels.items())
    argv = [
        str(bin_dir / "kubelet"),
        f"--config={node.dir / 'kubelet' / 'config.yaml'}",
        f"--kubeconfig={kubeconfig}",
        f"--root-dir={node.dir / 'kubelet'}",
        # Its serving certificate; the default is /var/lib/kubelet/pki whatever --root-dir says.
        f"--cert-dir={node.dir / 'kubelet' / 'pki'}",
        f"--hostname-override={node.name}",
        f"--node-ip={node.ip}",
        f"--node-labels={labels}",
        "--v=1",
    ]
    if node.taints:
        argv.append(f"--register-with-taints={','.join(node.taints)}")
    return argv


def device_plugin_argv(node: RealNode, bin_dir: Path) -> list[str]:
    return [
        str(bin_dir / "testbed-device-plugin"),
        f"--resource={GPU_RESOURCE}",
        f"--count={node.gpus}",
        f"--id-prefix={node.name}-gpu",
    ]


def containerd_answers(node: RealNode) -> str:
    """ "" when the node's containerd answers a version request on its socket, else what
    `ctr` said."""
    try:
        done = subprocess.run(
            ["ctr", "--address", str(node.socket), "--connect-timeout", "2s", "version"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "ctr version did not return within 10 s"
    return "" if done.returncode == 0 else (done.stderr.strip() or done.stdout.strip() or "?")


def import_images(node: RealNode, images: list[Image]) -> None:
    for image in images:
        done = subprocess.run(
            [
                "ctr",
                "--address",
                str(node.socket),
                "--namespace",
                "k8s.io",
                "images",
                "import",
                str(image.archive),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise RealNodeError(
                f"importing {image.name} into {node.name}'s containerd failed: "
                f"{done.stderr.strip() or done.stdout.strip()}"
            )


def host_dirs() -> None:
    """The mount points each node's namespace binds over (empty on the host)."""
    for path in NODE_BINDS:
        path.mkdir(parents=True, exist_ok=True)


def kill_shims(node: RealNode) -> None:
    """containerd's shims outlive it by design; ours name our socket."""
    needle = f"-address\0{node.socket}\0".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"containerd-shim" in cmdline.split(b"\0")[0] and needle in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise RealNodeError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")


def _delete_bridge(name: str) -> None:
    with contextlib.suppress(RealNodeError):  # none of that name
        _ip("link", "del", name)


def _network_lock() -> contextlib.AbstractContextManager[None]:
    """This machine's lock on choosing and making Pod networks."""
    return processes.machine_lock(Path(tempfile.gettempdir()) / "kubetrain-testbed-networks.lock")


def _local_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    done = subprocess.run(
        ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, timeout=30, check=False
    )
    nets = []
    for line in done.stdout.splitlines():
        parts = line.split()
        if "inet" in parts:
            nets.append(ipaddress.ip_interface(parts[parts.index("inet") + 1]).network)
    return nets
