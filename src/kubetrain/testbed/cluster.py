"""The testbed's lifecycle: up, down, status, and restarting single components.

Everything a testbed owns lives in its state directory: PKI, kubeconfig, etcd
data, logs, and `testbed.json` with the ports and pids it started, so `down`
stops exactly those processes and two testbeds can run side by side.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from kubetrain.errors import KubetrainError
from kubetrain.testbed import incluster, processes
from kubetrain.testbed import kueue as kueue_mod
from kubetrain.testbed import pki as pki_mod
from kubetrain.testbed import realnode as real
from kubetrain.testbed.build import BINARIES, Binaries, installed
from kubetrain.testbed.images import Image, build_images
from kubetrain.testbed.kueue_build import KueueBuild
from kubetrain.testbed.kueue_build import installed as kueue_installed
from kubetrain.testbed.pools import POOL_LABEL, Pool, load_pool
from kubetrain.testbed.postgres import Postgres

log = logging.getLogger(__name__)

# Start order; stopped in reverse.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
SERVICE_CIDR = real.SERVICE_CIDR
# The API server's client identity towards aggregated APIs (Kueue's visibility API).
_FRONT_PROXY = "front-proxy-client"
POD_CIDR = "10.0.0.1/16"
_ALWAYS_ALLOW = "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics"


class TestbedError(KubetrainError, RuntimeError):
    """The testbed could not do what was asked; the message says why."""

    __test__ = False  # not a pytest test class


class PortTakenError(TestbedError):
    """A component found its picked port taken between the pick and its bind."""


# `up` picks the ports afresh and starts again this many times in all when a
# component finds its port taken (the pick and the bind are not atomic).
PORT_TRIES = 3


def stage_files() -> list[Path]:
    folder = resources.files("kubetrain.testbed") / "stages"
    return sorted(Path(str(p)) for p in folder.iterdir() if p.name.endswith(".yaml"))


@dataclass
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int
    # Kueue's servers (0 without --kueue).
    kueue_webhook: int = 0
    kueue_health: int = 0
    kueue_metrics: int = 0
    kueue_visibility: int = 0

    def named(self) -> dict[str, int]:
        named = {
            "etcd client": self.etcd_client,
            "etcd peer": self.etcd_peer,
            "kube-apiserver": self.apiserver,
            "kube-controller-manager": self.controller_manager,
            "kube-scheduler": self.scheduler,
            "kwok": self.kwok,
        }
        if self.kueue_webhook:
            named |= {
                "kueue webhook": self.kueue_webhook,
                "kueue health": self.kueue_health,
                "kueue metrics": self.kueue_metrics,
                "kueue visibility": self.kueue_visibility,
            }
        return named


@dataclass
class State:
    name: str
    pool: str
    bin_dir: str
    ports: Ports
    pids: dict[str, int] = field(default_factory=dict)
    started_at: float = 0.0
    ready_seconds: float | None = None
    # Seconds from the start of `up` to the end of each phase.
    phases: dict[str, float] = field(default_factory=dict)
    # Real nodes (kind: real groups) and the bridge their Pods share.
    network: real.Network | None = None
    real_nodes: list[real.RealNode] = field(default_factory=list)
    # With --kueue: the directory of its build, and the address its visibility API
    # listens on (None: no address the API server's aggregator may dial).
    kueue_dir: str | None = None
    kueue_visibility_address: str | None = None
    # With --in-cluster: kubetrain's own install (kube-proxy, PostgreSQL, the overlay).
    in_cluster: incluster.InCluster | None = None

    @classmethod
    def load(cls, path: Path) -> State:
        data = json.loads(path.read_text())
        data["ports"] = Ports(**data["ports"])
        if data.get("network"):
            data["network"] = real.Network(**data["network"])
        if data.get("in_cluster"):
            data["in_cluster"] = incluster.InCluster(**data["in_cluster"])
        data["real_nodes"] = [real.RealNode(**n) for n in data.get("real_nodes", [])]
        return cls(**data)

    def components(self) -> dict[str, Path]:
        """Every process this testbed starts, by name, with the binary it runs (a pid
        is ours only while it runs that binary): start order."""
        bin_dir = Path(self.bin_dir)
        named = {c: bin_dir / c for c in COMPONENTS}
        if self.kueue_dir:
            named["kueue"] = KueueBuild(Path(self.kueue_dir)).binary
        containerd = Path(shutil.which("containerd") or "/usr/bin/containerd")
        if self.network is not None:
            named["coredns"] = bin_dir / "coredns"
            named["local-path-provisioner"] = bin_dir / "local-path-provisioner"
        if self.in_cluster is not None:
            named["kube-proxy"] = bin_dir / "kube-proxy"
        for node in self.real_nodes:
            named[node.component("containerd")] = containerd
            named[node.component("kubelet")] = bin_dir / "kubelet"
            if node.gpus:
                named[node.component("device-plugin")] = bin_dir / "testbed-device-plugin"
        return named

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)


class Testbed:
    """A testbed's state directory, and the operations on what runs from it."""

    __test__ = False

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir.resolve()
        self.pki = pki_mod.Pki(self.state_dir / "pki")

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def state_file(self) -> Path:
        return self.state_dir / "testbed.json"

    def log_path(self, component: str) -> Path:
        return self.state_dir / "logs" / f"{component}.log"

    def state(self) -> State:
        if not self.state_file.exists():
            raise TestbedError(f"no testbed in {self.state_dir} (run `kubetrain testbed up`)")
        return State.load(self.state_file)

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.state().ports.apiserver}"

    # -- lifecycle -------------------------------------------------------------------------

    @classmethod
    def prepare(
        cls,
        state_dir: Path,
        pool: str | Pool = "default",
        binaries: Binaries | None = None,
        apiserver_port: int | None = None,
        kueue: bool | KueueBuild = False,
        pods_ready_timeout: str = kueue_mod.PODS_READY_TIMEOUT,
    ) -> Testbed:
        """Write a fresh state directory (ports, PKI, kubeconfig); start nothing.
        `pods_ready_timeout`: Kueue's waitForPodsReady.timeout (see kueue.configuration)."""
        binaries = binaries or installed()
        if not binaries.complete():
            missing = [n for n in BINARIES if not os.access(binaries.path(n), os.X_OK)]
            raise TestbedError(
                f"testbed binaries missing in {binaries.directory} ({', '.join(missing)}): "
                "run `kubetrain testbed build` (or `make testbed`) first"
            )
        kueue_build = kueue_installed() if kueue is True else kueue or None
        if kueue_build is not None and not kueue_build.complete():
            raise TestbedError(
                f"Kueue is not built in {kueue_build.directory}: "
                "run `kubetrain testbed build` (or `make testbed`) first"
            )
        testbed = cls(state_dir)
        if testbed.state_file.exists() and any(testbed.running().values()):
            raise TestbedError(
                f"a testbed already runs from {testbed.state_dir}: "
                "`kubetrain testbed down` it first, or pick another --name"
            )
        # A pool given by name only names the testbed's nodes (`up` makes them).
        real_groups = pool.real_groups() if isinstance(pool, Pool) else []
        if real_groups:
            real.check_system()
        free = processes.pick_free_ports(10 if kueue_build else 6)
        if apiserver_port is not None:
            processes.check_bindable(apiserver_port, "kube-apiserver")
            free[2] = apiserver_port
        shutil.rmtree(testbed.state_dir, ignore_errors=True)
        (testbed.state_dir / "logs").mkdir(parents=True)
        state = State(
            name=testbed.state_dir.name,
            pool=pool.name if isinstance(pool, Pool) else pool,
            bin_dir=str(binaries.directory),
            ports=Ports(*free),
            started_at=time.time(),
        )
        pki_mod.generate(testbed.pki.directory)
        if kueue_build is not None:
            testbed._prepare_kueue(state, kueue_build, pods_ready_timeout)
        pki_mod.write_kubeconfig(
            testbed.kubeconfig,
            testbed.pki,
            f"https://127.0.0.1:{state.ports.apiserver}",
            name=f"kubetrain-testbed-{state.name}",
        )
        if isinstance(pool, Pool) and real_groups:
            testbed_id = hashlib.sha256(str(testbed.state_dir).encode()).hexdigest()
            state.network = real.Network.choose(testbed_id)
            state.real_nodes = real.plan(pool, testbed.state_dir, state.network, testbed_id)
            for node in state.real_nodes:
                real.write_configs(node, state.network, testbed.pki, testbed.kubeconfig)
        state.save(testbed.state_file)
        return testbed

    @classmethod
    def up(
        cls,
        state_dir: Path,
        pool: str | Pool = "default",
        binaries: Binaries | None = None,
        apiserver_port: int | None = None,
        timeout: float = 120.0,
        kueue: bool | KueueBuild = False,
        in_cluster: bool = False,
        pods_ready_timeout: str = kueue_mod.PODS_READY_TIMEOUT,
    ) -> Testbed:
        """Start a testbed in `state_dir` and wait until its nodes are Ready (and, with
        `kueue`, until Kueue serves its webhooks and visibility API; with `in_cluster`,
        until kubetrain's own two replicas are ready in it, see `install_kubetrain`)."""
        processes.raise_inotify_limits()
        pool_spec = pool if isinstance(pool, Pool) else load_pool(pool)
        if in_cluster and not pool_spec.real_groups():
            raise TestbedError("--in-cluster runs kubetrain on real kubelets: use --pool real")
        # A port given is the caller's to keep; picked ones are picked again.
        tries = 1 if apiserver_port is not None else PORT_TRIES
        for tried in range(1, tries + 1):
            try:
                return cls._up_once(
                    state_dir,
                    pool_spec,
                    binaries,
                    apiserver_port,
                    timeout,
                    kueue,
                    in_cluster,
                    pods_ready_timeout,
                )
            except PortTakenError:
                # `_up_once` stopped what it started; the next `prepare` clears the state.
                if tried == tries:
                    raise
        raise AssertionError("unreachable")

    @classmethod
    def _up_once(
        cls,
        state_dir: Path,
        pool_spec: Pool,
        binaries: Binaries | None,
        apiserver_port: int | None,
        timeout: float,
        kueue: bool | KueueBuild,
        in_cluster: bool,
        pods_ready_timeout: str,
    ) -> Testbed:
        began = time.monotonic()
        testbed = cls.prepare(
            state_dir, pool_spec, binaries, apiserver_port, kueue, pods_ready_timeout
        )
        state = testbed.state()
        phases: dict[str, float] = {"prepare": time.monotonic() - began}
        try:
            # All start at once: the later components retry until the API server
            # answers, which is faster than waiting for each in turn.
            for component in COMPONENTS:
                testbed._start(component, state)
            if state.real_nodes:
                testbed._start_real_nodes(state, time.monotonic() + timeout)
                phases["real_nodes_started"] = time.monotonic() - began
            testbed._wait_ready(state, time.monotonic() + timeout, only=COMPONENTS)
            phases["components_ready"] = time.monotonic() - began
            if state.kueue_dir:
                testbed._start_kueue(state, time.monotonic() + timeout)
            testbed.create_nodes(pool_spec)
            phases["nodes_created"] = time.monotonic() - began
            if state.real_nodes:
                testbed._start_storage(state)
            if state.kueue_dir:
                testbed._wait_kueue(state, time.monotonic() + timeout)
                phases["kueue_ready"] = time.monotonic() - began
            testbed.wait_nodes_ready(pool_spec, time.monotonic() + timeout)
            phases["nodes_ready"] = time.monotonic() - began
            if in_cluster:
                testbed.install_kubetrain(timeout=max(timeout, 240.0))
                phases["kubetrain_ready"] = time.monotonic() - began
        except PortTakenError:
            # It never served: its components are stopped at once, not given the 15 s
            # a serving component's graceful stop may take while its peers are gone.
            testbed.down(keep_state=True, grace=0.0)
            raise
        except BaseException:
            testbed.down(keep_state=True)
            raise
        state = testbed.state()  # install_kubetrain saved its part
        state.ready_seconds = round(phases["nodes_ready"], 2)
        state.phases = {name: round(at, 3) for name, at in phases.items()}
        state.save(testbed.state_file)
        return testbed

    def down(self, keep_state: bool = False, grace: float = 15.0) -> list[str]:
        """Stop the processes this testbed started, each SIGKILLed after `grace` seconds
        (at once when 0); remove its state unless kept."""
        stopped = []
        if self.state_file.exists():
            state = self.state()
            if state.in_cluster is not None:
                # The cluster goes with the testbed: only what runs outside it.
                stopped += self._stop_in_cluster(state)
            stopped += self._stop_real_nodes(state)
            for component, binary in reversed(state.components().items()):
                pid = state.pids.get(component)
                if (
                    component in (*COMPONENTS, "kueue")
                    and pid
                    and processes.stop(pid, binary, timeout=grace)
                ):
                    stopped.append(component)
        if not keep_state:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        return stopped

    def running(self) -> dict[str, bool]:
        state = self.state()
        return {
            c: bool(state.pids.get(c)) and processes.is_ours(state.pids[c], binary)
            for c, binary in state.components().items()
        }

    def status(self) -> dict[str, Any]:
        state = self.state()
        alive = self.running()
        return {
            "state_dir": str(self.state_dir),
            "kubeconfig": str(self.kubeconfig),
            "server": f"https://127.0.0.1:{state.ports.apiserver}",
            "pool": state.pool,
            "ready_seconds": state.ready_seconds,
            "phases": state.phases,
            "components": {
                c: {"pid": state.pids.get(c), "running": alive[c], "log": str(self.log_path(c))}
                for c in state.components()
            },
            "apiserver_ready": alive["kube-apiserver"] and self._apiserver_ready(state),
            **({"kubetrain_url": state.in_cluster.url} if state.in_cluster else {}),
            **(
                {
                    "kueue": {
                        "visibility_api": state.kueue_visibility_address is not None,
                        "visibility_address": state.kueue_visibility_address,
                    }
                }
                if state.kueue_dir
                else {}
            ),
        }

    def stop_component(self, component: str, timeout: float = 15.0) -> None:
        """Stop one component: SIGTERM (a graceful stop can take seconds: the API
        server drains), or SIGKILL at once with timeout=0, as a crash."""
        state = self.state()
        pid = state.pids.get(component)
        if pid:
            processes.stop(pid, state.components()[component], timeout)

    def start_component(
        self, component: str, timeout: float = 60.0, extra_args: Sequence[str] = ()
    ) -> None:
        """Start one stopped component; `extra_args` are added to its flags for this run
        only (a fault test runs the API server without its watch cache, for one)."""
        state = self.state()
        if component == "kube-apiserver":
            _wait_port_free(state.ports.apiserver, time.monotonic() + 20)
        self._start(component, state, extra_args)
        self._wait_ready(state, time.monotonic() + timeout, only=component)

    def stop_node_component(self, node_name: str, what: str, timeout: float = 15.0) -> None:
        """Stop a real node's kubelet or device plugin (SIGKILL at once with timeout=0)."""
        state = self.state()
        node = _real_node(state, node_name)
        component = node.component(what)
        pid = state.pids.get(component)
        if pid:
            processes.stop(pid, state.components()[component], timeout)

    def start_node_component(self, node_name: str, what: str) -> None:
        """Start a stopped kubelet or device plugin of a real node, in its namespace."""
        state = self.state()
        node = _real_node(state, node_name)
        bin_dir = Path(state.bin_dir)
        argv = {
            "kubelet": lambda: real.kubelet_argv(node, bin_dir, self.kubeconfig),
            "device-plugin": lambda: real.device_plugin_argv(node, bin_dir),
        }
        if what not in argv:
            raise TestbedError(f"{what!r}: only kubelet or device-plugin can be restarted")
        containerd = state.pids[node.component("containerd")]
        self._launch(node.component(what), real.in_namespace(containerd, argv[what]()), state)

    def stop_real_node(self, node_name: str) -> None:
        """Lose a real node the way a machine that dies is lost: its device plugin and
        kubelet SIGKILLed, its Pods' processes killed (everything in its cgroups),
        containerd's shims and containerd stopped. Its Node object stays (the
        node-lifecycle controller marks it NotReady in time); deleting it has Pod
        garbage collection fail its Pods (DisruptionTarget) 40-60 s later.
        `start_real_node` brings it back."""
        state = self.state()
        node = _real_node(state, node_name)
        named = state.components()
        for what in ("device-plugin", "kubelet", "containerd"):
            component = node.component(what)
            pid = state.pids.pop(component, None)
            if what == "containerd":
                real.remove_cgroups(node)
                real.kill_shims(node)
            if pid:
                processes.stop(pid, named[component], timeout=0)
        real.remove_cgroups(node)
        state.save(self.state_file)

    def start_real_node(self, node_name: str, timeout: float = 60.0) -> None:
        """Start a node `stop_real_node` stopped: its cgroups, containerd (a new mount
        namespace), its images imported again, kubelet and device plugin; returns
        once its Node (registered again if it was deleted) is Ready with its GPUs."""
        from lightkube import Client
        from lightkube.config.kubeconfig import KubeConfig
        from lightkube.core.exceptions import ApiError
        from lightkube.resources.core_v1 import Node

        deadline = time.monotonic() + timeout
        state = self.state()
        node = _real_node(state, node_name)
        real.make_cgroups(node)
        # A containerd that was killed leaves its socket: waiting for it must wait for
        # the new one's.
        node.socket.unlink(missing_ok=True)
        self._launch(node.component("containerd"), real.containerd_argv(node), state)
        self._wait_containerd(state, node, deadline)
        # Imported again (idempotent, the archives are cached): a node that came back
        # without its sandbox image was seen to fail every Pod after it ("failed to get
        # sandbox image localhost/kubetrain-pause:testbed").
        self._import_images(state, node, build_images(Binaries(Path(state.bin_dir))), deadline)
        self._start_kubelet(state, node)
        client = Client(config=KubeConfig.from_file(self.kubeconfig))
        while time.monotonic() < deadline:
            try:
                found = client.get(Node, node_name)
            except ApiError as exc:
                if exc.status.code != 404:
                    raise
            else:
                if _node_ready(found) and _gpus(found) >= node.gpus:
                    return
            self._check_alive(state, [node.component(w) for w in ("containerd", "kubelet")])
            time.sleep(0.2)
        raise TestbedError(
            f"{node_name} was not Ready again before the timeout; "
            f"see {self.log_path(node.component('kubelet'))}"
        )

    # -- kubetrain in the cluster (--in-cluster) ------------------------------------------

    def install_kubetrain(self, timeout: float = 240.0) -> incluster.InCluster:
        """Install kubetrain into this real-pool testbed as an operator would
        (incluster.py says how): kube-proxy, PostgreSQL on the gateway, `kubectl apply
        -k` of an overlay of deploy/base; returns once both replicas are ready and the
        Service answers /readyz from this machine, with an admin token made in a Pod
        (`kubectl exec deploy/kubetrain -- kubetrain token create`)."""
        deadline = time.monotonic() + timeout
        state = self.state()
        if state.network is None or not state.real_nodes:
            raise TestbedError("--in-cluster runs kubetrain on real kubelets: use --pool real")
        if state.in_cluster is not None:
            raise TestbedError(f"kubetrain is already installed in {self.state_dir}")
        bin_dir = Path(state.bin_dir)
        base = incluster.deploy_base()
        try:
            incluster.check_no_other_kube_proxy()
        except incluster.InClusterError as exc:
            raise TestbedError(str(exc)) from None
        healthz, metrics, pg_port = processes.pick_free_ports(3)
        network = state.network
        incluster.enable_forwarding(network.bridge)
        password = incluster.new_password()
        postgres = Postgres.start(network.gateway, pg_port, network.cidr, password)
        overlay = self.state_dir / incluster.OVERLAY_DIR
        state.in_cluster = incluster.InCluster(str(overlay), asdict(postgres), healthz, metrics)
        state.save(self.state_file)
        try:
            argv = incluster.kube_proxy_argv(
                bin_dir, self.kubeconfig, state.real_nodes[0].name, network.cidr, healthz, metrics
            )
            self._launch("kube-proxy", argv, state)
            self._wait_ready(state, deadline, only="kube-proxy")
            incluster.write_overlay(overlay, base, postgres.url(password))
            incluster.kubectl(self.kubeconfig, "apply", "-k", str(overlay))
            state.in_cluster.url = self._wait_kubetrain(state, deadline)
            token = incluster.kubectl(
                self.kubeconfig,
                f"--namespace={incluster.NAMESPACE}",
                "exec",
                f"deploy/{incluster.DEPLOYMENT}",
                "--",
                "kubetrain",
                "token",
                "create",
                "--role=admin",
                "--project=*",
                "--name=testbed-admin",
            ).strip()
            state.in_cluster.token_file.touch(mode=0o600)
            state.in_cluster.token_file.write_text(token + "\n")
            state.save(self.state_file)
        except BaseException:
            self.uninstall_kubetrain()
            raise
        return state.in_cluster

    def uninstall_kubetrain(self) -> None:
        """Take the install back: `kubectl delete -k` of the overlay (not waited for),
        kube-proxy and its rules, PostgreSQL and its data."""
        state = self.state()
        if state.in_cluster is None:
            return
        if Path(state.in_cluster.overlay, "kustomization.yaml").exists():
            with contextlib.suppress(incluster.InClusterError, subprocess.SubprocessError):
                incluster.kubectl(
                    self.kubeconfig,
                    "delete",
                    "-k",
                    state.in_cluster.overlay,
                    "--ignore-not-found",
                    "--wait=false",
                )
        self._stop_in_cluster(state)
        state.in_cluster = None
        state.save(self.state_file)

    def kubetrain_env(self) -> dict[str, str]:
        """KUBETRAIN_URL and KUBETRAIN_TOKEN of the in-cluster install (empty without)."""
        info = self.state().in_cluster
        if info is None or not info.url:
            return {}
        return {"KUBETRAIN_URL": info.url, "KUBETRAIN_TOKEN": info.token_file.read_text().strip()}

    def _wait_kubetrain(self, state: State, deadline: float) -> str:
        """Until the Deployment's replicas are all ready and up to date and the Service
        answers /readyz from here (through kube-proxy); returns the Service's URL."""
        from lightkube import Client
        from lightkube.config.kubeconfig import KubeConfig
        from lightkube.resources.apps_v1 import Deployment
        from lightkube.resources.core_v1 import Service

        client = Client(config=KubeConfig.from_file(self.kubeconfig))
        url, ready = "", False
        while time.monotonic() < deadline:
            deployment = client.get(Deployment, incluster.DEPLOYMENT, namespace=incluster.NAMESPACE)
            ready = incluster.rolled_out(deployment)
            service = client.get(Service, incluster.SERVICE, namespace=incluster.NAMESPACE)
            ip = service.spec.clusterIP if service.spec else None
            url = f"http://{ip}"
            if ready and ip and processes.http_ok(f"{url}/readyz"):
                return url
            self._check_alive(state, ["kube-proxy"])
            time.sleep(0.5)
        raise TestbedError(
            f"kubetrain was not ready in the testbed before the timeout (replicas ready: "
            f"{ready}, {url}/readyz); see `kubectl -n {incluster.NAMESPACE} describe pods` "
            f"and {self.log_path('kube-proxy')}"
        )

    def _stop_in_cluster(self, state: State) -> list[str]:
        stopped = []
        info = state.in_cluster
        assert info is not None
        pid = state.pids.pop("kube-proxy", None)
        if pid and processes.stop(pid, Path(state.bin_dir) / "kube-proxy"):
            stopped.append("kube-proxy")
        if os.access(Path(state.bin_dir) / "kube-proxy", os.X_OK):
            with self.log_path("kube-proxy").open("a") as log:
                log.write(incluster.kube_proxy_cleanup(Path(state.bin_dir)))
        Postgres(**info.postgres).stop()
        stopped.append("postgres")
        return stopped

    # -- nodes -----------------------------------------------------------------------------

    def create_nodes(self, pool: Pool) -> None:
        from lightkube import Client
        from lightkube.codecs import from_dict
        from lightkube.config.kubeconfig import KubeConfig

        client = Client(config=KubeConfig.from_file(self.kubeconfig), field_manager="testbed")
        nodes = pool.nodes()

        def create(node: dict[str, Any]) -> None:
            client.create(from_dict(node))

        with ThreadPoolExecutor(max_workers=8) as pool_exec:
            list(pool_exec.map(create, nodes))

    def wait_nodes_ready(self, pool: Pool, deadline: float) -> None:
        from lightkube import Client
        from lightkube.config.kubeconfig import KubeConfig
        from lightkube.resources.core_v1 import Node

        client = Client(config=KubeConfig.from_file(self.kubeconfig))
        want = pool.node_count()
        # A real node's GPUs count once its device plugin has registered.
        gpus = {n.name: n.gpus for n in self.state().real_nodes}
        ready = 0
        while time.monotonic() < deadline:
            nodes = list(client.list(Node, labels={POOL_LABEL: pool.name}))
            ready = sum(1 for n in nodes if _node_ready(n) and _gpus(n) >= gpus.get(_name(n), 0))
            if ready == want:
                return
            self._check_alive(self.state())
            time.sleep(0.2)
        logs = [self.log_path("kwok")] + [
            self.log_path(n.component("kubelet")) for n in self.state().real_nodes
        ]
        raise TestbedError(
            f"{ready} of {want} nodes Ready before the timeout; see {', '.join(map(str, logs))}"
        )

    # -- internals -------------------------------------------------------------------------

    def _argv(self, component: str, state: State) -> list[str]:
        p, k, bin_dir = state.ports, self.pki, Path(state.bin_dir)
        kubeconfig = str(self.kubeconfig)
        binary = str(bin_dir / component)
        if component == "etcd":
            client, peer = f"http://127.0.0.1:{p.etcd_client}", f"http://127.0.0.1:{p.etcd_peer}"
            return [
                binary,
                "--name=testbed",
                f"--data-dir={self.state_dir / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=testbed={peer}",
                "--initial-cluster-state=new",
                # A loopback test cluster: durability across power loss buys nothing.
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ]
        if component == "kube-apiserver":
            # With real nodes, their Pods reach the API server as Pods do anywhere: at the
            # `kubernetes` Service, whose endpoint is the advertised address (the bridge's
            # gateway; kube-proxy translates the ClusterIP when it runs). It listens on
            # every address then, for the gateway does not exist before the bridge.
            bind, advertise = "127.0.0.1", "127.0.0.1"
            if state.network is not None:
                bind, advertise = "0.0.0.0", state.network.gateway  # noqa: S104
            return [
                binary,
                f"--etcd-servers=http://127.0.0.1:{p.etcd_client}",
                f"--secure-port={p.apiserver}",
                f"--bind-address={bind}",
                f"--advertise-address={advertise}",
                f"--tls-cert-file={k.server_cert}",
                f"--tls-private-key-file={k.server_key}",
                f"--client-ca-file={k.ca_cert}",
                # ServiceAccount tokens: signed with the testbed's key, under one issuer.
                # The kubelets' projected tokens for kubetrain's audience (its reports)
                # need nothing more: TokenRequest takes any audience, and a TokenReview
                # that names one checks the token against it. --api-audiences (default:
                # the issuer) is only what the API server itself takes as a credential,
                # so a token for kubetrain is no credential for the Kubernetes API.
                f"--service-account-key-file={k.sa_pub}",
                f"--service-account-signing-key-file={k.sa_key}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                f"--cert-dir={self.state_dir / 'apiserver-certs'}",
                "--allow-privileged=true",
                "--profiling=false",
                # Real kubelets (logs, exec): reached at their node IP, with the
                # admin certificate, which they accept from the testbed's CA.
                "--kubelet-preferred-address-types=InternalIP",
                f"--kubelet-client-certificate={k.admin_cert}",
                f"--kubelet-client-key={k.admin_key}",
                *(self._aggregator_flags() if state.kueue_visibility_address else []),
            ]
        if component == "kueue":
            return kueue_mod.argv(state.components()["kueue"], self.state_dir, self.kubeconfig)
        common = [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            _ALWAYS_ALLOW,
            # client-go's default 20 QPS makes the node-lifecycle controller lift
            # the not-ready taint of a 500-node pool at ~5 nodes/s (measured);
            # a loopback testbed has no other tenant to protect.
            "--kube-api-qps=1000",
            "--kube-api-burst=2000",
        ]
        if component == "kube-controller-manager":
            return [
                binary,
                *common,
                f"--secure-port={p.controller_manager}",
                f"--cert-dir={self.state_dir / 'kcm-certs'}",
                "--controllers=*",
                "--use-service-account-credentials=false",
                f"--root-ca-file={k.ca_cert}",
                f"--service-account-private-key-file={k.sa_key}",
                f"--cluster-signing-cert-file={k.ca_cert}",
                f"--cluster-signing-key-file={k.ca_key}",
                "--profiling=false",
            ]
        if component == "kube-scheduler":
            return [
                binary,
                *common,
                f"--secure-port={p.scheduler}",
                f"--cert-dir={self.state_dir / 'scheduler-certs'}",
                "--profiling=false",
            ]
        if component == "kwok":
            return [
                binary,
                f"--kubeconfig={kubeconfig}",
                *[f"--config={path}" for path in stage_files()],
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                f"--cidr={POD_CIDR}",
                "--node-ip=10.0.0.1",
                "--node-lease-duration-seconds=40",
                f"--server-address=127.0.0.1:{p.kwok}",
            ]
        raise TestbedError(f"unknown component {component!r}")

    # -- Kueue -----------------------------------------------------------------------------

    @property
    def front_proxy_cert(self) -> Path:
        return self.pki.directory / "front-proxy-client.crt"

    @property
    def front_proxy_key(self) -> Path:
        return self.pki.directory / "front-proxy-client.key"

    def _prepare_kueue(self, state: State, build: KueueBuild, pods_ready_timeout: str) -> None:
        """Kueue's certificate and configuration, and the API server's front-proxy client
        certificate (the aggregator's identity towards the visibility API)."""
        address = kueue_mod.host_address()
        state.kueue_dir = str(build.directory)
        state.kueue_visibility_address = address
        p = state.ports
        kueue_mod.write_certificates(self.pki, self.state_dir, address)
        kueue_mod.write_configuration(
            self.state_dir,
            kueue_mod.configuration(
                self.state_dir,
                p.kueue_webhook,
                p.kueue_health,
                p.kueue_metrics,
                p.kueue_visibility,
                address,
                pods_ready_timeout,
            ),
        )
        if address:
            pki_mod.issue(
                self.pki, self.front_proxy_cert, self.front_proxy_key, _FRONT_PROXY, client=True
            )
        state.save(self.state_file)

    def _aggregator_flags(self) -> list[str]:
        """The API server proxies the visibility API to Kueue: it dials the Service's
        Endpoints (no kube-proxy here) as the front-proxy client."""
        return [
            "--enable-aggregator-routing=true",
            f"--proxy-client-cert-file={self.front_proxy_cert}",
            f"--proxy-client-key-file={self.front_proxy_key}",
            f"--requestheader-client-ca-file={self.pki.ca_cert}",
            f"--requestheader-allowed-names={_FRONT_PROXY}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        ]

    def _start_kueue(self, state: State, deadline: float) -> None:
        """Install Kueue's CRDs, webhooks and visibility APIService, then start it."""
        assert state.kueue_dir
        visibility = None
        if state.kueue_visibility_address:
            visibility = (state.kueue_visibility_address, state.ports.kueue_visibility)
        kueue_mod.install(
            self.kubeconfig,
            KueueBuild(Path(state.kueue_dir)),
            self.pki,
            state.ports.kueue_webhook,
            visibility,
            deadline,
        )
        self._start("kueue", state)

    def _wait_kueue(self, state: State, deadline: float) -> None:
        """Until Kueue's webhooks answer (its readyz) and the aggregator reports the
        visibility API available: before that a Job create would be refused."""
        self._wait_ready(state, deadline, only="kueue")
        while state.kueue_visibility_address:
            if kueue_mod.visibility_available(self.kubeconfig):
                return
            self._check_alive(state, ["kueue"])
            if time.monotonic() > deadline:
                raise TestbedError(
                    "Kueue's visibility API is not available before the timeout; "
                    f"see {self.log_path('kueue')} and the APIService "
                    "v1beta2.visibility.kueue.x-k8s.io"
                )
            time.sleep(0.2)

    def _start(self, component: str, state: State, extra_args: Sequence[str] = ()) -> None:
        argv = [*self._argv(component, state), *extra_args]
        self._launch(component, argv, state)

    def _launch(self, component: str, argv: Sequence[str], state: State) -> None:
        pid = processes.start(component, argv, self.log_path(component), self.state_dir)
        state.pids[component] = pid
        state.save(self.state_file)

    # -- real nodes ------------------------------------------------------------------------

    def _start_real_nodes(self, state: State, deadline: float) -> None:
        """containerd first (it makes the node's mount namespace), the images, then
        the kubelet and the device plugin in that namespace; the kubelets retry
        until the API server answers."""
        assert state.network is not None
        bin_dir = Path(state.bin_dir)
        images = build_images(Binaries(bin_dir))
        real.host_dirs()
        state.network.up(len(state.real_nodes))
        # Binds the gateway's address: after the bridge holds it.
        conf = self.state_dir / "Corefile"
        conf.write_text(real.corefile(state.network, self.kubeconfig))
        self._launch("coredns", real.coredns_argv(bin_dir, conf), state)
        for node in state.real_nodes:
            real.make_cgroups(node)
            self._launch(node.component("containerd"), real.containerd_argv(node), state)
        for node in state.real_nodes:
            self._wait_containerd(state, node, deadline)
        with ThreadPoolExecutor(max_workers=4) as pool_exec:
            list(
                pool_exec.map(
                    lambda n: self._import_images(state, n, images, deadline), state.real_nodes
                )
            )
        for node in state.real_nodes:
            self._start_kubelet(state, node)

    def _start_storage(self, state: State) -> None:
        """The default StorageClass and its provisioner, a host process like CoreDNS."""
        from lightkube import Client
        from lightkube.codecs import from_dict
        from lightkube.config.kubeconfig import KubeConfig

        client = Client(config=KubeConfig.from_file(self.kubeconfig), field_manager="testbed")
        for obj in real.storage_objects(state.real_nodes):
            client.create(from_dict(obj))
        conf_dir = self.state_dir / "local-path"
        conf_dir.mkdir(exist_ok=True)
        config, helper = conf_dir / "config.json", conf_dir / "helper-pod.yaml"
        config.write_text(json.dumps(real.provisioner_config(state.real_nodes), indent=2))
        helper.write_text(json.dumps(real.helper_pod(), indent=2))  # JSON is YAML
        argv = real.provisioner_argv(Path(state.bin_dir), config, helper, self.kubeconfig)
        self._launch("local-path-provisioner", argv, state)

    def _wait_containerd(self, state: State, node: real.RealNode, deadline: float) -> None:
        """Until the node's containerd answers on its socket. The socket's file is not
        enough: it exists from the listener's bind, and a dial before its listen is
        refused (seen in CI: the image import's `connect: connection refused`)."""
        component = node.component("containerd")
        said = ""
        while not (node.socket.exists() and (said := real.containerd_answers(node)) == ""):
            processes.reap(state.pids[component])
            if not Path(f"/proc/{state.pids[component]}").exists():
                raise TestbedError(
                    f"{component} exited during start; last lines of its log:\n"
                    f"{processes.log_tail(self.log_path(component))}"
                )
            if time.monotonic() > deadline:
                raise TestbedError(
                    f"{component} did not answer on {node.socket} before the timeout"
                    + (f" ({said})" if said else "")
                )
            time.sleep(0.05)

    def _import_images(
        self, state: State, node: real.RealNode, images: list[Image], deadline: float
    ) -> None:
        """The images into the node's containerd. A dial that containerd refuses after it
        answered (seen once in CI, when a lost node was started again) waits for it to
        answer again, or says its log if it exited, and imports again, twice at most."""
        for tries_left in (2, 1, 0):
            try:
                real.import_images(node, images)
                return
            except real.RealNodeError as exc:
                if not tries_left or "connection refused" not in str(exc):
                    raise
                log.warning("%s; waiting for its containerd to answer again", exc)
                self._wait_containerd(state, node, deadline)

    def _start_kubelet(self, state: State, node: real.RealNode) -> None:
        """The node's kubelet and device plugin, in its containerd's mount namespace."""
        bin_dir = Path(state.bin_dir)
        pid = state.pids[node.component("containerd")]
        kubelet = real.kubelet_argv(node, bin_dir, self.kubeconfig)
        self._launch(node.component("kubelet"), real.in_namespace(pid, kubelet), state)
        if node.gpus:
            plugin = real.device_plugin_argv(node, bin_dir)
            self._launch(node.component("device-plugin"), real.in_namespace(pid, plugin), state)

    def _stop_real_nodes(self, state: State) -> list[str]:
        """Device plugins and kubelets, then what they leave running (the Pods' processes,
        containerd's shims), containerd, the cgroups and the bridge."""
        stopped = []
        named = state.components()
        pid = state.pids.get("local-path-provisioner")
        if (
            pid
            and "local-path-provisioner" in named
            and processes.stop(pid, named["local-path-provisioner"])
        ):
            stopped.append("local-path-provisioner")
        for what in ("device-plugin", "kubelet"):
            for node in state.real_nodes:
                component = node.component(what)
                pid = state.pids.get(component)
                if pid and component in named and processes.stop(pid, named[component]):
                    stopped.append(component)
        for node in state.real_nodes:
            real.remove_cgroups(node)
            real.kill_shims(node)
            component = node.component("containerd")
            pid = state.pids.get(component)
            if pid and processes.stop(pid, named[component]):
                stopped.append(component)
            real.remove_cgroups(node)
        pid = state.pids.get("coredns")
        if pid and "coredns" in named and processes.stop(pid, named["coredns"]):
            stopped.append("coredns")
        if state.network is not None:
            state.network.down()
        return stopped

    def _apiserver_ready(self, state: State) -> bool:
        return processes.http_ok(
            f"https://127.0.0.1:{state.ports.apiserver}/readyz", self._admin_context()
        )

    def _admin_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return context

    def _probes(self, state: State) -> dict[str, Callable[[], bool]]:
        p, insecure = state.ports, processes.insecure_context()
        return {
            "etcd": lambda: processes.http_ok(f"http://127.0.0.1:{p.etcd_client}/health"),
            "kube-apiserver": lambda: self._apiserver_ready(state),
            "kube-controller-manager": lambda: processes.http_ok(
                f"https://127.0.0.1:{p.controller_manager}/healthz", insecure
            ),
            "kube-scheduler": lambda: processes.http_ok(
                f"https://127.0.0.1:{p.scheduler}/healthz", insecure
            ),
            "kube-proxy": lambda: (
                state.in_cluster is not None
                and processes.http_ok(
                    f"http://127.0.0.1:{state.in_cluster.kube_proxy_healthz}/healthz"
                )
            ),
            "kwok": lambda: processes.http_ok(f"http://127.0.0.1:{p.kwok}/healthz"),
            "kueue": lambda: processes.http_ok(f"http://127.0.0.1:{p.kueue_health}/readyz"),
        }

    def _wait_ready(
        self, state: State, deadline: float, only: str | Sequence[str] | None = None
    ) -> None:
        probes = self._probes(state)
        pending = [only] if isinstance(only, str) else list(only or state.components())
        while pending:
            self._check_alive(state, pending)
            pending = [c for c in pending if not probes[c]()]
            if not pending:
                return
            if time.monotonic() > deadline:
                raise TestbedError(
                    f"not ready before the timeout: {', '.join(pending)}; logs in "
                    f"{self.state_dir / 'logs'}\n{processes.log_tail(self.log_path(pending[0]))}"
                )
            time.sleep(0.1)

    def _check_alive(self, state: State, components: list[str] | None = None) -> None:
        named = state.components()
        for component in components or list(named):
            pid = state.pids.get(component)
            if pid is None:
                continue
            processes.reap(pid)
            if processes.is_ours(pid, named[component]) or processes.is_launching(pid):
                continue
            tail = processes.log_tail(self.log_path(component))
            if "address already in use" in tail:
                busy = [
                    f"{what} port {port}"
                    for what, port in state.ports.named().items()
                    if f":{port}" in tail
                ]
                raise PortTakenError(
                    f"{component} could not bind {', '.join(busy) or 'its port'}: "
                    f"address already in use\n{tail}"
                )
            raise TestbedError(f"{component} exited during start; last lines of its log:\n{tail}")


# The TaintNodesByCondition admission taints every new Node not-ready; the
# node-lifecycle controller lifts it once Ready. Until then nothing schedules.
_NOT_READY_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def _node_ready(node: Any) -> bool:
    """Ready and schedulable: the Ready condition holds and the not-ready taint is gone."""
    conditions = (node.status and node.status.conditions) or []
    taints = (node.spec and node.spec.taints) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions) and not any(
        t.key in _NOT_READY_TAINTS for t in taints
    )


def _real_node(state: State, name: str) -> real.RealNode:
    for node in state.real_nodes:
        if node.name == name:
            return node
    raise TestbedError(f"{name!r} is not a real node of this testbed")


def _name(node: Any) -> str:
    return str(node.metadata.name) if node.metadata else ""


def _gpus(node: Any) -> int:
    allocatable = (node.status and node.status.allocatable) or {}
    return int(allocatable.get(real.GPU_RESOURCE, "0"))


def _wait_port_free(port: int, deadline: float) -> None:
    """Until nothing listens on the port (or the deadline): a restarted component
    must not race the old process's socket."""
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            probe.settimeout(0.5)
            if probe.connect_ex(("127.0.0.1", port)) != 0:
                return
        time.sleep(0.1)


def node_table(testbed: Testbed) -> str:
    """The nodes as the scheduler sees them: GPUs, cpu, memory, taints, readiness."""
    from lightkube import Client
    from lightkube.config.kubeconfig import KubeConfig
    from lightkube.resources.core_v1 import Node

    client = Client(config=KubeConfig.from_file(testbed.kubeconfig))
    rows = [("NODE", "ACCELERATOR", "GPUS", "CPU", "MEMORY", "READY", "TAINTS")]
    for node in client.list(Node):
        labels = node.metadata.labels or {} if node.metadata else {}
        status = node.status
        alloc = (status.allocatable if status else None) or {}
        ready = any(
            c.type == "Ready" and c.status == "True" for c in (status and status.conditions) or []
        )
        taints = ",".join(
            f"{t.key}={t.value or ''}:{t.effect}" for t in (node.spec and node.spec.taints) or []
        )
        rows.append(
            (
                node.metadata.name if node.metadata and node.metadata.name else "?",
                labels.get("accelerator", "-"),
                alloc.get("nvidia.com/gpu", "0"),
                alloc.get("cpu", "?"),
                alloc.get("memory", "?"),
                "Ready" if ready else "NotReady",
                taints or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )
